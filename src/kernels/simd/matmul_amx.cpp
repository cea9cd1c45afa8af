// AMX-BF16 prefill matmul (see matmul_amx.h). The tile and AVX-512 code is compiled for
// those instruction sets with function attributes only, so nothing else in this file (or an
// inline function it shares with other files) can end up using them on a CPU without them.
//
// Precision: one bf16 product keeps 8 significant bits of each operand, which moved
// SmolLM2's teacher-forced logits by up to 0.40 from llama.cpp's f32 ones (the exact path:
// 0.026). So both operands are split, v = hi + lo with hi = bf16(v), lo = bf16(v - hi)
// (~16 bits), and three products are summed: x_hi w_hi + x_lo w_hi + x_hi w_lo (the
// dropped x_lo w_lo is below 2^-16 relative).
//
// Layout: X is converted once per call into hi and lo bf16 rows (A tiles: 16 tokens x 32 k,
// loaded straight from them). Weights come in panels of 32 rows, decoded to f32 and packed
// once per call into B tiles (16 k-pairs x 16 rows x 2 bf16, the "VNNI" layout; per 32 k:
// rows 0-15 hi, rows 16-31 hi, rows 0-15 lo, rows 16-31 lo). C tiles are 16 tokens x 16
// rows of f32, i.e. exactly a 16 x 16 block of Y. Steps (8 tiles in all):
//   pair_step   two panels: tmm0..tmm3 C (the 64 rows), tmm4/tmm5 X hi/lo, tmm6/tmm7 one
//               quarter's w hi/lo at a time; 12 tdpbf16ps per 32 k;
//   panel_step  an odd last panel: tmm0/tmm1 hi x hi, tmm2/tmm3 the two corrections,
//               tmm4/tmm5 X, tmm6/tmm7 w.
#include "kernels/simd/matmul_amx.h"

#include <cpuid.h>
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <vector>

// GCC 12 at -Og warns that the _mm512_undefined_* operands inside its own cast/extract
// intrinsics are used uninitialized (a known false positive; the sanitizer build shows it).
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

