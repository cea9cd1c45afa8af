// Decoding of low-bit KV windows (kv_quant.h) for attention, optimized path: SIMD decode of
// the codes straight into a caller's small per-run buffer, keys rotated only by their
// in-window RoPE, the rest of the rotation carried by the query (R(p0 + t) = R(p0)·R(t), so
// q·R(p0 + t)k = (R(p0)ᵀq)·(R(t)k)). Nothing depends on a per-position table: the rotations
// come from a fixed-size RopeTable. Highway kernels in simd/lowbit-inl.h, dispatched once;
// the scalar references with the same contracts are in ref/lowbit_ref.h.
#pragma once

#include <cstdint>

#include "kernels/kv_quant.h"
#include "kernels/rope.h"

namespace qevict {

// KV head h's keys of tokens [0, n) of a window, decoded (pre-RoPE) and rotated by
// R(row0 + t), t the token's offset in the window: k f32 [n][ldk] (head_dim used per row).
// row0 = 0 is the in-window rotation; a lone query rotated by R(hi)ᵀ only (p0 = hi + lo,
// lo < 256) passes row0 = lo and needs no per-window rotation of its own. Needs
// rope.head_dim() == L.head_dim, row0 >= 0 and row0 + L.window <= rope.limit().
void qwin_keys(const QuantLayout& L, const uint8_t* win, int h, int n, const RopeTable& rope,
               int row0, float* k, int64_t ldk);

// scores[j·lds + t] = scale · q_j · (R(row0 + t)·k_t) for the g query heads j (rows of q,
// already rotated by R(p0 - row0)ᵀ) and tokens t < n of KV head h's keys, straight from the
// codes: bit for bit qwin_keys followed by qk_scores_f32 (INT4 keys: see
// qwin_scores_by_nibbles), without writing the decoded keys.
// Needs qwin_scores_supported(L, rope, g) (SIMD width >= 8 dividing head_dim, head_dim <= 8
// vectors, g <= 16, windows within one RoPE table level, NeoX only with full rotation) and
// 0 <= row0, row0 + n <= RopeTable::kLevelRows (the rows come from the table's first level);
// otherwise decode with qwin_keys and score with qk_scores_f32.
bool qwin_scores_supported(const QuantLayout& L, const RopeTable& rope, int g);
// Whether qwin_scores takes its INT4 path, lanes in nibble order (simd/lowbit-inl.h: INT4
// keys, rope.has_pair_rows(), head_dim a multiple of two vectors, of four for kNeox): the
// same rotated keys, the channels summed in another order than qk_scores_f32 — a few ulps
// of Σ|q·k| from qwin_keys + qk_scores_f32 instead of bit for bit.
bool qwin_scores_by_nibbles(const QuantLayout& L, const RopeTable& rope);
void qwin_scores(const QuantLayout& L, const uint8_t* win, int h, int n, const RopeTable& rope,
                 int row0, const float* q, int64_t ldq, int g, float scale, float* scores,
                 int64_t lds);
// qwin_scores in two steps, for a query scored against many windows: qwin_scores_query puts
// the g rows of q (stride ldq) in the layout the kernel reads (nibble order on the INT4
// path, else as they are; out: g·head_dim floats), once; qwin_scores_prepared then scores
// a window from it — bit for bit qwin_scores.
void qwin_scores_query(const QuantLayout& L, const RopeTable& rope, const float* q, int64_t ldq,
                       int g, float* out);
void qwin_scores_prepared(const QuantLayout& L, const uint8_t* win, int h, int n,
                          const RopeTable& rope, int row0, const float* qp, int g, float scale,
                          float* scores, int64_t lds);

// KV head h's values of tokens [0, n): v f32 [n][ldv] = scale·code + zero per group.
void qwin_values(const QuantLayout& L, const uint8_t* win, int h, int n, float* v, int64_t ldv);

// out[j][c] += Σ_{t<n} p[j·ldp + t] · v_t[c] for the g query heads j of KV head h, v_t the
// window's value rows, computed from the codes (no decoded rows): the attention's P·V step
// for a low-bit window. Needs qwin_pv_supported(L, g) (value groups a whole number of SIMD
// vectors, g ≤ 8) and n ≤ 64; otherwise decode with qwin_values and accumulate.
bool qwin_pv_supported(const QuantLayout& L, int g);
void qwin_pv_accumulate(const QuantLayout& L, const uint8_t* win, int h, int n, const float* p,
                        int64_t ldp, int g, float* out, int64_t ldo);

// qwin_pv_accumulate with the weights in 8 bits (simd/lowbit_i8.cpp; AVX-512 VNNI + VBMI):
// for each query head j, w_t = p[j·ldp + t]·s_t (s_t, z_t: token t's value scale and zero),
// wmax = max_t |w_t|; q_t = round-to-nearest-even(w_t · (127 / wmax)), f = wmax / 127; then
//   out[j][c] += fma(float(Σ_t q_t·code_t[c]), f, zsum),  zsum = Σ_t p_t·z_t (fmas in token
// order, from 0), the integer sum exact. When wmax < kPvI8MinWeight (or is NaN) only zsum
// is added. Each weight moves by at most wmax/254. Bit for bit ref::qwin_pv_accumulate_i8.
// qwin_pv_i8_layout: INT2 values, one value group a row, head_dim 64 or 128, 8-token
// windows, g ≤ 16; qwin_pv_i8_supported: that, a CPU with the extensions, and the path
// switched on (it is until set_qwin_pv_i8_enabled(false): the CLI's --pv-int8 off, or
// QEVICT_PV_INT8=0 read by the frontends). qwin_pv_accumulate_i8 needs qwin_pv_i8_supported
// and n ≤ 8.
constexpr float kPvI8MinWeight = 1e-30f;
bool qwin_pv_i8_layout(const QuantLayout& L, int g);
bool qwin_pv_i8_supported(const QuantLayout& L, int g);
void set_qwin_pv_i8_enabled(bool on);
void qwin_pv_accumulate_i8(const QuantLayout& L, const uint8_t* win, int h, int n, const float* p,
                           int64_t ldp, int g, float* out, int64_t ldo);

// Rotates n rows of d floats: out[r][c] = x[r][c]·cosx[c] + x[r][partner(c)]·sinx[c] with
// expanded cos/sin (RopeTable::expanded); inverse = true rotates by the opposite angle
// (negated sinx). x and out must not overlap.
void rope_rows(const RopeParams& p, int d, const float* cosx, const float* sinx, bool inverse,
               const float* x, int64_t ldx, int n, float* out, int64_t ldo);

}  // namespace qevict
