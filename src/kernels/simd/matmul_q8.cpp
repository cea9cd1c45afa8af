// 8-bit-activation matmul on AVX-512 VNNI (see matmul_q8.h). Compiled for those
// instruction sets with function attributes only, so nothing here can run on a CPU without
// them (available() is asked first).
//
// A pair of consecutive 32-blocks is one 64-byte vector of codes:
//   nibble types (Q4_0/Q4_1/Q5_0/Q5_1): bytes [A 0-15 | B 0-15 | A 16-31 | B 16-31]: the
//     two blocks' 16 code bytes side by side, then the same shifted right by 4, masked, so
//     the low nibbles (elements 0-15) come first; Q5's fifth bit is added from qh with a
//     64-bit byte mask;
//   Q8_0: bytes [A 0-31 | B 0-31], signed.
// X is quantized once per call into the same byte order (PairX), so one vpdpbusd gives 16
// i32 lanes of 4-element partial sums, lanes {0-3, 8-11} of block A and {4-7, 12-15} of B
// (Q8_0: 0-7 and 8-15). Those lanes are converted to f32 and multiplied by a per-lane scale
// (d_w d_x of their block) into an f32 accumulator; the lanes are added at the end. The
// "- 8 sum q" / "- 16 sum q" of Q4_0/Q5_0 start the integer accumulator (PairX::init), and
// Q4_1/Q5_1's m_w d_x sum q is one more FMA with PairX::sa. Q8_0's signed weights use the
// sign trick: |w| (unsigned) times x with w's sign.
#include "kernels/simd/matmul_q8.h"

#include <immintrin.h>

#include <atomic>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "kernels/ref/dequant.h"
#include "kernels/ref/matmul_ref.h"
#include "kernels/simd/cpu_features.h"

// GCC 12 warns that the _mm512_undefined_* operands inside its own cast/extract intrinsics
// are used uninitialized (a known false positive; the sanitizer build shows it).
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

namespace qevict::q8 {
namespace {

// On until set_enabled(false) (the CLI's --matmul f32 or QEVICT_Q8=0, read in tools/).
std::atomic<bool> g_on{true};

#if defined(__x86_64__)
#define QEVICT_Q8_TARGET __attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni,f16c,fma")))

// One pair of activation blocks of one token, in the code order of the weight pairs.
struct alignas(64) PairX {
  int8_t q[64];
  float d[16];       // the block's d_x in each lane of its block
  float sa[16];      // lane 0: d_A sum q_A, lane 4: d_B sum q_B (nibble types), else 0
  int32_t init[16];  // lane 0: -bias sum q_A, lane 4: -bias sum q_B (Q4_0/Q5_0), else 0
};

enum class Kind { kQ4_0, kQ4_1, kQ5_0, kQ5_1, kQ8_0 };

constexpr bool nibble(Kind k) { return k != Kind::kQ8_0; }
constexpr bool has_m(Kind k) { return k == Kind::kQ4_1 || k == Kind::kQ5_1; }
constexpr bool has_qh(Kind k) { return k == Kind::kQ5_0 || k == Kind::kQ5_1; }
constexpr int bias(Kind k) { return k == Kind::kQ4_0 ? 8 : (k == Kind::kQ5_0 ? 16 : 0); }
constexpr size_t block_bytes(Kind k) {
  switch (k) {
    case Kind::kQ4_0:
      return 18;
    case Kind::kQ4_1:
      return 20;
    case Kind::kQ5_0:
      return 22;
    case Kind::kQ5_1:
      return 24;
    default:
      return 34;
  }
}
constexpr size_t qs_offset(Kind k) {
  switch (k) {
    case Kind::kQ4_1:
      return 4;
    case Kind::kQ5_0:
      return 6;
    case Kind::kQ5_1:
      return 8;
    default:
      return 2;
  }
}

// Quantizes one 32-block as ref::quantize_q8_block (same single operations: amax / 127,
// 127 / amax, x * id rounded to nearest even), writing its 32 codes to q0 (elements 0-15)
// and q1 (16-31). Returns d and sets *sum.
QEVICT_Q8_TARGET inline float quantize_block(const float* x, int8_t* q0, int8_t* q1, int32_t* sum) {
  const __m512 a = _mm512_loadu_ps(x), b = _mm512_loadu_ps(x + 16);
  const __m512 zero = _mm512_setzero_ps();
  // x - x is NaN exactly for Inf and NaN.
  const __mmask16 bad = _mm512_cmp_ps_mask(_mm512_sub_ps(a, a), zero, _CMP_NEQ_UQ) |
                        _mm512_cmp_ps_mask(_mm512_sub_ps(b, b), zero, _CMP_NEQ_UQ);
  const float amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(a), _mm512_abs_ps(b)));
  if (bad != 0 || amax == 0.0f) {
    std::memset(q0, 0, 16);
    std::memset(q1, 0, 16);
    *sum = 0;
    return bad != 0 ? std::nanf("") : 0.0f;
  }
  const float id = 127.0f / amax;
  const __m512i ia = _mm512_cvtps_epi32(_mm512_mul_ps(a, _mm512_set1_ps(id)));
  const __m512i ib = _mm512_cvtps_epi32(_mm512_mul_ps(b, _mm512_set1_ps(id)));
  _mm_storeu_si128(reinterpret_cast<__m128i*>(q0), _mm512_cvtepi32_epi8(ia));
  _mm_storeu_si128(reinterpret_cast<__m128i*>(q1), _mm512_cvtepi32_epi8(ib));
  *sum = _mm512_reduce_add_epi32(_mm512_add_epi32(ia, ib));
  return amax / 127.0f;
}