namespace qevict::amx {
namespace {

constexpr size_t kPanelRows = 32, kTileK = 32, kTileTokens = 16;
// u16 per panel and 32 k: four B tiles of 512 bf16.
// Per-thread scratch kept between calls (see matmul_bf16).
constexpr size_t kKeepScratchBytes = size_t(4) << 20;
constexpr size_t kPanelStep = 4 * 512;
// Bytes of packed weights that one pass over the token tiles reads. Between passes the C
// tiles go through Y (eight 1 KiB tile transfers per token tile, Y being L2- or L3-sized):
// with L1-sized passes (24-32 KiB) those transfers bound the kernel (SmolLM2 prefill at 512
// tokens ~720 tok/s); with 512 KiB (B from L2) ~925-1030; larger changed nothing.
constexpr size_t kKBlockBytes = 512 * 1024;

bool cpu_and_os_allow() {
#if defined(__x86_64__) && defined(__linux__)
  unsigned a = 0, b = 0, c = 0, d = 0;
  if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return false;
  const bool avx512f = b & (1u << 16), avx512bw = b & (1u << 30);
  const bool amx_bf16 = d & (1u << 22), amx_tile = d & (1u << 24);
  if (!__get_cpuid_count(7, 1, &a, &b, &c, &d)) return false;
  const bool avx512_bf16 = a & (1u << 5);
  if (!(avx512f && avx512bw && amx_bf16 && amx_tile && avx512_bf16)) return false;
  // Linux hands out the 8 KiB tile state only on request (ARCH_REQ_XCOMP_PERM for
  // XFEATURE_XTILEDATA); the grant is process-wide.
  constexpr long kArchReqXcompPerm = 0x1023, kXfeatureXtiledata = 18;
  return syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) == 0;
#else
  return false;
#endif
}

// On until set_enabled(false) (the CLI's --amx off or QEVICT_AMX=0, read in tools/).
std::atomic<bool> g_on{true};

#if defined(__x86_64__)
#define QEVICT_AMX_TARGET __attribute__((target("avx512f,avx512bw,avx512bf16,amx-tile,amx-bf16")))

struct alignas(64) TileConfig {
  uint8_t palette = 1;
  uint8_t start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};

QEVICT_AMX_TARGET void configure_tiles() {
  TileConfig cfg;
  for (int i = 0; i < 8; ++i) {
    cfg.colsb[i] = 64;
    cfg.rows[i] = 16;
  }
  // Not _tile_loadconfig: GCC 12's version declares an 8-byte memory operand, so the
  // stores to colsb/rows above are dead to the optimizer and vanish (every tile then stays
  // unconfigured and the first tile instruction faults). This operand is the whole struct.
  __asm__ volatile("ldtilecfg %0" ::"m"(cfg));
}

QEVICT_AMX_TARGET void release_tiles() { _tile_release(); }

// 32 floats -> their bf16 roundings hi (round to nearest even; element i at u16 i, so
// u32 j holds the pair 2j, 2j + 1) and the bf16 roundings of the remainders,
// lo = bf16(x - hi): hi + lo carries ~16 significant bits of x.
QEVICT_AMX_TARGET inline void split_bf16(const float* p, uint16_t* hi, uint16_t* lo) {
  const __m512 a = _mm512_loadu_ps(p), b = _mm512_loadu_ps(p + 16);
  const __m512bh h = _mm512_cvtne2ps_pbh(b, a);
  const __m512i hv = (__m512i)h;  // NOLINT: vector cast
  // Back to f32: bf16 is the top half of an f32.
  const __m512 ha =
      _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm512_castsi512_si256(hv)), 16));
  const __m512 hb = _mm512_castsi512_ps(
      _mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm512_extracti64x4_epi64(hv, 1)), 16));
  _mm512_storeu_si512(hi, hv);
  _mm512_storeu_si512(lo, (__m512i)_mm512_cvtne2ps_pbh(_mm512_sub_ps(b, hb), _mm512_sub_ps(a, ha)));
}

// X rows [0, n_tokens) -> xhi/xlo[t * kp + k] (split_bf16), zero beyond n_cols and
// n_tokens (up to n_tpad rows).
QEVICT_AMX_TARGET void convert_x(const float* x, size_t ldx, size_t n_tokens, size_t n_tpad,
                                 size_t n_cols, size_t kp, uint16_t* xhi, uint16_t* xlo) {
  for (size_t t = 0; t < n_tpad; ++t) {
    uint16_t* oh = xhi + t * kp;
    uint16_t* ol = xlo + t * kp;
    if (t >= n_tokens) {
      std::memset(oh, 0, kp * 2);
      std::memset(ol, 0, kp * 2);
      continue;
    }
    const float* xt = x + t * ldx;
    size_t k = 0;
    for (; k + 32 <= n_cols; k += 32) split_bf16(xt + k, oh + k, ol + k);
    if (k < kp) {  // the last partial 32: zero-padded copy
      alignas(64) float tail[32] = {};
      for (size_t i = 0; k + i < n_cols; ++i) tail[i] = xt[k + i];
      split_bf16(tail, oh + k, ol + k);
    }
  }
}

