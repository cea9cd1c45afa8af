// One layer's keys and values written out densely, per KV head, for the caches whose storage
// attend_blocks cannot read (the quantizers KIVI and ZipCache: their codes, groups and sets).
// Such a cache writes every token's key and value rows (dequantized) here and attends over
// them with the shared block loop. Reference path, not a fast one: it is rewritten on every
// layer call and shared by the layers; its bytes count in the cache's bytes_held.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "core/f16.h"
#include "core/thread_pool.h"
#include "kernels/attention.h"
#include "kvcache/shape.h"

namespace qevict {

// fn(begin, end) over [0, n): split over `pool` in chunks of at least `grain` when there is
// one, else one call. The quantized caches dequantize a layer with it: attend() spreads the
// rows over the threads, the paths without a pool (a replayed prompt, a prompt's rule, which
// may already run on a pool thread) run on their own.
inline void for_rows(ThreadPool* pool, int64_t n, int64_t grain,
                     const std::function<void(int64_t, int64_t)>& fn) {
  if (n <= 0) return;
  if (pool && pool->size() > 1 && n > grain) {
    pool->parallel_for(n, grain, fn);
  } else {
    fn(0, n);
  }
}

class DenseLayerScratch {
 public:
  // Makes rows for n tokens (contents unspecified). Grows in steps of 64 tokens, so decode does
  // not reallocate every step and the slack stays bounded.
  void resize(const KvShape& shape, int64_t n);
  int64_t n() const { return n_; }
  // f16/bf16 [head_dim]: token t's key or value in KV head h.
  uint16_t* k_row(int h, int64_t t) { return k_.data() + (size_t(h) * n_ + size_t(t)) * d_; }
  uint16_t* v_row(int h, int64_t t) { return v_.data() + (size_t(h) * n_ + size_t(t)) * d_; }
  const uint16_t* k_row(int h, int64_t t) const {
    return k_.data() + (size_t(h) * n_ + size_t(t)) * d_;
  }
  const uint16_t* v_row(int h, int64_t t) const {
    return v_.data() + (size_t(h) * n_ + size_t(t)) * d_;
  }
  // Causal attention of n_q query tokens (f32 [n_q][q_width], positions q_pos0 + i) over the n
  // tokens, into out (the same layout as q); masses are not reported.
  void attend(HalfType dtype, const float* q, int64_t n_q, int64_t q_pos0, float* out,
              ThreadPool& pool);
  // Gives back the attention scratch of a prompt chunk (decode needs far less).
  void trim() { attn_.trim(); }
  size_t bytes() const;

 private:
  KvShape shape_;
  int d_ = 0;
  int64_t n_ = 0;
  std::vector<uint16_t> k_, v_;  // [n_kv_heads][n][head_dim]
  BlockAttnScratch attn_;
  std::vector<KvBlockRef> blocks_;  // one block per KV head
  std::vector<int64_t> head_off_;
};

}  // namespace qevict