// X rows [0, n_tokens) -> px[t * n_pairs + p].
template <Kind K>
QEVICT_Q8_TARGET void prepare_x(const float* x, size_t ldx, size_t n_tokens, size_t n_blocks,
                                PairX* px) {
  const size_t n_pairs = (n_blocks + 1) / 2;
  for (size_t t = 0; t < n_tokens; ++t) {
    for (size_t p = 0; p < n_pairs; ++p) {
      PairX& o = px[t * n_pairs + p];
      std::memset(&o, 0, sizeof o);
      for (size_t h = 0; h < 2 && 2 * p + h < n_blocks; ++h) {
        const float* xb = x + t * ldx + (2 * p + h) * 32;
        int32_t sum = 0;
        float d;
        if constexpr (nibble(K)) {
          d = quantize_block(xb, o.q + 16 * h, o.q + 32 + 16 * h, &sum);
          for (int l = 0; l < 4; ++l) o.d[4 * h + l] = o.d[8 + 4 * h + l] = d;
          o.sa[4 * h] = d * static_cast<float>(sum);
          o.init[4 * h] = -bias(K) * sum;
        } else {
          d = quantize_block(xb, o.q + 32 * h, o.q + 32 * h + 16, &sum);
          for (int l = 0; l < 8; ++l) o.d[8 * h + l] = d;
        }
      }
    }
  }
}

// The codes and per-lane scales of one weight pair (block A at a; B at a + block_bytes
// unless !kHasB, then zeros).
struct WPair {
  __m512i c;
  __m512 d, m;
};

