// Highway per-target bodies of kernels/lowbit.h (optimized path; scalar references in
// ref/lowbit_ref.cpp). Included once per SIMD target by simd/lowbit.cpp via foreach_target.
// Lanes are channels: a window's key scales/zeros are per channel, so they are vectors, and
// N codes (N·bits ≤ 64 bits, contiguous in a row) become N lanes with one broadcast, one
// variable shift and one mask.
#if defined(QEVICT_KERNELS_SIMD_LOWBIT_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef QEVICT_KERNELS_SIMD_LOWBIT_INL_H_
#undef QEVICT_KERNELS_SIMD_LOWBIT_INL_H_
#else
#define QEVICT_KERNELS_SIMD_LOWBIT_INL_H_
#endif

#include <cassert>
#include <cstdint>
#include <cstring>

#include "core/f16.h"
#include "hwy/highway.h"
#include "kernels/kv_quant.h"
#include "kernels/rope.h"

HWY_BEFORE_NAMESPACE();
namespace qevict {
namespace HWY_NAMESPACE {
namespace hl = hwy::HWY_NAMESPACE;

// At most 16 lanes, so that N codes of 4 bits fit in 64 bits.
using LbTag = hl::CappedTag<float, 16>;

// Unpacks the N codes of channels [c0, c0 + N) of a packed row (c0 a multiple of N).
struct CodeUnpacker {
  LbTag df;
  hl::RebindToUnsigned<LbTag> du;
  int bits, nbytes;
  hl::Vec<hl::RebindToUnsigned<LbTag>> shift, mask;
  hl::Mask<hl::RebindToUnsigned<LbTag>> hi;  // lanes whose code is in the second 32 bits
  explicit CodeUnpacker(int b) : bits(b) {
    const int N = static_cast<int>(hl::Lanes(df));
    nbytes = N * bits / 8;
    const auto bitpos = hl::Mul(hl::Iota(du, 0), hl::Set(du, uint32_t(bits)));
    shift = hl::And(bitpos, hl::Set(du, 31u));
    const hl::RebindToSigned<LbTag> di;  // (unsigned compares are not on every target)
    hi = hl::RebindMask(du, hl::Gt(hl::BitCast(di, bitpos), hl::Set(di, 31)));
    mask = hl::Set(du, (1u << bits) - 1);
  }
  HWY_INLINE hl::Vec<LbTag> operator()(const uint8_t* row, int c0) const {
    uint64_t w = 0;
    std::memcpy(&w, row + c0 * bits / 8, size_t(nbytes));
    auto v = hl::Set(du, uint32_t(w));
    if (nbytes > 4) v = hl::IfThenElse(hi, hl::Set(du, uint32_t(w >> 32)), v);
    return hl::ConvertTo(df, hl::And(hl::Shr(v, shift), mask));
  }
};

HWY_INLINE float CodeAt(const uint8_t* row, int c, int bits) {
  const int per = 8 / bits;
  return float((row[c / per] >> (bits * (c % per))) & ((1 << bits) - 1));
}

// out = x·cosx + partner(x)·sinx (sinx negated when inverse) for one row; see rope.h.
inline void RotateRow(const RopeParams& p, int d, const float* HWY_RESTRICT cosx,
                      const float* HWY_RESTRICT sinx, bool inverse, const float* HWY_RESTRICT x,
                      float* HWY_RESTRICT out) {
  const LbTag df;
  const int N = static_cast<int>(hl::Lanes(df));
  const float sg = inverse ? -1.0f : 1.0f;
  int c = 0;
  if (p.style == RopeStyle::kNormal && N >= 2) {
    const auto vsg = hl::Set(df, sg);
    for (; c + N <= d; c += N) {
      const auto v = hl::LoadU(df, x + c);
      const auto s = hl::Mul(hl::LoadU(df, sinx + c), vsg);
      hl::StoreU(hl::MulAdd(hl::Reverse2(df, v), s, hl::Mul(v, hl::LoadU(df, cosx + c))), df,
                 out + c);
    }
  } else if (p.style == RopeStyle::kNeox && p.n_rot == d && (d / 2) % N == 0) {
    const int half = d / 2;
    const auto vsg = hl::Set(df, sg);
    for (; c < d; c += N) {
      const auto v = hl::LoadU(df, x + c);
      const auto w = hl::LoadU(df, x + (c < half ? c + half : c - half));
      const auto s = hl::Mul(hl::LoadU(df, sinx + c), vsg);
      hl::StoreU(hl::MulAdd(w, s, hl::Mul(v, hl::LoadU(df, cosx + c))), df, out + c);
    }
  }
  for (; c < d; ++c) out[c] = x[c] * cosx[c] + x[rope_partner(p, c)] * (sg * sinx[c]);
}

inline void RopeRows(const RopeParams& p, int d, const float* cosx, const float* sinx, bool inverse,
                     const float* x, int64_t ldx, int n, float* out, int64_t ldo) {
  for (int r = 0; r < n; ++r) RotateRow(p, d, cosx, sinx, inverse, x + r * ldx, out + r * ldo);
}

inline void QwinKeys(const QuantLayout& L, const uint8_t* win, int h, int n, const RopeTable& rope,
                     float* k, int64_t ldk) {
  const LbTag df;
  const int N = static_cast<int>(hl::Lanes(df));
  const int d = L.head_dim, W = L.window, bits = L.bits;
  assert(rope.head_dim() == d && d <= 1024 && W <= rope.limit());
  const size_t row_bytes = size_t(d) * bits / 8;
  const uint8_t* ks = win + L.k_scale_off() + 2 * size_t(h) * d;  // any alignment: LoadU/memcpy
  const uint8_t* kz = win + L.k_zero_off() + 2 * size_t(h) * d;
  HWY_ALIGN float s[1024], z[1024], pre[1024], cwide[1024], swide[1024];
  {
    const hl::Rebind<hwy::float16_t, LbTag> dh;
    int c = 0;
    for (; c + N <= d; c += N) {
      hl::Store(
          hl::PromoteTo(df, hl::LoadU(dh, reinterpret_cast<const hwy::float16_t*>(ks + 2 * c))), df,
          s + c);
      hl::Store(
          hl::PromoteTo(df, hl::LoadU(dh, reinterpret_cast<const hwy::float16_t*>(kz + 2 * c))), df,
          z + c);
    }
    for (; c < d; ++c)
      s[c] = f16_to_f32(load_f16_bits(ks, c)), z[c] = f16_to_f32(load_f16_bits(kz, c));
  }
  const CodeUnpacker unpack(bits);
  const RopeParams& rp = rope.params();
  const int dv = d / N * N;
  const bool fused = rp.style == RopeStyle::kNormal && N >= 2;
  for (int t = 0; t < n; ++t) {
    const uint8_t* row = win + L.k_codes_off() + (size_t(h) * W + t) * row_bytes;
    const float* cx = rope.cosx_row(t);
    const float* sx = rope.sinx_row(t);
    if (t >= RopeTable::kLevelRows) {  // windows longer than one level (ω > 256): compose
      rope.expanded(t, cwide, swide);
      cx = cwide;
      sx = swide;
    }
    float* out = k + t * ldk;
    if (fused) {
      // Decode and rotate in registers: the pair partner is the adjacent lane.
      for (int c = 0; c < dv; c += N) {
        const auto v = hl::MulAdd(unpack(row, c), hl::Load(df, s + c), hl::Load(df, z + c));
        hl::StoreU(hl::MulAdd(hl::Reverse2(df, v), hl::LoadU(df, sx + c),
                              hl::Mul(v, hl::LoadU(df, cx + c))),
                   df, out + c);
      }
      for (int c = dv; c < d; ++c) pre[c] = CodeAt(row, c, bits) * s[c] + z[c];
      for (int c = dv; c < d; c += 2) {  // dv and d are even (d fills whole bytes, N even)
        out[c] = pre[c] * cx[c] + pre[c + 1] * sx[c];
        out[c + 1] = pre[c + 1] * cx[c + 1] + pre[c] * sx[c + 1];
      }
      continue;
    }
    for (int c = 0; c < dv; c += N)
      hl::Store(hl::MulAdd(unpack(row, c), hl::Load(df, s + c), hl::Load(df, z + c)), df, pre + c);
    for (int c = dv; c < d; ++c) pre[c] = CodeAt(row, c, bits) * s[c] + z[c];
    RotateRow(rp, d, cx, sx, false, pre, out);
  }
}

inline void QwinValues(const QuantLayout& L, const uint8_t* win, int h, int n, float* v,
                       int64_t ldv) {
  const LbTag df;
  const int N = static_cast<int>(hl::Lanes(df));
  const int d = L.head_dim, W = L.window, bits = L.bits, g = L.g(), ng = d / g;
  const size_t row_bytes = size_t(d) * bits / 8;
  const uint8_t* vs = win + L.v_scale_off();
  const uint8_t* vz = win + L.v_zero_off();
  const CodeUnpacker unpack(bits);
  for (int t = 0; t < n; ++t) {
    const uint8_t* row = win + L.v_codes_off() + (size_t(h) * W + t) * row_bytes;
    float* out = v + t * ldv;
    for (int gi = 0; gi < ng; ++gi) {
      const size_t pi = (size_t(h) * W + t) * ng + gi;
      const float s = f16_to_f32(load_f16_bits(vs, pi)), z = f16_to_f32(load_f16_bits(vz, pi));
      const int c0 = gi * g, c1 = c0 + g;
      int c = c0;
      if (c0 % N == 0) {
        const auto vsc = hl::Set(df, s), vze = hl::Set(df, z);
        for (; c + N <= c1; c += N) hl::StoreU(hl::MulAdd(unpack(row, c), vsc, vze), df, out + c);
      }
      for (; c < c1; ++c) out[c] = CodeAt(row, c, bits) * s + z;
    }
  }
}

}  // namespace HWY_NAMESPACE
}  // namespace qevict
HWY_AFTER_NAMESPACE();

#endif  // include guard
