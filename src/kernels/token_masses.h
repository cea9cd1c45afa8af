// attend_blocks' per-token probability masses over 16-bit blocks, computed after the
// attention from each query's final softmax (M, L) (attention.cpp calls it; internal to the
// kernels layer). Optimized path: scores by qk_scores_rows, exp and sums by the Highway
// kernels of ops.h.
#pragma once

#include <cstdint>

#include "core/thread_pool.h"
#include "kernels/attention.h"

namespace qevict {

// mass[u] += Σ exp(s − M) / L over the tile's n_q queries (positions qpos0 + t, rows of q
// at stride ldq) and each KV head's query heads, (M, L) every (query, head)'s final softmax
// max and sum (gml, f32 [query][KV head][group][2]), s the score recomputed by
// qk_scores_rows — what the attention computed for runs of queries, so exp(s − M) ≤ 1.
// Units are the tokens of head h's blocks [head_off[h], head_off[h + 1]), unit_off[b] those
// before block b; mass is laid out as attend_blocks' (kPerHeadBlock: head after head;
// kSumOverHeads: summed per unit index). Work is split over the pool by (head, chunk of
// units) when heads write their own masses, else by chunk; each unit sums its terms in one
// fixed order (heads, queries, query heads), so the result does not depend on the threads.
// Queries before a chunk's first position skip it. Every block must be 16-bit (k set).
void token_masses(const FusedAttnParams& fp, int H, const float* q, int64_t ldq, int64_t n_q,
                  int64_t qpos0, const KvBlockRef* blocks, const int64_t* head_off,
                  const int64_t* unit_off, const float* gml, double* mass, MassLayout layout,
                  BlockAttnScratch& sc, ThreadPool& pool);

}  // namespace qevict