template <Kind K, bool kHasB>
QEVICT_Q8_TARGET inline WPair load_pair(const uint8_t* a) {
  constexpr size_t bb = block_bytes(K), qo = qs_offset(K);
  const uint8_t* b = a + bb;
  WPair w;
  // Scales: [d_A, (m_A,) d_B, (m_B)] as f16 in one integer, converted at once.
  if constexpr (has_m(K)) {
    uint32_t ha, hb = 0;
    std::memcpy(&ha, a, 4);
    if constexpr (kHasB) std::memcpy(&hb, b, 4);
    const __m512 v = _mm512_castps128_ps512(
        _mm_cvtph_ps(_mm_cvtsi64_si128(static_cast<long long>(ha | uint64_t{hb} << 32))));
    w.d =
        _mm512_permutexvar_ps(_mm512_setr_epi32(0, 0, 0, 0, 2, 2, 2, 2, 0, 0, 0, 0, 2, 2, 2, 2), v);
    w.m =
        _mm512_permutexvar_ps(_mm512_setr_epi32(1, 1, 1, 1, 3, 3, 3, 3, 1, 1, 1, 1, 3, 3, 3, 3), v);
  } else {
    uint16_t ha, hb = 0;
    std::memcpy(&ha, a, 2);
    if constexpr (kHasB) std::memcpy(&hb, b, 2);
    const __m512 v =
        _mm512_castps128_ps512(_mm_cvtph_ps(_mm_cvtsi32_si128(int(ha | uint32_t{hb} << 16))));
    const __m512i idx = nibble(K)
                            ? _mm512_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1, 0, 0, 0, 0, 1, 1, 1, 1)
                            : _mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1);
    w.d = _mm512_permutexvar_ps(idx, v);
    w.m = _mm512_setzero_ps();
  }
  if constexpr (nibble(K)) {
    const __m128i qa = _mm_loadu_si128(reinterpret_cast<const __m128i*>(a + qo));
    __m128i qb = _mm_setzero_si128();
    if constexpr (kHasB) qb = _mm_loadu_si128(reinterpret_cast<const __m128i*>(b + qo));
    const __m256i ab = _mm256_inserti128_si256(_mm256_castsi128_si256(qa), qb, 1);
    w.c = _mm512_and_si512(
        _mm512_inserti64x4(_mm512_castsi256_si512(ab), _mm256_srli_epi16(ab, 4), 1),
        _mm512_set1_epi8(0x0F));
    if constexpr (has_qh(K)) {
      constexpr size_t ho = K == Kind::kQ5_0 ? 2 : 4;
      uint32_t qa_h, qb_h = 0;
      std::memcpy(&qa_h, a + ho, 4);
      if constexpr (kHasB) std::memcpy(&qb_h, b + ho, 4);
      const uint64_t bits = uint64_t{qa_h & 0xFFFF} | uint64_t{qb_h & 0xFFFF} << 16 |
                            uint64_t{qa_h >> 16} << 32 | uint64_t{qb_h >> 16} << 48;
      w.c = _mm512_mask_add_epi8(w.c, static_cast<__mmask64>(bits), w.c, _mm512_set1_epi8(16));
    }
  } else {
    const __m256i qa = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a + qo));
    __m256i qb = _mm256_setzero_si256();
    if constexpr (kHasB) qb = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + qo));
    w.c = _mm512_inserti64x4(_mm512_castsi256_si512(qa), qb, 1);
  }
  return w;
}

// Rows ahead that a tile prefetches (as the f32 kernel's kPrefetchTiles: 4 tiles).
constexpr size_t kPrefetchTiles = 4;

// acc[r][t] += the pair's products for kR rows and kT tokens.
template <Kind K, size_t kR, size_t kT, bool kHasB>
QEVICT_Q8_TARGET inline void pair_step(const uint8_t* const* rows, size_t off, size_t ahead,
                                       const PairX* const* xs, __m512 (&acc)[kR][kT]) {
  WPair w[kR];
  __mmask64 neg[kR];
  for (size_t r = 0; r < kR; ++r) {
    _mm_prefetch(reinterpret_cast<const char*>(rows[r] + off + ahead), _MM_HINT_T0);
    _mm_prefetch(reinterpret_cast<const char*>(rows[r] + off + ahead + 63), _MM_HINT_T0);
    w[r] = load_pair<K, kHasB>(rows[r] + off);
    if constexpr (!nibble(K)) {
      neg[r] = _mm512_movepi8_mask(w[r].c);
      w[r].c = _mm512_abs_epi8(w[r].c);
    }
  }
  for (size_t t = 0; t < kT; ++t) {
    const PairX& x = *xs[t];
    const __m512i q = _mm512_load_si512(x.q);
    const __m512 dx = _mm512_load_ps(x.d);
    const __m512i init = _mm512_load_si512(x.init);
    for (size_t r = 0; r < kR; ++r) {
      __m512i dot;
      if constexpr (nibble(K)) {
        dot = _mm512_dpbusd_epi32(init, w[r].c, q);
      } else {
        const __m512i qs = _mm512_mask_sub_epi8(q, neg[r], _mm512_setzero_si512(), q);
        dot = _mm512_dpbusd_epi32(_mm512_setzero_si512(), w[r].c, qs);
      }
      acc[r][t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot), _mm512_mul_ps(w[r].d, dx), acc[r][t]);
      if constexpr (has_m(K)) acc[r][t] = _mm512_fmadd_ps(w[r].m, _mm512_load_ps(x.sa), acc[r][t]);
    }
  }
}

