// The tiered cache's storage (SPEC §1, §5), per layer:
//   sink   positions [0, S)                  f16/bf16, never routed
//   windows every ω tokens after the sink, ids stable; each in one of
//     local  the newest (full precision, not routed until it ages)
//     F      full precision: a slot of `fpool`, K|V [n_kv_heads][ω][head_dim] post-RoPE
//     Q      the low-bit ledger: a slot of `qpool` (QuantLayout, keys pre-RoPE)
//     E      evicted: nothing held
// The store decides nothing: it gives the attention loop its blocks and the policy its
// candidates, and applies a RoutingPlan after checking it against the budget — evictions
// first, then demotions (quantize once, keep the ledger), then promotions (decode, re-apply
// RoPE, keep the ledger), so it never holds more than the budget in between. It gives pool
// memory back when a tier shrinks by a whole chunk, and drops evicted windows' entries at
// the next routing event: nothing it holds grows with the number of positions.
#pragma once

#include <cstdint>
#include <vector>

#include "kernels/attention.h"
#include "kernels/kv_quant.h"
#include "kernels/rope.h"
#include "kvcache/budget.h"
#include "kvcache/policies/routing_policy.h"
#include "kvcache/report.h"
#include "kvcache/shape.h"
#include "kvcache/slot_pool.h"

namespace qevict {

class WindowStore {
 public:
  // The pools' chunk size for a budget: 1/64 of a layer's budget (at least one slot, at most
  // SlotPool::kChunkBytes), so that the two partly used chunks stay within ~3 % of it.
  static size_t pool_chunk_bytes(const KvBudget& b) {
    return b.total > 0 ? b.total / 64 : SlotPool::kChunkBytes;
  }

  struct Window {
    // (Ordered for a 32-byte entry: with ω = 1, StreamingLLM's, there is one per token.)
    int32_t id = -1;      // stable window id: positions [S + id·ω, S + (id+1)·ω)
    int32_t f_slot = -1;  // full-precision slot (local or F)
    int32_t q_slot = -1;  // ledger entry (Q, or F after promotion)
    int32_t n = 0;        // tokens written
    double score = 0.0;   // cumulative attention mass S̄ (Eq. 1)
    Tier tier = Tier::kLocal;
    bool routed = false;     // has been through at least one routing event since aging
    Tier to = Tier::kLocal;  // apply(): the plan's tier for it (kLocal: not in the plan)
  };
  static_assert(sizeof(Window) <= kWindowEntryBytes,
                "the budget charges kWindowEntryBytes a window entry (one per token at ω = 1)");

  // `rope` re-rotates keys on demotion/promotion; it must cover every stored position.
  WindowStore(const KvShape& shape, const KvBudget& budget, const QuantLayout& ql, HalfType dtype,
              const RopeTable* rope);

  // Writes one token's keys/values (f32 [n_kv_heads][head_dim] each) at position pos.
  void store_token(int layer, int64_t pos, const float* k, const float* v);

  // The attention blocks over the sink and every kept window, in position order, one entry
  // a block for every KV head (attend_shared_blocks: 16-bit rows of head h at h·head_rows·ld
  // halfs, low-bit windows with every head's part): block_window[b] = window id (-1: sink).
  // `total` = tokens written so far including the current call.
  void attention_blocks(int layer, int64_t total, std::vector<KvBlockRef>* blocks,
                        std::vector<int32_t>* block_window) const;
  // Adds attention mass to a window's score (id -1: the sink).
  void add_score(int layer, int32_t id, double mass);
  // add_score(layer, ids[b], mass[b] * factor) for b in [0, n), ids ascending (as
  // attention_blocks lists them): one walk of the table instead of a search per window.
  void add_scores(int layer, const int32_t* ids, const double* mass, int64_t n, double factor);
  // Sets every window's score of a layer to 0 (a prompt-end observation window restarts
  // the scores, --prefill-window).
  void reset_scores(int layer);

  // The candidates of a routing event at n_past: aged windows not yet evicted, oldest first.
  void candidates(int layer, int64_t n_past, RoutingRequest* req) const;
  // Checks `plan` (an answer to `req`) against the budget and applies it; on error nothing
  // changed. Layers are independent: different layers may be routed on different threads.
  Status apply(int layer, const RoutingRequest& req, const RoutingPlan& plan);
  // --prefill-route staged: every aged window still in the local tier at n_past is quantized
  // into Q (its ledger entry: the staged copy, made once), its 16-bit slot freed — unless at
  // most `hold` windows are aged and not evicted, which then stay in 16 bits (they would all
  // fit in F). Nothing is evicted and no budget is checked: the prompt's routing decides.
  // Returns the windows staged.
  int64_t stage(int layer, int64_t n_past, int64_t hold);

