// KV-cache options: one struct, defaults from SPEC §1–5. Every option is typed here and
// parsed once, at the edge, by set_kv_option (kvcache/options.h), which the CLI, `eval`
// variants, the Python bindings and the server share. A policy's own defaults (the authors'
// settings of a baseline) are applied by its registry row (kvcache/registry.h), which also
// fills the settings only its family has (QuantizerOptions); caches are made by the row's
// make_cache (make_kv_cache, kvcache/factory.h); every byte figure of the budget is computed
// by compute_budget (kvcache/budget.h).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/status.h"
#include "kernels/ops.h"

namespace qevict {

struct KvQuantLayerCalib;  // kvcache/quantizers/kvquant_policy.h

// When a budgeted cache routes during prefill (SPEC §4): kChunk after every prefill chunk
// (peak bytes ≤ budget + one chunk, whatever the prompt); kEnd holds the whole prompt in full
// precision and routes once, when the prompt is complete (SequenceKvCache::end_prompt, or the
// first decode step): the paper's own code, peak bytes = the prompt. kStaged (windowed caches
// with a low-bit tier, issue 52): routes once at the same point as kEnd, with the same
// scoring, but windows that leave the local region while the prompt is read are quantized
// into the low-bit tier at once (the staged copy; nothing evicted), so the peak is sink +
// local + the prompt at low bits + one chunk (KvBudget::staged_prompt_bytes).
enum class PrefillRoute { kChunk, kEnd, kStaged };
// How qevict ranks windows (QEvictPolicy, SPEC §2): kSum = the cumulative score S̄(w) (paper
// Eq. 1); kAge = S̄(w) per query token that has seen the window.
enum class ScoreMode { kSum, kAge };
// Which neighbours pool into a window: kBoth (ids within `pool` either side) or kAfter (a
// window takes the best of itself and the `pool` windows before it, so only the windows that
// follow a peak — the rest of a value the question found — rise with it).
enum class PoolSide { kBoth, kAfter };

const char* to_string(PrefillRoute r);  // "chunk", "end", "staged"
const char* to_string(ScoreMode s);     // "sum", "age"
const char* to_string(PoolSide s);      // "both", "after"

// The settings of the quantizers that keep every token (KIVI, KVQuant, ZipCache), each under
// its own name. Their registry rows fill them from the shared flags (--kv-bits, --kv-q,
// --kv-sink, --kv-local, --kv-group, --kv-route-every), whose meaning differs per family, so
// that no cache reads a shared field in a sense of its own.
struct QuantizerOptions {
  int bits = 2;                // KIVI, KVQuant: code bits; ZipCache: the low bit width
  int group = 32;              // KIVI: G, tokens (keys) and channels (values) per group
  int residual = 128;          // KIVI: R, newest tokens kept in f16
  double outlier_share = 0.0;  // KVQuant: share of values kept exactly (1 − sparsity threshold)
  int f16_first = 0;           // KVQuant: first tokens kept in f16
  double low_share = 0.0;      // ZipCache: share of tokens at the low bit width
  int gap = 100;               // ZipCache: tokens between requantizations (streaming_gap)
  // KVQuant: the model's calibration, one entry per layer (pre-RoPE key thresholds and
  // levels; engine/kvquant_calibration.h fits it on a calibration text). Shared, read-only.
  std::shared_ptr<const std::vector<KvQuantLayerCalib>> kvquant_calib;
};

struct KvCacheParams {
  std::string policy = "full";      // a registry name: full, qevict, streaming, h2o, ...
  HalfType dtype = HalfType::kF16;  // full-precision storage type
  // Budget per layer: a fraction of the full-precision cache for n_ctx tokens (the paper's
  // "20 % budget") or an exact byte count. One of the two must be set for budgeted policies.
  double budget_fraction = 0.0;
  int64_t budget_bytes = 0;
  // Per-head token caches only, and only when neither of the two above is set: tokens per
  // KV head (the capacity the eviction papers state, e.g. SnapKV's max_capacity_prompt);
  // the registry rows of those baselines set it as their authors' default budget.
  int64_t budget_tokens = 0;
  double q = 0.70;      // share of the history budget given to the low-bit tier
  int window = 8;       // ω: tokens per window
  int route_every = 8;  // Ω: decode steps between routing events
  int sink = 5;         // S: first tokens, always full precision
  int local = 32;       // L: newest tokens, always full precision
  // Per-head caches (H2O's default): the recent window takes half of what the sink leaves of
  // a head's capacity, resolved by compute_budget; `local` is not read then.
  bool local_half_budget = false;
  // qevict's registry row sets bits 4 and value_bits 2 when neither is given (K4V2).
  int bits = 2;         // low-bit tier: 2 or 4; 0 = auto (KvBudget::bits: 4 if it holds all)
  int value_group = 0;  // g: value quantization group (0: head_dim)
  int value_bits = 0;   // the low-bit tier's values: 2 or 4 (windowed caches); 0 = `bits`
  // The low-bit tier's key scales and zeros (windowed caches): 16 = f16, 8 = one byte each
  // (QuantLayout::kmeta; 128 fewer bytes a window-head at head_dim 64).
  int key_meta = 16;
  bool strict_ledger = false;  // charge ledger copies of promoted windows to the budget
  ScoreMode score = ScoreMode::kSum;
  // qevict: rank a window by the highest score within `pool` windows of it (QEvictPolicy;
  // SnapKV's pooling at window granularity), on the side `pool_side` says. 0: its own score.
  int pool = 0;
  PoolSide pool_side = PoolSide::kBoth;
  PrefillRoute prefill_route = PrefillRoute::kChunk;
  // How that one kEnd / kStaged routing ranks windows (windowed caches): 0 = the cumulative
  // score S̄ of every prompt query (Eq. 1, SPEC §2); N > 0 = the attention mass the last N
  // prompt queries put on each window only (SnapKV's observation window, w = 32 in
  // init_snapkv, BASELINES.md), after which scores restart from that mass. The qevict
  // registry row makes 32 the default with route kEnd or kStaged (chosen from the eval suite
  // for kEnd) unless the option is given.
  int prefill_window = 0;
  // --kv-adapt T (qevict, --prefill-route end with a prefill window; 0: off): at the prompt's
  // first routing, when its observation window looks where the text itself looks — the mean
  // over layers of KL(window's attention || the prompt's own attention per query) over the
  // history windows is below T nats (PromptFocus::kl, focus_score) — no question about the
  // text is in view: the low-bit tier becomes the coverage tier (coverage_params: INT2 keys
  // and values, one-byte key scales, q 0.95), which keeps most of the text for questions that
  // come later; else the configured tier stays. Same budget either way.
  double adapt = 0.0;
  std::string trace_path;  // --kv-trace: JSONL record per routing event and layer
  // KIVI / KVQuant / ZipCache: filled by their registry rows.
  QuantizerOptions quant;

  // The prompt is routed once, at its end (end, staged).
  bool defers_prompt() const { return prefill_route != PrefillRoute::kChunk; }
  // ... and held in full precision until then (end).
  bool holds_prompt() const { return prefill_route == PrefillRoute::kEnd; }
  // Checks every field, and the policy's own rules (its registry row).
  Status validate() const;
};

// The low-bit tier --kv-adapt switches to when the prompt's end points nowhere in the text:
// p with INT2 keys and values, one-byte key scales and zeros, q 0.95 (issue 51's coverage
// candidate, EVALUATION.md), and no further adaptation.
KvCacheParams coverage_params(const KvCacheParams& p);

// Which KvCacheParams fields the user set explicitly (set_kv_option marks them): a policy's
// registry row gives the others its authors' defaults.
struct KvParamsGiven {
  bool window = false, route_every = false, sink = false, local = false, q = false, bits = false;
  bool prefill_route = false, prefill_window = false, pool = false, value_bits = false;
  bool value_group = false, key_meta = false;
};

}  // namespace qevict