// y for kR rows starting at w (row_bytes apart) and kT tokens of px (token t's pairs at
// px + t * n_pairs).
template <Kind K, size_t kR, size_t kT>
QEVICT_Q8_TARGET void block_tile(const uint8_t* w, size_t row_bytes, size_t n_blocks,
                                 const PairX* px, size_t n_pairs, float* y, size_t ldy) {
  constexpr size_t pair_bytes = 2 * block_bytes(K);
  const uint8_t* rows[kR];
  for (size_t r = 0; r < kR; ++r) rows[r] = w + r * row_bytes;
  const size_t ahead = kPrefetchTiles * kR * row_bytes;
  __m512 acc[kR][kT];
  for (size_t r = 0; r < kR; ++r) {
    for (size_t t = 0; t < kT; ++t) acc[r][t] = _mm512_setzero_ps();
  }
  const PairX* xs[kT];
  const size_t full = n_blocks / 2;
  for (size_t p = 0; p < full; ++p) {
    for (size_t t = 0; t < kT; ++t) xs[t] = px + t * n_pairs + p;
    pair_step<K, kR, kT, true>(rows, p * pair_bytes, ahead, xs, acc);
  }
  if (n_blocks % 2 != 0) {
    for (size_t t = 0; t < kT; ++t) xs[t] = px + t * n_pairs + full;
    pair_step<K, kR, kT, false>(rows, full * pair_bytes, ahead, xs, acc);
  }
  for (size_t r = 0; r < kR; ++r) {
    for (size_t t = 0; t < kT; ++t) y[t * ldy + r] = _mm512_reduce_add_ps(acc[r][t]);
  }
}

// The 32-element block formats (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0) for the tiling below (run):
// blocks in pairs, two to a PairX.
template <Kind K>
struct BlockFormat {
  using X = PairX;
  static size_t units(size_t n_cols) { return n_cols / 32; }  // blocks a row
  static size_t pairs(size_t n_cols) { return (units(n_cols) + 1) / 2; }
  QEVICT_Q8_TARGET static void prepare(const float* x, size_t ldx, size_t n_tokens, size_t n_cols,
                                       X* px) {
    prepare_x<K>(x, ldx, n_tokens, units(n_cols), px);
  }
  template <size_t kR, size_t kT>
  QEVICT_Q8_TARGET static void tile(const uint8_t* w, size_t row_bytes, size_t n_units, const X* px,
                                    size_t n_pairs, float* y, size_t ldy) {
    block_tile<K, kR, kT>(w, row_bytes, n_units, px, n_pairs, y, ldy);
  }
};

// ---- K-quants: Q4_K and Q6_K (256-element super-blocks of 32-element sub-blocks) ----
//
// A pair is two consecutive sub-blocks, bytes [A 0-31 | B 0-31] (Q8_0's order), so X is
// prepared as for Q8_0, plus what the formulas need: Q4_K's "- dmin m d_x sum q" takes
// KPairX::sa (lane 0: d_A sum q_A, lane 8: d_B sum q_B), Q6_K's "- 32 sum q" per 16 elements
// starts the integer accumulator (KPairX::init, lanes 0, 4, 8, 12). Per-lane scales follow
// the codes: Q4_K's d·scale per sub-block (lanes 0-7 and 8-15), Q6_K's d·scale per 16
// elements (4 lanes each). A super-block's eight (Q4_K) or sixteen (Q6_K) scales are decoded
// to f32 once per row and super-block, shared by the tile's tokens.
struct alignas(64) KPairX {
  int8_t q[64];
  float d[16];
  float sa[16];
  int32_t init[16];
};