// Transposes 16 x 16 u32 in registers: r[i] lane j -> r[j] lane i.
QEVICT_AMX_TARGET inline void transpose16(__m512i r[16]) {
  __m512i a[16], b[16];
  for (int i = 0; i < 8; ++i) {
    a[2 * i] = _mm512_unpacklo_epi32(r[2 * i], r[2 * i + 1]);
    a[2 * i + 1] = _mm512_unpackhi_epi32(r[2 * i], r[2 * i + 1]);
  }
  // b[4j + c], 128-bit lane L: rows 4j..4j+3 of column 4L + c.
  for (int j = 0; j < 4; ++j) {
    b[4 * j + 0] = _mm512_unpacklo_epi64(a[4 * j], a[4 * j + 2]);
    b[4 * j + 1] = _mm512_unpackhi_epi64(a[4 * j], a[4 * j + 2]);
    b[4 * j + 2] = _mm512_unpacklo_epi64(a[4 * j + 1], a[4 * j + 3]);
    b[4 * j + 3] = _mm512_unpackhi_epi64(a[4 * j + 1], a[4 * j + 3]);
  }
  for (int c = 0; c < 4; ++c) {
    const __m512i u0 = _mm512_shuffle_i32x4(b[c], b[4 + c], 0x88);
    const __m512i u1 = _mm512_shuffle_i32x4(b[c], b[4 + c], 0xdd);
    const __m512i v0 = _mm512_shuffle_i32x4(b[8 + c], b[12 + c], 0x88);
    const __m512i v1 = _mm512_shuffle_i32x4(b[8 + c], b[12 + c], 0xdd);
    r[c] = _mm512_shuffle_i32x4(u0, v0, 0x88);
    r[4 + c] = _mm512_shuffle_i32x4(u1, v1, 0x88);
    r[8 + c] = _mm512_shuffle_i32x4(u0, v0, 0xdd);
    r[12 + c] = _mm512_shuffle_i32x4(u1, v1, 0xdd);
  }
}

// Packs 32 decoded rows (w[n * kp + k], zero-padded) into B tiles: for 32 k (kb) and
// tile q = 2 part + h (part 0 hi, 1 lo; h the 16-row half),
// out[kb * kPanelStep + q * 512 + kpair * 32 + n * 2 + e] = part of w[(16 h + n) * kp + 32 kb + 2
// kpair + e].
QEVICT_AMX_TARGET void pack_panel(const float* w, size_t kp, uint16_t* out) {
  __m512i hi[16], lo[16];
  alignas(64) uint16_t h16[32], l16[32];
  for (size_t kb = 0; kb < kp / kTileK; ++kb) {
    for (size_t h = 0; h < 2; ++h) {
      for (int n = 0; n < 16; ++n) {
        split_bf16(w + (16 * h + n) * kp + kb * kTileK, h16, l16);
        hi[n] = _mm512_load_si512(h16);
        lo[n] = _mm512_load_si512(l16);
      }
      transpose16(hi);
      transpose16(lo);
      uint16_t* oh = out + kb * kPanelStep + h * 512;
      uint16_t* ol = oh + 2 * 512;
      for (int i = 0; i < 16; ++i) {
        _mm512_storeu_si512(oh + 32 * i, hi[i]);
        _mm512_storeu_si512(ol + 32 * i, lo[i]);
      }
    }
  }
}

