// Scalar references for kernels/ops.h (see ref/ops_ref.h).
#include "kernels/ref/ops_ref.h"

#include <cmath>

namespace qevict::ref {

void rmsnorm(const float* x, const float* w, float* y, int64_t n, float eps) {
  double ss = 0.0;
  for (int64_t i = 0; i < n; ++i) ss += double(x[i]) * x[i];
  const float inv = static_cast<float>(1.0 / std::sqrt(ss / double(n) + eps));
  for (int64_t i = 0; i < n; ++i) y[i] = x[i] * inv * w[i];
}

void swiglu(const float* gate, const float* up, float* out, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const double g = gate[i];
    out[i] = static_cast<float>(g / (1.0 + std::exp(-g)) * up[i]);
  }
}

void f32_to_half(HalfType t, const float* src, uint16_t* dst, int64_t n) {
  for (int64_t i = 0; i < n; ++i) dst[i] = float_to_half(t, src[i]);
}

void half_to_f32(HalfType t, const uint16_t* src, float* dst, int64_t n) {
  for (int64_t i = 0; i < n; ++i) dst[i] = half_to_float(t, src[i]);
}

void qk_scores(HalfType t, const float* q, int64_t ldq, int g, const uint16_t* k, int64_t ldk,
               int64_t n, int d, float scale, float* scores, int64_t lds) {
  for (int h = 0; h < g; ++h) {
    for (int64_t j = 0; j < n; ++j) {
      double acc = 0.0;
      for (int c = 0; c < d; ++c) acc += double(q[h * ldq + c]) * half_to_float(t, k[j * ldk + c]);
      scores[h * lds + j] = static_cast<float>(acc * scale);
    }
  }
}

void pv_accumulate(HalfType t, const float* p, int64_t ldp, int g, const uint16_t* v, int64_t ldv,
                   int64_t n, int d, float* out, int64_t ldo) {
  for (int h = 0; h < g; ++h) {
    for (int c = 0; c < d; ++c) {
      double acc = 0.0;
      for (int64_t j = 0; j < n; ++j)
        acc += double(p[h * ldp + j]) * half_to_float(t, v[j * ldv + c]);
      out[h * ldo + c] += static_cast<float>(acc);
    }
  }
}

void qk_scores_f32(const float* q, int64_t ldq, int g, const float* k, int64_t ldk, int64_t n,
                   int d, float scale, float* scores, int64_t lds) {
  for (int h = 0; h < g; ++h)
    for (int64_t j = 0; j < n; ++j) {
      double acc = 0.0;
      for (int c = 0; c < d; ++c) acc += double(q[h * ldq + c]) * k[j * ldk + c];
      scores[h * lds + j] = static_cast<float>(acc * scale);
    }
}

void pv_accumulate_f32(const float* p, int64_t ldp, int g, const float* v, int64_t ldv, int64_t n,
                       int d, float* out, int64_t ldo) {
  for (int h = 0; h < g; ++h)
    for (int c = 0; c < d; ++c) {
      double acc = 0.0;
      for (int64_t j = 0; j < n; ++j) acc += double(p[h * ldp + j]) * v[j * ldv + c];
      out[h * ldo + c] += static_cast<float>(acc);
    }
}

float softmax_inplace(float* x, int64_t n) {
  if (n <= 0) return 0.0f;
  float mx = x[0];
  for (int64_t i = 1; i < n; ++i) mx = std::fmax(mx, x[i]);
  double sum = 0.0;
  for (int64_t i = 0; i < n; ++i) {
    x[i] = std::exp(x[i] - mx);
    sum += x[i];
  }
  const float inv = static_cast<float>(1.0 / sum);
  for (int64_t i = 0; i < n; ++i) x[i] *= inv;
  return mx;
}

float max_of(const float* x, int64_t n) {
  float m = x[0];
  for (int64_t i = 1; i < n; ++i) m = std::fmax(m, x[i]);
  return m;
}

float exp_sub_sum(float* x, int64_t n, float m) {
  double s = 0.0;
  for (int64_t i = 0; i < n; ++i) {
    x[i] = std::exp(x[i] - m);
    s += x[i];
  }
  return static_cast<float>(s);
}

void sum8_groups(const float* x, int64_t n, float* sums) {
  for (int64_t k = 0; k * 8 < n; ++k) {
    float v[8] = {};
    for (int64_t j = 0; j < 8 && 8 * k + j < n; ++j) v[j] = x[8 * k + j];
    sums[k] = ((v[0] + v[1]) + (v[2] + v[3])) + ((v[4] + v[5]) + (v[6] + v[7]));
  }
}

}  // namespace qevict::ref
