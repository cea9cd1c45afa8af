// Fused attention over mixed-tier KV blocks with per-block probability mass (SPEC §6).
// For one query token and one KV head's group of query heads, one pass over the blocks:
// 16-bit blocks (sink, full-tier windows, local tokens, current chunk) are read directly;
// low-bit windows are decoded into an L1-sized scratch (dequantize, re-apply RoPE at the
// stored positions) and used at once — nothing is materialized for the whole cache. Online
// softmax keeps, per head, the running (m, l, o) and, per block, the block's own (m_b, l_b),
// so each block's probability mass comes out at the end without a second pass:
//   mass_b = l_b · exp(m_b − M) / L   with the global max M and denominator L.
// ref::attention_materialized (ref/attention_ref.h) computes the same from full matrices.
#pragma once

#include <cstdint>

#include "kernels/kv_quant.h"
#include "kernels/ops.h"
#include "kernels/rope.h"

namespace qevict {

// A run of cached tokens of one KV head.
struct KvBlockRef {
  int64_t pos0 = 0;  // position of the block's first token
  int32_t n = 0;     // tokens in the block
  // 16-bit source: post-RoPE keys and values, rows of head_dim at stride ld (in halfs).
  const uint16_t* k = nullptr;
  const uint16_t* v = nullptr;
  int64_t ld = 0;
  // Low-bit source (used when k is null): a quantized window (QuantLayout), keys pre-RoPE.
  const uint8_t* qwin = nullptr;
};

struct FusedAttnParams {
  HalfType dtype = HalfType::kF16;
  int group = 1;  // query heads sharing this KV head
  int head_dim = 0;
  float scale = 1.0f;                    // 1/sqrt(head_dim)
  int kv_head = 0;                       // which head of a quantized window to decode
  const QuantLayout* qlayout = nullptr;  // for low-bit blocks
  const RopeTable* rope = nullptr;       // for low-bit blocks (covers their positions)
};

// Per-head online-softmax state: m (running max), l (sum of exp(s - m)), o[head_dim]
// (sum of exp(s - m) · v). Layout [group][head_dim + 2] = {m, l, o...}.
inline int attn_state_stride(int head_dim) { return head_dim + 2; }
void attn_state_init(float* state, int group, int head_dim);

// Accumulates blocks[0..n_blocks) into the states of nq query tokens at positions
// qpos0 + i (i < nq): query i is q + i*ldq, f32 [group][head_dim] (stride head_dim); its
// state is state + i*group*(head_dim+2). Tokens after a query's position are masked
// (causal). Each low-bit block is decoded once for all nq queries. block_ml receives each
// block's (m_b, l_b) per head: f32 at block_ml + i*ml_stride + (b*group + h)*2
// (m_b = -inf, l_b = 0 for a block fully masked for that query).
void fused_attention_partial(const FusedAttnParams& p, const float* q, int64_t ldq, int nq,
                             int64_t qpos0, const KvBlockRef* blocks, int n_blocks, float* state,
                             float* block_ml, int64_t ml_stride);

// Merges `n_parts` partial states (each [group][head_dim+2], part_stride floats apart) into
// out f32 [group][head_dim] (stride head_dim) = O / L with M = max m_p, L = Σ l_p e^(m_p−M),
// O = Σ o_p e^(m_p−M); writes (M, L) per head to global_ml f32 [group][2] so that callers can
// turn each block's (m_b, l_b) into its mass (attn_block_mass).
void attn_merge(const float* parts, int n_parts, int64_t part_stride, int group, int head_dim,
                float* out, float* global_ml);

// mass of one block for one head from its (m_b, l_b) and the global (M, L).
inline float attn_block_mass(const float* ml_b, const float* ml_global) {
  if (ml_b[1] == 0.0f) return 0.0f;
  return ml_b[1] * __builtin_expf(ml_b[0] - ml_global[0]) / ml_global[1];
}

}  // namespace qevict