// Y for tokens [t0, t0 + 16) (rows of the converted X; those past n_tokens are zeros) and
// one panel (rows r0 .. r0 + 31), k steps [kb0, kb1). tmm0/tmm1 take hi x hi for the two
// 16-row halves, starting from zero (kb0 == 0) or from what Y holds; tmm2/tmm3 take the two
// correction products, from zero. Two accumulators per half keep the dependent chain of
// tdpbf16ps (latency ~3x its issue interval) at <= 2 per k step. Y = tmm0 + tmm2, tmm1 + tmm3.
QEVICT_AMX_TARGET void panel_step(const uint16_t* xhi, const uint16_t* xlo, size_t kp,
                                  const uint16_t* wp, size_t kb0, size_t kb1, size_t t0,
                                  size_t n_tokens, size_t r0, size_t n_rows, float* y, size_t ldy) {
  alignas(64) float tmp[2][16 * 16];
  const bool all_tokens = t0 + 16 <= n_tokens;
  const auto get = [&](float* t, size_t r) {
    for (size_t i = 0; i < 16; ++i)
      for (size_t j = 0; j < 16; ++j)
        t[i * 16 + j] = (t0 + i < n_tokens && r + j < n_rows) ? y[(t0 + i) * ldy + r + j] : 0.0f;
  };
  if (kb0 == 0) {
    _tile_zero(0);
    _tile_zero(1);
  } else {
    get(tmp[0], r0);
    get(tmp[1], r0 + 16);
    _tile_loadd(0, tmp[0], 64);
    _tile_loadd(1, tmp[1], 64);
  }
  _tile_zero(2);
  _tile_zero(3);
  const uint16_t* ah = xhi + t0 * kp;
  const uint16_t* al = xlo + t0 * kp;
  const long sa = static_cast<long>(kp * 2);
  for (size_t kb = kb0; kb < kb1; ++kb) {
    const uint16_t* b = wp + kb * kPanelStep;
    _tile_loadd(4, ah + kb * kTileK, sa);
    _tile_loadd(5, al + kb * kTileK, sa);
    _tile_loadd(6, b, 64);        // w hi, rows 0-15
    _tile_loadd(7, b + 512, 64);  // w hi, rows 16-31
    _tile_dpbf16ps(0, 4, 6);      // x hi . w hi
    _tile_dpbf16ps(1, 4, 7);
    _tile_dpbf16ps(2, 5, 6);  // x lo . w hi
    _tile_dpbf16ps(3, 5, 7);
    _tile_loadd(6, b + 1024, 64);  // w lo, rows 0-15
    _tile_loadd(7, b + 1536, 64);  // w lo, rows 16-31
    _tile_dpbf16ps(2, 4, 6);       // x hi . w lo
    _tile_dpbf16ps(3, 4, 7);
  }
  alignas(64) float corr[16 * 16];
  for (size_t h = 0; h < 2; ++h) {
    const size_t r = r0 + 16 * h;
    if (r >= n_rows) break;
    if (h == 0) {
      _tile_stored(0, tmp[0], 64);
      _tile_stored(2, corr, 64);
    } else {
      _tile_stored(1, tmp[1], 64);
      _tile_stored(3, corr, 64);
    }
    float* t = tmp[h];
    if (all_tokens && r + 16 <= n_rows) {
      for (size_t i = 0; i < 16; ++i) {
        _mm512_storeu_ps(y + (t0 + i) * ldy + r,
                         _mm512_add_ps(_mm512_load_ps(t + 16 * i), _mm512_load_ps(corr + 16 * i)));
      }
    } else {
      for (size_t i = 0; i < 16 && t0 + i < n_tokens; ++i)
        for (size_t j = 0; j < 16 && r + j < n_rows; ++j)
          y[(t0 + i) * ldy + r + j] = t[i * 16 + j] + corr[i * 16 + j];
    }
  }
}

