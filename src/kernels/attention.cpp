// Fused mixed-tier attention (see attention.h). Optimized path: the inner products run on
// the Highway kernels of ops.h; this file only walks blocks and keeps softmax bookkeeping.
#include "kernels/attention.h"

#include <cmath>
#include <limits>
#include <vector>

namespace qevict {

void attn_state_init(float* state, int group, int head_dim) {
  const int st = attn_state_stride(head_dim);
  for (int h = 0; h < group; ++h) {
    state[h * st] = -std::numeric_limits<float>::infinity();
    state[h * st + 1] = 0.0f;
    for (int c = 0; c < head_dim; ++c) state[h * st + 2 + c] = 0.0f;
  }
}

void fused_attention_partial(const FusedAttnParams& p, const float* q, int64_t ldq, int nq,
                             int64_t qpos0, const KvBlockRef* blocks, int n_blocks, float* state,
                             float* block_ml, int64_t ml_stride) {
  const int g = p.group, d = p.head_dim, st = attn_state_stride(d);
  thread_local std::vector<float> scores, kbuf, vbuf;
  for (int b = 0; b < n_blocks; ++b) {
    const KvBlockRef& blk = blocks[b];
    const bool quant = blk.k == nullptr;
    // Tokens of this block visible to the last query of the run.
    const int n_max = static_cast<int>(std::min<int64_t>(blk.n, std::max<int64_t>(qpos0 + nq - blk.pos0, 0)));
    if (quant && n_max > 0) {
      // Decode the window's keys (pre-RoPE) and values for this head once, rotate keys to
      // their positions, then use them for every query of the run.
      if (kbuf.size() < size_t(n_max) * d) kbuf.resize(size_t(n_max) * d), vbuf.resize(size_t(n_max) * d);
      dequantize_window_head(*p.qlayout, blk.qwin, p.kv_head, n_max, kbuf.data(), vbuf.data());
      for (int t = 0; t < n_max; ++t)
        rope_apply(p.rope->params(), p.rope->cos_at(blk.pos0 + t), p.rope->sin_at(blk.pos0 + t),
                   kbuf.data() + size_t(t) * d, 1, d, d);
    }
    for (int i = 0; i < nq; ++i) {
      const int64_t visible = qpos0 + i - blk.pos0 + 1;
      const int n = static_cast<int>(std::min<int64_t>(blk.n, std::max<int64_t>(visible, 0)));
      float* ml = block_ml + i * ml_stride + size_t(b) * g * 2;
      if (n <= 0) {
        for (int h = 0; h < g; ++h) ml[2 * h] = -std::numeric_limits<float>::infinity(), ml[2 * h + 1] = 0.0f;
        continue;
      }
      const float* qi = q + i * ldq;
      float* si = state + size_t(i) * g * st;
      if (scores.size() < size_t(g) * n) scores.resize(size_t(g) * n);
      if (!quant)
        qk_scores(p.dtype, qi, d, g, blk.k, blk.ld, n, d, p.scale, scores.data(), n);
      else
        qk_scores_f32(qi, d, g, kbuf.data(), d, n, d, p.scale, scores.data(), n);
      for (int h = 0; h < g; ++h) {
        float* sh = scores.data() + size_t(h) * n;
        float* s = si + h * st;
        const float mb = max_of(sh, n);
        const float lb = exp_sub_sum(sh, n, mb);  // sh[j] = exp(s_j - m_b)
        ml[2 * h] = mb;
        ml[2 * h + 1] = lb;
        const float m_new = std::max(s[0], mb);
        const float alpha = std::exp(s[0] - m_new);  // 0 when the state was empty
        const float beta = std::exp(mb - m_new);
        s[0] = m_new;
        s[1] = s[1] * alpha + lb * beta;
        if (alpha != 1.0f)
          for (int c = 0; c < d; ++c) s[2 + c] *= alpha;
        if (beta != 1.0f)
          for (int j = 0; j < n; ++j) sh[j] *= beta;
      }
      if (!quant)
        pv_accumulate(p.dtype, scores.data(), n, g, blk.v, blk.ld, n, d, si + 2, st);
      else
        pv_accumulate_f32(scores.data(), n, g, vbuf.data(), d, n, d, si + 2, st);
    }
  }
}

void attn_merge(const float* parts, int n_parts, int64_t part_stride, int group, int head_dim,
                float* out, float* global_ml) {
  const int st = attn_state_stride(head_dim);
  for (int h = 0; h < group; ++h) {
    float M = -std::numeric_limits<float>::infinity();
    for (int i = 0; i < n_parts; ++i) M = std::max(M, parts[i * part_stride + h * st]);
    float L = 0.0f;
    float* o = out + size_t(h) * head_dim;
    for (int c = 0; c < head_dim; ++c) o[c] = 0.0f;
    for (int i = 0; i < n_parts; ++i) {
      const float* s = parts + i * part_stride + h * st;
      if (s[1] == 0.0f) continue;
      const float w = std::exp(s[0] - M);
      L += s[1] * w;
      for (int c = 0; c < head_dim; ++c) o[c] += s[2 + c] * w;
    }
    const float inv = L > 0.0f ? 1.0f / L : 0.0f;
    for (int c = 0; c < head_dim; ++c) o[c] *= inv;
    global_ml[2 * h] = M;
    global_ml[2 * h + 1] = L;
  }
}

}  // namespace qevict
