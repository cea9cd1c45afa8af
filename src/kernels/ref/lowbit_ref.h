// Scalar references for kernels/lowbit.h: the same contracts written plainly, with cos/sin
// computed in double for every position (rope_cos_sin), no table. Tests compare the SIMD
// kernels and the fused attention against these.
#pragma once

#include <cstdint>

#include "kernels/kv_quant.h"
#include "kernels/rope.h"

namespace qevict::ref {

// Keys of tokens [0, n) decoded and rotated by R(row0 + t) (t = offset in the window):
// f32 [n][ldk].
void qwin_keys(const QuantLayout& L, const uint8_t* win, int h, int n, const RopeParams& p,
               int64_t row0, float* k, int64_t ldk);
// Values of tokens [0, n): f32 [n][ldv].
void qwin_values(const QuantLayout& L, const uint8_t* win, int h, int n, float* v, int64_t ldv);
// out[j][c] += Σ_{t<n} p[j·ldp + t]·v_t[c], j < g: decoded values, summed in double.
void qwin_pv_accumulate(const QuantLayout& L, const uint8_t* win, int h, int n, const float* p,
                        int64_t ldp, int g, float* out, int64_t ldo);
// The 8-bit-weight P·V of kernels/lowbit.h's qwin_pv_accumulate_i8, written plainly (its
// layouts: qwin_pv_i8_layout).
void qwin_pv_accumulate_i8(const QuantLayout& L, const uint8_t* win, int h, int n, const float* p,
                           int64_t ldp, int g, float* out, int64_t ldo);
// Rotation of n rows by the angle of position pos (inverse: by −angle), double angles.
void rope_rows(const RopeParams& p, int d, int64_t pos, bool inverse, const float* x, int64_t ldx,
               int n, float* out, int64_t ldo);

}  // namespace qevict::ref
