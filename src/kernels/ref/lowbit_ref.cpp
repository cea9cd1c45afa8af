// Scalar references for kernels/lowbit.h (see ref/lowbit_ref.h).
#include "kernels/ref/lowbit_ref.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "core/f16.h"
#include "kernels/lowbit.h"

namespace qevict::ref {

void qwin_keys(const QuantLayout& L, const uint8_t* win, int h, int n, const RopeParams& p,
               int64_t row0, float* k, int64_t ldk) {
  const int d = L.head_dim;
  std::vector<float> kp(size_t(n) * d), c(size_t(p.n_rot / 2 + 1)), s(c.size());
  dequantize_window_head(L, win, h, n, kp.data(), nullptr);
  for (int t = 0; t < n; ++t) {
    rope_cos_sin(p, row0 + t, c.data(), s.data());
    rope_apply(p, c.data(), s.data(), kp.data() + size_t(t) * d, 1, d, d);
    for (int j = 0; j < d; ++j) k[t * ldk + j] = kp[size_t(t) * d + j];
  }
}

void qwin_values(const QuantLayout& L, const uint8_t* win, int h, int n, float* v, int64_t ldv) {
  const int d = L.head_dim;
  std::vector<float> vp(size_t(n) * d);
  dequantize_window_head(L, win, h, n, nullptr, vp.data());
  for (int t = 0; t < n; ++t)
    for (int j = 0; j < d; ++j) v[t * ldv + j] = vp[size_t(t) * d + j];
}

void qwin_pv_accumulate(const QuantLayout& L, const uint8_t* win, int h, int n, const float* p,
                        int64_t ldp, int g, float* out, int64_t ldo) {
  const int d = L.head_dim;
  std::vector<float> vp(size_t(n) * d);
  dequantize_window_head(L, win, h, n, nullptr, vp.data());
  for (int j = 0; j < g; ++j)
    for (int c = 0; c < d; ++c) {
      double acc = 0.0;
      for (int t = 0; t < n; ++t) acc += double(p[j * ldp + t]) * vp[size_t(t) * d + c];
      out[j * ldo + c] += float(acc);
    }
}

void qwin_pv_accumulate_i8(const QuantLayout& L, const uint8_t* win, int h, int n, const float* p,
                           int64_t ldp, int g, float* out, int64_t ldo) {
  const int d = L.head_dim;
  const size_t row_bytes = L.v_row_bytes();
  const uint8_t* codes = win + L.v_codes_off(h);
  for (int j = 0; j < g; ++j) {
    float w[8] = {}, zsum = 0.0f, wmax = 0.0f;
    for (int t = 0; t < n; ++t) {
      const float pt = p[j * ldp + t];
      w[t] = pt * f16_to_f32(load_f16_bits(win + L.v_scale_off(h), size_t(t)));
      zsum = std::fma(pt, f16_to_f32(load_f16_bits(win + L.v_zero_off(h), size_t(t))), zsum);
      wmax = std::max(wmax, std::fabs(w[t]));
    }
    float* o = out + j * ldo;
    if (!(wmax >= kPvI8MinWeight)) {
      for (int c = 0; c < d; ++c) o[c] += zsum;
      continue;
    }
    const float qs = 127.0f / wmax, f = wmax / 127.0f;
    int q[8] = {};
    for (int t = 0; t < n; ++t) q[t] = static_cast<int>(std::nearbyint(w[t] * qs));
    for (int c = 0; c < d; ++c) {
      int32_t acc = 0;
      for (int t = 0; t < n; ++t)
        acc += q[t] * int32_t((codes[size_t(t) * row_bytes + c / 4] >> (2 * (c % 4))) & 3);
      o[c] += std::fma(float(acc), f, zsum);
    }
  }
}

void rope_rows(const RopeParams& p, int d, int64_t pos, bool inverse, const float* x, int64_t ldx,
               int n, float* out, int64_t ldo) {
  std::vector<float> c(size_t(p.n_rot / 2 + 1)), s(c.size());
  rope_cos_sin(p, pos, c.data(), s.data());
  for (int r = 0; r < n; ++r) {
    for (int j = 0; j < d; ++j) out[r * ldo + j] = x[r * ldx + j];
    rope_apply(p, c.data(), s.data(), out + r * ldo, 1, d, d, inverse);
  }
}

}  // namespace qevict::ref
