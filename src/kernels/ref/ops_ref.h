// Scalar reference implementations of kernels/ops.h: straightforward loops, double
// accumulation where it matters, no SIMD. They define what the fast paths must compute.
#pragma once

#include "kernels/ops.h"

namespace qevict::ref {

void rmsnorm(const float* x, const float* w, float* y, int64_t n, float eps);
void swiglu(const float* gate, const float* up, float* out, int64_t n);
void f32_to_half(HalfType t, const float* src, uint16_t* dst, int64_t n);
void half_to_f32(HalfType t, const uint16_t* src, float* dst, int64_t n);
void qk_scores(HalfType t, const float* q, int64_t ldq, int g, const uint16_t* k, int64_t ldk,
               int64_t n, int d, float scale, float* scores, int64_t lds);
void pv_accumulate(HalfType t, const float* p, int64_t ldp, int g, const uint16_t* v, int64_t ldv,
                   int64_t n, int d, float* out, int64_t ldo);
float softmax_inplace(float* x, int64_t n);
void qk_scores_f32(const float* q, int64_t ldq, int g, const float* k, int64_t ldk, int64_t n,
                   int d, float scale, float* scores, int64_t lds);
void pv_accumulate_f32(const float* p, int64_t ldp, int g, const float* v, int64_t ldv, int64_t n,
                       int d, float* out, int64_t ldo);
float max_of(const float* x, int64_t n);
float exp_sub_sum(float* x, int64_t n, float m);
// The group sums of exp_sub_sum8 over x as it is (no exp): the order the fast path must give.
void sum8_groups(const float* x, int64_t n, float* sums);

inline float half_to_float(HalfType t, uint16_t h);
inline uint16_t float_to_half(HalfType t, float f);

}  // namespace qevict::ref

#include "core/f16.h"

namespace qevict::ref {
inline float half_to_float(HalfType t, uint16_t h) {
  return t == HalfType::kF16 ? f16_to_f32(h) : bf16_to_f32(h);
}
inline uint16_t float_to_half(HalfType t, float f) {
  return t == HalfType::kF16 ? f32_to_f16(f) : f32_to_bf16(f);
}
}  // namespace qevict::ref