template <GgmlType T>
QEVICT_Q8_TARGET void prepare_kx(const float* x, size_t ldx, size_t n_tokens, size_t n_pairs,
                                 KPairX* px) {
  for (size_t t = 0; t < n_tokens; ++t) {
    for (size_t p = 0; p < n_pairs; ++p) {
      KPairX& o = px[t * n_pairs + p];
      std::memset(&o, 0, sizeof o);
      for (size_t h = 0; h < 2; ++h) {
        int8_t* q = o.q + 32 * h;
        int32_t sum = 0;
        const float d = quantize_block(x + t * ldx + (2 * p + h) * 32, q, q + 16, &sum);
        for (int l = 0; l < 8; ++l) o.d[8 * h + l] = d;
        if constexpr (T == GgmlType::kQ4_K) {
          o.sa[8 * h] = d * static_cast<float>(sum);
        } else {
          int32_t lo = 0;
          for (int i = 0; i < 16; ++i) lo += q[i];
          o.init[8 * h] = -32 * lo;
          o.init[8 * h + 4] = -32 * (sum - lo);
        }
      }
    }
  }
}

// A super-block's scales as f32 (Q4_K: lanes 0-7 d·scale of sub-blocks 0-7, lanes 8-15
// dmin·min; Q6_K: d·scale of its 16 groups of 16), each product exact.
template <GgmlType T>
QEVICT_Q8_TARGET inline __m512 super_scales(const uint8_t* sb) {
  if constexpr (T == GgmlType::kQ4_K) {
    uint16_t hd, hm;
    std::memcpy(&hd, sb, 2);
    std::memcpy(&hm, sb + 2, 2);
    alignas(64) int32_t v[16];
    for (int s = 0; s < 8; ++s) ref::q4_k_scale_min(sb + 4, s, &v[s], &v[8 + s]);
    const __m128 dm = _mm_cvtph_ps(_mm_cvtsi32_si128(int(hd | uint32_t{hm} << 16)));
    const __m512 dd =
        _mm512_permutexvar_ps(_mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1),
                              _mm512_castps128_ps512(dm));
    return _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_load_si512(v)), dd);
  } else {
    uint16_t hd;
    std::memcpy(&hd, sb + 208, 2);
    const __m512 d = _mm512_set1_ps(_mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(hd))));
    const __m512i sc =
        _mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(sb + 192)));
    return _mm512_mul_ps(_mm512_cvtepi32_ps(sc), d);
  }
}

// Pair i (0-3) of a super-block: its codes, per-lane scales (and Q4_K's mins) from `ss`
// (super_scales).
template <GgmlType T>
QEVICT_Q8_TARGET inline WPair load_kpair(const uint8_t* sb, int i, __m512 ss) {
  WPair w;
  const __m512i mask = _mm512_set1_epi8(0x0F);
  if constexpr (T == GgmlType::kQ4_K) {
    const __m256i ab = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(sb + 16 + 32 * i));
    w.c = _mm512_and_si512(
        _mm512_inserti64x4(_mm512_castsi256_si512(ab), _mm256_srli_epi16(ab, 4), 1), mask);
    const __m512i lo = _mm512_set1_epi32(2 * i), hi = _mm512_set1_epi32(2 * i + 1);
    const __m512i sel = _mm512_mask_blend_epi32(0xFF00, lo, hi);
    w.d = _mm512_permutexvar_ps(sel, ss);
    w.m = _mm512_permutexvar_ps(_mm512_add_epi32(sel, _mm512_set1_epi32(8)), ss);
  } else {
    const int h = i / 2, g = i % 2;  // half of the super-block, low or high nibbles
    const __m512i ql = _mm512_loadu_si512(sb + 64 * h);
    const __m256i qh = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(sb + 128 + 32 * h));
    const __m512i lo4 = _mm512_and_si512(g == 0 ? ql : _mm512_srli_epi16(ql, 4), mask);
    // Sub-block A takes bits 4g..4g+1 of qh, B bits 4g+2..4g+3.
    const __m256i ha = g == 0 ? qh : _mm256_srli_epi16(qh, 4);
    const __m512i hab = _mm512_inserti64x4(_mm512_castsi256_si512(ha), _mm256_srli_epi16(ha, 2), 1);
    const __m512i hi2 = _mm512_slli_epi16(_mm512_and_si512(hab, _mm512_set1_epi8(3)), 4);
    w.c = _mm512_or_si512(lo4, hi2);
    // Lane l (4 elements) of the pair: group 8h + 4g... as 16-element groups 4i + l / 4.
    const __m512i gi =
        _mm512_add_epi32(_mm512_set1_epi32(4 * i),
                         _mm512_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3));
    w.d = _mm512_permutexvar_ps(gi, ss);
    w.m = _mm512_setzero_ps();
  }
  return w;
}