// As panel_step, for two consecutive panels (rows r0 .. r0 + 63; rows past n_rows are the
// zero padding of the second panel or of its Y writes): tmm0..tmm3 hold the four 16-row
// quarters, each summing its three products in one chain; the X tiles (tmm4 hi, tmm5 lo),
// which come from L2, serve 64 rows instead of 32, and the B tiles take turns in
// tmm6 (w hi) and tmm7 (w lo).
QEVICT_AMX_TARGET void pair_step(const uint16_t* xhi, const uint16_t* xlo, size_t kp,
                                 const uint16_t* wp, size_t panel_u16, size_t kb0, size_t kb1,
                                 size_t t0, size_t n_tokens, size_t r0, size_t n_rows, float* y,
                                 size_t ldy) {
  alignas(64) float tmp[16 * 16];
  const long sy = static_cast<long>(ldy * 4);
  const bool all_tokens = t0 + 16 <= n_tokens;
  const auto whole = [&](size_t q) { return all_tokens && r0 + 16 * q + 16 <= n_rows; };
  const auto get = [&](size_t q) {
    const size_t r = r0 + 16 * q;
    for (size_t i = 0; i < 16; ++i)
      for (size_t j = 0; j < 16; ++j)
        tmp[i * 16 + j] = (t0 + i < n_tokens && r + j < n_rows) ? y[(t0 + i) * ldy + r + j] : 0.0f;
  };
  const auto put = [&](size_t q) {
    const size_t r = r0 + 16 * q;
    for (size_t i = 0; i < 16 && t0 + i < n_tokens; ++i)
      for (size_t j = 0; j < 16 && r + j < n_rows; ++j) y[(t0 + i) * ldy + r + j] = tmp[i * 16 + j];
  };
#define QEVICT_AMX_LOAD_C(q)                            \
  do {                                                  \
    if (kb0 == 0) {                                     \
      _tile_zero(q);                                    \
    } else if (whole(q)) {                              \
      _tile_loadd(q, y + t0 * ldy + r0 + 16 * (q), sy); \
    } else {                                            \
      get(q);                                           \
      _tile_loadd(q, tmp, 64);                          \
    }                                                   \
  } while (0)
  QEVICT_AMX_LOAD_C(0);
  QEVICT_AMX_LOAD_C(1);
  QEVICT_AMX_LOAD_C(2);
  QEVICT_AMX_LOAD_C(3);
#undef QEVICT_AMX_LOAD_C
  const uint16_t* ah = xhi + t0 * kp;
  const uint16_t* al = xlo + t0 * kp;
  const long sa = static_cast<long>(kp * 2);
  for (size_t kb = kb0; kb < kb1; ++kb) {
    const uint16_t* b0 = wp + kb * kPanelStep;  // first panel
    const uint16_t* b1 = b0 + panel_u16;        // second panel
    _tile_loadd(4, ah + kb * kTileK, sa);
    _tile_loadd(5, al + kb * kTileK, sa);
#define QEVICT_AMX_QUARTER(q, b)  \
  _tile_loadd(6, (b), 64);        \
  _tile_loadd(7, (b) + 1024, 64); \
  _tile_dpbf16ps(q, 4, 6);        \
  _tile_dpbf16ps(q, 5, 6);        \
  _tile_dpbf16ps(q, 4, 7)
    QEVICT_AMX_QUARTER(0, b0);
    QEVICT_AMX_QUARTER(1, b0 + 512);
    QEVICT_AMX_QUARTER(2, b1);
    QEVICT_AMX_QUARTER(3, b1 + 512);
#undef QEVICT_AMX_QUARTER
  }
#define QEVICT_AMX_STORE_C(q)                              \
  do {                                                     \
    if (r0 + 16 * (q) < n_rows) {                          \
      if (whole(q)) {                                      \
        _tile_stored(q, y + t0 * ldy + r0 + 16 * (q), sy); \
      } else {                                             \
        _tile_stored(q, tmp, 64);                          \
        put(q);                                            \
      }                                                    \
    }                                                      \
  } while (0)
  QEVICT_AMX_STORE_C(0);
  QEVICT_AMX_STORE_C(1);
  QEVICT_AMX_STORE_C(2);
  QEVICT_AMX_STORE_C(3);
#undef QEVICT_AMX_STORE_C
}
#endif  // __x86_64__

}  // namespace

bool available() {
  static const bool ok = cpu_and_os_allow();
  return ok;
}

bool enabled() { return g_on.load(std::memory_order_relaxed) && available(); }

void set_enabled(bool on) { g_on.store(on, std::memory_order_relaxed); }

