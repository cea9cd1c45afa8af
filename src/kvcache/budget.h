// Every byte figure of a KV budget, computed once (SPEC §3, paper Eq. 3) and read by the
// caches, the policies, stats, describe(), diagnostics and tests. Per layer:
//   B_total = budget_bytes, or budget_fraction × the 16-bit cache of n_ctx tokens
//   windowed caches (tiered):  B_sink = S tokens, B_local = ceil((L+Ω−1)/ω)+1 windows of M_f
//     (the local region plus the windows that age out of it between two routing events),
//     B_hist = B_total − B_sink − B_local,  K_f = ⌊(1−q) B_hist / M_f⌋,  K_q = ⌊q B_hist / M_q⌋
//     M_f = one window's K|V in 16 bits,  M_q = one window in the low-bit ledger (codes +
//     scales/zeros, QuantLayout::window_bytes), each + the window's entry in the store's
//     table (kWindowEntryBytes: SPEC §3, "metadata included ... any index")
//   per-head token caches (H2O):  M = one token of one KV head (K + V + int32 position),
//     C = ⌊B_total / n_kv_heads / M⌋ tokens per head = S sink + L recent + K heavy
// A budget given as a fraction that does not cover the fixed regions (windowed: sink + local
// windows + one window of history; per-head: sink + recent + the Ω decode tokens + one heavy
// token per head) is floored at that minimum instead of refused: a context that small needs
// no compression (issue 50). A budget in bytes stays exact and is refused.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "core/status.h"
#include "kernels/kv_quant.h"
#include "kvcache/params.h"
#include "kvcache/shape.h"

namespace qevict {

struct PolicyNeeds;  // kvcache/policies/routing_policy.h

// A window's entry in the store's table (WindowStore::Window: id, slots, score, tier),
// charged with the window in M_f and M_q: with ω = 1 (StreamingLLM) there is one a token, 6 %
// of a token's K and V on a model with 2 KV heads of 64.
inline constexpr size_t kWindowEntryBytes = 32;

// How a cache lays out its bytes; decides which figures a budget has.
enum class CacheKind {
  kFull,       // FullKV: no budget
  kWindowed,   // sink + windows in F / Q / E + local region (TieredKvCache)
  kPerHead,    // per-KV-head token sets (HeadKvCache)
  kQuantized,  // every token kept, quantized (kivi, kvquant, zipcache: KiviKvCache,
               // KvQuantCache, ZipKvCache): no budget, a byte point
};

// What a routing policy may keep, in bytes (a view of KvBudget for one routing event).
struct RoutingBudget {
  size_t full_bytes = 0;       // K_f · M_f (per-head caches: K · M)
  size_t quant_bytes = 0;      // K_q · M_q
  size_t window_full = 0;      // M_f (per-head caches: M)
  size_t window_quant = 0;     // M_q
  bool strict_ledger = false;  // a full window that keeps a ledger also pays M_q from full_bytes
};

struct KvBudget {
  CacheKind kind = CacheKind::kFull;
  // Geometry.
  int sink = 0;               // S tokens
  int local = 0;              // L tokens (per-head caches: the recent tokens, resolved from -1)
  int window = 1;             // ω tokens
  int64_t local_windows = 0;  // windows not yet routed, at most: ceil((L + Ω − 1)/ω) + 1
  // Bytes per layer.
  size_t total = 0;  // B_total
  // What the fraction gave (budget_fraction × the 16-bit cache of n_ctx tokens), and whether
  // it was below the fixed regions, so that total is their minimum instead (header comment).
  size_t requested = 0;
  bool floored = false;
  size_t token_bytes = 0;  // one token's K and V for all KV heads in 16 bits
  size_t sink_bytes = 0, local_bytes = 0, hist_bytes = 0;
  size_t window_full = 0;                         // M_f, the entry included
  size_t window_quant = 0;                        // M_q, scales, zeros and the entry included
  size_t window_entry = 0;                        // the entry's share of M_f and M_q
  int64_t capacity_full = 0, capacity_quant = 0;  // K_f, K_q
  // The low-bit tier's bits M_q and K_q are for: --kv-bits, or with --kv-bits auto (0) 4
  // when K_f + K_q at INT4 cover every window of the context past the sink (no window would
  // ever be evicted: the spare bytes buy precision), else 2.
  int bits = 0;
  bool strict_ledger = false;
  // Per-head token caches.
  size_t head_token_bytes = 0;  // M
  int64_t head_capacity = 0;    // C
  int64_t head_heavy = 0;       // K = C − S − L

