// Dynamic dispatch for kernels/ops.h: compiles simd/ops-inl.h once per Highway target and
// picks the best one the CPU supports on first call.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kernels/simd/ops.cpp"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
#include "hwy/highway.h"
#include "kernels/simd/ops-inl.h"

#if HWY_ONCE
#include "kernels/ops.h"

namespace qevict {

HWY_EXPORT(RmsNorm);
HWY_EXPORT(Swiglu);
HWY_EXPORT(F32ToHalf);
HWY_EXPORT(HalfToF32);
HWY_EXPORT(QkScores);
HWY_EXPORT(PvAccumulate);
HWY_EXPORT(Softmax);
HWY_EXPORT(TargetName);
HWY_EXPORT(MaxOf);
HWY_EXPORT(QkScoresF32);
HWY_EXPORT(PvAccumulateF32);
HWY_EXPORT(ExpSubSum);
HWY_EXPORT(ExpSubSum8);
HWY_EXPORT(QkScoresRows);
HWY_EXPORT(PvAccumulateRows);
HWY_EXPORT(ExpScaleAcc);

void rmsnorm(const float* x, const float* w, float* y, int64_t n, float eps) {
  HWY_DYNAMIC_DISPATCH(RmsNorm)(x, w, y, n, eps);
}
void swiglu(const float* gate, const float* up, float* out, int64_t n) {
  HWY_DYNAMIC_DISPATCH(Swiglu)(gate, up, out, n);
}
void f32_to_half(HalfType t, const float* src, uint16_t* dst, int64_t n) {
  HWY_DYNAMIC_DISPATCH(F32ToHalf)(t == HalfType::kF16, src, dst, n);
}
void half_to_f32(HalfType t, const uint16_t* src, float* dst, int64_t n) {
  HWY_DYNAMIC_DISPATCH(HalfToF32)(t == HalfType::kF16, src, dst, n);
}
void qk_scores(HalfType t, const float* q, int64_t ldq, int g, const uint16_t* k, int64_t ldk,
               int64_t n, int d, float scale, float* scores, int64_t lds) {
  HWY_DYNAMIC_DISPATCH(QkScores)(t == HalfType::kF16, q, ldq, g, k, ldk, n, d, scale, scores, lds);
}
void pv_accumulate(HalfType t, const float* p, int64_t ldp, int g, const uint16_t* v, int64_t ldv,
                   int64_t n, int d, float* out, int64_t ldo) {
  HWY_DYNAMIC_DISPATCH(PvAccumulate)(t == HalfType::kF16, p, ldp, g, v, ldv, n, d, out, ldo);
}
float softmax_inplace(float* x, int64_t n) { return HWY_DYNAMIC_DISPATCH(Softmax)(x, n); }
float max_of(const float* x, int64_t n) { return HWY_DYNAMIC_DISPATCH(MaxOf)(x, n); }
float exp_sub_sum(float* x, int64_t n, float m) { return HWY_DYNAMIC_DISPATCH(ExpSubSum)(x, n, m); }
float exp_sub_sum8(float* x, int64_t n, float m, float* sums) {
  return HWY_DYNAMIC_DISPATCH(ExpSubSum8)(x, n, m, sums);
}
void qk_scores_f32(const float* q, int64_t ldq, int g, const float* k, int64_t ldk, int64_t n,
                   int d, float scale, float* scores, int64_t lds) {
  HWY_DYNAMIC_DISPATCH(QkScoresF32)(q, ldq, g, k, ldk, n, d, scale, scores, lds);
}
void pv_accumulate_f32(const float* p, int64_t ldp, int g, const float* v, int64_t ldv, int64_t n,
                       int d, float* out, int64_t ldo) {
  HWY_DYNAMIC_DISPATCH(PvAccumulateF32)(p, ldp, g, v, ldv, n, d, out, ldo);
}
void qk_scores_rows(HalfType t, const float* q, int64_t ldq, int m, const uint16_t* const* k,
                    int64_t n, int d, float scale, float* scores, int64_t lds) {
  HWY_DYNAMIC_DISPATCH(QkScoresRows)(t == HalfType::kF16, q, ldq, m, k, n, d, scale, scores, lds);
}
void pv_accumulate_rows(HalfType t, const float* p, int64_t ldp, int m, const uint16_t* const* v,
                        int64_t n, int d, float* out, int64_t ldo) {
  HWY_DYNAMIC_DISPATCH(PvAccumulateRows)(t == HalfType::kF16, p, ldp, m, v, n, d, out, ldo);
}
void exp_scale_accumulate(const float* s, int64_t n, float m, float inv, double* acc) {
  HWY_DYNAMIC_DISPATCH(ExpScaleAcc)(s, n, m, inv, acc);
}
const char* simd_target_name() { return HWY_DYNAMIC_DISPATCH(TargetName)(); }

}  // namespace qevict
#endif  // HWY_ONCE
