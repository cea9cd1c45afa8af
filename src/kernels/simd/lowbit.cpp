// Dynamic dispatch for kernels/lowbit.h: compiles simd/lowbit-inl.h once per Highway target
// and picks the best one the CPU supports on first call.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kernels/simd/lowbit.cpp"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
#include "hwy/highway.h"
#include "kernels/simd/lowbit-inl.h"

#if HWY_ONCE
#include "kernels/lowbit.h"

namespace qevict {

HWY_EXPORT(QwinKeys);
HWY_EXPORT(QwinValues);
HWY_EXPORT(RopeRows);
HWY_EXPORT(QwinPv);
HWY_EXPORT(QwinPvSupported);
HWY_EXPORT(QwinScores);
HWY_EXPORT(QwinScoresPrepared);
HWY_EXPORT(QwinScoresQuery);
HWY_EXPORT(QwinScoresSupported);
HWY_EXPORT(QwinScores4Supported);

void qwin_keys(const QuantLayout& L, const uint8_t* win, int h, int n, const RopeTable& rope,
               int row0, float* k, int64_t ldk) {
  HWY_DYNAMIC_DISPATCH(QwinKeys)(L, win, h, n, rope, row0, k, ldk);
}
void qwin_values(const QuantLayout& L, const uint8_t* win, int h, int n, float* v, int64_t ldv) {
  HWY_DYNAMIC_DISPATCH(QwinValues)(L, win, h, n, v, ldv);
}
bool qwin_scores_supported(const QuantLayout& L, const RopeTable& rope, int g) {
  return HWY_DYNAMIC_DISPATCH(QwinScoresSupported)(L, rope, g);
}
bool qwin_scores_by_nibbles(const QuantLayout& L, const RopeTable& rope) {
  return HWY_DYNAMIC_DISPATCH(QwinScores4Supported)(L, rope);
}
void qwin_scores(const QuantLayout& L, const uint8_t* win, int h, int n, const RopeTable& rope,
                 int row0, const float* q, int64_t ldq, int g, float scale, float* scores,
                 int64_t lds) {
  HWY_DYNAMIC_DISPATCH(QwinScores)(L, win, h, n, rope, row0, q, ldq, g, scale, scores, lds);
}
void qwin_scores_query(const QuantLayout& L, const RopeTable& rope, const float* q, int64_t ldq,
                       int g, float* out) {
  HWY_DYNAMIC_DISPATCH(QwinScoresQuery)(L, rope, q, ldq, g, out);
}
void qwin_scores_prepared(const QuantLayout& L, const uint8_t* win, int h, int n,
                          const RopeTable& rope, int row0, const float* qp, int g, float scale,
                          float* scores, int64_t lds) {
  HWY_DYNAMIC_DISPATCH(QwinScoresPrepared)(L, win, h, n, rope, row0, qp, g, scale, scores, lds);
}
bool qwin_pv_supported(const QuantLayout& L, int g) {
  return HWY_DYNAMIC_DISPATCH(QwinPvSupported)(L, g);
}
void qwin_pv_accumulate(const QuantLayout& L, const uint8_t* win, int h, int n, const float* p,
                        int64_t ldp, int g, float* out, int64_t ldo) {
  HWY_DYNAMIC_DISPATCH(QwinPv)(L, win, h, n, p, ldp, g, out, ldo);
}
void rope_rows(const RopeParams& p, int d, const float* cosx, const float* sinx, bool inverse,
               const float* x, int64_t ldx, int n, float* out, int64_t ldo) {
  HWY_DYNAMIC_DISPATCH(RopeRows)(p, d, cosx, sinx, inverse, x, ldx, n, out, ldo);
}

}  // namespace qevict
#endif  // HWY_ONCE