  void clear();
  // Gives the store another low-bit layout and the budget made for it (--kv-adapt, at a
  // prompt's first routing). Only while no window has a low-bit copy, and only for a budget of
  // the same total, sink, local region and full-precision slots (the 16-bit windows stay
  // where they are); errors change nothing.
  Status relayout(const KvBudget& budget, const QuantLayout& ql);

  // Sessions (window_store_state.cpp). Whether every window holding a position >= n is still
  // in the local region, unrouted (so [n, total) can be dropped); truncate() drops them
  // (their slots go back to the pools; the window containing n keeps its first tokens).
  bool can_truncate(int64_t n) const;
  void truncate(int64_t n);
  // Every layer's sink, window table, pools, counters; load() checks sizes, ids and slots.
  void save(ByteWriter& w) const;
  Status load(ByteReader& r);

  // Windows ever created (ids [0, n_windows)); only the kept ones and those evicted at the
  // last routing event still have an entry.
  int32_t n_windows(int layer) const { return layers_[layer].next_id; }
  // A window's entry; windows evicted before the last routing event read as evicted with
  // score 0 (their entries are dropped, so the table does not grow with the positions).
  const Window& window(int layer, int32_t id) const;
  // The ledger bytes of a window (null without one), M_q bytes.
  const uint8_t* ledger(int layer, int32_t id) const;
  // Post-RoPE 16-bit keys of a window in F or local, [n_kv_heads][ω][head_dim]; null otherwise.
  const uint16_t* full_keys(int layer, int32_t id) const;

  // Bytes that count against B_total (sink + F + Q; ledger copies of promoted windows only in
  // strict mode).
  size_t budgeted_bytes_in_use(int layer) const;
  size_t bytes_allocated() const;  // pools, sinks, window tables
  size_t entry_bytes() const;      // the window tables alone (their room, not their size)
  // Counts and bytes of one layer; tiers [position] when `tiers` is given.
  KvLayerReport layer_report(int layer) const;
  void position_tiers(int layer, int64_t n_past, std::vector<Tier>* out) const;
  double quantize_seconds() const {
    double s = 0.0;
    for (const Layer& L : layers_) s += L.quant_s;
    return s;
  }
  double promote_seconds() const {
    double s = 0.0;
    for (const Layer& L : layers_) s += L.promote_s;
    return s;
  }

 private:
  struct Layer {
    std::vector<uint16_t> sink_k, sink_v;  // half [n_kv_heads][S][head_dim]
    // Entries of the live windows (local, F, Q, and those evicted at the last routing
    // event, kept one event for diagnostics' score deltas), sorted by id: bounded by the
    // budget, not the positions.
    std::vector<Window> windows;
    int32_t next_id = 0;     // id of the next window to be created
    int64_t dropped = 0;     // evicted windows whose entries were dropped
    SlotPool fpool, qpool;   // K|V windows; ledger
    KvLayerReport counters;  // moves so far (the counts by tier are filled on report)
    double quant_s = 0.0, promote_s = 0.0;  // time quantizing / promoting (per layer: layers
                                            // may route on different threads)
  };

  static size_t lower(const Layer& L, int32_t id);  // index of the first window with id >= id
  static Window* find(Layer& L, int32_t id);
  static const Window* find(const Layer& L, int32_t id);
  // find() for ids sought in ascending order from cursor i (0 at first): a forward walk,
  // O(windows) for all of them; an id behind the cursor falls back to a binary search.
  static Window* seek(Layer& L, size_t& i, int32_t id);
  uint16_t* f_k(Layer& L, int32_t slot, int h) const;
  uint16_t* f_v(Layer& L, int32_t slot, int h) const;
  const uint16_t* f_k(const Layer& L, int32_t slot, int h) const;
  const uint16_t* f_v(const Layer& L, int32_t slot, int h) const;
  void quantize(Layer& L, Window& w, int32_t id);  // the ledger entry, once (demote, stage)
  void demote(Layer& L, Window& w, int32_t id);
  void promote(Layer& L, Window& w, int32_t id);
  void evict(Layer& L, Window& w);
  void compact(Layer& L);

  KvShape shape_;
  KvBudget budget_;
  QuantLayout ql_;
  HalfType dtype_;
  const RopeTable* rope_;
  std::vector<Layer> layers_;
};

}  // namespace qevict
