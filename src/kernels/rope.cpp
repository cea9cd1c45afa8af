// Scalar RoPE (see rope.h); this is both the reference and the production path. RopeTable
// composes cos/sin from a fixed-size table of base-256 digits.
#include "kernels/rope.h"

#include <algorithm>
#include <cassert>
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

namespace {
// Pair index of channel c (c < n_rot) and whether c is the pair's first channel.
inline int pair_of(const RopeParams& p, int c, bool* first) {
  if (p.style == RopeStyle::kNormal) {
    *first = (c & 1) == 0;
    return c / 2;
  }
  const int half = p.n_rot / 2;
  *first = c < half;
  return c < half ? c : c - half;
}
}  // namespace

RopeTable::RopeTable(const RopeParams& p, int head_dim, int64_t n_pos) : p_(p), d_(head_dim) {
  levels_ = 1;
  while (levels_ < 7 && (int64_t(1) << (kLevelBits * levels_)) < n_pos) ++levels_;
  // The top level holds only the rows positions below n_pos use (2K positions: 8 rows, not
  // 256); the first level is always whole (in-window offsets read it).
  const int64_t top_step = int64_t(1) << (kLevelBits * (levels_ - 1));
  top_rows_ = levels_ == 1 ? kLevelRows
                           : int(std::min<int64_t>(kLevelRows, (n_pos + top_step - 1) / top_step));
  const size_t n = (size_t(levels_ - 1) * kLevelRows + size_t(top_rows_)) * d_;
  cos_.assign(n, 1.0f);
  sin_.assign(n, 0.0f);
  const int half = p_.n_rot / 2;
  std::vector<double> freq(size_t(std::max(half, 1)));
  for (int i = 0; i < half; ++i)
    freq[i] = double(p_.freq_scale) * std::pow(double(p_.freq_base), -2.0 * i / p_.n_rot);
  for (int l = 0; l < levels_; ++l) {
    const double step = std::ldexp(1.0, kLevelBits * l);
    for (int r = 0; r < (l == levels_ - 1 ? top_rows_ : kLevelRows); ++r) {
      float* cr = cos_.data() + (size_t(l) * kLevelRows + r) * d_;
      float* sr = sin_.data() + (size_t(l) * kLevelRows + r) * d_;
      for (int c = 0; c < p_.n_rot; ++c) {
        bool first;
        const int i = pair_of(p_, c, &first);
        // Angle reduced exactly enough in double: r·256^l·freq (|angle| < 2^53 is exact
        // to double rounding; cos/sin of it in double, rounded to float once).
        const double theta = double(r) * step * freq[i];
        cr[c] = static_cast<float>(std::cos(theta));
        const float s = static_cast<float>(std::sin(theta));
        sr[c] = first ? -s : s;
      }
    }
  }
  const int h2 = d_ / 2;
  const bool normal_pairs = p_.style == RopeStyle::kNormal && d_ % 2 == 0;
  const bool neox_pairs = p_.style == RopeStyle::kNeox && p_.n_rot == d_ && d_ % 4 == 0;
  if (h2 > 0 && (normal_pairs || neox_pairs)) {
    pair_cos_.resize(size_t(kLevelRows) * h2);
    pair_sin_.resize(size_t(kLevelRows) * h2);
    for (int r = 0; r < kLevelRows; ++r)
      for (int s = 0; s < h2; ++s) {
        // The pair's two channels: kNormal (2s, 2s + 1); kNeox pair f = 2s, or 2(s − d/4) + 1
        // for the second half of the slots, at (f, f + d/2).
        int first = 2 * s, second = 2 * s + 1;
        if (neox_pairs) {
          const int f = s < d_ / 4 ? 2 * s : 2 * (s - d_ / 4) + 1;
          first = f, second = f + h2;
        }
        pair_cos_[size_t(r) * h2 + s] = cos_[size_t(r) * d_ + first];
        pair_sin_[size_t(r) * h2 + s] = sin_[size_t(r) * d_ + second];
      }
  }
}

void RopeTable::expanded(int64_t pos, float* cosx, float* sinx) const {
  assert(pos >= 0 && pos < limit());
  const int64_t r0 = pos & (kLevelRows - 1);
  std::copy_n(cos_.data() + size_t(r0) * d_, d_, cosx);
  std::copy_n(sin_.data() + size_t(r0) * d_, d_, sinx);
  for (int l = 1; l < levels_; ++l) {
    const int64_t r = (pos >> (kLevelBits * l)) & (kLevelRows - 1);
    if (r == 0) continue;  // R(0) = identity
    const float* cr = cos_.data() + (size_t(l) * kLevelRows + r) * d_;
    const float* sr = sin_.data() + (size_t(l) * kLevelRows + r) * d_;
    // (c1 + i s1)(c2 + i s2); both sinx carry the same sign per channel, so s1·s2 = |s1||s2|
    // and the product's sin keeps that sign.
    for (int c = 0; c < d_; ++c) {
      const float c1 = cosx[c], s1 = sinx[c];
      cosx[c] = c1 * cr[c] - s1 * sr[c];
      sinx[c] = c1 * sr[c] + s1 * cr[c];
    }
  }
}

void RopeTable::cos_sin(int64_t pos, float* cos_out, float* sin_out) const {
  // The expanded rows on the stack for head_dim up to 256 (every model we load), else on the
  // heap: no buffer outlives the call.
  constexpr int kStackDim = 256;
  float stack[2 * kStackDim];
  std::vector<float> heap;
  float* cx = stack;
  if (d_ > kStackDim) {
    heap.resize(size_t(2) * d_);
    cx = heap.data();
  }
  float* sx = cx + d_;
  expanded(pos, cx, sx);
  for (int c = 0; c < p_.n_rot; ++c) {
    bool first;
    const int i = pair_of(p_, c, &first);
    if (!first) continue;
    cos_out[i] = cx[c];
    sin_out[i] = -sx[c];
  }
}

}  // namespace qevict
