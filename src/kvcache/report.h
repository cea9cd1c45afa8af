// What a cache reports about itself, for --kv-stats, bench, diagnostics and tests: one
// plain struct filled by SequenceKvCache::report(), so that nothing outside kvcache/ needs
// to know which cache class it holds.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "kvcache/budget.h"
#include "kvcache/tier.h"

namespace qevict {

struct KvLayerReport {
  // Windows (per-head caches: tokens, all KV heads) by tier now.
  int64_t windows_full = 0, windows_quant = 0, windows_evicted = 0, windows_local = 0;
  // Moves so far.
  // quantizations: windows written to the low-bit tier (tiered cache), once each.
  int64_t promotions = 0, demotions = 0, evictions = 0, quantizations = 0;
  // Quantizers (every token kept): units held at low bits — KIVI's key groups, ZipCache's
  // low-bit tokens (per KV head) — and KVQuant's outlier values kept exactly.
  int64_t quantized_units = 0, outliers = 0;
  int64_t evicted_at_first_routing = 0;  // young-window evictions (SPEC §8)
  int64_t aged = 0;                      // windows that left the local region
  // Bytes in use by tier, and what the process holds for the layer.
  size_t bytes_sink = 0, bytes_full = 0, bytes_quant = 0;
  size_t bytes_ledger_of_full = 0;  // ledger entries held by windows now in F
  size_t bytes_budgeted = 0;        // what counts against B_total (sink + F + Q [+ ledger])
  size_t bytes_allocated = 0;       // pools + sink
};

// Where a prompt-end observation window's attention fell when the prompt was first routed
// (tiered caches with --prefill-window), one layer: shares of the window's queries'
// attention (each query's sums to 1, averaged over query heads and the window's queries) on
// the aged windows ("history": neither sink nor local), and on its 1, 4 and 16 most attended
// of them; far4: on its 4 most attended aged windows that end kFocusFarTokens or more before
// the prompt's end. A question about the text points into it (a few windows, anywhere in it,
// take much); a text's own tail attends mostly to its sink and its newest sentences.
inline constexpr int64_t kFocusFarTokens = 256;
struct PromptFocus {
  double history = 0.0, top1 = 0.0, top4 = 0.0, top16 = 0.0, far4 = 0.0;
  // KL(P || G) in nats between the window's attention over the aged windows (P) and the
  // prompt's own attention per query that saw each window (G: every prompt query's, divided
  // by the queries at or after the window), both normalised over the aged windows: how far
  // the prompt's end looks where the text itself does not. 0 when G is unknown (a replayed
  // prompt without every query's masses).
  double kl = 0.0;
};

// --kv-adapt's statistic: the mean over layers of PromptFocus::kl (0 when empty).
inline double focus_score(const std::vector<PromptFocus>& focus) {
  if (focus.empty()) return 0.0;
  double s = 0.0;
  for (const PromptFocus& f : focus) s += f.kl;
  return s / double(focus.size());
}

enum class ReportDetail {
  kSummary,  // counts, bytes, times
  kTiers,    // also the tier of every position and the score of every window
};

struct KvReport {
  std::string policy;     // registry name ("full", "qevict", ...)
  std::string describe;   // one line
  KvBudget budget;        // kind kFull: no budget
  size_t bytes_held = 0;  // everything the cache object holds (pools, tables, scratch)
  // The most it held after any forward call, before that call's routing (0: not tracked):
  // budget + one chunk with --prefill-route chunk, the whole prompt with end.
  size_t peak_bytes_held = 0;
  int64_t routing_events = 0;
  double route_seconds = 0.0;         // all routing events
  double route_seconds_decode = 0.0;  // routing triggered by decode steps
  double quantize_seconds = 0.0, promote_seconds = 0.0;
  std::vector<KvLayerReport> layers;
  // [layer], measured at the first prompt routing (tiered caches with a prompt-end
  // observation window); empty otherwise.
  std::vector<PromptFocus> prompt_focus;
  // --kv-adapt: whether that routing found the prompt's end pointing into the text (focus
  // at or above the threshold: the configured low-bit tier kept) or not (the coverage tier);
  // "" when the cache does not adapt or has not routed a prompt yet.
  std::string adapted;

  // ReportDetail::kTiers only.
  bool per_head = false;  // units are (layer, KV head) instead of layers
  int unit_tokens = 1;    // tokens per window (per-head caches: 1)
  // [unit][position]: kLocal for the sink and the local region (never routed), kFull /
  // kQuant / kEvicted for routed history. unit = layer, or layer · n_kv_heads + head.
  std::vector<std::vector<Tier>> position_tiers;
  // [layer][window] cumulative scores (windowed caches).
  std::vector<std::vector<double>> window_scores;

  // Sum of the per-layer figures; bytes_budgeted is the worst layer's.
  KvLayerReport total() const;
};

}  // namespace qevict
