// The constant of the bytes-held bound (issue 9 item 2; BENCHMARKS §7): what a budgeted
// tiered cache may hold beyond budget × 1.05, shared by the synthetic test
// (tests/kvcache/bytes_bound_test.cpp) and the real-model one
// (tests/e2e/bytes_held_model_test.cpp).
#pragma once

#include <cstddef>

#include "kvcache/budget.h"
#include "kvcache/shape.h"
#include "kvcache/slot_pool.h"
#include "kvcache/window_store.h"

namespace qevict {

// Per cache, the fixed RoPE table when the cache has a low-bit tier (levels × 256 rows ×
// head_dim × cos and sin, f32: 2 levels below 65,536 positions = 256 KiB for head_dim 64,
// and the first level again by channel pairs for the INT4 key scorer, 64 KiB) and
// the object itself (16 KiB); per layer, at most one partly used pool chunk per tier (a chunk
// is ~1/64 of a layer's budget, at least one window, at most SlotPool::kChunkBytes: pools give
// memory back by whole chunks) and room for the entries of the windows the budget can hold
// (K_f + K_q + local + one 512-token prefill chunk's, ×2: the entries are in M_f and M_q since
// they were charged to the budget, so this is a loose bound on the table's spare room, a
// quarter + 64 after a routing event, and a prefill chunk's); and the attention and routing
// scratch over them (block refs, masses, candidates: < 200 B per kept window).
inline size_t pool_chunks_bytes(const KvBudget& b) {
  const size_t c = WindowStore::pool_chunk_bytes(b);
  return SlotPool(b.window_full, c).chunk_bytes() + SlotPool(b.window_quant, c).chunk_bytes();
}

inline size_t bytes_held_constant(const KvShape& s, const KvBudget& b) {
  const size_t kept = size_t(b.capacity_full + b.capacity_quant + b.local_windows + 512 / 8 + 2);
  const size_t rope_bytes =
      b.capacity_quant > 0 ? size_t(2 * 2 + 1) * 256 * s.head_dim * sizeof(float) : 0;
  return rope_bytes + size_t(16 << 10) +
         size_t(s.n_layers) * (pool_chunks_bytes(b) + kept * 2 * sizeof(WindowStore::Window)) +
         kept * 200;
}

}  // namespace qevict
