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

namespace {

// Blocks are processed in runs of up to kRunTokens tokens: scores of a run live in one
// buffer, so the softmax bookkeeping (max, exp, rescaling of the running state) is done
// once per run with full vectors instead of once per 8-token window.
constexpr int kRunTokens = 256;
constexpr float kMasked = -1e30f;  // score of a masked token: exp() underflows to exactly 0

}  // namespace

void fused_attention_partial(const FusedAttnParams& p, const float* q, int64_t ldq, int nq,
                             int64_t qpos0, const KvBlockRef* blocks, int n_blocks, float* state,
                             float* block_ml, int64_t ml_stride) {
  const int g = p.group, d = p.head_dim, st = attn_state_stride(d);
  thread_local std::vector<float> scores, kbuf, vbuf;
  thread_local std::vector<int> off;
  thread_local std::vector<const float*> kq, vq;  // decoded rows of low-bit blocks in the run
  if (scores.size() < size_t(g) * kRunTokens) scores.resize(size_t(g) * kRunTokens);
  for (int b0 = 0; b0 < n_blocks;) {
    // Form a run [b0, b1).
    int b1 = b0, run = 0;
    off.clear();
    while (b1 < n_blocks && (b1 == b0 || run + blocks[b1].n <= kRunTokens)) {
      off.push_back(run);
      run += blocks[b1].n;
      ++b1;
    }
    if (scores.size() < size_t(g) * run) scores.resize(size_t(g) * run);
    const int R = run;
    // Decode the run's low-bit windows once for all queries: keys (pre-RoPE) rotated to
    // their positions, values as they are.
    if (kbuf.size() < size_t(R) * d) kbuf.resize(size_t(R) * d), vbuf.resize(size_t(R) * d);
    kq.assign(size_t(b1 - b0), nullptr);
    vq.assign(size_t(b1 - b0), nullptr);
    for (int b = b0; b < b1; ++b) {
      const KvBlockRef& blk = blocks[b];
      if (blk.k) continue;
      const int n_max =
          static_cast<int>(std::min<int64_t>(blk.n, std::max<int64_t>(qpos0 + nq - blk.pos0, 0)));
      if (n_max <= 0) continue;
      float* kb = kbuf.data() + size_t(off[b - b0]) * d;
      float* vb = vbuf.data() + size_t(off[b - b0]) * d;
      dequantize_window_head(*p.qlayout, blk.qwin, p.kv_head, n_max, kb, vb);
      for (int t = 0; t < n_max; ++t)
        rope_apply(p.rope->params(), p.rope->cos_at(blk.pos0 + t), p.rope->sin_at(blk.pos0 + t),
                   kb + size_t(t) * d, 1, d, d);
      kq[b - b0] = kb;
      vq[b - b0] = vb;
    }
    for (int i = 0; i < nq; ++i) {
      const float* qi = q + i * ldq;
      float* si = state + size_t(i) * g * st;
      float* ml_i = block_ml + i * ml_stride;
      const int64_t qpos = qpos0 + i;
      int used = 0;  // scores[0, used) are filled (masked tokens hold kMasked)
      bool any = false;
      for (int b = b0; b < b1; ++b) {
        const KvBlockRef& blk = blocks[b];
        const int o = off[b - b0];
        const int n =
            static_cast<int>(std::min<int64_t>(blk.n, std::max<int64_t>(qpos - blk.pos0 + 1, 0)));
        if (n > 0) {
          any = true;
          if (blk.k)
            qk_scores(p.dtype, qi, d, g, blk.k, blk.ld, n, d, p.scale, scores.data() + o, R);
          else
            qk_scores_f32(qi, d, g, kq[b - b0], d, n, d, p.scale, scores.data() + o, R);
        }
        for (int h = 0; h < g; ++h)
          for (int j = n; j < blk.n; ++j) scores[size_t(h) * R + o + j] = kMasked;
        used = o + blk.n;
      }
      if (!any) {
        for (int b = b0; b < b1; ++b)
          for (int h = 0; h < g; ++h) {
            float* ml = ml_i + (size_t(b) * g + h) * 2;
            ml[0] = -std::numeric_limits<float>::infinity();
            ml[1] = 0.0f;
          }
        continue;
      }
      for (int h = 0; h < g; ++h) {
        float* sh = scores.data() + size_t(h) * R;
        float* s = si + h * st;
        const float m = max_of(sh, used);
        const float l = exp_sub_sum(sh, used, m);  // sh[j] = exp(s_j - m); masked → 0
        for (int b = b0; b < b1; ++b) {
          const KvBlockRef& blk = blocks[b];
          const int o = off[b - b0];
          const int n =
              static_cast<int>(std::min<int64_t>(blk.n, std::max<int64_t>(qpos - blk.pos0 + 1, 0)));
          float* ml = ml_i + (size_t(b) * g + h) * 2;
          if (n <= 0) {
            ml[0] = -std::numeric_limits<float>::infinity();
            ml[1] = 0.0f;
            continue;
          }
          float lb = 0.0f;
          for (int j = 0; j < n; ++j) lb += sh[o + j];
          ml[0] = m;  // every block of the run shares the run's max
          ml[1] = lb;
        }
        const float m_new = std::max(s[0], m);
        const float alpha = std::exp(s[0] - m_new);  // 0 when the state was empty
        const float beta = std::exp(m - m_new);
        s[0] = m_new;
        s[1] = s[1] * alpha + l * beta;
        if (alpha != 1.0f)
          for (int c = 0; c < d; ++c) s[2 + c] *= alpha;
        if (beta != 1.0f)
          for (int j = 0; j < used; ++j) sh[j] *= beta;
      }
      for (int b = b0; b < b1; ++b) {
        const KvBlockRef& blk = blocks[b];
        const int n =
            static_cast<int>(std::min<int64_t>(blk.n, std::max<int64_t>(qpos - blk.pos0 + 1, 0)));
        if (n <= 0) continue;
        const float* pb = scores.data() + off[b - b0];
        if (blk.k)
          pv_accumulate(p.dtype, pb, R, g, blk.v, blk.ld, n, d, si + 2, st);
        else
          pv_accumulate_f32(pb, R, g, vq[b - b0], d, n, d, si + 2, st);
      }
    }
    b0 = b1;
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