  bool budgeted() const { return kind == CacheKind::kWindowed || kind == CacheKind::kPerHead; }
  // A window's bytes in its tier's pool (M_f or M_q without the entry): the slot size, and
  // what a ledger copy kept by a promoted window really holds.
  size_t full_slot() const { return window_full - window_entry; }
  size_t quant_slot() const { return window_quant > 0 ? window_quant - window_entry : 0; }
  // Windows whose every position has left the local region after n_past tokens: the
  // candidates of a routing event.
  int64_t aged_windows(int64_t n_past) const {
    const int64_t n = n_past - local - sink;
    return n > 0 ? n / window : 0;
  }
  RoutingBudget routing() const;
  // --prefill-route staged: the most one layer's store holds (pools in use, sink, window
  // entries) while a prompt of n_prompt tokens is read in calls of `chunk` tokens:
  //   B_sink + B_local + max(B_hist, ⌈(n_prompt − S)/ω⌉ · M_q) + (⌈chunk/ω⌉ + 1) · M_f
  // (windows held in 16 bits while they would all fit in F, at most B_hist; else every aged
  // window staged at M_q; the call's own windows in 16 bits). Pool chunks partly used,
  // the tables' spare room and scratch are not in it (tests/kvcache/staged_route_test.cpp).
  size_t staged_prompt_bytes(int64_t n_prompt, int64_t chunk) const;
  std::string describe() const;  // one line of the figures above
  // "budget floored at N B/layer: the fraction gave M, below ..." when floored, else "".
  std::string floor_note() const;
  // " (floored; the fraction gave M KiB)" when floored, else "": for the caches' describe().
  std::string floor_tag() const;
};

// The low-bit tier's layout a windowed cache of `params` stores (--kv-bits, --kv-value-bits,
// --kv-key-meta, the window and value group) for `shape`: the one place it is built, for the
// budget's bytes and the store's pool alike. params.bits is 2, 3 or 4 here (auto resolved).
QuantLayout quant_layout(const KvCacheParams& params, const KvShape& shape);

// Computes the budget of a cache of `kind` for at most n_ctx tokens, or says why the
// params cannot make one (no budget given, a budget in bytes or tokens below sink + local, ...;
// kQuantized: a budget given, which a pure quantizer cannot meet). A fraction below the fixed
// regions is floored (header comment). For kPerHead, params.local_half_budget is
// H2O's default: the recent window takes half of what the sink leaves.
Expected<KvBudget> compute_budget(CacheKind kind, const KvShape& shape, int64_t n_ctx,
                                  const KvCacheParams& params);

// A per-head budget given in bytes (--kv-budget, --kv-budget-bytes) is what the cache holds,
// not only its K/V rows: refits b's token capacity so that, per layer, every KV head's kept
// tokens — capacity plus the Ω tokens decode adds between two routings — with their K and V rows,
// position and the policy's per-token state (cumulative score f64, value norm f32, the decode
// observation window's g sums and running max, f32) fit in b->total. Sink and
// recent counts are kept (H2O's default split is recomputed); b->head_token_bytes becomes the
// per-token cost. A budget in tokens (KvCacheParams::budget_tokens, kvpress's unit, used by the
// faithfulness check) keeps its meaning. A budget given as a fraction that leaves no heavy
// token is floored at sink + recent + Ω + 1 tokens per head (b->floored); a budget in bytes
// errors. The capacity is at most n_ctx tokens, or sink + recent + 1 if the context is smaller.
Status fit_head_budget(KvBudget* b, const KvShape& shape, int64_t n_ctx, const KvCacheParams& p,
                       const PolicyNeeds& needs);

}  // namespace qevict