template <GgmlType T, size_t kR, size_t kT>
QEVICT_Q8_TARGET void kquant_tile(const uint8_t* w, size_t row_bytes, size_t n_super,
                                  const KPairX* px, size_t n_pairs, float* y, size_t ldy) {
  constexpr size_t sb_bytes = T == GgmlType::kQ4_K ? 144 : 210;
  const uint8_t* rows[kR];
  for (size_t r = 0; r < kR; ++r) rows[r] = w + r * row_bytes;
  const size_t ahead = kPrefetchTiles * kR * row_bytes;
  __m512 acc[kR][kT];
  for (size_t r = 0; r < kR; ++r) {
    for (size_t t = 0; t < kT; ++t) acc[r][t] = _mm512_setzero_ps();
  }
  for (size_t b = 0; b < n_super; ++b) {
    __m512 ss[kR];
    for (size_t r = 0; r < kR; ++r) {
      const uint8_t* sb = rows[r] + b * sb_bytes;
      for (size_t o = 0; o < sb_bytes; o += 64)
        _mm_prefetch(reinterpret_cast<const char*>(sb + ahead + o), _MM_HINT_T0);
      ss[r] = super_scales<T>(sb);
    }
    for (int i = 0; i < 4; ++i) {
      WPair wp[kR];
      for (size_t r = 0; r < kR; ++r) wp[r] = load_kpair<T>(rows[r] + b * sb_bytes, i, ss[r]);
      for (size_t t = 0; t < kT; ++t) {
        const KPairX& x = px[t * n_pairs + 4 * b + i];
        const __m512i q = _mm512_load_si512(x.q);
        const __m512 dx = _mm512_load_ps(x.d);
        const __m512i init = _mm512_load_si512(x.init);
        for (size_t r = 0; r < kR; ++r) {
          const __m512i dot = _mm512_dpbusd_epi32(init, wp[r].c, q);
          acc[r][t] =
              _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot), _mm512_mul_ps(wp[r].d, dx), acc[r][t]);
          if constexpr (T == GgmlType::kQ4_K)
            acc[r][t] = _mm512_fnmadd_ps(wp[r].m, _mm512_load_ps(x.sa), acc[r][t]);
        }
      }
    }
  }
  for (size_t r = 0; r < kR; ++r) {
    for (size_t t = 0; t < kT; ++t) y[t * ldy + r] = _mm512_reduce_add_ps(acc[r][t]);
  }
}

// Q4_K and Q6_K for the tiling below: 256-element super-blocks, four pairs to one, prepared
// as KPairX.
template <GgmlType T>
struct KQuantFormat {
  using X = KPairX;
  static size_t units(size_t n_cols) { return n_cols / 256; }  // super-blocks a row
  static size_t pairs(size_t n_cols) { return n_cols / 64; }
  QEVICT_Q8_TARGET static void prepare(const float* x, size_t ldx, size_t n_tokens, size_t n_cols,
                                       X* px) {
    prepare_kx<T>(x, ldx, n_tokens, pairs(n_cols), px);
  }
  template <size_t kR, size_t kT>
  QEVICT_Q8_TARGET static void tile(const uint8_t* w, size_t row_bytes, size_t n_units, const X* px,
                                    size_t n_pairs, float* y, size_t ldy) {
    kquant_tile<T, kR, kT>(w, row_bytes, n_units, px, n_pairs, y, ldy);
  }
};

// ---- The tiling every format shares (F: BlockFormat or KQuantFormat) ----

// kT tokens' outputs over every row, in tiles of 4 rows (then single rows).
template <class F, size_t kT>
QEVICT_Q8_TARGET void rows_of(const uint8_t* w, size_t row_bytes, size_t n_rows, size_t n_units,
                              const typename F::X* px, size_t n_pairs, float* y, size_t ldy) {
  constexpr size_t kR = 4;
  size_t r = 0;
  for (; r + kR <= n_rows; r += kR) {
    F::template tile<kR, kT>(w + r * row_bytes, row_bytes, n_units, px, n_pairs, y + r, ldy);
  }
  for (; r < n_rows; ++r) {
    F::template tile<1, kT>(w + r * row_bytes, row_bytes, n_units, px, n_pairs, y + r, ldy);
  }
}