void matmul_bf16(const float* x, size_t ldx, size_t n_tokens, size_t n_cols, size_t n_rows,
                 DecodeRowsFn decode, const void* ctx, float* y, size_t ldy) {
#if defined(__x86_64__)
  if (n_tokens == 0 || n_rows == 0) return;
  const size_t kp = (n_cols + kTileK - 1) / kTileK * kTileK;
  const size_t n_tpad = (n_tokens + kTileTokens - 1) / kTileTokens * kTileTokens;
  const size_t n_panels = (n_rows + kPanelRows - 1) / kPanelRows;
  // thread_local: a matmul's activation scratch (the model's, not a KV cache's, whose
  // bytes_held it is not part of), sized by the call; matmul's API takes no scratch.
  thread_local std::vector<uint16_t> xhi, xlo, wb;
  thread_local std::vector<float> rows;
  const size_t n_kb = kp / kTileK;
  const size_t panel_u16 = n_kb * kPanelStep;
  xhi.resize(n_tpad * kp);
  xlo.resize(n_tpad * kp);
  wb.resize(2 * panel_u16);  // the two panels of one step, packed just before their use
  rows.resize(kPanelRows * kp);
  convert_x(x, ldx, n_tokens, n_tpad, n_cols, kp, xhi.data(), xlo.data());
  // Decodes panel p into bf16 tiles at wb + slot * panel_u16.
  const auto pack = [&](size_t p, size_t slot) {
    const size_t r0 = p * kPanelRows, n = std::min(kPanelRows, n_rows - r0);
    decode(ctx, r0, n, rows.data(), kp);
    for (size_t r = 0; r < kPanelRows; ++r) {  // zero the padding columns and rows
      float* row = rows.data() + r * kp;
      if (r < n) {
        std::fill(row + n_cols, row + kp, 0.0f);
      } else {
        std::fill(row, row + kp, 0.0f);
      }
    }
    pack_panel(rows.data(), kp, wb.data() + slot * panel_u16);
  };
  // Loop order: two panels are packed, then a block of their k steps (kKBlockBytes of B,
  // from L2) meets every token tile in turn; the C tiles carry the partial sums through Y
  // between blocks. An odd last panel goes alone (panel_step). Packing per step keeps the
  // scratch at two panels whatever the matrix (packing it whole took ~9 MB for Qwen 0.5B's
  // FFN matrices, allocated and zeroed again by every call of a batched decode). Decoding and
  // packing leave the tiles alone.
  configure_tiles();
  for (size_t p = 0; p < n_panels; p += 2) {
    const bool pair = p + 1 < n_panels;
    pack(p, 0);
    if (pair) pack(p + 1, 1);
    const size_t kb_block = std::max<size_t>(1, kKBlockBytes / (kPanelStep * 2 * (pair ? 2 : 1)));
    const uint16_t* wp = wb.data();
    for (size_t kb0 = 0; kb0 < n_kb; kb0 += kb_block) {
      const size_t kb1 = std::min(n_kb, kb0 + kb_block);
      for (size_t t0 = 0; t0 < n_tpad; t0 += kTileTokens) {
        if (pair) {
          pair_step(xhi.data(), xlo.data(), kp, wp, panel_u16, kb0, kb1, t0, n_tokens,
                    p * kPanelRows, n_rows, y, ldy);
        } else {
          panel_step(xhi.data(), xlo.data(), kp, wp, kb0, kb1, t0, n_tokens, p * kPanelRows, n_rows,
                     y, ldy);
        }
      }
    }
  }
  release_tiles();
  // Scratch of this size stays for the next call (a batched decode of 64 rows on Qwen 0.5B's
  // 4,864-column matrices needs ~3.1 MiB, SmolLM2's 512-token prompt calls ~3.7 MiB); larger
  // (Qwen 0.5B's 512-token prompt calls: ~12 MiB) is given back, so that a thread does not
  // hold it after the prompt (a fresh allocation costs ~5 % of such a call).
  const size_t held =
      (xhi.capacity() + xlo.capacity() + wb.capacity()) * 2 + rows.capacity() * sizeof(float);
  if (held > kKeepScratchBytes) {
    std::vector<uint16_t>().swap(xhi);
    std::vector<uint16_t>().swap(xlo);
    std::vector<uint16_t>().swap(wb);
    std::vector<float>().swap(rows);
  }
#else
  (void)x, (void)ldx, (void)n_tokens, (void)n_cols, (void)n_rows, (void)decode, (void)ctx, (void)y,
      (void)ldy;
#endif
}

}  // namespace qevict::amx
