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
#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>

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

// Calls f(std::integral_constant<int, K>()) with K = k for k in 1..7, else 8: turns a small
// run-time count (vectors per head dim, query heads per pass) into a template constant.
template <class F>
HWY_INLINE void WithUpTo8(int k, F&& f) {
  switch (k) {
    case 1:
      f(std::integral_constant<int, 1>());
      break;
    case 2:
      f(std::integral_constant<int, 2>());
      break;
    case 3:
      f(std::integral_constant<int, 3>());
      break;
    case 4:
      f(std::integral_constant<int, 4>());
      break;
    case 5:
      f(std::integral_constant<int, 5>());
      break;
    case 6:
      f(std::integral_constant<int, 6>());
      break;
    case 7:
      f(std::integral_constant<int, 7>());
      break;
    default:
      f(std::integral_constant<int, 8>());
      break;
  }
}

// Unpacks the N codes of channels [c0, c0 + N) of a packed row (c0 a multiple of N), codes
// of kBits bits. The width is a constant, so the hot loops carry no test of it.
template <int kBits>
struct CodeUnpacker {
  static constexpr int kBytes = static_cast<int>(hl::MaxLanes(LbTag())) * kBits / 8;
  static_assert(kBytes == 0 || kBytes == 1 || kBytes == 2 || kBytes == 4 || kBytes == 8,
                "lanes x bits");
  LbTag df;
  hl::RebindToUnsigned<LbTag> du;
  hl::Vec<hl::RebindToUnsigned<LbTag>> shift, mask;
  hl::Mask<hl::RebindToUnsigned<LbTag>> hi;  // lanes whose code is in the second 32 bits
  CodeUnpacker() {
    const auto bitpos = hl::Mul(hl::Iota(du, 0), hl::Set(du, uint32_t(kBits)));
    shift = hl::And(bitpos, hl::Set(du, 31u));
    const hl::RebindToSigned<LbTag> di;  // (unsigned compares are not on every target)
    hi = hl::RebindMask(du, hl::Gt(hl::BitCast(di, bitpos), hl::Set(di, 31)));
    mask = hl::Set(du, (1u << kBits) - 1);
  }
  HWY_INLINE hl::Vec<LbTag> operator()(const uint8_t* row, int c0) const {
    // One plain load of the exact width: a memcpy of a run-time size is a libc call whose
    // partial stores the 64-bit reload then waits on (store forwarding fails).
    const uint8_t* src = row + c0 * kBits / 8;
    uint64_t w;
    if constexpr (kBytes == 4) {
      uint32_t x;
      std::memcpy(&x, src, 4);
      w = x;
    } else if constexpr (kBytes == 8) {
      std::memcpy(&w, src, 8);
    } else if constexpr (kBytes == 2) {
      uint16_t x;
      std::memcpy(&x, src, 2);
      w = x;
    } else {  // one byte or part of one (targets of 1 or 2 lanes: c0 need not start it)
      w = src[0] >> ((c0 * kBits) & 7);
    }
    auto v = hl::Set(du, uint32_t(w));
    if constexpr (kBytes > 4) v = hl::IfThenElse(hi, hl::Set(du, uint32_t(w >> 32)), v);
    return hl::ConvertTo(df, hl::And(hl::Shr(v, shift), mask));
  }
};

// Calls f(std::integral_constant<int, B>()) with B = bits (2 or 4).
template <class F>
HWY_INLINE void WithBits(int bits, F&& f) {
  if (bits == 2) {
    f(std::integral_constant<int, 2>());
  } else {
    assert(bits == 4);
    f(std::integral_constant<int, 4>());
  }
}

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

