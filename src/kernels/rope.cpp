// Scalar RoPE (see rope.h); this is both the reference and the production path.
#include "kernels/rope.h"

#include <algorithm>
#include <cmath>

namespace qevict {

void rope_cos_sin(const RopeParams& p, int64_t pos, float* cos_out, float* sin_out) {
  const int half = p.n_rot / 2;
  const double ppos = double(pos) * p.freq_scale;
  for (int i = 0; i < half; ++i) {
    const double theta = ppos * std::pow(double(p.freq_base), -2.0 * i / p.n_rot);
    cos_out[i] = static_cast<float>(std::cos(theta));
    sin_out[i] = static_cast<float>(std::sin(theta));
  }
}

void rope_apply(const RopeParams& p, const float* cos_t, const float* sin_t, float* x, int n_heads,
                int head_dim, int64_t ld, bool inverse) {
  const int half = p.n_rot / 2;
  const float sgn = inverse ? -1.0f : 1.0f;
  for (int h = 0; h < n_heads; ++h) {
    float* v = x + h * ld;
    for (int i = 0; i < half; ++i) {
      const int a = p.style == RopeStyle::kNormal ? 2 * i : i;
      const int b = p.style == RopeStyle::kNormal ? 2 * i + 1 : i + half;
      const float c = cos_t[i], s = sgn * sin_t[i];
      const float x0 = v[a], x1 = v[b];
      v[a] = x0 * c - x1 * s;
      v[b] = x0 * s + x1 * c;
    }
  }
  (void)head_dim;
}

void RopeTable::ensure(int64_t n) {
  if (n <= n_) return;
  const int half = p_.n_rot / 2;
  int64_t cap = std::max<int64_t>(n, n_ * 2);
  cos_.resize(size_t(cap * half));
  sin_.resize(size_t(cap * half));
  for (int64_t pos = n_; pos < cap; ++pos)
    rope_cos_sin(p_, pos, cos_.data() + pos * half, sin_.data() + pos * half);
  n_ = cap;
}

}  // namespace qevict
