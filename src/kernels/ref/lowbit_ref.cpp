// Scalar references for kernels/lowbit.h (see ref/lowbit_ref.h).
#include "kernels/ref/lowbit_ref.h"

#include <vector>

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