// Head h's key scales and zeros of channels [c, c + N) as vectors, either format
// (kv_quant.h: f16, or kmeta 8's codes — the same f32 values as key_params).
HWY_INLINE void KeyParamVecs(const QuantLayout& L, const uint8_t* win, int h, int c,
                             hl::Vec<LbTag>* s, hl::Vec<LbTag>* z) {
  const LbTag df;
  if (L.kmeta == 8) {
    const hl::RebindToUnsigned<LbTag> du;
    const hl::RebindToSigned<LbTag> di;
    const hl::Rebind<uint8_t, decltype(du)> d8;
    const hl::Rebind<int8_t, decltype(di)> di8;
    const auto code = hl::PromoteTo(du, hl::LoadU(d8, win + L.k_scale_off(h) + c));
    const auto bits = hl::Add(hl::ShiftLeft<20>(code), hl::Set(du, 107u << 23));
    const auto zero = hl::RebindMask(du, hl::Lt(hl::BitCast(di, code), hl::Set(di, 8)));
    *s = hl::BitCast(df, hl::IfThenZeroElse(zero, bits));
    const auto n = hl::PromoteTo(
        di, hl::LoadU(di8, reinterpret_cast<const int8_t*>(win + L.k_zero_off(h)) + c));
    *z = hl::Mul(hl::ConvertTo(df, n), hl::Mul(*s, hl::Set(df, 0.5f)));
    return;
  }
  const hl::Rebind<hwy::float16_t, LbTag> dh;
  *s = hl::PromoteTo(
      df, hl::LoadU(dh, reinterpret_cast<const hwy::float16_t*>(win + L.k_scale_off(h)) + c));
  *z = hl::PromoteTo(
      df, hl::LoadU(dh, reinterpret_cast<const hwy::float16_t*>(win + L.k_zero_off(h)) + c));
}

