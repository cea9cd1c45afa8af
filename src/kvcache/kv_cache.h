// The KV-cache interface: the centre of the architecture. The model hands each layer's new
// keys/values and queries to a sequence's cache; the cache stores them in whatever form
// its policy chose and computes attention over everything it holds. Policies decide, the
// cache stores, kernels compute: a cache implementation owns storage and calls kernels;
// routing policies (later) return plans that the cache applies.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/status.h"
#include "core/thread_pool.h"
#include "kernels/ops.h"
#include "kernels/rope.h"
#include "kvcache/tier.h"

namespace qevict {

// What one sequence's cache stores per layer (plain data, from the model config).
struct KvShape {
  int n_layers = 0;
  int n_q_heads = 0;
  int n_kv_heads = 0;  // GQA: n_q_heads / n_kv_heads query heads share one KV head
  int head_dim = 0;
  RopeParams rope;  // how keys were rotated (caches that re-rotate keys need it)

  int group() const { return n_q_heads / n_kv_heads; }
  // Bytes of one token's keys and values for all KV heads in a 16-bit type (f16 or bf16).
  size_t token_bytes() const { return size_t(2) * n_kv_heads * head_dim * sizeof(uint16_t); }
  int q_width() const { return n_q_heads * head_dim; }
  int kv_width() const { return n_kv_heads * head_dim; }
  Status validate() const;
};

// The check every cache's begin() makes: at least one token, and room for it in n_ctx.
Status check_begin(int64_t n_past, int64_t n_new, int64_t n_ctx);

// Receives the attention a cache computed (diagnostics, SPEC §8). For one attend() call:
//   probs f32 [n_kv_heads][n_keys], n_keys = positions [0, n_past + n_new): the probability
//   each position received, summed over the call's query tokens and averaged over the
//   query heads that share the KV head (so each row sums to the number of query tokens).
class AttentionObserver {
 public:
  virtual ~AttentionObserver() = default;
  virtual void on_attention(int layer, int64_t n_keys, const float* probs) = 0;
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

  // Ends the call: n_past += n_new. Caches with a routing policy route here.
  virtual void commit() = 0;

  // Forgets all tokens (n_past = 0); may keep allocations for reuse.
  virtual void clear() = 0;

  // Bytes of storage this cache holds right now (allocated, not nominal).
  virtual size_t bytes_held() const = 0;

  virtual std::string describe() const = 0;

  // --- Diagnostics (SPEC §8); defaults describe a cache that keeps everything. ---
  // Routing events so far (after prefill chunks and every Ω decode steps).
  virtual int64_t routing_events() const { return 0; }
  // True when tiers differ between the KV heads of a layer (per-head caches such as H2O).
  virtual bool per_head_tiers() const { return false; }
  // out[p] = tier of position p for p in [0, n_past()): kLocal for the sink and the local
  // region (never routed), kFull / kQuant / kEvicted for routed history. kv_head is
  // ignored unless per_head_tiers().
  virtual void position_tiers(int layer, int kv_head, std::vector<Tier>* out) const {
    (void)layer;
    (void)kv_head;
    out->assign(size_t(n_past()), Tier::kFull);
  }
  // Reports every attend() call's attention probabilities to `observer` (nullptr: stop).
  // Caches that cannot report them return an error.
  virtual Status set_attention_observer(AttentionObserver* observer) {
    (void)observer;
    return Status::error(describe() + " cannot report attention probabilities");
  }
};

}  // namespace qevict
