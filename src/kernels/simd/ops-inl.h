// Highway per-target bodies of kernels/ops.h (optimized path; the scalar references are in
// ref/ops_ref.cpp). Included once per SIMD target by simd/ops.cpp via foreach_target.
#if defined(QEVICT_KERNELS_SIMD_OPS_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef QEVICT_KERNELS_SIMD_OPS_INL_H_
#undef QEVICT_KERNELS_SIMD_OPS_INL_H_
#else
#define QEVICT_KERNELS_SIMD_OPS_INL_H_
#endif

#include <cmath>
#include <cstdint>
#include <type_traits>
#include <vector>

#include "core/f16.h"
#include "hwy/contrib/math/math-inl.h"
#include "hwy/highway.h"

HWY_BEFORE_NAMESPACE();
namespace qevict {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// Loads N halfs (f16 or bf16) as f32 lanes.
template <class DF>
HWY_INLINE hn::Vec<DF> LoadHalf(DF df, bool is_f16, const uint16_t* p) {
  if (is_f16) {
    const hn::Rebind<hwy::float16_t, DF> dh;
    return hn::PromoteTo(df, hn::LoadU(dh, reinterpret_cast<const hwy::float16_t*>(p)));
  }
  const hn::Rebind<hwy::bfloat16_t, DF> dh;
  return hn::PromoteTo(df, hn::LoadU(dh, reinterpret_cast<const hwy::bfloat16_t*>(p)));
}

HWY_INLINE float HalfScalar(bool is_f16, uint16_t h) {
  return is_f16 ? f16_to_f32(h) : bf16_to_f32(h);
}

// Key/value rows are either 16-bit halfs or f32 (decoded low-bit windows): one template
// serves both through these overloads.
template <class DF>
HWY_INLINE hn::Vec<DF> LoadRow(DF df, bool is_f16, const uint16_t* p) {
  return LoadHalf(df, is_f16, p);
}
template <class DF>
HWY_INLINE hn::Vec<DF> LoadRow(DF df, bool, const float* p) {
  return hn::LoadU(df, p);
}
HWY_INLINE float RowScalar(bool is_f16, uint16_t h) { return HalfScalar(is_f16, h); }
HWY_INLINE float RowScalar(bool, float x) { return x; }

inline void RmsNormImpl(const float* x, const float* w, float* y, int64_t n, float eps) {
  const hn::ScalableTag<float> df;
  const int64_t N = hn::Lanes(df);
  auto acc = hn::Zero(df);
  int64_t i = 0;
  for (; i + N <= n; i += N) {
    const auto v = hn::LoadU(df, x + i);
    acc = hn::MulAdd(v, v, acc);
  }
  double ss = hn::GetLane(hn::SumOfLanes(df, acc));
  for (; i < n; ++i) ss += double(x[i]) * x[i];
  const float inv = static_cast<float>(1.0 / std::sqrt(ss / double(n) + eps));
  const auto vinv = hn::Set(df, inv);
  i = 0;
  for (; i + N <= n; i += N)
    hn::StoreU(hn::Mul(hn::Mul(hn::LoadU(df, x + i), vinv), hn::LoadU(df, w + i)), df, y + i);
  for (; i < n; ++i) y[i] = x[i] * inv * w[i];
}

inline void SwigluImpl(const float* gate, const float* up, float* out, int64_t n) {
  const hn::ScalableTag<float> df;
  const int64_t N = hn::Lanes(df);
  const auto one = hn::Set(df, 1.0f);
  int64_t i = 0;
  for (; i + N <= n; i += N) {
    const auto g = hn::LoadU(df, gate + i);
    const auto e = hn::Exp(df, hn::Neg(g));
    hn::StoreU(hn::Mul(hn::Div(g, hn::Add(one, e)), hn::LoadU(df, up + i)), df, out + i);
  }
  for (; i < n; ++i) out[i] = gate[i] / (1.0f + std::exp(-gate[i])) * up[i];
}

inline void F32ToHalfImpl(bool is_f16, const float* src, uint16_t* dst, int64_t n) {
  // Conversion is not on any hot path: scalar code gives exact round-to-nearest-even for
  // both formats without depending on per-target rounding modes.
  for (int64_t i = 0; i < n; ++i) dst[i] = is_f16 ? f32_to_f16(src[i]) : f32_to_bf16(src[i]);
}

inline void HalfToF32Impl(bool is_f16, const uint16_t* src, float* dst, int64_t n) {
  const hn::ScalableTag<float> df;
  const int64_t N = hn::Lanes(df);
  int64_t i = 0;
  for (; i + N <= n; i += N) hn::StoreU(LoadHalf(df, is_f16, src + i), df, dst + i);
  for (; i < n; ++i) dst[i] = HalfScalar(is_f16, src[i]);
}

constexpr int kMaxGroup = 8;

// Calls f(std::integral_constant<int, G>{}) with G = gg (1..kMaxGroup): the group size as a
// compile-time constant, so the per-head accumulators of a block stay in registers.
template <class F>
HWY_INLINE void WithGroupSize(int gg, const F& f) {
  static_assert(kMaxGroup == 8, "extend the switch below");
  switch (gg) {
    case 1:
      f(std::integral_constant<int, 1>{});
      break;
    case 2:
      f(std::integral_constant<int, 2>{});
      break;
    case 3:
      f(std::integral_constant<int, 3>{});
      break;
    case 4:
      f(std::integral_constant<int, 4>{});
      break;
    case 5:
      f(std::integral_constant<int, 5>{});
      break;
    case 6:
      f(std::integral_constant<int, 6>{});
      break;
    case 7:
      f(std::integral_constant<int, 7>{});
      break;
    default:
      f(std::integral_constant<int, 8>{});
      break;
  }
}

// One key row against up to kMaxGroup query heads: each key chunk is converted once.
template <int G, typename KT>
HWY_INLINE void QkRow(bool is_f16, const float* q, int64_t ldq, const KT* krow, int d, float scale,
                      float* scores, int64_t lds, int64_t j) {
  const hn::ScalableTag<float> df;
  const int N = static_cast<int>(hn::Lanes(df));
  hn::Vec<decltype(df)> acc[G];
  for (int h = 0; h < G; ++h) acc[h] = hn::Zero(df);
  int c = 0;
  for (; c + N <= d; c += N) {
    const auto kv = LoadRow(df, is_f16, krow + c);
    for (int h = 0; h < G; ++h) acc[h] = hn::MulAdd(hn::LoadU(df, q + h * ldq + c), kv, acc[h]);
  }
  for (int h = 0; h < G; ++h) {
    float s = hn::GetLane(hn::SumOfLanes(df, acc[h]));
    for (int cc = c; cc < d; ++cc) s += q[h * ldq + cc] * RowScalar(is_f16, krow[cc]);
    scores[h * lds + j] = s * scale;
  }
}

template <int G, typename KT>
HWY_INLINE void QkBlock(bool is_f16, const float* q, int64_t ldq, const KT* k, int64_t ldk,
                        int64_t n, int d, float scale, float* scores, int64_t lds) {
  for (int64_t j = 0; j < n; ++j)
    QkRow<G, KT>(is_f16, q, ldq, k + j * ldk, d, scale, scores, lds, j);
}

template <typename KT>
inline void QkScoresImpl(bool is_f16, const float* q, int64_t ldq, int g, const KT* k, int64_t ldk,
                         int64_t n, int d, float scale, float* scores, int64_t lds) {
  // Heads are processed kMaxGroup at a time; within a pass every key row is read once.
  for (int h0 = 0; h0 < g; h0 += kMaxGroup) {
    const int gg = g - h0 < kMaxGroup ? g - h0 : kMaxGroup;
    const float* qh = q + h0 * ldq;
    float* sh = scores + h0 * lds;
    WithGroupSize(gg, [&](auto G) {
      QkBlock<decltype(G)::value, KT>(is_f16, qh, ldq, k, ldk, n, d, scale, sh, lds);
    });
  }
}

template <int G, typename VT>
HWY_INLINE void PvBlock(bool is_f16, const float* p, int64_t ldp, const VT* v, int64_t ldv,
                        int64_t n, int d, float* out, int64_t ldo) {
  const hn::ScalableTag<float> df;
  const int N = static_cast<int>(hn::Lanes(df));
  int c = 0;
  for (; c + N <= d; c += N) {
    hn::Vec<decltype(df)> acc[G];
    for (int h = 0; h < G; ++h) acc[h] = hn::LoadU(df, out + h * ldo + c);
    for (int64_t j = 0; j < n; ++j) {
      const auto vv = LoadRow(df, is_f16, v + j * ldv + c);
      for (int h = 0; h < G; ++h) acc[h] = hn::MulAdd(hn::Set(df, p[h * ldp + j]), vv, acc[h]);
    }
    for (int h = 0; h < G; ++h) hn::StoreU(acc[h], df, out + h * ldo + c);
  }
  for (; c < d; ++c) {
    for (int h = 0; h < G; ++h) {
      float acc = 0.0f;
      for (int64_t j = 0; j < n; ++j) acc += p[h * ldp + j] * RowScalar(is_f16, v[j * ldv + c]);
      out[h * ldo + c] += acc;
    }
  }
}

template <typename VT>
inline void PvAccumulateImpl(bool is_f16, const float* p, int64_t ldp, int g, const VT* v,
                             int64_t ldv, int64_t n, int d, float* out, int64_t ldo) {
  for (int h0 = 0; h0 < g; h0 += kMaxGroup) {
    const int gg = g - h0 < kMaxGroup ? g - h0 : kMaxGroup;
    const float* ph = p + h0 * ldp;
    float* oh = out + h0 * ldo;
    WithGroupSize(gg, [&](auto G) {
      PvBlock<decltype(G)::value, VT>(is_f16, ph, ldp, v, ldv, n, d, oh, ldo);
    });
  }
}

// Scores of f32 key rows (decoded low-bit windows) for g heads with the horizontal sums of
// T tokens folded together: Fold(a, b) = ConcatEven(b, a) + ConcatOdd(b, a) puts the
// pairwise sums of a in the lower half and of b in the upper half, so T accumulators become
// one vector of T segments after T − 1 folds, and log2(N/T) self-folds leave token t's dot
// product in lane t — about 3 ops per token and head instead of a full SumOfLanes each.
#if HWY_TARGET != HWY_SCALAR  // (one lane: nothing to fold)
template <class DF>
HWY_INLINE hn::Vec<DF> Fold(DF df, hn::Vec<DF> a, hn::Vec<DF> b) {
  return hn::Add(hn::ConcatEven(df, b, a), hn::ConcatOdd(df, b, a));
}

template <int T>
HWY_INLINE void QkF32Folded(const float* q, int64_t ldq, int g, const float* k, int64_t ldk,
                            int64_t n, int d, float scale, float* scores, int64_t lds) {
  const hn::ScalableTag<float> df;
  const int N = static_cast<int>(hn::Lanes(df));
  const int dv = d / N * N;
  HWY_ALIGN float tmp[hn::MaxLanes(df)];
  for (int64_t j0 = 0; j0 < n; j0 += T) {
    const int nt = static_cast<int>(n - j0 < T ? n - j0 : T);
    const float* rows[T];
    for (int t = 0; t < T; ++t) rows[t] = k + (j0 + (t < nt ? t : nt - 1)) * ldk;  // pad: repeat
    for (int h = 0; h < g; ++h) {
      const float* qh = q + h * ldq;
      hn::Vec<decltype(df)> acc[T];
      for (int t = 0; t < T; ++t) acc[t] = hn::Zero(df);
      for (int c = 0; c < dv; c += N) {
        const auto qv = hn::LoadU(df, qh + c);
        for (int t = 0; t < T; ++t) acc[t] = hn::MulAdd(qv, hn::LoadU(df, rows[t] + c), acc[t]);
      }
      for (int cnt = T; cnt > 1; cnt /= 2)
        for (int i = 0; i < cnt / 2; ++i) acc[i] = Fold(df, acc[2 * i], acc[2 * i + 1]);
      auto x = acc[0];
      for (int seg = N / T; seg > 1; seg /= 2) x = Fold(df, x, x);
      hn::Store(x, df, tmp);
      for (int t = 0; t < nt; ++t) {
        float sum = tmp[t];
        for (int c = dv; c < d; ++c) sum += qh[c] * rows[t][c];
        scores[h * lds + j0 + t] = sum * scale;
      }
    }
  }
}

#endif  // HWY_TARGET != HWY_SCALAR

inline void QkScoresF32Impl(const float* q, int64_t ldq, int g, const float* k, int64_t ldk,
                            int64_t n, int d, float scale, float* scores, int64_t lds) {
#if HWY_TARGET == HWY_SCALAR
  QkScoresImpl(true, q, ldq, g, k, ldk, n, d, scale, scores, lds);
#else
  const hn::ScalableTag<float> df;
  const size_t N = hn::Lanes(df);
  if (n <= 0) return;
  if (N >= 8)
    QkF32Folded<8>(q, ldq, g, k, ldk, n, d, scale, scores, lds);
  else if (N == 4)
    QkF32Folded<4>(q, ldq, g, k, ldk, n, d, scale, scores, lds);
  else if (N == 2)
    QkF32Folded<2>(q, ldq, g, k, ldk, n, d, scale, scores, lds);
  else
    QkScoresImpl(true, q, ldq, g, k, ldk, n, d, scale, scores, lds);
#endif
}

inline float MaxOf(const float* x, int64_t n) {
  const hn::ScalableTag<float> df;
  const int64_t N = hn::Lanes(df);
  float mx = x[0];
  int64_t i = 0;
  if (n >= N) {
    auto vm = hn::LoadU(df, x);
    for (i = N; i + N <= n; i += N) vm = hn::Max(vm, hn::LoadU(df, x + i));
    mx = hn::GetLane(hn::MaxOfLanes(df, vm));
  }
  for (; i < n; ++i) mx = std::fmax(mx, x[i]);
  return mx;
}

// exp(x) for a softmax's x = s − max ≤ 0 (exp_sub_sum): e^x = 2^n·e^r, n = round(x/ln 2),
// r = x − n·ln 2 in two parts (|r| ≤ ln2/2), e^r = 1 + r + r²·P(r) with Highway's Exp's
// polynomial, 2^n straight into the exponent bits. Below −87.33 (2^n would leave the normal
// range) exactly 0, where Highway's Exp gives subnormals down to −104; NaN stays NaN. About
// two thirds of Highway's Exp's operations (its range handling serves any x), and within
// 3e-7 of std::exp (tested). ExpSubSum8's only (a decode's masses and probabilities, where the
// exp's cost shows: 16K decode step −1.0 % / −0.4 %, A/B in BENCHMARKS §2); ExpSubSum keeps
// Highway's, which the prefill's scores (and the baselines matched to kvpress) were measured with.
template <class DF, class V>
HWY_INLINE V ExpNonPositive(DF df, V x) {
  const hn::RebindToSigned<DF> di;
  const auto kLo = hn::Set(df, -87.33f);
  const auto xc = hn::Max(kLo, x);  // x86 max returns its second operand when one is NaN
  const auto n = hn::Round(hn::Mul(xc, hn::Set(df, 1.44269504088896341f)));
  auto r = hn::NegMulAdd(n, hn::Set(df, 0.693145751953125f), xc);
  r = hn::NegMulAdd(n, hn::Set(df, 1.428606765330187045e-6f), r);
  auto p = hn::Set(df, 0.000198527617612853646278381f);
  p = hn::MulAdd(p, r, hn::Set(df, 0.00139304355252534151077271f));
  p = hn::MulAdd(p, r, hn::Set(df, 0.00833336077630519866943359f));
  p = hn::MulAdd(p, r, hn::Set(df, 0.0416664853692054748535156f));
  p = hn::MulAdd(p, r, hn::Set(df, 0.166666671633720397949219f));
  p = hn::MulAdd(p, r, hn::Set(df, 0.5f));
  const auto y = hn::Add(hn::MulAdd(p, hn::Mul(r, r), r), hn::Set(df, 1.0f));
  const auto two_n =
      hn::BitCast(df, hn::ShiftLeft<23>(hn::Add(hn::ConvertTo(di, n), hn::Set(di, 127))));
  return hn::IfThenZeroElse(hn::Lt(x, kLo), hn::Mul(y, two_n));
}

// The two exps as function objects (ExpSubRest's exp_fn).
struct HighwayExp {
  template <class DF, class V>
  HWY_INLINE V operator()(DF df, V x) const {
    return hn::Exp(df, x);
  }
};
struct NonPositiveExp {
  template <class DF, class V>
  HWY_INLINE V operator()(DF df, V x) const {
    return ExpNonPositive(df, x);
  }
};

// The exp pass from x[i] on: x[j] = exp(x[j] − m) by whole vectors (exp_fn), then one at a
// time (std::exp); returns the sum of vsum's lanes and the scalars, in that order.
template <class DF, class ExpFn>
HWY_INLINE float ExpSubRest(DF df, float* x, int64_t i, int64_t n, float m, hn::Vec<DF> vsum,
                            ExpFn exp_fn) {
  const int64_t N = hn::Lanes(df);
  const auto vm = hn::Set(df, m);
  for (; i + N <= n; i += N) {
    const auto e = exp_fn(df, hn::Sub(hn::LoadU(df, x + i), vm));
    hn::StoreU(e, df, x + i);
    vsum = hn::Add(vsum, e);
  }
  float sum = hn::GetLane(hn::SumOfLanes(df, vsum));
  for (; i < n; ++i) {
    x[i] = std::exp(x[i] - m);
    sum += x[i];
  }
  return sum;
}

inline float ExpSubSum(float* x, int64_t n, float m) {
  const hn::ScalableTag<float> df;
  return ExpSubRest(df, x, 0, n, m, hn::Zero(df), HighwayExp());
}

// Σ of the 8 floats at p in the order ((p0+p1)+(p2+p3)) + ((p4+p5)+(p6+p7)): the order the
// vector tree below gives each group, so that the two agree bit for bit.
HWY_INLINE float Sum8Tree(const float* p, int64_t n) {
  float v[8] = {};
  for (int64_t j = 0; j < n && j < 8; ++j) v[j] = p[j];
  return ((v[0] + v[1]) + (v[2] + v[3])) + ((v[4] + v[5]) + (v[6] + v[7]));
}

#if HWY_TARGET != HWY_SCALAR
// Adjacent lanes of lo, then of hi, summed in pairs: lane i of the result is
// lo[2i] + lo[2i+1] for i < N/2, else hi[2(i-N/2)] + hi[2(i-N/2)+1].
template <class DF, class V>
HWY_INLINE V PairSums(DF df, V lo, V hi) {
  return hn::Add(hn::ConcatEven(df, hi, lo), hn::ConcatOdd(df, hi, lo));
}
#endif

// ExpSubSum with ExpNonPositive (values within 3e-7 of ExpSubSum's) that also writes sums[k] = the
// Sum8Tree of x[8k, 8k + 8) (after the exp; a last partial group sums what there is). Eight vectors
// at a time: three levels of pair sums leave one lane per group, in group order.
inline float ExpSubSum8(float* x, int64_t n, float m, float* sums) {
  const hn::ScalableTag<float> df;
  auto vsum = hn::Zero(df);
  int64_t i = 0;
#if HWY_TARGET != HWY_SCALAR
  const int64_t N = hn::Lanes(df);
  const auto vm = hn::Set(df, m);
  if (N >= 4) {
    for (; i + 8 * N <= n; i += 8 * N) {
      hn::Vec<decltype(df)> e[8];
      for (int k = 0; k < 8; ++k) {
        e[k] = ExpNonPositive(df, hn::Sub(hn::LoadU(df, x + i + k * N), vm));
        hn::StoreU(e[k], df, x + i + k * N);
        vsum = hn::Add(vsum, e[k]);
      }
      const auto a0 = PairSums(df, e[0], e[1]), a1 = PairSums(df, e[2], e[3]);
      const auto a2 = PairSums(df, e[4], e[5]), a3 = PairSums(df, e[6], e[7]);
      const auto b0 = PairSums(df, a0, a1), b1 = PairSums(df, a2, a3);
      hn::StoreU(PairSums(df, b0, b1), df, sums + i / 8);
    }
  }
#endif
  const float sum = ExpSubRest(df, x, i, n, m, vsum, NonPositiveExp());
  for (int64_t k = i / 8; k * 8 < n; ++k) sums[k] = Sum8Tree(x + 8 * k, n - 8 * k);
  return sum;
}

// acc[i] += exp(s[i] − m) · inv, i < n: a softmax's probabilities (m its max, inv 1/its
// sum) added to per-token masses in double. Floats in double-width vectors' lane count, so
// each promotes to one double vector.
inline void ExpScaleAccumulate(const float* s, int64_t n, float m, float inv, double* acc) {
#if HWY_HAVE_FLOAT64
  const hn::ScalableTag<double> dd;
  const hn::Rebind<float, decltype(dd)> df;
  const int64_t N = static_cast<int64_t>(hn::Lanes(dd));
  const auto vm = hn::Set(df, m), vinv = hn::Set(df, inv);
  int64_t i = 0;
  for (; i + N <= n; i += N) {
    const auto e = hn::Mul(hn::Exp(df, hn::Sub(hn::LoadU(df, s + i), vm)), vinv);
    hn::StoreU(hn::Add(hn::LoadU(dd, acc + i), hn::PromoteTo(dd, e)), dd, acc + i);
  }
#else
  int64_t i = 0;
#endif
  for (; i < n; ++i) acc[i] += double(std::exp(s[i] - m) * inv);
}

inline float SoftmaxImpl(float* x, int64_t n) {
  if (n <= 0) return 0.0f;
  const hn::ScalableTag<float> df;
  const int64_t N = hn::Lanes(df);
  const float mx = MaxOf(x, n);
  const float inv = 1.0f / ExpSubSum(x, n, mx);
  const auto vinv = hn::Set(df, inv);
  int64_t i = 0;
  for (; i + N <= n; i += N) hn::StoreU(hn::Mul(hn::LoadU(df, x + i), vinv), df, x + i);
  for (; i < n; ++i) x[i] *= inv;
  return mx;
}

// Many query rows (a prefill run's (query, head) pairs) against 16-bit key rows given by
// pointers (the run's blocks need not be contiguous; null: a zero row). Keys are
// converted and transposed once per block of 2N into kt[c][2N], so each channel c costs
// two vector loads for all RB rows, whose q[c] are broadcast: 2·RB multiply-adds per
// 2 + RB loads, where the per-row kernels above load a key vector for every multiply-add.
// Each score sums its channels in order (c = 0, 1, …), one rounding per product.
template <int RB>
HWY_INLINE void QkRowsBlock(const float* q, int64_t ldq, const float* kt, int d, float scale,
                            float* s, int64_t lds, int nt) {
  const hn::ScalableTag<float> df;
  const int N = static_cast<int>(hn::Lanes(df));
  hn::Vec<decltype(df)> a0[RB], a1[RB];
  for (int r = 0; r < RB; ++r) a0[r] = a1[r] = hn::Zero(df);
  for (int c = 0; c < d; ++c) {
    const auto k0 = hn::LoadU(df, kt + size_t(c) * 2 * N);
    const auto k1 = hn::LoadU(df, kt + size_t(c) * 2 * N + N);
    for (int r = 0; r < RB; ++r) {
      const auto qb = hn::Set(df, q[r * ldq + c]);
      a0[r] = hn::MulAdd(qb, k0, a0[r]);
      a1[r] = hn::MulAdd(qb, k1, a1[r]);
    }
  }
  const auto vs = hn::Set(df, scale);
  HWY_ALIGN float tmp[2 * hn::MaxLanes(df)];
  for (int r = 0; r < RB; ++r) {
    float* sr = s + r * lds;
    if (nt == 2 * N) {
      hn::StoreU(hn::Mul(a0[r], vs), df, sr);
      hn::StoreU(hn::Mul(a1[r], vs), df, sr + N);
    } else {
      hn::Store(hn::Mul(a0[r], vs), df, tmp);
      hn::Store(hn::Mul(a1[r], vs), df, tmp + N);
      for (int t = 0; t < nt; ++t) sr[t] = tmp[t];
    }
  }
}

inline void QkScoresRows(bool f16, const float* q, int64_t ldq, int m, const uint16_t* const* k,
                         int64_t n, int d, float scale, float* s, int64_t lds) {
  const hn::ScalableTag<float> df;
  const int N = static_cast<int>(hn::Lanes(df));
  const int dv = d / N * N;
  constexpr int RB = 8;  // rows per block: 16 accumulators of 32 vector registers (AVX-512)
  // thread_local, not the caller's (BlockAttnScratch): 2·lanes·d + d floats fixed by head_dim
  // (≤ 34 KiB at d = 256), not by the cache's tokens, in a leaf kernel whose callers pass no
  // scratch (ops.h). Not counted in a cache's bytes_held.
  thread_local std::vector<float> kt_buf;
  thread_local std::vector<float> row;
  if (kt_buf.size() < size_t(d) * 2 * N) kt_buf.resize(size_t(d) * 2 * N);
  if (row.size() < size_t(d)) row.resize(size_t(d));
  float* kt = kt_buf.data();
  for (int64_t j0 = 0; j0 < n; j0 += 2 * N) {
    const int nt = static_cast<int>(n - j0 < 2 * N ? n - j0 : 2 * N);
    for (int t = 0; t < 2 * N; ++t) {
      const uint16_t* src = t < nt ? k[j0 + t] : nullptr;
      if (src == nullptr) {  // padding or a row not given: zero keys
        for (int c = 0; c < d; ++c) kt[size_t(c) * 2 * N + t] = 0.0f;
        continue;
      }
      for (int c = 0; c < dv; c += N) hn::StoreU(LoadHalf(df, f16, src + c), df, row.data() + c);
      for (int c = dv; c < d; ++c) row[c] = HalfScalar(f16, src[c]);
      for (int c = 0; c < d; ++c) kt[size_t(c) * 2 * N + t] = row[c];
    }
    int r0 = 0;
    for (; r0 + RB <= m; r0 += RB)
      QkRowsBlock<RB>(q + r0 * ldq, ldq, kt, d, scale, s + r0 * lds + j0, lds, nt);
    if (r0 < m) {
      WithGroupSize(m - r0, [&](auto G) {
        QkRowsBlock<decltype(G)::value>(q + r0 * ldq, ldq, kt, d, scale, s + r0 * lds + j0, lds,
                                        nt);
      });
    }
  }
}

// Many probability rows against 16-bit value rows given by pointers (null: a zero row):
// out[r·ldo + c] += Σ_j p[r·ldp + j]·v_j[c].
// Value rows are converted once per block of kPvRows for all rows; RB rows × NV vectors of
// channels accumulate in registers. Each output sums its terms in the order of
// PvAccumulate (from out, j = 0, 1, … one multiply-add each; the channels past the last full
// vector as a separate sum added at the end), so the results are bit for bit PvAccumulate's.
template <int RB, int NV>
HWY_INLINE void PvRowsBlock(const float* p, int64_t ldp, const float* vf, int d, int nj, float* out,
                            int64_t ldo) {
  const hn::ScalableTag<float> df;
  const int N = static_cast<int>(hn::Lanes(df));
  hn::Vec<decltype(df)> acc[RB][NV];
  for (int r = 0; r < RB; ++r)
    for (int x = 0; x < NV; ++x) acc[r][x] = hn::LoadU(df, out + r * ldo + x * N);
  for (int j = 0; j < nj; ++j) {
    hn::Vec<decltype(df)> vv[NV];
    for (int x = 0; x < NV; ++x) vv[x] = hn::LoadU(df, vf + size_t(j) * d + x * N);
    for (int r = 0; r < RB; ++r) {
      const auto pb = hn::Set(df, p[r * ldp + j]);
      for (int x = 0; x < NV; ++x) acc[r][x] = hn::MulAdd(pb, vv[x], acc[r][x]);
    }
  }
  for (int r = 0; r < RB; ++r)
    for (int x = 0; x < NV; ++x) hn::StoreU(acc[r][x], df, out + r * ldo + x * N);
}

template <int NV>
HWY_INLINE void PvRowsChannels(const float* p, int64_t ldp, int m, const float* vf, int d, int nj,
                               float* out, int64_t ldo) {
  constexpr int RB = 4;  // 4 rows × up to 4 vectors: 16 accumulators
  int r0 = 0;
  for (; r0 + RB <= m; r0 += RB)
    PvRowsBlock<RB, NV>(p + r0 * ldp, ldp, vf, d, nj, out + r0 * ldo, ldo);
  for (; r0 < m; ++r0) PvRowsBlock<1, NV>(p + r0 * ldp, ldp, vf, d, nj, out + r0 * ldo, ldo);
}

inline void PvAccumulateRows(bool f16, const float* p, int64_t ldp, int m, const uint16_t* const* v,
                             int64_t n, int d, float* out, int64_t ldo) {
  const hn::ScalableTag<float> df;
  const int N = static_cast<int>(hn::Lanes(df));
  const int dv = d / N * N;
  constexpr int kPvRows = 64;
  // thread_local as QkScoresRows' buffers: kPvRows·d floats fixed by head_dim (16 KiB at 64).
  thread_local std::vector<float> vbuf;
  if (vbuf.size() < size_t(kPvRows) * d) vbuf.resize(size_t(kPvRows) * d);
  for (int64_t j0 = 0; j0 < n; j0 += kPvRows) {
    const int nj = static_cast<int>(n - j0 < kPvRows ? n - j0 : kPvRows);
    for (int t = 0; t < nj; ++t) {
      float* dst = vbuf.data() + size_t(t) * d;
      const uint16_t* src = v[j0 + t];
      for (int c = 0; c < dv; c += N)
        hn::StoreU(src ? LoadHalf(df, f16, src + c) : hn::Zero(df), df, dst + c);
    }
    const float* pj = p + j0;
    for (int c0 = 0; c0 < dv; c0 += 4 * N) {
      const int nv = (dv - c0) / N < 4 ? (dv - c0) / N : 4;
      const float* vf = vbuf.data() + c0;
      float* o = out + c0;
      switch (nv) {
        case 1:
          PvRowsChannels<1>(pj, ldp, m, vf, d, nj, o, ldo);
          break;
        case 2:
          PvRowsChannels<2>(pj, ldp, m, vf, d, nj, o, ldo);
          break;
        case 3:
          PvRowsChannels<3>(pj, ldp, m, vf, d, nj, o, ldo);
          break;
        default:
          PvRowsChannels<4>(pj, ldp, m, vf, d, nj, o, ldo);
          break;
      }
    }
  }
  // Channels past the last full vector: PvBlock's scalar tail, term by term in the same order.
  for (int c = dv; c < d; ++c)
    for (int r = 0; r < m; ++r) {
      float acc = 0.0f;
      for (int64_t j = 0; j < n; ++j)
        if (v[j]) acc += p[r * ldp + j] * HalfScalar(f16, v[j][c]);
      out[r * ldo + c] += acc;
    }
}

// Wrappers with plain signatures for HWY_EXPORT.
inline void RmsNorm(const float* x, const float* w, float* y, int64_t n, float eps) {
  RmsNormImpl(x, w, y, n, eps);
}
inline void Swiglu(const float* g, const float* u, float* o, int64_t n) { SwigluImpl(g, u, o, n); }
inline void F32ToHalf(bool f16, const float* s, uint16_t* d, int64_t n) {
  F32ToHalfImpl(f16, s, d, n);
}
inline void HalfToF32(bool f16, const uint16_t* s, float* d, int64_t n) {
  HalfToF32Impl(f16, s, d, n);
}
// 16-bit keys: every 8 rows are converted once into an f32 block (as QkRow converts each row
// once for all heads) and scored by QkScoresF32Impl, whose folded sums take about half the
// shuffles of a SumOfLanes per token and head. Its token groups (8, 4 or 2) divide 8, so the
// scores are bit for bit those of QkScoresF32Impl over the whole converted run. (Converting
// a prefill run's keys once for its 16 queries for this kernel was slower: 64 KiB of f32 rows
// read from L2 16 times cost more than 2 KiB converted in L1 each time; prefill runs use
// QkScoresRows, whose transposed 32-key blocks stay in L1.)
inline void QkScores(bool f16, const float* q, int64_t ldq, int g, const uint16_t* k, int64_t ldk,
                     int64_t n, int d, float scale, float* s, int64_t lds) {
  constexpr int kRows = 8, kStackDim = 256;
  const hn::ScalableTag<float> df;
  const int N = static_cast<int>(hn::Lanes(df));
  const int dv = d / N * N;
  HWY_ALIGN float stack[kRows * kStackDim];
  thread_local std::vector<float> heap;  // only for head_dim > 256 (no model we load)
  float* rows = stack;
  if (d > kStackDim) {
    if (heap.size() < size_t(kRows) * d) heap.resize(size_t(kRows) * d);
    rows = heap.data();
  }
  for (int64_t j0 = 0; j0 < n; j0 += kRows) {
    const int nt = static_cast<int>(n - j0 < kRows ? n - j0 : kRows);
    for (int t = 0; t < nt; ++t) {
      const uint16_t* src = k + (j0 + t) * ldk;
      float* dst = rows + t * d;
      for (int c = 0; c < dv; c += N) hn::StoreU(LoadRow(df, f16, src + c), df, dst + c);
      for (int c = dv; c < d; ++c) dst[c] = RowScalar(f16, src[c]);
    }
    QkScoresF32Impl(q, ldq, g, rows, d, nt, d, scale, s + j0, lds);
  }
}
inline void PvAccumulate(bool f16, const float* p, int64_t ldp, int g, const uint16_t* v,
                         int64_t ldv, int64_t n, int d, float* o, int64_t ldo) {
  PvAccumulateImpl(f16, p, ldp, g, v, ldv, n, d, o, ldo);
}
inline float Softmax(float* x, int64_t n) { return SoftmaxImpl(x, n); }
inline void ExpScaleAcc(const float* s, int64_t n, float m, float inv, double* acc) {
  ExpScaleAccumulate(s, n, m, inv, acc);
}
inline void QkScoresF32(const float* q, int64_t ldq, int g, const float* k, int64_t ldk, int64_t n,
                        int d, float scale, float* s, int64_t lds) {
  QkScoresF32Impl(q, ldq, g, k, ldk, n, d, scale, s, lds);
}
inline void PvAccumulateF32(const float* p, int64_t ldp, int g, const float* v, int64_t ldv,
                            int64_t n, int d, float* o, int64_t ldo) {
  PvAccumulateImpl(true, p, ldp, g, v, ldv, n, d, o, ldo);
}
inline const char* TargetName() { return hwy::TargetName(HWY_TARGET); }

}  // namespace HWY_NAMESPACE
}  // namespace qevict
HWY_AFTER_NAMESPACE();

#endif  // include guard
