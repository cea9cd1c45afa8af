// Optimized path: the SIMD matmul kernels, compiled once per Highway target (included by
// kernels/simd/matmul.cpp through foreach_target). The portable SIMD matmul; the x86-only
// paths with raw intrinsics (AMX prefill, 8-bit activations) are matmul_amx.cpp, matmul_q8.cpp.
//
// Y[t, r] = sum_k W[r, k] * X[t, k] is computed in "dot product" form: both W rows and X rows
// are contiguous along k, each (row, token) pair owns a vector accumulator whose lanes hold
// partial sums over k, and the lanes are added once at the end.
//
// Two regimes (chosen per call in Run):
//  - decode, few tokens: bound by streaming and decoding the weights. Each weight block is
//    decoded straight into registers and used for a tile of kDecodeRows rows x <=
//    kDecodeTokens tokens (Tile<Dec>), so every weight byte is read and decoded once per
//    kDecodeTokens tokens.
//  - prefill, >= kPrefillMinTokens tokens: compute-bound. kPrefillRows rows are decoded
//    once into an f32 scratch buffer and reused for all tokens with the F32 tile, so
//    decoding is amortized over every token instead of over one tile.
//
// Weight decoders produce exactly the floats ref::dequantize_row produces: every quantized
// value is q * scale (+ offset) where the product is exact in f32, so one rounding at most.

// Per-target include guard (foreach_target re-includes this file once per target).
#if defined(QEVICT_KERNELS_SIMD_MATMUL_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef QEVICT_KERNELS_SIMD_MATMUL_INL_H_
#undef QEVICT_KERNELS_SIMD_MATMUL_INL_H_
#else
#define QEVICT_KERNELS_SIMD_MATMUL_INL_H_
#endif

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "core/f16.h"
#include "gguf/ggml_types.h"
#include "hwy/aligned_allocator.h"
#include "hwy/cache_control.h"
#include "hwy/highway.h"
#include "kernels/matmul.h"
#include "kernels/ref/dequant.h"
#include "kernels/simd/matmul_amx.h"
#include "kernels/simd/matmul_q8.h"

