// The KV-cache interface: the centre of the architecture. The model hands each layer's new
// keys/values and queries to a sequence's cache; the cache stores them in whatever form
// its policy chose and computes attention over everything it holds. Policies decide, the
// cache stores, kernels compute: a cache implementation owns storage and calls kernels;
// routing policies (kvcache/policies) return plans that the cache's store applies. Caches
// are made by make_kv_cache (kvcache/factory.h) from a policy's registry row.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/byte_io.h"
#include "core/status.h"
#include "core/thread_pool.h"
#include "kernels/matmul.h"
#include "kernels/ops.h"
#include "kernels/rope.h"
#include "kvcache/report.h"
#include "kvcache/shape.h"
#include "kvcache/tier.h"

namespace qevict {

// The check every cache's begin() makes: at least one token, and room for it in n_ctx.
Status check_begin(int64_t n_past, int64_t n_new, int64_t n_ctx);

// The common head of a quantizer's report (KIVI, ZipCache, KVQuant: every token kept, no
// budget): its name and description, kind kQuantized, bytes held and the most held (peak).
KvReport quantizer_report(const std::string& policy, const std::string& describe,
                          const KvShape& shape, size_t bytes_held, size_t peak);

// The common head of a budgeted cache's report (the tiered and per-head caches): name,
// description, budget, bytes held and the most held, routing events and their wall time
// (all of it, and the part spent during decode).
KvReport routed_report(const std::string& policy, const std::string& describe,
                       const KvBudget& budget, size_t bytes_held, size_t peak,
                       int64_t routing_events, double route_seconds, double route_seconds_decode);

// A model's attention output projections, for policies that score tokens by their
// value-projected norms (CriticalKV): wo[l] is layer l's W_O, n_embd rows of
// n_q_heads · head_dim columns (a GGUF weight, not owned).
struct OutputProjection {
  std::vector<WeightView> wo;  // [n_layers]
};

// One sequence's cache. Call order per forward call: begin(n) → attend(layer, ...) for
// every layer in order → commit(). Not thread-safe; attend() parallelizes internally.
class SequenceKvCache {
 public:
  virtual ~SequenceKvCache() = default;

  // Tokens already stored: the position of the next token.
  virtual int64_t n_past() const = 0;
  // Largest sequence length this cache accepts.
  virtual int64_t n_ctx() const = 0;

  // Prepares a call that adds n_new tokens at positions [n_past, n_past + n_new).
  // Errors (nothing changed) when the sequence would exceed n_ctx or memory is short.
  virtual Status begin(int64_t n_new) = 0;

  // Stores layer `layer`'s keys/values for the n_new tokens of this call and computes
  // causal attention for their queries over all cached tokens plus the new ones:
  //   q   f32 [n_new, n_q_heads * head_dim]   post-RoPE
  //   k   f32 [n_new, n_kv_heads * head_dim]  post-RoPE
  //   v   f32 [n_new, n_kv_heads * head_dim]
  //   out f32 [n_new, n_q_heads * head_dim]   softmax(q k^T / sqrt(head_dim)) v per head
  virtual void attend(int layer, const float* q, const float* k, const float* v, float* out,
                      ThreadPool& pool) = 0;

  // Ends the call: n_past += n_new. A cache with a routing policy then runs a routing
  // event when one is due — after a prefill chunk (a call with more than one token; with
  // --prefill-route end, not until the prompt ends) and every Ω decode steps — exactly as
  // route() does. Errors only when a policy's plan does not fit the budget (nothing is
  // changed then).
  virtual Status commit() = 0;
  // commit() / end_prompt() for a caller that ends this one cache's call alone (no other
  // cache commits beside it): a cache may then spread its routing work over `pool`. The
  // result is the same as commit() / end_prompt()'s. Callers that commit many caches side by
  // side call those instead, one cache a thread.
  virtual Status commit_alone(ThreadPool& pool) {
    (void)pool;
    return commit();
  }
  virtual Status end_prompt_alone(ThreadPool& pool) {
    (void)pool;
    return end_prompt();
  }

  // The prompt is complete (the caller has committed its last prefill chunk). A cache that
  // defers prefill routing (--prefill-route end, SPEC §4) runs its one routing event over
  // the whole prompt now; a cache that is not told routes at the first decode step instead.
  // Otherwise, and when nothing is pending, it does nothing.
  virtual Status end_prompt() { return Status::ok(); }

  // Runs a routing event now: the policy plans every layer, the store checks each plan
  // against the budget and applies it (evict → demote → promote). Caches without a policy
  // do nothing.
  virtual Status route() { return Status::ok(); }

