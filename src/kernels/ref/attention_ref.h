// Scalar reference for kernels/attention.h: materializes every visible key (decoding and
// re-rotating low-bit windows), the full probability row per head in double, and sums
// probabilities per block. Defines what the fused kernel must compute.
#pragma once

#include <vector>

#include "kernels/attention.h"

namespace qevict::ref {

// out f32 [group][head_dim]; masses f32 [n_blocks][group] (probability mass of each block
// per query head). Tokens after qpos are masked.
void attention_materialized(const FusedAttnParams& p, const float* q, int64_t qpos,
                            const KvBlockRef* blocks, int n_blocks, float* out, float* masses);

}  // namespace qevict::ref