inline void QwinKeys(const QuantLayout& L, const uint8_t* win, int h, int n, const RopeTable& rope,
                     int row0, float* k, int64_t ldk) {
  const LbTag df;
  const int N = static_cast<int>(hl::Lanes(df));
  const int d = L.head_dim, bits = L.kb();
  assert(rope.head_dim() == d && d <= 1024 && row0 >= 0 && row0 + L.window <= rope.limit());
  const size_t row_bytes = L.k_row_bytes();
  HWY_ALIGN float s[1024], z[1024], pre[1024], cwide[1024], swide[1024];
  {
    int c = 0;
    for (; c + N <= d; c += N) {  // any alignment: LoadU
      hl::Vec<LbTag> sv, zv;
      KeyParamVecs(L, win, h, c, &sv, &zv);
      hl::Store(sv, df, s + c);
      hl::Store(zv, df, z + c);
    }
    if (c < d) key_params(L, win, h, s, z, c);  // the tail channels, scalar (the same values)
  }
  const RopeParams& rp = rope.params();
  const int dv = d / N * N;
  const bool fused = rp.style == RopeStyle::kNormal && N >= 2;
  WithBits(bits, [&](auto kb) {
    const CodeUnpacker<decltype(kb)::value> unpack;
    for (int t = 0; t < n; ++t) {
      const uint8_t* row = win + L.k_codes_off(h) + size_t(t) * row_bytes;
      const int r = row0 + t;
      const float* cx = rope.cosx_row(r);
      const float* sx = rope.sinx_row(r);
      if (r >= RopeTable::kLevelRows) {  // past the first level (ω > 256, or row0 + t): compose
        rope.expanded(r, cwide, swide);
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
        hl::Store(hl::MulAdd(unpack(row, c), hl::Load(df, s + c), hl::Load(df, z + c)), df,
                  pre + c);
      for (int c = dv; c < d; ++c) pre[c] = CodeAt(row, c, bits) * s[c] + z[c];
      RotateRow(rp, d, cx, sx, false, pre, out);
    }
  });
}

// Scores straight from the codes (lowbit.h qwin_scores): QwinKeys' decode and rotation and
// QkF32Folded<8>'s multiply-adds and folds, the same operations in the same order, with each
// key row kept in DV registers instead of written and read back.
inline bool QwinScoresSupported(const QuantLayout& L, const RopeTable& rope, int g) {
  const LbTag df;
  const hl::ScalableTag<float> dfull;  // qk_scores_f32's vectors: the folds must match
  const int N = static_cast<int>(hl::Lanes(df)), d = L.head_dim;
  const RopeParams& rp = rope.params();
  const bool rot = rp.style == RopeStyle::kNormal ||
                   (rp.style == RopeStyle::kNeox && rp.n_rot == d && (d / 2) % N == 0);
  return N >= 8 && size_t(N) == hl::Lanes(dfull) && d % N == 0 && d / N <= 8 && g >= 1 && g <= 16 &&
         rope.head_dim() == d && L.window <= RopeTable::kLevelRows && rot;
}

// qwin_scores_by_nibbles: QwinScores4Dv's layouts (see there).
inline bool QwinScores4Supported(const QuantLayout& L, const RopeTable& rope) {
  const LbTag df;
  const int N = static_cast<int>(hl::Lanes(df)), d = L.head_dim;
  const bool neox = rope.params().style == RopeStyle::kNeox;
  return N >= 8 && d / N <= 8 && L.kb() == 4 && rope.has_pair_rows() && d % (2 * N) == 0 &&
         (!neox || d % (4 * N) == 0);
}

#if HWY_TARGET != HWY_SCALAR
// accs [g][8][N]: for each query head j and token t < 8, N partial sums of its score →
// scores[j·lds + t] = scale · (their sum), t < nt. One transposing fold for the 8 tokens
// (adjacent lanes added pairwise), the same for every caller, so their sums match.
HWY_INLINE void FoldTokenSums(const float* HWY_RESTRICT accs, int g, int nt, float scale,
                              float* scores, int64_t lds) {
  constexpr int T = 8;
  const LbTag df;
  const int N = static_cast<int>(hl::Lanes(df));
  HWY_ALIGN float tmp[16] = {};  // (targets under 8 lanes never get here: supported says no)
  for (int j = 0; j < g; ++j) {
    hl::Vec<LbTag> a[T];
    for (int t = 0; t < T; ++t) a[t] = hl::Load(df, accs + (j * T + t) * N);
    for (int cnt = T; cnt > 1; cnt /= 2)
      for (int i = 0; i < cnt / 2; ++i)
        a[i] = hl::Add(hl::ConcatEven(df, a[2 * i + 1], a[2 * i]),
                       hl::ConcatOdd(df, a[2 * i + 1], a[2 * i]));
    auto x = a[0];
    for (int seg = N / T; seg > 1; seg /= 2)
      x = hl::Add(hl::ConcatEven(df, x, x), hl::ConcatOdd(df, x, x));
    // Lanes [0, 8) are the tokens' sums: a whole fold is scaled and stored as one vector of 8
    // (the same products as lane by lane), a partial one lane by lane (nothing past nt).
    if constexpr (hl::MaxLanes(LbTag()) == T || hl::MaxLanes(LbTag()) == 2 * T) {
      if (nt == T) {
        const auto y = hl::Mul(x, hl::Set(df, scale));
        if constexpr (hl::MaxLanes(LbTag()) == T) {
          hl::StoreU(y, df, scores + j * lds);
        } else {
          const hl::Half<LbTag> dh;
          hl::StoreU(hl::LowerHalf(dh, y), dh, scores + j * lds);
        }
        continue;
      }
    }
    hl::Store(x, df, tmp);
    for (int t = 0; t < nt; ++t) scores[j * lds + t] = tmp[t] * scale;
  }
}

template <int DV, int KB>
HWY_INLINE void QwinScoresDv(const QuantLayout& L, const uint8_t* win, int h, int n,
                             const RopeTable& rope, int row0, const float* q, int64_t ldq, int g,
                             float scale, float* scores, int64_t lds) {
  constexpr int T = 8;
  const LbTag df;
  const int N = static_cast<int>(hl::Lanes(df));
  const size_t row_bytes = L.k_row_bytes();
  hl::Vec<LbTag> sv[DV], zv[DV];
  for (int k = 0; k < DV; ++k) KeyParamVecs(L, win, h, k * N, &sv[k], &zv[k]);
  const CodeUnpacker<KB> unpack;
  const bool neox = rope.params().style == RopeStyle::kNeox;
  HWY_ALIGN float accs[16 * T * 16];  // [head][token][lane]
  for (int j0 = 0; j0 < n; j0 += T) {
    const int nt = n - j0 < T ? n - j0 : T;
    for (int t = 0; t < T; ++t) {
      if (t >= nt) {  // padding: its lanes never reach a valid token's sum
        for (int j = 0; j < g; ++j) hl::Store(hl::Zero(df), df, accs + (j * T + t) * N);
        continue;
      }
      const int tw = j0 + t;  // offset in the window
      const uint8_t* row = win + L.k_codes_off(h) + size_t(tw) * row_bytes;
      const float* cx = rope.cosx_row(row0 + tw);
      const float* sx = rope.sinx_row(row0 + tw);
      hl::Vec<LbTag> kv[DV];
      if (!neox) {
        for (int k = 0; k < DV; ++k) {
          const auto v = hl::MulAdd(unpack(row, k * N), sv[k], zv[k]);
          kv[k] = hl::MulAdd(hl::Reverse2(df, v), hl::LoadU(df, sx + k * N),
                             hl::Mul(v, hl::LoadU(df, cx + k * N)));
        }
      } else {
        hl::Vec<LbTag> pre[DV];
        for (int k = 0; k < DV; ++k) pre[k] = hl::MulAdd(unpack(row, k * N), sv[k], zv[k]);
        for (int k = 0; k < DV; ++k) {
          const int pk = k < DV / 2 ? k + DV / 2 : k - DV / 2;
          kv[k] = hl::MulAdd(pre[pk], hl::LoadU(df, sx + k * N),
                             hl::Mul(pre[k], hl::LoadU(df, cx + k * N)));
        }
      }
      for (int j = 0; j < g; ++j) {
        const float* qj = q + j * ldq;
        auto acc = hl::Zero(df);
        for (int k = 0; k < DV; ++k) acc = hl::MulAdd(hl::LoadU(df, qj + k * N), kv[k], acc);
        hl::Store(acc, df, accs + (j * T + t) * N);
      }
    }
    FoldTokenSums(accs, g, nt, scale, scores + j0, lds);
  }
}

// INT4 keys with lanes in "nibble order": N code bytes widened to N lanes give the low
// nibbles (channels 2i) and the high nibbles (channels 2i + 1) as two vectors, with no
// broadcast, variable shift or blend per vector. The window's key scales and zeros and the
// queries are put in that order once per call (ConcatEven/ConcatOdd); the two channels of a
// RoPE pair then meet lane by lane — kNormal's (2i, 2i + 1) in a low and a high vector,
// kNeox's (c, c + d/2) in two low or two high vectors — rotated by RopeTable's pair rows.
// Every rotated key element is qwin_keys' bit for bit (the same fused operations); the dot
// adds the channels in another order than qk_scores_f32 (a few ulps of Σ|q·k|).
// Micro-benchmark (bench/lowbit_bench.cpp, one window in L1, head_dim 64, 3 query heads):
// ~35 % fewer ns than QwinScoresDv's INT4 path.
// Natural channel order → nibble order for DV vectors: vector m of the low nibbles is the
// even lanes of natural vectors 2m and 2m + 1, of the high nibbles the odd ones.
template <int DV>
HWY_INLINE void ToNibbleOrder(const hl::Vec<LbTag>* x, hl::Vec<LbTag>* out) {
  constexpr int M = DV / 2;
  const LbTag df;
  for (int m = 0; m < M; ++m) {
    out[m] = hl::ConcatEven(df, x[2 * m + 1], x[2 * m]);
    out[M + m] = hl::ConcatOdd(df, x[2 * m + 1], x[2 * m]);
  }
}

// The g query rows (stride ldq) in nibble order, rows of DV·N floats: [head][vector][lane].
template <int DV>
HWY_INLINE void NibbleQuery(const float* q, int64_t ldq, int g, float* qn) {
  const LbTag df;
  const int N = static_cast<int>(hl::Lanes(df));
  for (int j = 0; j < g; ++j) {
    hl::Vec<LbTag> x[DV], y[DV];
    for (int k = 0; k < DV; ++k) x[k] = hl::LoadU(df, q + j * ldq + k * N);
    ToNibbleOrder<DV>(x, y);
    for (int v = 0; v < DV; ++v) hl::StoreU(y[v], df, qn + (j * DV + v) * N);
  }
}

// QN: q is NibbleQuery's layout already (qwin_scores_prepared), else natural rows of stride
// ldq, put in that order here. G: the query heads as a constant (g == G), or 0 (any g): a
// constant count unrolls the heads' loop, so their chains of multiply-adds interleave.
template <int DV, bool QN, int G>
HWY_INLINE void QwinScores4Dv(const QuantLayout& L, const uint8_t* win, int h, int n,
                              const RopeTable& rope, int row0, const float* q, int64_t ldq,
                              int g_any, float scale, float* scores, int64_t lds) {
  static_assert(DV % 2 == 0, "low and high nibble vectors");
  const int g = G > 0 ? G : g_any;
  constexpr int T = 8, M = DV / 2;  // M vectors of low nibbles, then M of high ones
  const LbTag df;
  const hl::RebindToUnsigned<LbTag> du;
  const hl::Rebind<uint8_t, decltype(du)> d8;
  const int N = static_cast<int>(hl::Lanes(df));
  const size_t row_bytes = L.k_row_bytes();
  hl::Vec<LbTag> sv[DV], zv[DV];
  {
    hl::Vec<LbTag> sn[DV], zn[DV];
    for (int k = 0; k < DV; ++k) KeyParamVecs(L, win, h, k * N, &sn[k], &zn[k]);
    ToNibbleOrder<DV>(sn, sv);
    ToNibbleOrder<DV>(zn, zv);
  }
  HWY_ALIGN float qbuf[QN ? 1 : 16 * DV * 16];  // [head][vector][lane], nibble order
  const float* qn = q;
  if constexpr (!QN) {
    NibbleQuery<DV>(q, ldq, g, qbuf);
    qn = qbuf;
  }
  // RoPE pairs (a, b) of vectors, the pair rows' slice p·N: kNormal (low m, high m); kNeox
  // (low m, low m + M/2) and (high m, high m + M/2). Spelled out per style with constant
  // indices, so that the key vectors stay in registers (an index array kept them on the stack).
  const bool neox = rope.params().style == RopeStyle::kNeox;
  // The pair rows of the window's first token; a row is head_dim / 2 floats.
  const float* const pc0 = rope.pair_cos_row(row0);
  const float* const ps0 = rope.pair_sin_row(row0);
  const size_t prow = size_t(L.head_dim / 2);
  const auto m15 = hl::Set(du, 15u);
  HWY_ALIGN float accs[16 * T * 16];  // [head][token][lane]
  const uint8_t* codes = win + L.k_codes_off(h);
  for (int j0 = 0; j0 < n; j0 += T) {
    const int nt = n - j0 < T ? n - j0 : T;
    for (int t = 0; t < T; ++t) {
      if (t >= nt) {  // padding: its lanes never reach a valid token's sum
        for (int j = 0; j < g; ++j) hl::Store(hl::Zero(df), df, accs + (j * T + t) * N);
        continue;
      }
      const int tw = j0 + t;
      const uint8_t* row = codes + size_t(tw) * row_bytes;
      hl::Vec<LbTag> kv[DV];
      for (int m = 0; m < M; ++m) {
        const auto u = hl::PromoteTo(du, hl::LoadU(d8, row + m * N));
        kv[m] = hl::MulAdd(hl::ConvertTo(df, hl::And(u, m15)), sv[m], zv[m]);
        kv[M + m] = hl::MulAdd(hl::ConvertTo(df, hl::ShiftRight<4>(u)), sv[M + m], zv[M + m]);
      }
      const float* pc = pc0 + size_t(tw) * prow;
      const float* ps = ps0 + size_t(tw) * prow;
      const auto rotate = [&](hl::Vec<LbTag>& a, hl::Vec<LbTag>& b, int p) {
        const auto c = hl::LoadU(df, pc + p * N), sn = hl::LoadU(df, ps + p * N);
        const auto a0 = a;
        a = hl::NegMulAdd(b, sn, hl::Mul(a0, c));  // a·cos − b·sin
        b = hl::MulAdd(a0, sn, hl::Mul(b, c));     // b·cos + a·sin
      };
      if (!neox) {
        for (int p = 0; p < M; ++p) rotate(kv[p], kv[M + p], p);
      } else {
        for (int p = 0; p < M / 2; ++p) rotate(kv[p], kv[p + M / 2], p);
        for (int p = M / 2; p < M; ++p) rotate(kv[M + p - M / 2], kv[M + p], p);
      }
      for (int j = 0; j < g; ++j) {
        const float* qj = qn + j * DV * N;
        auto acc = hl::Zero(df);
        for (int v = 0; v < DV; ++v) acc = hl::MulAdd(hl::LoadU(df, qj + v * N), kv[v], acc);
        hl::Store(acc, df, accs + (j * T + t) * N);
      }
    }
    FoldTokenSums(accs, g, nt, scale, scores + j0, lds);
  }
}
// QwinScores4Dv with the engine's GQA groups as constants (SmolLM2 3, Qwen2.5-Coder-1.5B 6,
// -0.5B 7), any other g at run time.
template <int DV, bool QN>
HWY_INLINE void QwinScores4G(const QuantLayout& L, const uint8_t* win, int h, int n,
                             const RopeTable& rope, int row0, const float* q, int64_t ldq, int g,
                             float scale, float* scores, int64_t lds) {
  switch (g) {
    case 3:
      QwinScores4Dv<DV, QN, 3>(L, win, h, n, rope, row0, q, ldq, g, scale, scores, lds);
      break;
    case 6:
      QwinScores4Dv<DV, QN, 6>(L, win, h, n, rope, row0, q, ldq, g, scale, scores, lds);
      break;
    case 7:
      QwinScores4Dv<DV, QN, 7>(L, win, h, n, rope, row0, q, ldq, g, scale, scores, lds);
      break;
    default:
      QwinScores4Dv<DV, QN, 0>(L, win, h, n, rope, row0, q, ldq, g, scale, scores, lds);
  }
}
#endif  // HWY_TARGET != HWY_SCALAR

// prepared: q is QwinScoresQuery's output (rows of head_dim), else natural rows of stride ldq.
inline void QwinScoresAny(const QuantLayout& L, const uint8_t* win, int h, int n,
                          const RopeTable& rope, int row0, const float* q, int64_t ldq, int g,
                          float scale, float* scores, int64_t lds, bool prepared) {
  assert(QwinScoresSupported(L, rope, g) && row0 >= 0 && row0 + n <= RopeTable::kLevelRows);
#if HWY_TARGET != HWY_SCALAR
  const LbTag df;
  const bool nibbles = QwinScores4Supported(L, rope);
  WithUpTo8(L.head_dim / static_cast<int>(hl::Lanes(df)), [&](auto dv) {
    if constexpr (decltype(dv)::value % 2 == 0) {
      if (nibbles) {
        constexpr int DV = decltype(dv)::value;
        if (prepared) {
          QwinScores4G<DV, true>(L, win, h, n, rope, row0, q, ldq, g, scale, scores, lds);
        } else {
          QwinScores4G<DV, false>(L, win, h, n, rope, row0, q, ldq, g, scale, scores, lds);
        }
        return;
      }
    }
    WithBits(L.kb(), [&](auto kb) {
      QwinScoresDv<decltype(dv)::value, decltype(kb)::value>(L, win, h, n, rope, row0, q, ldq, g,
                                                             scale, scores, lds);
    });
  });
#else
  (void)L, (void)win, (void)h, (void)n, (void)rope, (void)row0, (void)q, (void)ldq, (void)g,
      (void)scale;
  (void)scores, (void)lds, (void)prepared;
#endif
}

inline void QwinScores(const QuantLayout& L, const uint8_t* win, int h, int n,
                       const RopeTable& rope, int row0, const float* q, int64_t ldq, int g,
                       float scale, float* scores, int64_t lds) {
  QwinScoresAny(L, win, h, n, rope, row0, q, ldq, g, scale, scores, lds, false);
}
inline void QwinScoresPrepared(const QuantLayout& L, const uint8_t* win, int h, int n,
                               const RopeTable& rope, int row0, const float* qp, int g, float scale,
                               float* scores, int64_t lds) {
  QwinScoresAny(L, win, h, n, rope, row0, qp, L.head_dim, g, scale, scores, lds, true);
}
// qwin_scores_query: the nibble path's query layout, else the rows as they are.
inline void QwinScoresQuery(const QuantLayout& L, const RopeTable& rope, const float* q,
                            int64_t ldq, int g, float* out) {
  const int d = L.head_dim;
#if HWY_TARGET != HWY_SCALAR
  const LbTag df;
  if (QwinScores4Supported(L, rope)) {  // head_dim: an even number of vectors, 2..8
    WithUpTo8(d / static_cast<int>(hl::Lanes(df)), [&](auto dv) {
      if constexpr (decltype(dv)::value % 2 == 0) NibbleQuery<decltype(dv)::value>(q, ldq, g, out);
    });
    return;
  }
#else
  (void)rope;
#endif
  for (int j = 0; j < g; ++j) std::memcpy(out + size_t(j) * d, q + j * ldq, sizeof(float) * d);
}

inline void QwinValues(const QuantLayout& L, const uint8_t* win, int h, int n, float* v,
                       int64_t ldv) {
  const LbTag df;
  const int N = static_cast<int>(hl::Lanes(df));
  const int d = L.head_dim, bits = L.vb(), g = L.g(), ng = d / g;
  const size_t row_bytes = L.v_row_bytes();
  const uint8_t* vs = win + L.v_scale_off(h);
  const uint8_t* vz = win + L.v_zero_off(h);
  WithBits(bits, [&](auto vb) {
    const CodeUnpacker<decltype(vb)::value> unpack;
    for (int t = 0; t < n; ++t) {
      const uint8_t* row = win + L.v_codes_off(h) + size_t(t) * row_bytes;
      float* out = v + t * ldv;
      for (int gi = 0; gi < ng; ++gi) {
        const size_t pi = size_t(t) * ng + gi;
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
  });
}

// out[j][c] += Σ_t p[j][t]·v_t[c] straight from the codes: v_t[c] = s_t·code + z_t per
// group, so the sum is Σ_t (p_jt·s_t)·code_t[c] + Σ_t p_jt·z_t — one multiply-add per code
// and query head, no decoded row. Needs g() % lanes == 0 (a vector never spans two groups)
// and g ≤ 8 query heads; QwinPvSupported tells.
inline bool QwinPvSupported(const QuantLayout& L, int g) {
  const LbTag df;
  const int N = static_cast<int>(hl::Lanes(df));
  return g >= 1 && g <= 8 && L.g() % N == 0 && L.head_dim <= 1024 && L.window <= 64 &&
         L.window * (L.head_dim / L.g()) <= 64 * 64;
}

// VB vectors of channels from c, for G query heads: out[j][c, c + VB·N) += zsum[j] + Σ_t
// w[j][t]·code_t, with the G·VB accumulators in registers across the tokens.
template <int G, int VB, class Unpacker>
HWY_INLINE void QwinPvBlock(const Unpacker& unpack, const uint8_t* codes, size_t row_bytes, int n,
                            const float* HWY_RESTRICT w, const float* zsum, int c, float* out,
                            int64_t ldo) {
  const LbTag df;
  const int N = static_cast<int>(hl::Lanes(df));
  hl::Vec<LbTag> a[G][VB];
  for (int j = 0; j < G; ++j)
    for (int k = 0; k < VB; ++k) a[j][k] = hl::Set(df, zsum[j]);
  for (int t = 0; t < n; ++t) {
    const uint8_t* row = codes + size_t(t) * row_bytes;
    hl::Vec<LbTag> cv[VB];
    for (int k = 0; k < VB; ++k) cv[k] = unpack(row, c + k * N);
    for (int j = 0; j < G; ++j) {
      const auto wj = hl::Set(df, w[j * 64 + t]);
      for (int k = 0; k < VB; ++k) a[j][k] = hl::MulAdd(wj, cv[k], a[j][k]);
    }
  }
  for (int j = 0; j < G; ++j)
    for (int k = 0; k < VB; ++k) {
      float* o = out + j * ldo + c + k * N;
      hl::StoreU(hl::Add(hl::LoadU(df, o), a[j][k]), df, o);
    }
}

// QwinPv's work on one value group gi (channels [c0, c1)) for G query heads: the weights
// w[j][t] = p_jt·s_t and zsum[j] = Σ_t p_jt·z_t in token order (G independent chains in
// registers), then G vector accumulators, from zsum, across the tokens.
template <int G, class Unpacker>
HWY_INLINE void QwinPvGroup(const Unpacker& unpack, const uint8_t* codes, size_t row_bytes, int n,
                            const float* p, int64_t ldp, const float* sf, const float* zf, int ng,
                            int gi, int c0, int c1, float* out, int64_t ldo) {
  const LbTag df;
  const int N = static_cast<int>(hl::Lanes(df));
  HWY_ALIGN float w[G * 64];
  float zsum[G];
  for (int j = 0; j < G; ++j) zsum[j] = 0.0f;
  for (int t = 0; t < n; ++t) {
    const size_t pi = size_t(t) * ng + gi;
    const float st = sf[pi], zt = zf[pi];
    for (int j = 0; j < G; ++j) {
      const float pj = p[j * ldp + t];
      w[j * 64 + t] = pj * st;
      zsum[j] = std::fma(pj, zt, zsum[j]);  // fused, in token order
    }
  }
  // Blocks of VB vectors: the block's G·VB accumulators (at most 16) stay in registers
  // across the tokens, so the chains of multiply-adds interleave and each token's codes are
  // unpacked once per vector; the channels left over go one vector at a time.
  constexpr int VB = G <= 4 ? 4 : 2;
  int c = c0;
  for (; c + VB * N <= c1; c += VB * N)
    QwinPvBlock<G, VB>(unpack, codes, row_bytes, n, w, zsum, c, out, ldo);
  for (; c < c1; c += N) QwinPvBlock<G, 1>(unpack, codes, row_bytes, n, w, zsum, c, out, ldo);
}

inline void QwinPv(const QuantLayout& L, const uint8_t* win, int h, int n, const float* p,
                   int64_t ldp, int g, float* out, int64_t ldo) {
  const LbTag df;
  const int N = static_cast<int>(hl::Lanes(df));
  const int d = L.head_dim, bits = L.vb(), gs = L.g(), ng = d / gs;
  assert(QwinPvSupported(L, g) && n <= 64);
  const size_t row_bytes = L.v_row_bytes();
  const uint8_t* codes = win + L.v_codes_off(h);
  const uint8_t* vs = win + L.v_scale_off(h);
  const uint8_t* vz = win + L.v_zero_off(h);
  // The window's value scales and zeros as floats, [t][gi], by vector F16C conversion. The
  // zeros follow the scales (W·ng each): when the two fill whole vectors (an 8-token window
  // of one group a token: one vector of 16) they are converted together, partial windows
  // included (the unused tokens' values are read, never used); else a tail shorter than a
  // vector goes through a zero-padded copy.
  HWY_ALIGN float sf[64 * 64 + 16], zf[64 * 64 + 16];
  const int wp = L.window * ng;
  const float* zfp = zf;
  const hl::Rebind<hwy::float16_t, LbTag> dh;
  const auto* hs = reinterpret_cast<const hwy::float16_t*>(vs);
  if ((2 * wp) % N == 0 && 2 * wp <= 64 * 64 + 16) {
    for (int i = 0; i < 2 * wp; i += N)
      hl::Store(hl::PromoteTo(df, hl::LoadU(dh, hs + i)), df, sf + i);
    zfp = sf + wp;
  } else {
    const auto* hz = reinterpret_cast<const hwy::float16_t*>(vz);
    const int np = n * ng;
    int i = 0;
    for (; i + N <= np; i += N) {
      hl::Store(hl::PromoteTo(df, hl::LoadU(dh, hs + i)), df, sf + i);
      hl::Store(hl::PromoteTo(df, hl::LoadU(dh, hz + i)), df, zf + i);
    }
    if (i < np) {
      HWY_ALIGN uint16_t bs[16] = {}, bz[16] = {};
      std::memcpy(bs, vs + 2 * i, 2 * size_t(np - i));
      std::memcpy(bz, vz + 2 * i, 2 * size_t(np - i));
      hl::Store(hl::PromoteTo(df, hl::Load(dh, reinterpret_cast<const hwy::float16_t*>(bs))), df,
                sf + i);
      hl::Store(hl::PromoteTo(df, hl::Load(dh, reinterpret_cast<const hwy::float16_t*>(bz))), df,
                zf + i);
    }
  }
  WithBits(bits, [&](auto vb) {
    const CodeUnpacker<decltype(vb)::value> unpack;
    WithUpTo8(g, [&](auto gc) {
      for (int gi = 0; gi < ng; ++gi) {
        const int c0 = gi * gs, c1 = c0 + gs;
        QwinPvGroup<decltype(gc)::value>(unpack, codes, row_bytes, n, p, ldp, sf, zfp, ng, gi, c0,
                                         c1, out, ldo);
      }
    });
  });
}

}  // namespace HWY_NAMESPACE
}  // namespace qevict
HWY_AFTER_NAMESPACE();

#endif  // include guard
