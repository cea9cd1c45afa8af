// The stated bound of what a cache with --prefill-route staged holds while it reads a prompt
// (issue 52 item 1), shared by tests/kvcache/staged_route_test.cpp and
// tests/e2e/staged_route_model_test.cpp.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>

#include "common/bytes_bound.h"
#include "kernels/attention.h"
#include "kvcache/budget.h"
#include "kvcache/shape.h"
#include "kvcache/window_store.h"

namespace qevict::test {

// The bound, per call of a prompt of n tokens so far read in calls of `chunk`, in two parts.
// The store (pools, sinks, window tables):
//   n_layers · (staged_prompt_bytes(n, chunk)    sink, local, the staged prompt, the call
//               + one partly used chunk per pool  (pools grow and shrink by chunks)
//               + one entry per window             (a table's spare room: capacity ≤ 2 · size))
// The rest of the cache:
//   the RoPE table (fixed by n_ctx) + 16 KiB (the object)
//   + the observation window: (n_layers + 1) · N query rows (kept; their discarded outputs)
//   + one layer's block list: (windows + 1) · (KvBlockRef + f64 mass + i32 id)
//   + the attention kernel's scratch for one call (BlockAttnScratch, kernels/attention.cpp):
//     block masses min(2^20, chunk · (windows + 1) · group · 2) f32, partial states and their
//     merge ≤ 2 · chunk · q_width f32, and per pool thread (FusedAttnScratch, every slot as
//     large as the largest) per cached token a run's decoded key and value (2 · head_dim f32),
//     scores of up to 16 queries (17 · group f32) and two row pointers, per block its ref,
//     RoPE rotation (2 · head_dim f32) and span (24 B), and 64 KiB.
// What end, chunk and staged share (the kernel's scratch) is sized by the call and the blocks.
inline size_t staged_store_bound(const KvShape& s, const KvBudget& b, int64_t n, int64_t chunk) {
  const int64_t windows = (std::max<int64_t>(n - b.sink, 0) + b.window - 1) / b.window;
  return size_t(s.n_layers) * (b.staged_prompt_bytes(n, chunk) + pool_chunks_bytes(b) +
                               size_t(windows) * sizeof(WindowStore::Window));
}
inline size_t staged_rest_bound(const KvShape& s, const KvBudget& b, int64_t n, int64_t chunk,
                                int window_q, size_t rope_bytes, int threads) {
  const int64_t windows = (std::max<int64_t>(n - b.sink, 0) + b.window - 1) / b.window;
  const size_t qrow = size_t(s.q_width()) * sizeof(float);
  const size_t block_masses =
      std::min<size_t>(size_t(1) << 20, size_t(chunk) * size_t(windows + 1) * s.group() * 2) *
      sizeof(float);
  return rope_bytes + (size_t(16) << 10) + size_t(s.n_layers + 1) * size_t(window_q) * qrow +
         size_t(windows + 1) * (sizeof(KvBlockRef) + sizeof(double) + sizeof(int32_t)) +
         block_masses + 2 * size_t(chunk) * qrow +
         size_t(threads) *
             (size_t(n) *
                  (size_t(2 * s.head_dim + 17 * s.group()) * sizeof(float) + 2 * sizeof(void*)) +
              size_t(windows + 1) * (sizeof(KvBlockRef) + 2 * s.head_dim * sizeof(float) + 24) +
              (size_t(64) << 10));
}

}  // namespace qevict::test
