// The constant of the bytes-held bound (issue 9 item 2, README "Bytes held"): what a budgeted
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

// Per cache, the fixed RoPE table (levels × 256 rows × head_dim × cos and sin, f32: 2 levels
// below 65,536 positions = 256 KiB for head_dim 64) and the object itself (16 KiB); per
// layer, at most one partly used pool chunk per tier (≤ SlotPool::kChunkBytes each: pools
// give memory back by whole chunks) and the entries of the windows the budget can hold (K_f
// + K_q + local + one 512-token prefill chunk's, ×2 for vector growth); and the attention and
// routing scratch over them (block refs, masses, candidates: < 200 B per kept window).
inline size_t bytes_held_constant(const KvShape& s, const KvBudget& b) {
  const size_t kept = size_t(b.capacity_full + b.capacity_quant + b.local_windows + 512 / 8 + 2);
  const size_t rope_bytes = size_t(2) * 256 * s.head_dim * 2 * sizeof(float);
  return rope_bytes + size_t(16 << 10) +
         size_t(s.n_layers) * (2 * SlotPool::kChunkBytes + kept * 2 * sizeof(WindowStore::Window)) +
         kept * 200;
}

}  // namespace qevict
