// Materializing reference attention (see ref/attention_ref.h).
#include "kernels/ref/attention_ref.h"

#include <cmath>

#include "kernels/ref/ops_ref.h"

namespace qevict::ref {

void attention_materialized(const FusedAttnParams& p, const float* q, int64_t qpos,
                            const KvBlockRef* blocks, int n_blocks, float* out, float* masses) {
  const int g = p.group, d = p.head_dim;
  std::vector<std::vector<double>> K, V;
  std::vector<int> owner;
  for (int b = 0; b < n_blocks; ++b) {
    const KvBlockRef& blk = blocks[b];
    std::vector<float> kq(size_t(blk.n) * d), vq(size_t(blk.n) * d);
    if (!blk.k) {
      dequantize_window_head(*p.qlayout, blk.qwin, p.kv_head, blk.n, kq.data(), vq.data());
      const RopeParams& rp = p.rope->params();
      std::vector<float> c(size_t(rp.n_rot / 2 + 1)), s(c.size());
      for (int t = 0; t < blk.n; ++t) {
        rope_cos_sin(rp, blk.pos0 + t, c.data(), s.data());  // double angles, no table
        rope_apply(rp, c.data(), s.data(), kq.data() + t * d, 1, d, d);
      }
    }
    for (int t = 0; t < blk.n; ++t) {
      if (blk.pos0 + t > qpos) continue;
      std::vector<double> kr(d), vr(d);
      for (int c = 0; c < d; ++c) {
        kr[c] = blk.k ? half_to_float(p.dtype, blk.k[t * blk.ld + c]) : kq[size_t(t) * d + c];
        vr[c] = blk.k ? half_to_float(p.dtype, blk.v[t * blk.ld + c]) : vq[size_t(t) * d + c];
      }
      K.push_back(kr);
      V.push_back(vr);
      owner.push_back(b);
    }
  }
  for (int h = 0; h < g; ++h) {
    std::vector<double> s(K.size());
    double mx = -INFINITY;
    for (size_t j = 0; j < K.size(); ++j) {
      double acc = 0;
      for (int c = 0; c < d; ++c) acc += double(q[h * d + c]) * K[j][c];
      s[j] = acc * p.scale;
      mx = std::max(mx, s[j]);
    }
    double sum = 0;
    for (auto& x : s) sum += (x = std::exp(x - mx));
    for (int b = 0; b < n_blocks; ++b) masses[b * g + h] = 0.0f;
    for (int c = 0; c < d; ++c) {
      double acc = 0;
      for (size_t j = 0; j < K.size(); ++j) acc += s[j] / sum * V[j][c];
      out[h * d + c] = static_cast<float>(acc);
    }
    for (size_t j = 0; j < K.size(); ++j)
      masses[owner[j] * g + h] += static_cast<float>(s[j] / sum);
  }
}

}  // namespace qevict::ref