HWY_BEFORE_NAMESPACE();
namespace qevict {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// At most 16 f32 lanes: ggml's 32-element blocks split into two 16-element halves (the
// low and the high nibbles of the same 16 bytes), so a vector must not straddle them.
using DF = hn::CappedTag<float, 16>;
using VF = hn::Vec<DF>;
using DI32 = hn::RebindToSigned<DF>;
using DU32 = hn::RebindToUnsigned<DF>;
using DU8 = hn::Rebind<uint8_t, DF>;
using DI8 = hn::Rebind<int8_t, DF>;
using DU16 = hn::Rebind<uint16_t, DF>;
using DF16 = hn::Rebind<hwy::float16_t, DF>;
constexpr size_t kLanes = hn::MaxLanes(DF());

// Tile shapes (rows x tokens held in accumulators). AVX-512 has 32 vector registers, the
// others 16. Decode tiles also hold kDecodeRows decoded weight vectors and their scales;
// prefill tiles read both operands from L1, so they are squarer to load less per FMA.
#if HWY_TARGET <= HWY_AVX3
constexpr size_t kDecodeRows = 4, kDecodeTokens = 4;
constexpr size_t kPrefillRows = 4, kPrefillTokens = 4;
#else
constexpr size_t kDecodeRows = 4, kDecodeTokens = 2;
constexpr size_t kPrefillRows = 3, kPrefillTokens = 3;
#endif
// From this many tokens on, rows are decoded once into f32 and reused for every token
// (prefill); below it, blocks are decoded into registers per token tile (decode).
constexpr size_t kPrefillMinTokens = 2 * kDecodeTokens;

// Software prefetch in the register-tile kernel: the hardware prefetchers alone leave
// DRAM-sized matrices latency-bound. A tile of kR rows prefetches, for each block it reads,
// the same block kPrefetchTiles tiles on (kPrefetchTiles * kR * row_bytes further: the rows
// of a matrix are consecutive), so those bytes are on their way for several tiles' work and
// the scale conversion (which touches every cache line of a tile first) does not stall.
// Rows of short matrices are consumed in a fraction of a microsecond: one tile ahead (the
// previous scheme) still left ConvertScales ~40 % of SmolLM2's decode matmul time, waiting
// on loads; four tiles ahead raised decode at 512 tokens from ~135 to ~160 tok/s (noisy,
// 3 x 3 runs), and changed nothing on Qwen2.5-0.5B, whose rows are 3-9x longer.
constexpr size_t kPrefetchTiles = 4;

// ------------------------------------------------------------------------------------------
// Helpers

// kLanes bytes at p, zero-extended to u32 lanes.
HWY_INLINE hn::Vec<DU32> LoadBytesU32(const uint8_t* p) {
  return hn::PromoteTo(DU32(), hn::LoadU(DU8(), p));
}

// Low (hi == false) or high nibbles of kLanes bytes at p, as f32.
HWY_INLINE VF LoadNibbles(const uint8_t* p, bool hi) {
  const DU32 du;
  const auto bytes = LoadBytesU32(p);
  const auto q = hi ? hn::ShiftRight<4>(bytes) : hn::And(bytes, hn::Set(du, 0xF));
  return hn::ConvertTo(DF(), hn::BitCast(DI32(), q));
}

// ------------------------------------------------------------------------------------------
// Weight decoders. Each describes one block format:
//   kElems, kBytes     elements and bytes per block;
//   kScaleAt[kScales]  byte offsets of the block's f16 scales. They are converted to f32
//                      in bulk ahead of use (ConvertScales): converting them one at a
//                      time costs ~3 vector ops each, as much as decoding 16 weights;
//   Begin(blk, sc)     sets up the block given its converted scales sc[kScales];
//   Get(blk, i)        returns elements [i * kLanes, (i + 1) * kLanes) of the block as f32.
// The float types use one vector as their "block"; their leftover n_cols % kLanes
// elements are read with Scalar(row, k).

struct DecF32 {
  static constexpr size_t kElems = kLanes;
  static constexpr size_t kBytes = kLanes * 4;
  static constexpr size_t kScales = 0;
  static constexpr size_t kScaleAt[1] = {0};
  HWY_INLINE void Begin(const uint8_t*, const float*) {}
  HWY_INLINE VF Get(const uint8_t* blk, size_t) const {
    return hn::LoadU(DF(), reinterpret_cast<const float*>(blk));
  }
  static float Scalar(const uint8_t* row, size_t k) {
    float v;
    std::memcpy(&v, row + 4 * k, 4);
    return v;
  }
};

struct DecF16 {
  static constexpr size_t kElems = kLanes;
  static constexpr size_t kBytes = kLanes * 2;
  static constexpr size_t kScales = 0;
  static constexpr size_t kScaleAt[1] = {0};
  HWY_INLINE void Begin(const uint8_t*, const float*) {}
  HWY_INLINE VF Get(const uint8_t* blk, size_t) const {
    return hn::PromoteTo(DF(), hn::LoadU(DF16(), reinterpret_cast<const hwy::float16_t*>(blk)));
  }
  static float Scalar(const uint8_t* row, size_t k) {
    uint16_t h;
    std::memcpy(&h, row + 2 * k, 2);
    return f16_to_f32(h);
  }
};

struct DecBF16 {
  static constexpr size_t kElems = kLanes;
  static constexpr size_t kBytes = kLanes * 2;
  static constexpr size_t kScales = 0;
  static constexpr size_t kScaleAt[1] = {0};
  HWY_INLINE void Begin(const uint8_t*, const float*) {}
  HWY_INLINE VF Get(const uint8_t* blk, size_t) const {
    // bf16 is the top half of an f32.
    const auto u = hn::PromoteTo(DU32(), hn::LoadU(DU16(), reinterpret_cast<const uint16_t*>(blk)));
    return hn::BitCast(DF(), hn::ShiftLeft<16>(u));
  }
  static float Scalar(const uint8_t* row, size_t k) {
    uint16_t h;
    std::memcpy(&h, row + 2 * k, 2);
    return bf16_to_f32(h);
  }
};

// Q4_0: f16 d | u8 qs[16]; element j < 16 = low nibble of qs[j], j + 16 = its high
// nibble; x = (q - 8) * d, computed as q * d + (-8 d): every term is exact, so the one
// rounding gives the same float.
struct DecQ4_0 {
  static constexpr size_t kElems = 32;
  static constexpr size_t kBytes = 18;
  static constexpr size_t kScales = 1;
  static constexpr size_t kScaleAt[1] = {0};
  VF d, offset;
  HWY_INLINE void Begin(const uint8_t*, const float* sc) {
    d = hn::Set(DF(), sc[0]);
    offset = hn::Set(DF(), -8.0f * sc[0]);
  }
  HWY_INLINE VF Get(const uint8_t* blk, size_t i) const {
    const size_t e = i * kLanes;
    return hn::MulAdd(LoadNibbles(blk + 2 + e % 16, e >= 16), d, offset);
  }
};

// Q4_1: f16 d | f16 m | u8 qs[16]; nibbles as Q4_0; x = q * d + m.
struct DecQ4_1 {
  static constexpr size_t kElems = 32;
  static constexpr size_t kBytes = 20;
  static constexpr size_t kScales = 2;
  static constexpr size_t kScaleAt[2] = {0, 2};
  VF d, m;
  HWY_INLINE void Begin(const uint8_t*, const float* sc) {
    d = hn::Set(DF(), sc[0]);
    m = hn::Set(DF(), sc[1]);
  }
  HWY_INLINE VF Get(const uint8_t* blk, size_t i) const {
    const size_t e = i * kLanes;
    return hn::MulAdd(LoadNibbles(blk + 4 + e % 16, e >= 16), d, m);
  }
};

// Fifth bits of elements [e, e + kLanes) of a Q5_0/Q5_1 block (bit e + l of the
// little-endian u32 qh, for lane l) as a lane mask: on AVX-512 one mask-register load,
// cheaper than moving the bits into the lanes with shifts (elsewhere Highway emulates it).
HWY_INLINE hn::Mask<DF> Q5HighBits(uint32_t qh, size_t e) {
  const uint64_t bits = static_cast<uint64_t>(qh >> e);  // LoadMaskBits reads <= 8 bytes
  uint8_t bytes[8];
  std::memcpy(bytes, &bits, 8);
  return hn::LoadMaskBits(DF(), bytes);
}

// The low four bits of elements [e, e + kLanes) of a Q4_0/Q4_1/Q5_0/Q5_1 block whose
// nibbles start at qs (element j < 16: low nibble of qs[j], j + 16: its high nibble).
HWY_INLINE hn::Vec<DI32> LowNibbles(const uint8_t* qs, size_t e) {
  const DU32 du;
  const auto bytes = LoadBytesU32(qs + e % 16);
  return hn::BitCast(DI32(), e >= 16 ? hn::ShiftRight<4>(bytes) : hn::And(bytes, hn::Set(du, 0xF)));
}

// Q5_0: f16 d | u8 qh[4] | u8 qs[16]; q = nibble (as Q4_0) | fifth bit << 4 (bit e of qh);
// x = (q - 16) * d, computed as nibble * d + (fifth bit ? 0 : -16 d): both terms are
// multiples of d below 32 |d| (5 x 11 bits), so the sum is exact and the one rounding gives
// the reference's float.
struct DecQ5_0 {
  static constexpr size_t kElems = 32;
  static constexpr size_t kBytes = 22;
  static constexpr size_t kScales = 1;
  static constexpr size_t kScaleAt[1] = {0};
  VF d, offset;
  uint32_t qh;
  HWY_INLINE void Begin(const uint8_t* blk, const float* sc) {
    d = hn::Set(DF(), sc[0]);
    offset = hn::Set(DF(), -16.0f * sc[0]);
    std::memcpy(&qh, blk + 2, 4);
  }
  HWY_INLINE VF Get(const uint8_t* blk, size_t i) const {
    const size_t e = i * kLanes;
    const VF lo = hn::ConvertTo(DF(), LowNibbles(blk + 6, e));
    return hn::MulAdd(lo, d, hn::IfThenZeroElse(Q5HighBits(qh, e), offset));
  }
};

// Q5_1: f16 d | f16 m | u8 qh[4] | u8 qs[16]; q as Q5_0; x = q * d + m (q * d exact, one
// rounding, as the reference).
struct DecQ5_1 {
  static constexpr size_t kElems = 32;
  static constexpr size_t kBytes = 24;
  static constexpr size_t kScales = 2;
  static constexpr size_t kScaleAt[2] = {0, 2};
  VF d, m;
  uint32_t qh;
  HWY_INLINE void Begin(const uint8_t* blk, const float* sc) {
    d = hn::Set(DF(), sc[0]);
    m = hn::Set(DF(), sc[1]);
    std::memcpy(&qh, blk + 4, 4);
  }
  HWY_INLINE VF Get(const uint8_t* blk, size_t i) const {
    const size_t e = i * kLanes;
    const VF lo = hn::ConvertTo(DF(), LowNibbles(blk + 8, e));
    const VF q = hn::Add(lo, hn::IfThenElseZero(Q5HighBits(qh, e), hn::Set(DF(), 16.0f)));
    return hn::MulAdd(q, d, m);
  }
};

// Q8_0: f16 d | i8 qs[32]; x = q * d.
struct DecQ8_0 {
  static constexpr size_t kElems = 32;
  static constexpr size_t kBytes = 34;
  static constexpr size_t kScales = 1;
  static constexpr size_t kScaleAt[1] = {0};
  VF d;
  HWY_INLINE void Begin(const uint8_t*, const float* sc) { d = hn::Set(DF(), sc[0]); }
  HWY_INLINE VF Get(const uint8_t* blk, size_t i) const {
    const auto q8 = hn::LoadU(DI8(), reinterpret_cast<const int8_t*>(blk + 2 + i * kLanes));
    return hn::Mul(hn::ConvertTo(DF(), hn::PromoteTo(DI32(), q8)), d);
  }
};

// Q4_K: f16 d | f16 dmin | u8 scales[12] | u8 qs[128]; 8 sub-blocks of 32 with 6-bit
// scale/min packed as in ggml's get_scale_min_k4. Chunk c of 64 elements reads
// qs[32c, 32c + 32): low nibbles are sub-block 2c, high nibbles 2c + 1.
// x = (d * scale) * q - (dmin * min).
struct DecQ4_K {
  static constexpr size_t kElems = 256;
  static constexpr size_t kBytes = 144;
  static constexpr size_t kScales = 2;
  static constexpr size_t kScaleAt[2] = {0, 2};  // d, dmin
  float scale[8], min[8];
  HWY_INLINE void Begin(const uint8_t* blk, const float* dd) {
    const float d = dd[0], dmin = dd[1];
    const uint8_t* sc = blk + 4;
    for (int s = 0; s < 4; ++s) {
      scale[s] = d * static_cast<float>(sc[s] & 63);
      min[s] = dmin * static_cast<float>(sc[s + 4] & 63);
      scale[s + 4] = d * static_cast<float>((sc[s + 8] & 0xF) | ((sc[s] >> 6) << 4));
      min[s + 4] = dmin * static_cast<float>((sc[s + 8] >> 4) | ((sc[s + 4] >> 6) << 4));
    }
  }
  HWY_INLINE VF Get(const uint8_t* blk, size_t i) const {
    const size_t e = i * kLanes;
    const size_t s = e / 32;
    const VF q = LoadNibbles(blk + 16 + 32 * (e / 64) + e % 32, (s & 1) != 0);
    return hn::MulSub(q, hn::Set(DF(), scale[s]), hn::Set(DF(), min[s]));
  }
};

// Q6_K: u8 ql[128] | u8 qh[64] | i8 scales[16] | f16 d; scale of element e is scales[e/16].
// Half h (128 elements), quarter g (32), lane l: low 4 bits from ql[64h + 32(g & 1) + l]
// (low nibble for g < 2, else high), top 2 bits from bits 2g, 2g+1 of qh[32h + l].
// x = (d * scale) * (q - 32).
struct DecQ6_K {
  static constexpr size_t kElems = 256;
  static constexpr size_t kBytes = 210;
  static constexpr size_t kScales = 1;
  static constexpr size_t kScaleAt[1] = {208};
  float scale[16];
  HWY_INLINE void Begin(const uint8_t* blk, const float* dd) {
    const float d = dd[0];
    const int8_t* sc = reinterpret_cast<const int8_t*>(blk + 192);
    for (int j = 0; j < 16; ++j) scale[j] = d * static_cast<float>(sc[j]);
  }
  HWY_INLINE VF Get(const uint8_t* blk, size_t i) const {
    const DU32 du;
    const size_t e = i * kLanes;
    const size_t h = e / 128, g = (e % 128) / 32, l = e % 32;
    const auto lo_bytes = LoadBytesU32(blk + 64 * h + 32 * (g & 1) + l);
    const auto lo = (g >> 1) ? hn::ShiftRight<4>(lo_bytes) : hn::And(lo_bytes, hn::Set(du, 0xF));
    const auto hi_bytes = LoadBytesU32(blk + 128 + 32 * h + l);
    const auto hi = hn::And(hn::ShiftRightSame(hi_bytes, static_cast<int>(2 * g)), hn::Set(du, 3));
    const auto q =
        hn::Sub(hn::BitCast(DI32(), hn::Or(lo, hn::ShiftLeft<4>(hi))), hn::Set(DI32(), 32));
    return hn::Mul(hn::ConvertTo(DF(), q), hn::Set(DF(), scale[e / 16]));
  }
};

// ------------------------------------------------------------------------------------------
// Kernels

// Blocks per row whose scales are converted together (bounds the stack buffers).
constexpr size_t kChunkBlocks = 64;

// Scales of blocks [b0, b0 + nb) of kR rows, as f32: out[(r * nb + b) * kScales + s].
template <class Dec, size_t kR>
HWY_NOINLINE void ConvertScales(const uint8_t* HWY_RESTRICT w, size_t row_bytes, size_t b0,
                                size_t nb, float* HWY_RESTRICT out) {
  constexpr size_t kMax = kR * kChunkBlocks * Dec::kScales;
  HWY_ALIGN uint16_t bits[hwy::RoundUpTo(kMax, kLanes)];
  size_t n = 0;
  for (size_t r = 0; r < kR; ++r) {
    const uint8_t* blk = w + r * row_bytes + b0 * Dec::kBytes;
    for (size_t b = 0; b < nb; ++b, blk += Dec::kBytes) {
      for (size_t s = 0; s < Dec::kScales; ++s) std::memcpy(&bits[n++], blk + Dec::kScaleAt[s], 2);
    }
  }
  for (; n % kLanes != 0; ++n) bits[n] = 0;
  const DF df;
  const DF16 dh;
  for (size_t i = 0; i < n; i += kLanes) {
    const auto h = hn::LoadU(dh, reinterpret_cast<const hwy::float16_t*>(bits + i));
    hn::Store(hn::PromoteTo(df, h), df, out + i);
  }
}

// Adds block b of kR rows times the matching x columns of kT tokens to acc[r][t].
// sc points at row 0's converted scales of block b; row r's are sc_stride floats further.
template <class Dec, size_t kR, size_t kT>
HWY_INLINE void AccumulateBlock(const uint8_t* HWY_RESTRICT w, size_t row_bytes, size_t b,
                                const float* sc, size_t sc_stride, const float* HWY_RESTRICT x,
                                size_t ldx, VF (&acc)[kR][kT]) {
  const DF df;
  const uint8_t* blk[kR];
  Dec dec[kR];
  HWY_UNROLL(16)
  for (size_t r = 0; r < kR; ++r) {
    blk[r] = w + r * row_bytes + b * Dec::kBytes;
    // Integer arithmetic: the address may lie past the end of W (a prefetch never faults).
    hwy::Prefetch(reinterpret_cast<const uint8_t*>(reinterpret_cast<uintptr_t>(blk[r]) +
                                                   kPrefetchTiles * kR * row_bytes));
    dec[r].Begin(blk[r], sc + r * sc_stride);
  }
  const float* xb = x + b * Dec::kElems;
  for (size_t i = 0; i < Dec::kElems / kLanes; ++i) {
    VF wv[kR];
    HWY_UNROLL(16)
    for (size_t r = 0; r < kR; ++r) wv[r] = dec[r].Get(blk[r], i);
    HWY_UNROLL(16)
    for (size_t t = 0; t < kT; ++t) {
      const VF xv = hn::LoadU(df, xb + t * ldx + i * kLanes);
      HWY_UNROLL(16)
      for (size_t r = 0; r < kR; ++r) acc[r][t] = hn::MulAdd(wv[r], xv, acc[r][t]);
    }
  }
}

// Y tile of kR rows x kT tokens: y[t * ldy + r] = sum_k W[r, k] * x[t * ldx + k] for
// r < kR, t < kT, k < n_cols, where row r of W starts at w + r * row_bytes.
// Each block of each row is decoded once into registers and used for all kT tokens.
// The loops over rows and tokens are unrolled completely (HWY_UNROLL) so that the
// accumulators stay in registers.
template <class Dec, size_t kR, size_t kT>
HWY_NOINLINE void Tile(const uint8_t* HWY_RESTRICT w, size_t row_bytes, size_t n_cols,
                       const float* HWY_RESTRICT x, size_t ldx, float* HWY_RESTRICT y, size_t ldy) {
  static_assert(Dec::kElems % kLanes == 0, "a block must be whole vectors");
  const DF df;
  const size_t n_blocks = n_cols / Dec::kElems;

  VF acc[kR][kT];
  HWY_UNROLL(16)
  for (size_t r = 0; r < kR; ++r) {
    HWY_UNROLL(16)
    for (size_t t = 0; t < kT; ++t) acc[r][t] = hn::Zero(df);
  }

  if constexpr (Dec::kScales == 0) {
    for (size_t b = 0; b < n_blocks; ++b) {
      AccumulateBlock<Dec, kR, kT>(w, row_bytes, b, nullptr, 0, x, ldx, acc);
    }
  } else {
    HWY_ALIGN float scales[kR * kChunkBlocks * Dec::kScales + kLanes];
    for (size_t b0 = 0; b0 < n_blocks; b0 += kChunkBlocks) {
      const size_t nb = HWY_MIN(kChunkBlocks, n_blocks - b0);
      ConvertScales<Dec, kR>(w, row_bytes, b0, nb, scales);
      for (size_t b = 0; b < nb; ++b) {
        AccumulateBlock<Dec, kR, kT>(w, row_bytes, b0 + b, scales + b * Dec::kScales,
                                     nb * Dec::kScales, x, ldx, acc);
      }
    }
  }

  HWY_UNROLL(16)
  for (size_t r = 0; r < kR; ++r) {
    HWY_UNROLL(16)
    for (size_t t = 0; t < kT; ++t) {
      float sum = hn::GetLane(hn::SumOfLanes(df, acc[r][t]));
      if constexpr (Dec::kElems == kLanes) {  // float types: leftover columns
        const uint8_t* row = w + r * row_bytes;
        for (size_t k = n_blocks * kLanes; k < n_cols; ++k) {
          sum += Dec::Scalar(row, k) * x[t * ldx + k];
        }
      }
      y[t * ldy + r] = sum;
    }
  }
}

// All n_tokens tokens for kR rows: tiles of kTMax tokens, then one narrower tile.
template <class Dec, size_t kR, size_t kTMax>
HWY_INLINE void RowTile(const uint8_t* w, size_t row_bytes, size_t n_cols, const float* x,
                        size_t ldx, size_t n_tokens, float* y, size_t ldy) {
  size_t t = 0;
  for (; t + kTMax <= n_tokens; t += kTMax) {
    Tile<Dec, kR, kTMax>(w, row_bytes, n_cols, x + t * ldx, ldx, y + t * ldy, ldy);
  }
  const float* xt = x + t * ldx;
  float* yt = y + t * ldy;
  static_assert(kTMax <= 8, "extend the switch below");
  switch (n_tokens - t) {
#define QEVICT_TOKEN_CASE(n)                                    \
  case n:                                                       \
    if constexpr (n < kTMax) {                                  \
      Tile<Dec, kR, n>(w, row_bytes, n_cols, xt, ldx, yt, ldy); \
    }                                                           \
    break;
    QEVICT_TOKEN_CASE(1)
    QEVICT_TOKEN_CASE(2)
    QEVICT_TOKEN_CASE(3)
    QEVICT_TOKEN_CASE(4)
    QEVICT_TOKEN_CASE(5)
    QEVICT_TOKEN_CASE(6)
    QEVICT_TOKEN_CASE(7)
#undef QEVICT_TOKEN_CASE
    default:
      break;
  }
}

// Decodes n_rows rows of W (row r at w + r * row_bytes; n_cols a multiple of Dec::kElems
// or, for the float types, anything) into out[r * stride + k].
template <class Dec>
HWY_NOINLINE void DecodeRows(const uint8_t* w, size_t row_bytes, size_t n_rows, size_t n_cols,
                             size_t stride, float* HWY_RESTRICT out) {
  const DF df;
  const size_t n_blocks = n_cols / Dec::kElems;
  HWY_ALIGN float scales[kChunkBlocks * HWY_MAX(Dec::kScales, 1) + kLanes];
  for (size_t r = 0; r < n_rows; ++r) {
    const uint8_t* row = w + r * row_bytes;
    float* o = out + r * stride;
    for (size_t b0 = 0; b0 < n_blocks; b0 += kChunkBlocks) {
      const size_t nb = HWY_MIN(kChunkBlocks, n_blocks - b0);
      if constexpr (Dec::kScales != 0) ConvertScales<Dec, 1>(row, row_bytes, b0, nb, scales);
      for (size_t b = b0; b < b0 + nb; ++b) {
        const uint8_t* blk = row + b * Dec::kBytes;
        Dec dec;
        dec.Begin(blk, scales + (b - b0) * Dec::kScales);
        for (size_t i = 0; i < Dec::kElems / kLanes; ++i) {
          hn::StoreU(dec.Get(blk, i), df, o + b * Dec::kElems + i * kLanes);
        }
      }
    }
    if constexpr (Dec::kElems == kLanes) {
      for (size_t k = n_blocks * kLanes; k < n_cols; ++k) o[k] = Dec::Scalar(row, k);
    }
  }
}

// ------------------------------------------------------------------------------------------
// Drivers

// One matmul call with the row range applied.
struct Job {
  const uint8_t* w;  // row row_begin of W
  size_t row_bytes;
  size_t n_cols;
  size_t n_rows;  // row_end - row_begin
  const float* x;
  size_t ldx;
  size_t n_tokens;
  float* y;  // &Y[0, row_begin]
  size_t ldy;
};

// All rows of the job from W rows at w (row_bytes apart): tiles of kR rows, then single
// rows.
template <class Dec, size_t kR, size_t kTMax>
void RunRows(const Job& j, const uint8_t* w, size_t row_bytes, size_t n_rows, float* y) {
  size_t r = 0;
  for (; r + kR <= n_rows; r += kR) {
    RowTile<Dec, kR, kTMax>(w + r * row_bytes, row_bytes, j.n_cols, j.x, j.ldx, j.n_tokens, y + r,
                            j.ldy);
  }
  for (; r < n_rows; ++r) {
    RowTile<Dec, 1, kTMax>(w + r * row_bytes, row_bytes, j.n_cols, j.x, j.ldx, j.n_tokens, y + r,
                           j.ldy);
  }
}

// Prefill regime (and types without a SIMD decoder): decode(w, n_rows, stride, out) turns
// up to kPrefillRows rows into f32 rows `stride` floats apart, which the F32 tiles then
// use for every token.
template <class DecodeFn>
void RunDecoded(const Job& j, const DecodeFn& decode) {
  const size_t stride = hwy::RoundUpTo(j.n_cols, kLanes);  // keeps scratch rows aligned
  auto scratch = hwy::AllocateAligned<float>(kPrefillRows * stride);
  const auto* s = reinterpret_cast<const uint8_t*>(scratch.get());
  for (size_t r = 0; r < j.n_rows; r += kPrefillRows) {
    const size_t n = HWY_MIN(kPrefillRows, j.n_rows - r);
    decode(j.w + r * j.row_bytes, n, stride, scratch.get());
    RunRows<DecF32, kPrefillRows, kPrefillTokens>(j, s, stride * sizeof(float), n, j.y + r);
  }
}

// Calls run(part) for consecutive parts of the job's tokens whose X rows fit in a
// quarter of a 1 MiB L2: with more tokens, every row tile would stream all of X from L3.
// Parts keep at least 4 token tiles so that decoding stays amortized for very long rows.
template <class RunFn>
void ForTokenBlocks(const Job& j, const RunFn& run) {
  constexpr size_t kXBytes = 256 * 1024;
  const size_t per_block = HWY_MAX(kXBytes / (j.n_cols * sizeof(float) + 1), 4 * kPrefillTokens);
  for (size_t t = 0; t < j.n_tokens; t += per_block) {
    Job part = j;
    part.x = j.x + t * j.ldx;
    part.y = j.y + t * j.ldy;
    part.n_tokens = HWY_MIN(per_block, j.n_tokens - t);
    run(part);
  }
}

// The AMX-BF16 path (kernels/simd/matmul_amx.h) decodes its weight rows with DecodeRows.
template <class Dec>
void DecodeForAmx(const void* ctx, size_t row0, size_t n_rows, float* out, size_t stride) {
  const Job& j = *static_cast<const Job*>(ctx);
  DecodeRows<Dec>(j.w + row0 * j.row_bytes, j.row_bytes, n_rows, j.n_cols, stride, out);
}

template <class Dec>
void Run(const Job& j) {
  if (j.n_tokens < kPrefillMinTokens) {
    return RunRows<Dec, kDecodeRows, kDecodeTokens>(j, j.w, j.row_bytes, j.n_rows, j.y);
  }
  if (j.n_tokens >= amx::kMinTokens && amx::enabled()) {
    return amx::matmul_bf16(j.x, j.ldx, j.n_tokens, j.n_cols, j.n_rows, &DecodeForAmx<Dec>, &j, j.y,
                            j.ldy);
  }
  ForTokenBlocks(j, [](const Job& part) {
    if constexpr (std::is_same_v<Dec, DecF32>) {  // already f32: no decoding
      RunRows<DecF32, kPrefillRows, kPrefillTokens>(part, part.w, part.row_bytes, part.n_rows,
                                                    part.y);
    } else {
      RunDecoded(part, [&part](const uint8_t* w, size_t n_rows, size_t stride, float* out) {
        DecodeRows<Dec>(w, part.row_bytes, n_rows, part.n_cols, stride, out);
      });
    }
  });
}

// Types without a SIMD decoder (none today; a safety net for types added to ref/ first):
// the scalar reference dequantizer, then the F32 tiles.
inline void RunViaRef(const Job& j, GgmlType type) {
  ForTokenBlocks(j, [type](const Job& part) {
    RunDecoded(part, [&part, type](const uint8_t* w, size_t n_rows, size_t stride, float* out) {
      for (size_t r = 0; r < n_rows; ++r) {
        ref::dequantize_row(type, w + r * part.row_bytes, out + r * stride,
                            static_cast<int64_t>(part.n_cols));
      }
    });
  });
}

// qevict::matmul for this target; arguments already validated.
inline void MatmulImpl(const WeightView& w, const float* x, int64_t ldx, int64_t n_tokens, float* y,
                       int64_t ldy, int64_t row_begin, int64_t row_end) {
  const Job j{w.data + static_cast<size_t>(row_begin) * w.row_bytes,
              w.row_bytes,
              static_cast<size_t>(w.n_cols),
              static_cast<size_t>(row_end - row_begin),
              x,
              static_cast<size_t>(ldx),
              static_cast<size_t>(n_tokens),
              y + row_begin,
              static_cast<size_t>(ldy)};
  // Below the AMX threshold the 32-block types take the 8-bit-activation path where it is
  // on (matmul_q8.h): every call of fewer tokens, so a token's result does not depend on
  // how many tokens share its call below amx::kMinTokens.
  if (j.n_tokens < amx::kMinTokens && q8::enabled() && q8::supports(w.type)) {
    return q8::matmul(w.type, j.w, j.row_bytes, j.n_rows, j.n_cols, j.x, j.ldx, j.n_tokens, j.y,
                      j.ldy);
  }
  switch (w.type) {
    case GgmlType::kF32:
      return Run<DecF32>(j);
    case GgmlType::kF16:
      return Run<DecF16>(j);
    case GgmlType::kBF16:
      return Run<DecBF16>(j);
    case GgmlType::kQ4_0:
      return Run<DecQ4_0>(j);
    case GgmlType::kQ4_1:
      return Run<DecQ4_1>(j);
    case GgmlType::kQ5_0:
      return Run<DecQ5_0>(j);
    case GgmlType::kQ5_1:
      return Run<DecQ5_1>(j);
    case GgmlType::kQ8_0:
      return Run<DecQ8_0>(j);
    case GgmlType::kQ4_K:
      return Run<DecQ4_K>(j);
    case GgmlType::kQ6_K:
      return Run<DecQ6_K>(j);
    default:
      return RunViaRef(j, w.type);
  }
}

}  // namespace HWY_NAMESPACE
}  // namespace qevict
HWY_AFTER_NAMESPACE();

#endif  // per-target include guard
