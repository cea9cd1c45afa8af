// qwin_pv_accumulate_i8 (kernels/lowbit.h): P·V of an INT2-value window with the weights in
// 8 bits and the sums in integers, on AVX-512 VNNI + VBMI (scalar reference:
// ref::qwin_pv_accumulate_i8, bit for bit). Raw intrinsics in functions compiled for those
// extensions and called only when the CPU reports them: the Debian Highway (1.0.3) has no
// 8-bit dot product.
//
// The float path (QwinPv) spends one unpack (broadcast, shift, mask, convert) per 16 codes
// and one multiply-add per code and query head. Here a value group is a whole row (one
// scale s_t and zero z_t per token), so
//   Σ_t p_t·(s_t·code_t[c] + z_t) = Σ_t w_t·code_t[c] + Σ_t p_t·z_t,   w_t = p_t·s_t,
// and w_t is rounded to 8 bits against the head's largest |w_t|: w_t ≈ f·q_t, |q_t| ≤ 127.
// Σ_t q_t·code_t[c] is then exact in 32-bit integers, four tokens per VPDPBUSD lane. The
// codes need no unpacking: a row byte holds channels 4i..4i+3 in bit pairs 0..3; a byte
// permutation (VPERMB) puts, in lane l of vector k, byte 4k + l/4 of four tokens' rows, and a
// mask keeps bit pair l % 4 of it, so lane l of vector k sums channel 16k + l, times 4^(l%4)
// — undone, exactly, by the float factor f·4^-(l%4). Per window: 2 permutes and 2 masks per
// 16 channels, one VPDPBUSD per 16 channels, 4 tokens and query head, against 8 unpacks and
// 32 multiply-adds per 16 channels and 8 tokens of 4 heads.
//
// The rounding of the weights is the one approximation: each w_t moves by at most f/2, i.e.
// 1/254 of the head's largest weight in the window, against INT2 values whose own rounding
// moves each value by up to a sixth of its token's range (half of a step of range / 3).
#include <atomic>
#include <cmath>
#include <cstdlib>
#include <cstring>

#include "kernels/lowbit.h"
#include "kernels/simd/cpu_features.h"

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define QEVICT_PV_I8_X86 1
// GCC 12's AVX-512 headers fill the unused source of some intrinsics (_mm512_permutexvar_epi8,
// _mm256_cvtepi32_epi8) with a deliberately undefined vector, which -Wuninitialized reports.
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#else
#define QEVICT_PV_I8_X86 0
#endif

