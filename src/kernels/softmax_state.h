// Online-softmax state and its merge (Milakov & Gimelshein 2018; FlashInfer's "attention
// state" with merge()). One state per query head summarises attention over any set of keys:
//   m  running max of the scores s_j
//   l  Σ_j exp(s_j − m)
//   o  Σ_j exp(s_j − m) · v_j          f32 [head_dim]
// Two states over disjoint key sets merge exactly: M = max(m_a, m_b),
//   l = l_a e^(m_a−M) + l_b e^(m_b−M),  o = o_a e^(m_a−M) + o_b e^(m_b−M),
// and the attention output is o / l. A block of keys that records its own (m_b, l_b) gets
// its probability mass from the final (M, L) alone: mass_b = l_b · e^(m_b − M) / L.
// Reference path and optimized path share these few lines (they are the definition).
#pragma once

#include <cstdint>

namespace qevict {

// Layout of a group's states: [group][head_dim + 2] = {m, l, o[head_dim]}.
inline int attn_state_stride(int head_dim) { return head_dim + 2; }

// m = −inf, l = 0, o = 0 for `group` heads.
void attn_state_init(float* state, int group, int head_dim);

// Merges `n_parts` partial states (each [group][head_dim+2], part_stride floats apart) into
// out f32 [group][head_dim] (stride head_dim) = o / l; writes (M, L) per head to global_ml
// f32 [group][2] so that callers can turn each block's (m_b, l_b) into its mass. Parts with
// l = 0 (no keys) are skipped; a head with no keys at all gets out = 0.
void attn_merge(const float* parts, int n_parts, int64_t part_stride, int group, int head_dim,
                float* out, float* global_ml);

// Mass of one block for one head from its (m_b, l_b) and the merged (M, L).
inline float attn_block_mass(const float* ml_b, const float* ml_global) {
  if (ml_b[1] == 0.0f) return 0.0f;
  return ml_b[1] * __builtin_expf(ml_b[0] - ml_global[0]) / ml_global[1];
}

}  // namespace qevict