template <class F>
QEVICT_Q8_TARGET void run(const uint8_t* w, size_t row_bytes, size_t n_rows, size_t n_cols,
                          const float* x, size_t ldx, size_t n_tokens, float* y, size_t ldy) {
  using X = typename F::X;
  const size_t n_units = F::units(n_cols), n_pairs = F::pairs(n_cols);
  // thread_local: the activations in 8 bits, a matmul call's scratch (the model's, not a KV
  // cache's), sized by its tokens; matmul's API takes no scratch.
  thread_local std::vector<X> scratch;
  if (scratch.size() < n_tokens * n_pairs) scratch.resize(n_tokens * n_pairs);
  X* px = scratch.data();
  F::prepare(x, ldx, n_tokens, n_cols, px);
  // Tiles of up to 4 tokens: each weight pair is unpacked once per tile.
  size_t t = 0;
  for (; t + 4 <= n_tokens; t += 4) {
    rows_of<F, 4>(w, row_bytes, n_rows, n_units, px + t * n_pairs, n_pairs, y + t * ldy, ldy);
  }
  const size_t left = n_tokens - t;
  const X* pt = px + t * n_pairs;
  float* yt = y + t * ldy;
  if (left == 3) rows_of<F, 3>(w, row_bytes, n_rows, n_units, pt, n_pairs, yt, ldy);
  if (left == 2) rows_of<F, 2>(w, row_bytes, n_rows, n_units, pt, n_pairs, yt, ldy);
  if (left == 1) rows_of<F, 1>(w, row_bytes, n_rows, n_units, pt, n_pairs, yt, ldy);
  // A few MiB of scratch (long rows x many tokens) are not kept past the call.
  if (scratch.size() * sizeof(X) > (size_t(4) << 20)) std::vector<X>().swap(scratch);
}
#endif  // __x86_64__

}  // namespace

bool available() { return cpu::avx512_vnni(); }
bool enabled() { return cpu::avx512_vnni() && g_on.load(std::memory_order_relaxed); }
void set_enabled(bool on) { g_on.store(on, std::memory_order_relaxed); }
bool supports(GgmlType t) { return ref::q8_supported(t); }

void matmul(GgmlType type, const uint8_t* w, size_t row_bytes, size_t n_rows, size_t n_cols,
            const float* x, size_t ldx, size_t n_tokens, float* y, size_t ldy) {
#if defined(__x86_64__)
  switch (type) {
    case GgmlType::kQ4_0:
      return run<BlockFormat<Kind::kQ4_0>>(w, row_bytes, n_rows, n_cols, x, ldx, n_tokens, y, ldy);
    case GgmlType::kQ4_1:
      return run<BlockFormat<Kind::kQ4_1>>(w, row_bytes, n_rows, n_cols, x, ldx, n_tokens, y, ldy);
    case GgmlType::kQ5_0:
      return run<BlockFormat<Kind::kQ5_0>>(w, row_bytes, n_rows, n_cols, x, ldx, n_tokens, y, ldy);
    case GgmlType::kQ5_1:
      return run<BlockFormat<Kind::kQ5_1>>(w, row_bytes, n_rows, n_cols, x, ldx, n_tokens, y, ldy);
    case GgmlType::kQ8_0:
      return run<BlockFormat<Kind::kQ8_0>>(w, row_bytes, n_rows, n_cols, x, ldx, n_tokens, y, ldy);
    case GgmlType::kQ4_K:
      return run<KQuantFormat<GgmlType::kQ4_K>>(w, row_bytes, n_rows, n_cols, x, ldx, n_tokens, y,
                                                ldy);
    case GgmlType::kQ6_K:
      return run<KQuantFormat<GgmlType::kQ6_K>>(w, row_bytes, n_rows, n_cols, x, ldx, n_tokens, y,
                                                ldy);
    default:
      break;
  }
#endif
  (void)type, (void)w, (void)row_bytes, (void)n_rows, (void)n_cols, (void)x, (void)ldx;
  (void)n_tokens, (void)y, (void)ldy;
}

}  // namespace qevict::q8