namespace qevict {
namespace {

// The process-wide switch: on until set_qwin_pv_i8_enabled(false) (the CLI's --pv-int8 off or
// QEVICT_PV_INT8=0, read in tools/; tests and A/B runs flip it).
std::atomic<int>& pv_i8_switch() {
  static std::atomic<int> on{1};
  return on;
}

#if QEVICT_PV_I8_X86
#define QEVICT_VNNI_TARGET                                                  \
  __attribute__((                                                           \
      target("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512dq,avx512vnni," \
             "avx512vbmi")))

// The permutations: vector k (of 4·D64) lane l takes byte 4k + l/4 of the rows of tokens
// t = 0..3 (row r at byte r·16·D64 of the source), into bytes 4l + t.
template <int D64>
struct PermTables {
  alignas(64) uint8_t idx[4 * D64][64];
  alignas(64) uint8_t mask[64];  // bit pair l % 4 of lane l's four bytes
  PermTables() {
    for (int k = 0; k < 4 * D64; ++k)
      for (int l = 0; l < 16; ++l)
        for (int t = 0; t < 4; ++t) idx[k][4 * l + t] = uint8_t(16 * D64 * t + 4 * k + l / 4);
    for (int l = 0; l < 16; ++l)
      for (int t = 0; t < 4; ++t) mask[4 * l + t] = uint8_t(3u << (2 * (l % 4)));
  }
};

// head_dim = 64·D64. Codes of tokens 0..7 are read whole (a window's 8 rows); the weights of
// tokens ≥ n are 0, so whatever those rows hold adds nothing.
template <int D64>
QEVICT_VNNI_TARGET void pv_i8(const QuantLayout& L, const uint8_t* win, int h, int n,
                              const float* p, int64_t ldp, int g, float* out, int64_t ldo) {
  static const PermTables<D64> tab;
  constexpr int NV = 4 * D64;  // 16-channel vectors in a row
  const uint8_t* codes = win + L.v_codes_off(h);
  const __m256 s8 =
      _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(win + L.v_scale_off(h))));
  alignas(32) float zf[8];
  _mm256_store_ps(
      zf,
      _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(win + L.v_zero_off(h)))));
  const __m512i m = _mm512_load_si512(tab.mask);
  __m512i c0[NV], c1[NV];  // tokens 0..3, 4..7
  if constexpr (D64 == 1) {
    const __m512i r0 = _mm512_loadu_si512(codes), r1 = _mm512_loadu_si512(codes + 64);
    for (int k = 0; k < NV; ++k) {
      const __m512i ix = _mm512_load_si512(tab.idx[k]);
      c0[k] = _mm512_and_si512(_mm512_permutexvar_epi8(ix, r0), m);
      c1[k] = _mm512_and_si512(_mm512_permutexvar_epi8(ix, r1), m);
    }
  } else {
    const __m512i a0 = _mm512_loadu_si512(codes), b0 = _mm512_loadu_si512(codes + 64);
    const __m512i a1 = _mm512_loadu_si512(codes + 128), b1 = _mm512_loadu_si512(codes + 192);
    for (int k = 0; k < NV; ++k) {
      const __m512i ix = _mm512_load_si512(tab.idx[k]);
      c0[k] = _mm512_and_si512(_mm512_permutex2var_epi8(a0, ix, b0), m);
      c1[k] = _mm512_and_si512(_mm512_permutex2var_epi8(a1, ix, b1), m);
    }
  }
  // Lane l's factor 4^-(l%4), times f per head.
  const __m512 lsc =
      _mm512_setr_ps(1.0f, 0.25f, 0.0625f, 0.015625f, 1.0f, 0.25f, 0.0625f, 0.015625f, 1.0f, 0.25f,
                     0.0625f, 0.015625f, 1.0f, 0.25f, 0.0625f, 0.015625f);
  const __mmask8 tm = __mmask8((1u << n) - 1);
  for (int j = 0; j < g; ++j) {
    const float* pj = p + j * ldp;
    const __m256 w = _mm256_mul_ps(_mm256_maskz_loadu_ps(tm, pj), s8);
    float zsum = 0.0f;
    for (int t = 0; t < n; ++t) zsum = std::fma(pj[t], zf[t], zsum);  // in token order
    const __m256 a = _mm256_andnot_ps(_mm256_set1_ps(-0.0f), w);
    __m128 x = _mm_max_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
    x = _mm_max_ps(x, _mm_movehl_ps(x, x));
    x = _mm_max_ss(x, _mm_movehdup_ps(x));
    const float wmax = _mm_cvtss_f32(x);
    float* o = out + j * ldo;
    const __m512 zv = _mm512_set1_ps(zsum);
    if (!(wmax >= kPvI8MinWeight)) {  // nothing to round against (or a NaN): the zeros only
      for (int k = 0; k < NV; ++k)
        _mm512_storeu_ps(o + 16 * k, _mm512_add_ps(_mm512_loadu_ps(o + 16 * k), zv));
      continue;
    }
    const float qs = 127.0f / wmax, f = wmax / 127.0f;
    const __m128i wb =
        _mm256_cvtepi32_epi8(_mm256_cvtps_epi32(_mm256_mul_ps(w, _mm256_set1_ps(qs))));
    const __m512i w0 = _mm512_set1_epi32(_mm_cvtsi128_si32(wb));
    const __m512i w1 = _mm512_set1_epi32(_mm_extract_epi32(wb, 1));
    const __m512 fl = _mm512_mul_ps(lsc, _mm512_set1_ps(f));
    for (int k = 0; k < NV; ++k) {
      __m512i acc = _mm512_dpbusd_epi32(_mm512_setzero_si512(), c0[k], w0);
      acc = _mm512_dpbusd_epi32(acc, c1[k], w1);
      const __m512 v = _mm512_fmadd_ps(_mm512_cvtepi32_ps(acc), fl, zv);
      _mm512_storeu_ps(o + 16 * k, _mm512_add_ps(_mm512_loadu_ps(o + 16 * k), v));
    }
  }
}
#endif  // QEVICT_PV_I8_X86

}  // namespace

bool qwin_pv_i8_layout(const QuantLayout& L, int g) {
  return L.vb() == 2 && L.g() == L.head_dim && (L.head_dim == 64 || L.head_dim == 128) &&
         L.window == 8 && g >= 1 && g <= 16;
}

bool qwin_pv_i8_supported(const QuantLayout& L, int g) {
#if QEVICT_PV_I8_X86
  return pv_i8_switch().load(std::memory_order_relaxed) != 0 && cpu::avx512_vnni_vbmi() &&
         qwin_pv_i8_layout(L, g);
#else
  (void)L, (void)g;
  return false;
#endif
}

void set_qwin_pv_i8_enabled(bool on) { pv_i8_switch().store(on ? 1 : 0); }

void qwin_pv_accumulate_i8(const QuantLayout& L, const uint8_t* win, int h, int n, const float* p,
                           int64_t ldp, int g, float* out, int64_t ldo) {
#if QEVICT_PV_I8_X86
  if (L.head_dim == 64) {
    pv_i8<1>(L, win, h, n, p, ldp, g, out, ldo);
  } else {
    pv_i8<2>(L, win, h, n, p, ldp, g, out, ldo);
  }
#else
  (void)L, (void)win, (void)h, (void)n, (void)p, (void)ldp, (void)g, (void)out, (void)ldo;
#endif
}

}  // namespace qevict