  // True when, until end_prompt(), this cache keeps every prompt token in full precision
  // and attends over all of them — FullKV, and every policy with --prefill-route end — so
  // its prompt state is what any other such cache would reach from the same model
  // activations (engine/prefill_share.h replays one prefill into several caches).
  virtual bool prefill_keeps_everything() const { return false; }

  // What replaying a recorded prompt call into this cache needs (engine/prefill_share.h), for
  // a cache that keeps everything until end_prompt(). kAttend: attention itself (its outputs
  // or statistics only the cache computes; the default: replay calls attend()). kStore: only
  // the tokens (replay calls append_prompt() without masses). kMasses: the tokens and the
  // attention mass each position received, which replay computes once for every cache that
  // asks — a prompt then costs one attention pass, not one per cache.
  enum class PromptReplay { kAttend, kStore, kMasses };
  virtual PromptReplay prompt_replay() const { return PromptReplay::kAttend; }
  // With kMasses, whose queries the masses sum: 0, each call's own (handed with every call);
  // N > 0, only the prompt's last N queries (a SnapKV-style observation window), over every
  // prompt position, handed with the prompt's last call only (earlier calls get none).
  virtual int64_t prompt_mass_window() const { return 0; }
  // Whether replay should also hand over each new token's value norm (CriticalKV's ν, which
  // the recording computes once for every cache that asks).
  virtual bool prompt_replay_value_norms() const { return false; }
  // What replay computed for one call and layer (null when not asked for):
  //   mass        f64 [n_kv_heads][n_past + n_new]: the probability each position received
  //               from the call's queries, summed over them and over the KV head's group of
  //               query heads, under causal f16 attention over every position so far;
  //   value_norm  f32 [n_kv_heads][n_new]: ν = (1/g) Σ_j ‖v W_O^{h·g+j}‖₁ of each new token
  //               (value_norm_rows in head_cache.h), v rounded to f16.
  struct PromptExtras {
    const double* mass = nullptr;
    const float* value_norm = nullptr;
    // prompt_replay_all_masses(): every query's masses of this call as `mass` lays them out
    // (f64 [n_kv_heads][n_past + n_new]), even when `mass` holds a window's.
    const double* all_mass = nullptr;
  };
  // Whether a replay should also hand every query's masses (PromptExtras::all_mass).
  virtual bool prompt_replay_all_masses() const { return false; }
  // Stores one prompt call's tokens in `layer` as attend() would, without attention
  // (prompt_replay() is kStore or kMasses); q as attend()'s (a cache may keep queries).
  virtual void append_prompt(int layer, const float* q, const float* k, const float* v,
                             const PromptExtras& x) {
    (void)layer, (void)q, (void)k, (void)v, (void)x;
  }

  // The model's output projections (Model::forward binds them on every call; they must
  // outlive the cache's next routing event). Caches whose policy does not read them ignore it.
  virtual void set_output_projection(const OutputProjection* wo) { (void)wo; }

  // Forgets all tokens (n_past = 0); may keep allocations for reuse.
  virtual void clear() = 0;

  // Sessions (engine/session.h). Whether the tokens at positions [n, n_past) can be dropped,
  // leaving the cache exactly as if it had stopped at n except for what those tokens' queries
  // added to scores (n <= n_past; n == n_past always can). FullKV truncates anywhere; a
  // compressed cache only while every dropped token is still in its full-precision local
  // region and no routing event has run since they arrived. Default: only n == n_past.
  virtual bool can_truncate(int64_t n) const { return n == n_past(); }
  // Drops [n, n_past); errors (nothing changed) when !can_truncate(n).
  virtual Status truncate(int64_t n);
  // Whether save_state() writes this cache's whole state (a policy that cannot is saved as its
  // tokens and re-prefilled on load).
  virtual bool can_save_state() const { return false; }
  // Writes / reads every byte that defines the cache's state (tiers, scores, routing clock,
  // counters); load_state() into a cache made with the same shape, n_ctx and params gives a
  // cache whose next outputs are bit-identical. Called between forward calls only.
  virtual Status save_state(ByteWriter& w) const;
  virtual Status load_state(ByteReader& r);

  // Bytes of storage this cache holds right now (allocated, not nominal).
  virtual size_t bytes_held() const = 0;

  virtual std::string describe() const = 0;

  // Stats and diagnostics (report.h): counts, bytes by tier, budget, times; with
  // ReportDetail::kTiers also every position's tier and every window's score.
  virtual void report(KvReport* out, ReportDetail detail = ReportDetail::kSummary) const = 0;
};

}  // namespace qevict
