// Tests for qevict::matmul (the SIMD kernels) against ref::matmul (scalar dequantize +
// double dot), on every compiled Highway target this CPU supports (AVX-512, AVX2, SSE4,
// SSSE3, scalar), with awkward shapes, padded strides, misaligned X/Y and sentinels
// around Y. The f32 paths run with the AMX prefill path off; MatmulAmx tests that path
// (bf16 products) and MatmulQ8 the 8-bit-activation path on their own, where the CPU has
// them.
#include "kernels/matmul.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "core/f16.h"
#include "hwy/targets.h"
#include "hwy/tests/hwy_gtest.h"
#include "kernels/ref/dequant.h"
#include "kernels/ref/matmul_ref.h"
#include "kernels/simd/matmul_amx.h"
#include "kernels/simd/matmul_q8.h"

namespace qevict {
namespace {

constexpr float kUnitRoundoff = std::numeric_limits<float>::epsilon() / 2;  // u = 2^-24
constexpr float kSentinel = -7.77e30f;

float uniform(std::mt19937& rng, float lo, float hi) {
  return std::uniform_real_distribution<float>(lo, hi)(rng);
}

void put_f16(uint8_t* p, float v) {
  const uint16_t h = f32_to_f16(v);
  std::memcpy(p, &h, 2);
}

size_t packed_row_bytes(GgmlType t, int64_t n_cols) {
  const GgmlTypeInfo* info = ggml_type_info(t);
  return static_cast<size_t>(n_cols / info->block_elems * info->block_bytes);
}

// n_rows random rows of `type`, row_bytes apart (padding bytes are 0xFF, a NaN pattern for
// the float types, so a kernel that reads them shows it). Quantized blocks get random quants
// and random but sane f16 scales (random bits could be Inf/NaN). All values and scales are
// multiplied by `scale` (1e-4 puts the f16 ones in the subnormal range).
std::vector<uint8_t> make_weights(GgmlType t, int64_t n_rows, int64_t n_cols, size_t row_bytes,
                                  std::mt19937& rng, float scale = 1.0f) {
  std::vector<uint8_t> w(static_cast<size_t>(n_rows) * row_bytes, 0xFF);
  std::uniform_int_distribution<int> byte(0, 255);
  const GgmlTypeInfo* info = ggml_type_info(t);
  for (int64_t r = 0; r < n_rows; ++r) {
    uint8_t* row = w.data() + r * row_bytes;
    for (int64_t k = 0; k < n_cols; ++k) {
      const float v = scale * uniform(rng, -1.0f, 1.0f);
      if (t == GgmlType::kF32) std::memcpy(row + 4 * k, &v, 4);
      if (t == GgmlType::kF16) put_f16(row + 2 * k, v);
      if (t == GgmlType::kBF16) {
        const uint16_t b = f32_to_bf16(v);
        std::memcpy(row + 2 * k, &b, 2);
      }
    }
    if (info->block_elems == 1) continue;
    for (int64_t b = 0; b < n_cols / info->block_elems; ++b) {
      uint8_t* blk = row + b * info->block_bytes;
      for (int64_t i = 0; i < info->block_bytes; ++i) blk[i] = static_cast<uint8_t>(byte(rng));
      const float sign = byte(rng) < 128 ? -scale : scale;
      switch (t) {
        case GgmlType::kQ4_1:
        case GgmlType::kQ5_1:
          put_f16(blk + 2, scale * uniform(rng, -1.0f, 1.0f));  // m
          [[fallthrough]];
        case GgmlType::kQ4_0:
        case GgmlType::kQ5_0:
        case GgmlType::kQ8_0:
          put_f16(blk, sign * uniform(rng, 0.01f, 0.1f));  // d
          break;
        case GgmlType::kQ4_K:
          put_f16(blk, sign * uniform(rng, 0.001f, 0.01f));       // d
          put_f16(blk + 2, scale * uniform(rng, 0.001f, 0.01f));  // dmin
          break;
        case GgmlType::kQ6_K:
          put_f16(blk + 208, sign * uniform(rng, 0.001f, 0.01f));  // d
          break;
        default:
          ADD_FAILURE() << "no generator for type " << static_cast<int>(t);
      }
    }
  }
  return w;
}

// Float lanes per vector of the kernels (CappedTag<float, 16>) on `target`.
int64_t lanes_for(int64_t target) {
#if HWY_ARCH_X86
  if (target == HWY_AVX3 || target == HWY_AVX3_DL) return 16;
  if (target == HWY_AVX2) return 8;
  if (target == HWY_SSE4 || target == HWY_SSSE3) return 4;
#endif
  (void)target;
  return 1;
}

struct Shape {
  int64_t n_cols, n_rows, n_tokens;
  size_t row_pad = 0;  // bytes after each packed row
};

// What the kernel under test rounds: only the f32 sums (the exact-decode paths), or also
// X and W to bf16 before multiplying (the AMX prefill path).
enum class Products { kF32, kSplitBf16 };

// Runs matmul and ref::matmul on one random problem and compares them.
//
// Layout: W has n_rows + 3 rows of which rows [2, 2 + n_rows) are computed; X rows are ldx =
// n_cols + 3 apart with NaN in the gaps; X and Y start one float past an aligned address; Y
// has ldy = n_rows + 8 and sentinels everywhere that must not be written.
//
// Tolerance (derived): the weights are decoded exactly (see dequant.h), so the only error is
// f32 summation. A lane accumulates ceil(K / L) products with one rounding each (two
// without FMA), the L lanes are added in log2(L) steps, and up to K % L leftover columns are
// added one by one: every product passes through at most
// D = ceil(K / L) + log2(L) + K % L + 1 roundings, hence |fast - exact| <= D u sum|w x|
// (to first order), and the reference (double sum rounded once) adds u |exact|.
// With split-bf16 products (the AMX path), w and x are each carried as hi + lo bf16 parts
// (relative error <= 2^-16 each) and the lo x lo product is dropped (<= 2^-16): a product
// is off by <= 2^-14 relative, and each of the three part products is summed in f32.
void check_matmul(GgmlType type, const Shape& s, int64_t target, uint32_t seed,
                  Products products = Products::kF32) {
  std::mt19937 rng(seed);
  const int64_t total_rows = s.n_rows + 3, row_begin = 2, row_end = 2 + s.n_rows;
  const size_t row_bytes = packed_row_bytes(type, s.n_cols) + s.row_pad;
  const std::vector<uint8_t> wbytes = make_weights(type, total_rows, s.n_cols, row_bytes, rng);
  const WeightView w{type, wbytes.data(), s.n_cols, total_rows, row_bytes};
  ASSERT_TRUE(check_weight_view(w).is_ok()) << check_weight_view(w).message();

  const int64_t ldx = s.n_cols + 3, ldy = total_rows + 8;
  std::vector<float> xbuf(static_cast<size_t>(s.n_tokens * ldx + 1),
                          std::numeric_limits<float>::quiet_NaN());
  float* x = xbuf.data() + 1;
  for (int64_t t = 0; t < s.n_tokens; ++t) {
    for (int64_t k = 0; k < s.n_cols; ++k) x[t * ldx + k] = uniform(rng, -1.0f, 1.0f);
  }
  const int64_t y_size = s.n_tokens * ldy, guard = 16;
  std::vector<float> ybuf(static_cast<size_t>(y_size + 2 * guard + 1), kSentinel);
  std::vector<float> yref_buf = ybuf;
  float* y = ybuf.data() + guard + 1;
  float* yref = yref_buf.data() + guard + 1;

  matmul(w, x, ldx, s.n_tokens, y, ldy, row_begin, row_end);
  ref::matmul(w, x, ldx, s.n_tokens, yref, ldy, row_begin, row_end);

  const std::string where =
      "type " + std::string(ggml_type_info(type)->name) + " K=" + std::to_string(s.n_cols) +
      " rows=" + std::to_string(s.n_rows) + " tokens=" + std::to_string(s.n_tokens) +
      " pad=" + std::to_string(s.row_pad) + " target=" + hwy::TargetName(target);

  // Sentinels: nothing outside the requested (t, r) may change.
  for (size_t i = 0; i < ybuf.size(); ++i) {
    const int64_t off = static_cast<int64_t>(i) - guard - 1;
    const bool written = off >= 0 && off < y_size && off % ldy >= row_begin && off % ldy < row_end;
    if (!written && std::memcmp(&ybuf[i], &kSentinel, 4) != 0) {
      ADD_FAILURE() << where << ": wrote outside the output at offset " << off << " (" << ybuf[i]
                    << ")";
      return;
    }
  }

  const int64_t lanes = lanes_for(target);
  const int64_t depth = (s.n_cols + lanes - 1) / lanes +
                        static_cast<int64_t>(std::log2(static_cast<double>(lanes))) +
                        s.n_cols % lanes + 1;
  std::vector<float> wrow(static_cast<size_t>(s.n_cols));
  double worst_ratio = 0.0;
  int64_t worst_t = -1, worst_r = -1;
  for (int64_t r = row_begin; r < row_end; ++r) {
    ref::dequantize_row(type, wbytes.data() + r * row_bytes, wrow.data(), s.n_cols);
    for (int64_t t = 0; t < s.n_tokens; ++t) {
      double abs_sum = 0.0;
      for (int64_t k = 0; k < s.n_cols; ++k) abs_sum += std::fabs(double{wrow[k]} * x[t * ldx + k]);
      const double tol = products == Products::kF32 ? (depth + 1) * double{kUnitRoundoff} * abs_sum
                                                    : (std::ldexp(1.0, -7) + std::ldexp(1.0, -16) +
                                                       (s.n_cols + 3) * double{kUnitRoundoff}) *
                                                          abs_sum;
      const float got = y[t * ldy + r], want = yref[t * ldy + r];
      const double err = std::fabs(double{got} - double{want});
      const double ratio = tol > 0 ? err / tol : (err == 0 ? 0.0 : INFINITY);
      if (!std::isfinite(got) || ratio > worst_ratio) {
        worst_ratio = std::isfinite(got) ? ratio : INFINITY;
        worst_t = t, worst_r = r;
      }
    }
  }
  if (worst_ratio > 1.0) {
    ADD_FAILURE() << where << ": worst at token " << worst_t << " row " << worst_r << ": got "
                  << y[worst_t * ldy + worst_r] << " want " << yref[worst_t * ldy + worst_r]
                  << " (error / tolerance = " << worst_ratio << ")";
  }
}

// A sweep of awkward shapes: token counts around the tile widths, row counts around the
// row tile, 0..4 and 7 blocks (or, for the float types, every K up to two AVX-512 vectors
// plus one, and a long odd one), rows padded or packed.
void sweep(GgmlType type, int64_t target) {
  const int64_t be = ggml_type_info(type)->block_elems;
  std::vector<int64_t> cols;
  if (be == 1) {
    for (int64_t k = 0; k <= 33; ++k) cols.push_back(k);
    cols.push_back(100);
  } else {
    cols = {0, be, 2 * be, 3 * be, 4 * be, 7 * be};
  }
  const int64_t tokens[] = {0, 1, 2, 3, 5, 7, 8, 9, 17, 33};
  const int64_t rows[] = {1, 3, 7, 65};
  uint32_t seed = 1234;
  for (int64_t k : cols) {
    for (int64_t t : tokens) {
      for (int64_t r : rows) {
        // Keep the scalar-target sweep fast: the widest problems only with few tokens.
        if (be == 1 && r == 65 && t > 9 && k != 100) continue;
        const size_t pad = (seed % 3 == 0) ? 5 : 0;
        check_matmul(type, Shape{k, r, t, pad}, target, ++seed);
        if (::testing::Test::HasFailure()) return;  // one shape's report is enough
      }
    }
  }
}

// The exact-decode paths on every target: the AMX prefill path (bf16) is off meanwhile.
class MatmulTest : public hwy::TestWithParamTarget {
 protected:
  void SetUp() override {
    hwy::TestWithParamTarget::SetUp();
    was_on_ = amx::enabled();
    q8_was_on_ = q8::enabled();
    amx::set_enabled(false);
    q8::set_enabled(false);
  }
  void TearDown() override {
    amx::set_enabled(was_on_);
    q8::set_enabled(q8_was_on_);
    hwy::TestWithParamTarget::TearDown();
  }
  bool was_on_ = false, q8_was_on_ = false;
};
HWY_TARGET_INSTANTIATE_TEST_SUITE_P(MatmulTest);

TEST_P(MatmulTest, F32) { sweep(GgmlType::kF32, GetParam()); }
TEST_P(MatmulTest, F16) { sweep(GgmlType::kF16, GetParam()); }
TEST_P(MatmulTest, BF16) { sweep(GgmlType::kBF16, GetParam()); }
TEST_P(MatmulTest, Q4_0) { sweep(GgmlType::kQ4_0, GetParam()); }
TEST_P(MatmulTest, Q4_1) { sweep(GgmlType::kQ4_1, GetParam()); }
TEST_P(MatmulTest, Q5_0) { sweep(GgmlType::kQ5_0, GetParam()); }
TEST_P(MatmulTest, Q5_1) { sweep(GgmlType::kQ5_1, GetParam()); }
TEST_P(MatmulTest, Q8_0) { sweep(GgmlType::kQ8_0, GetParam()); }
TEST_P(MatmulTest, Q4_K) { sweep(GgmlType::kQ4_K, GetParam()); }
TEST_P(MatmulTest, Q6_K) { sweep(GgmlType::kQ6_K, GetParam()); }

// The reduction lengths and weight types of the linear layers of SmolLM2-135M (Q4_1, Q8_0
// at K = 576, 1536) and Qwen2.5-Coder-0.5B Q4_K_M (Q5_0, Q8_0 at K = 896; Q4_K, Q6_K at
// K = 4864), a few rows each, at decode and prefill token counts.
TEST_P(MatmulTest, ModelShapes) {
  const struct {
    GgmlType type;
    int64_t n_cols;
  } cases[] = {{GgmlType::kQ4_1, 576}, {GgmlType::kQ4_1, 1536}, {GgmlType::kQ8_0, 576},
               {GgmlType::kQ5_0, 896}, {GgmlType::kQ8_0, 896},  {GgmlType::kQ4_K, 4864},
               {GgmlType::kQ6_K, 4864}};
  uint32_t seed = 99;
  for (const auto& c : cases) {
    for (int64_t t : {1, 4, 64}) check_matmul(c.type, Shape{c.n_cols, 21, t}, GetParam(), ++seed);
  }
}

// Rows long enough to need several batches of scale conversion inside a tile, and token
// counts that the prefill path splits into several blocks (X blocks are sized for L2).
TEST_P(MatmulTest, LongRows) {
  const GgmlType types[] = {GgmlType::kF32,  GgmlType::kF16,  GgmlType::kBF16, GgmlType::kQ4_0,
                            GgmlType::kQ4_1, GgmlType::kQ5_0, GgmlType::kQ5_1, GgmlType::kQ8_0,
                            GgmlType::kQ4_K, GgmlType::kQ6_K};
  uint32_t seed = 500;
  for (GgmlType type : types) {
    const int64_t be = ggml_type_info(type)->block_elems;
    const int64_t n_cols = be == 1 ? 2101 : 67 * be;
    for (int64_t t : {1, 3, 9, 40}) check_matmul(type, Shape{n_cols, 5, t}, GetParam(), ++seed);
  }
}

// W's rows as ref::dequantize_row gives them, [n_rows][n_cols].
std::vector<float> dequantized(const WeightView& w) {
  std::vector<float> out(static_cast<size_t>(w.n_rows * w.n_cols));
  for (int64_t r = 0; r < w.n_rows; ++r)
    ref::dequantize_row(w.type, w.data + r * w.row_bytes, &out[r * w.n_cols], w.n_cols);
  return out;
}

// matmul of all of W's rows with one-hot tokens: token t is e_{first + t}; Y is
// [n_tokens][n_rows].
std::vector<float> one_hot_matmul(const WeightView& w, int64_t first, int64_t n_tokens) {
  std::vector<float> x(static_cast<size_t>(n_tokens * w.n_cols), 0.0f);
  for (int64_t t = 0; t < n_tokens; ++t) x[t * w.n_cols + first + t] = 1.0f;
  std::vector<float> y(static_cast<size_t>(n_tokens * w.n_rows), kSentinel);
  matmul(w, x.data(), w.n_cols, n_tokens, y.data(), w.n_rows, 0, w.n_rows);
  return y;
}

// With one-hot tokens (X = identity), Y[t, r] = W[r, t] exactly: checks that the SIMD
// decoders reproduce ref::dequantize_row bit for bit, in both the decode (few tokens) and
// the prefill (many tokens) regime.
void check_one_hot(GgmlType type, float scale, int64_t target, std::mt19937& rng) {
  const int64_t be = ggml_type_info(type)->block_elems;
  const int64_t n_cols = be == 1 ? 37 : 2 * be, n_rows = 6;
  const size_t row_bytes = packed_row_bytes(type, n_cols);
  const std::vector<uint8_t> wb = make_weights(type, n_rows, n_cols, row_bytes, rng, scale);
  const WeightView w{type, wb.data(), n_cols, n_rows, row_bytes};
  const std::vector<float> wref = dequantized(w);
  // Token t is e_{first + t}; n_tokens = n_cols - first reaches the last column (prefill),
  // 1 and 3 tokens at a few offsets exercise the register-tile (decode) path.
  for (int64_t first : {int64_t{0}, n_cols / 2, n_cols - 3}) {
    for (int64_t n_tokens : {int64_t{1}, int64_t{3}, n_cols - first}) {
      if (first + n_tokens > n_cols) continue;
      const std::vector<float> y = one_hot_matmul(w, first, n_tokens);
      for (int64_t t = 0; t < n_tokens; ++t) {
        for (int64_t r = 0; r < n_rows; ++r) {
          ASSERT_EQ(y[t * n_rows + r], wref[r * n_cols + first + t])
              << ggml_type_info(type)->name << " scale " << scale << " row " << r << " col "
              << first + t << " n_tokens " << n_tokens << " target " << hwy::TargetName(target);
        }
      }
    }
  }
}

// Normal and subnormal f16 scales/values (targets without F16C convert f16 in software).
TEST_P(MatmulTest, OneHotTokensReproduceWeightsExactly) {
  const GgmlType types[] = {GgmlType::kF32,  GgmlType::kF16,  GgmlType::kBF16, GgmlType::kQ4_0,
                            GgmlType::kQ4_1, GgmlType::kQ5_0, GgmlType::kQ5_1, GgmlType::kQ8_0,
                            GgmlType::kQ4_K, GgmlType::kQ6_K};
  std::mt19937 rng(7);
  for (float scale : {1.0f, 1e-4f}) {
    for (GgmlType type : types) check_one_hot(type, scale, GetParam(), rng);
  }
}

TEST(Matmul, SupportedTypes) {
  for (GgmlType t :
       {GgmlType::kF32, GgmlType::kF16, GgmlType::kBF16, GgmlType::kQ4_0, GgmlType::kQ4_1,
        GgmlType::kQ5_0, GgmlType::kQ5_1, GgmlType::kQ8_0, GgmlType::kQ4_K, GgmlType::kQ6_K}) {
    EXPECT_TRUE(matmul_supported(t)) << static_cast<int>(t);
  }
  EXPECT_FALSE(matmul_supported(GgmlType::kQ2_K));
  // Every type the scalar reference can decode has a SIMD kernel (no silent slow path).
  for (int t = 0; t < 40; ++t) {
    const auto type = static_cast<GgmlType>(t);
    if (ref::can_dequantize(type)) {
      EXPECT_TRUE(matmul_supported(type)) << t;
    }
  }
}

TEST(Matmul, CheckWeightView) {
  std::vector<uint8_t> data(20 * 4);
  WeightView w{GgmlType::kQ4_1, data.data(), 64, 2, 40};
  EXPECT_TRUE(check_weight_view(w).is_ok());
  w.n_cols = 48;  // not a multiple of 32
  EXPECT_FALSE(check_weight_view(w).is_ok());
  w.n_cols = 64;
  w.row_bytes = 39;  // shorter than two blocks
  EXPECT_FALSE(check_weight_view(w).is_ok());
  w.row_bytes = 40;
  w.type = GgmlType::kQ2_K;
  EXPECT_FALSE(check_weight_view(w).is_ok());
  w.type = GgmlType::kQ4_1;
  w.data = nullptr;
  EXPECT_FALSE(check_weight_view(w).is_ok());
}

TEST(Matmul, BrokenPreconditionPoisonsOutputs) {
  std::vector<uint8_t> data(84 * 2, 0);
  const WeightView w{GgmlType::kQ2_K, data.data(), 256, 2, 84};  // no dequantizer
  std::vector<float> x(256, 1.0f), y(3, kSentinel);
  matmul(w, x.data(), 256, 1, y.data(), 3, 0, 2);
  EXPECT_TRUE(std::isnan(y[0]));
  EXPECT_TRUE(std::isnan(y[1]));
  EXPECT_EQ(y[2], kSentinel);
}

// The reference itself, on a hand-computed problem: W = [[1, 2, 3], [-1, 0.5, 4]] (F32),
// two tokens x0 = [1, 1, 1], x1 = [2, -2, 0.25], row range [1, 2).
TEST(MatmulRef, HandComputedF32) {
  const float wv[6] = {1, 2, 3, -1, 0.5f, 4};
  const float x[8] = {1, 1, 1, -99, 2, -2, 0.25f, -99};                             // ldx = 4
  float y[6] = {kSentinel, kSentinel, kSentinel, kSentinel, kSentinel, kSentinel};  // ldy = 3
  const WeightView w{GgmlType::kF32, reinterpret_cast<const uint8_t*>(wv), 3, 2, 12};
  ref::matmul(w, x, 4, 2, y, 3, 1, 2);
  EXPECT_EQ(y[1], 3.5f);   // -1 + 0.5 + 4
  EXPECT_EQ(y[4], -2.0f);  // -2 - 1 + 1
  for (int i : {0, 2, 3, 5}) EXPECT_EQ(y[i], kSentinel) << i;
}

// ... and on one Q4_1 block (d = 0.5, m = -1, nibbles 0..15 then 15..0, i.e. weights
// -1, -0.5, ..., 6.5, 6.5, ..., -1) against x = all ones: sum = 2 * (16 * -1 + 0.5 * 120) = 88.
TEST(MatmulRef, HandComputedQ4_1) {
  uint8_t blk[20];
  const uint16_t d = 0x3800, m = 0xBC00;
  std::memcpy(blk, &d, 2);
  std::memcpy(blk + 2, &m, 2);
  for (int j = 0; j < 16; ++j) blk[4 + j] = static_cast<uint8_t>(j | ((15 - j) << 4));
  const WeightView w{GgmlType::kQ4_1, blk, 32, 1, 20};
  std::vector<float> x(32, 1.0f);
  float y = 0;
  ref::matmul(w, x.data(), 32, 1, &y, 1, 0, 1);
  EXPECT_EQ(y, 88.0f);
  matmul(w, x.data(), 32, 1, &y, 1, 0, 1);
  EXPECT_EQ(y, 88.0f);
}

// ------------------------------------------------------------------------------------------
// The AMX-BF16 prefill path (kernels/simd/matmul_amx.h): n_tokens >= 32 on a CPU with AMX.

class MatmulAmx : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!amx::available()) GTEST_SKIP() << "no AMX-BF16 on this CPU/OS";
    was_on_ = amx::enabled();
    amx::set_enabled(true);
  }
  void TearDown() override { amx::set_enabled(was_on_); }
  bool was_on_ = false;
};

const GgmlType kAllTypes[] = {GgmlType::kF32,  GgmlType::kF16,  GgmlType::kBF16, GgmlType::kQ4_0,
                              GgmlType::kQ4_1, GgmlType::kQ5_0, GgmlType::kQ5_1, GgmlType::kQ8_0,
                              GgmlType::kQ4_K, GgmlType::kQ6_K};

// Token counts around the 16- and 32-token tiles, row counts around the 16-row tiles and
// 32-row panels, K around the 32-wide k step (float types: not a multiple of 32 either).
TEST_F(MatmulAmx, AwkwardShapesWithinSplitBf16Bound) {
  uint32_t seed = 4000;
  for (GgmlType type : kAllTypes) {
    const int64_t be = ggml_type_info(type)->block_elems;
    std::vector<int64_t> cols = {be, 3 * be};
    if (be == 1) cols = {1, 31, 33, 100};
    for (int64_t k : cols) {
      for (int64_t t : {32, 33, 47, 64, 100}) {
        for (int64_t r : {1, 15, 17, 33, 70}) {
          const size_t pad = (seed % 3 == 0) ? 5 : 0;
          check_matmul(type, Shape{k, r, t, pad}, HWY_STATIC_TARGET, ++seed, Products::kSplitBf16);
          if (HasFailure()) return;
        }
      }
    }
  }
}

// The model shapes (as ModelShapes) at prefill token counts: their rows span several k
// blocks (kKBlockBytes), whose partial sums go through Y between blocks.
TEST_F(MatmulAmx, ModelShapesAndLongRows) {
  const struct {
    GgmlType type;
    int64_t n_cols, n_tokens;
  } cases[] = {{GgmlType::kQ4_1, 576, 64},   {GgmlType::kQ4_1, 1536, 100},
               {GgmlType::kQ8_0, 576, 40},   {GgmlType::kQ5_0, 896, 64},
               {GgmlType::kQ8_0, 896, 33},   {GgmlType::kQ4_K, 4864, 64},
               {GgmlType::kQ6_K, 4864, 130}, {GgmlType::kF32, 2101, 90}};
  uint32_t seed = 4500;
  // 20 rows: one panel; 37: a pair; 70: a pair and an odd panel. At K = 4864 both the pair
  // and the lone panel take several k blocks (kKBlockBytes), carried through Y.
  for (const auto& c : cases) {
    for (int64_t rows : {20, 37, 70}) {
      check_matmul(c.type, Shape{c.n_cols, rows, c.n_tokens}, HWY_STATIC_TARGET, ++seed,
                   Products::kSplitBf16);
    }
  }
}

// One-hot tokens: Y[t, r] = hi + lo of W[r, first + t] exactly (products with 1 and sums
// of zeros round nothing), which pins the packing of every element to its place.
TEST_F(MatmulAmx, OneHotTokensGiveSplitBf16Weights) {
  std::mt19937 rng(11);
  for (GgmlType type : kAllTypes) {
    const int64_t be = ggml_type_info(type)->block_elems;
    const int64_t n_cols = be == 1 ? 70 : (be == 32 ? 3 * be : be), n_rows = 35;
    const size_t row_bytes = packed_row_bytes(type, n_cols);
    const std::vector<uint8_t> wb = make_weights(type, n_rows, n_cols, row_bytes, rng);
    const WeightView w{type, wb.data(), n_cols, n_rows, row_bytes};
    const std::vector<float> wref = dequantized(w);
    const int64_t first = n_cols % 7, n_tokens = std::min<int64_t>(n_cols - first, 40);
    ASSERT_GE(n_tokens, 32);
    const std::vector<float> y = one_hot_matmul(w, first, n_tokens);
    for (int64_t t = 0; t < n_tokens; ++t) {
      for (int64_t r = 0; r < n_rows; ++r) {
        const float v = wref[r * n_cols + first + t];
        const float hi = bf16_to_f32(f32_to_bf16(v));
        const float want = hi + bf16_to_f32(f32_to_bf16(v - hi));
        ASSERT_EQ(y[t * n_rows + r], want)
            << ggml_type_info(type)->name << " row " << r << " col " << first + t;
      }
    }
  }
}

// set_enabled(false) really selects the exact path: the same prefill-sized problem then
// matches the f32 bound.
TEST_F(MatmulAmx, TurningItOffRestoresTheExactPath) {
  matmul_set_amx(false);
  EXPECT_FALSE(matmul_amx_enabled());
  check_matmul(GgmlType::kQ4_1, Shape{576, 20, 64}, HWY_STATIC_TARGET, 77);
}

// ------------------------------------------------------------------------------------------
// The 8-bit-activation path (kernels/simd/matmul_q8.h): n_tokens < 32, 32-block types, on a
// CPU with AVX-512 VNNI.

class MatmulQ8 : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!q8::available()) GTEST_SKIP() << "no AVX-512 VNNI on this CPU";
    was_on_ = q8::enabled();
    q8::set_enabled(true);
  }
  void TearDown() override { q8::set_enabled(was_on_); }
  bool was_on_ = false;
};

const GgmlType kQ8Types[] = {GgmlType::kQ4_0, GgmlType::kQ4_1, GgmlType::kQ5_0, GgmlType::kQ5_1,
                             GgmlType::kQ8_0, GgmlType::kQ4_K, GgmlType::kQ6_K};

bool k_quant(GgmlType t) { return t == GgmlType::kQ4_K || t == GgmlType::kQ6_K; }

// m_w of 32-block b of a row (Q4_1/Q5_1; Q4_K: dmin times its sub-block's min), else 0.
float block_m(GgmlType t, const uint8_t* row, int64_t b) {
  if (t == GgmlType::kQ4_K) {
    const uint8_t* sb = row + (b / 8) * ggml_type_info(t)->block_bytes;
    int scale, min;
    ref::q4_k_scale_min(sb + 4, static_cast<int>(b % 8), &scale, &min);
    uint16_t h;
    std::memcpy(&h, sb + 2, 2);
    return f16_to_f32(h) * static_cast<float>(min);
  }
  if (t != GgmlType::kQ4_1 && t != GgmlType::kQ5_1) return 0.0f;
  uint16_t h;
  std::memcpy(&h, row + b * ggml_type_info(t)->block_bytes + 2, 2);
  return f16_to_f32(h);
}

// Runs the Q8 path on one random problem (layout as check_matmul: padded X/Y strides,
// sentinels) and checks it against
//  - ref::matmul_q8, the same products from integers, within f32 summation: each block
//    term (d_w d_x times an exact integer; Q4_1/Q5_1 also m_w (d_x sum q)) is rounded <= 3
//    times and summed in a lane through <= 2 n_pairs + 4 additions, so |fast - ref| <=
//    (2 n_pairs + 8) u M with M = sum_k (|w_k| + 2 |m_b|) |xq_k| (|d_w c_k| <= |w_k| + |m_b|),
//    xq = d q the quantized activations;
//  - ref::matmul, the exact product: |fast - exact| <= sum_k |w_k| |x_k - xq_k| (the
//    quantization, each <= d_b / 2) + the bound above + u |exact|.
void check_q8(GgmlType type, const Shape& s, uint32_t seed, float x_scale = 1.0f) {
  std::mt19937 rng(seed);
  const int64_t total_rows = s.n_rows + 3, row_begin = 2, row_end = 2 + s.n_rows;
  const size_t row_bytes = packed_row_bytes(type, s.n_cols) + s.row_pad;
  const std::vector<uint8_t> wbytes = make_weights(type, total_rows, s.n_cols, row_bytes, rng);
  const WeightView w{type, wbytes.data(), s.n_cols, total_rows, row_bytes};
  const int64_t ldx = s.n_cols + 3, ldy = total_rows + 8;
  std::vector<float> xbuf(static_cast<size_t>(s.n_tokens * ldx + 1),
                          std::numeric_limits<float>::quiet_NaN());
  float* x = xbuf.data() + 1;
  for (int64_t t = 0; t < s.n_tokens; ++t) {
    for (int64_t k = 0; k < s.n_cols; ++k) x[t * ldx + k] = x_scale * uniform(rng, -1.0f, 1.0f);
    if (s.n_cols >= 64 && t % 3 == 1) {  // an all-zero block (d = 0)
      for (int64_t k = 32; k < 64; ++k) x[t * ldx + k] = 0.0f;
    }
  }
  const int64_t y_size = s.n_tokens * ldy, guard = 16;
  std::vector<float> ybuf(static_cast<size_t>(y_size + 2 * guard + 1), kSentinel);
  std::vector<float> yq_buf = ybuf, yx_buf = ybuf;
  float* y = ybuf.data() + guard + 1;
  float* yq = yq_buf.data() + guard + 1;
  float* yx = yx_buf.data() + guard + 1;
  matmul(w, x, ldx, s.n_tokens, y, ldy, row_begin, row_end);
  ref::matmul_q8(w, x, ldx, s.n_tokens, yq, ldy, row_begin, row_end);
  ref::matmul(w, x, ldx, s.n_tokens, yx, ldy, row_begin, row_end);

  const std::string where = "type " + std::string(ggml_type_info(type)->name) +
                            " K=" + std::to_string(s.n_cols) + " rows=" + std::to_string(s.n_rows) +
                            " tokens=" + std::to_string(s.n_tokens);
  for (size_t i = 0; i < ybuf.size(); ++i) {
    const int64_t off = static_cast<int64_t>(i) - guard - 1;
    const bool written = off >= 0 && off < y_size && off % ldy >= row_begin && off % ldy < row_end;
    if (!written) {
      ASSERT_EQ(std::memcmp(&ybuf[i], &kSentinel, 4), 0) << where << " offset " << off;
    }
  }
  const int64_t nb = s.n_cols / 32, n_pairs = (nb + 1) / 2;
  const double u = kUnitRoundoff;
  std::vector<float> wrow(static_cast<size_t>(s.n_cols));
  for (int64_t t = 0; t < s.n_tokens; ++t) {
    std::vector<ref::Q8Block> xb(static_cast<size_t>(nb));
    for (int64_t b = 0; b < nb; ++b) xb[b] = ref::quantize_q8_block(x + t * ldx + b * 32);
    for (int64_t r = row_begin; r < row_end; ++r) {
      const uint8_t* row = wbytes.data() + r * row_bytes;
      ref::dequantize_row(type, row, wrow.data(), s.n_cols);
      double mag = 0.0, quant = 0.0;
      for (int64_t k = 0; k < s.n_cols; ++k) {
        const ref::Q8Block& a = xb[k / 32];
        const double xq = double{a.d} * a.q[k % 32];
        mag += (std::fabs(double{wrow[k]}) + 2.0 * std::fabs(block_m(type, row, k / 32))) *
               std::fabs(xq);
        quant += std::fabs(double{wrow[k]}) * std::fabs(x[t * ldx + k] - xq);
      }
      const double tol_q = (2.0 * n_pairs + 8) * u * mag;
      const float got = y[t * ldy + r];
      ASSERT_LE(std::fabs(double{got} - yq[t * ldy + r]), tol_q)
          << where << " token " << t << " row " << r << ": got " << got << " ref::matmul_q8 "
          << yq[t * ldy + r];
      const double tol_x = quant * (1 + 1e-6) + tol_q + u * std::fabs(double{yx[t * ldy + r]});
      ASSERT_LE(std::fabs(double{got} - yx[t * ldy + r]), tol_x)
          << where << " token " << t << " row " << r << ": got " << got << " exact "
          << yx[t * ldy + r];
    }
  }
}

// Token counts around the 4-token tile and up to 31 (32 goes elsewhere), row counts around
// the 4-row tile, odd and even block counts (an odd count ends on a half pair); the K-quants'
// rows are whole 256-element super-blocks (1, 2 and 5 of them).
TEST_F(MatmulQ8, AwkwardShapesMatchTheReferences) {
  uint32_t seed = 8000;
  for (GgmlType type : kQ8Types) {
    const std::vector<int64_t> ks = k_quant(type) ? std::vector<int64_t>{256, 512, 1280}
                                                  : std::vector<int64_t>{32, 64, 96, 160, 576};
    for (int64_t k : ks) {
      for (int64_t t : {1, 2, 3, 4, 5, 7, 9, 31}) {
        for (int64_t r : {1, 3, 4, 5, 9, 65}) {
          const size_t pad = (seed % 3 == 0) ? 5 : 0;
          check_q8(type, Shape{k, r, t, pad}, ++seed);
          if (HasFailure()) return;
        }
      }
    }
  }
}

// The model shapes, and activations from 1e-3 to 1e3 (the codes do not care; d does).
TEST_F(MatmulQ8, ModelShapesAndScales) {
  uint32_t seed = 8500;
  for (GgmlType type : kQ8Types) {
    const std::vector<int64_t> ks = k_quant(type) ? std::vector<int64_t>{1536, 4864, 8960}
                                                  : std::vector<int64_t>{896, 1536, 4864};
    for (int64_t k : ks) {
      for (float scale : {1e-3f, 1e3f}) check_q8(type, Shape{k, 37, 2}, ++seed, scale);
    }
  }
}

// A token's result is the same bits whether it is alone in a call or with 30 others.
TEST_F(MatmulQ8, TokensDoNotDependOnTheirCallmates) {
  std::mt19937 rng(5);
  for (GgmlType type : kQ8Types) {
    const int64_t n_cols = k_quant(type) ? 512 : 160, n_rows = 13, n_tokens = 31;
    const size_t row_bytes = packed_row_bytes(type, n_cols);
    const std::vector<uint8_t> wb = make_weights(type, n_rows, n_cols, row_bytes, rng);
    const WeightView w{type, wb.data(), n_cols, n_rows, row_bytes};
    std::vector<float> x(static_cast<size_t>(n_tokens * n_cols));
    for (float& v : x) v = uniform(rng, -2.0f, 2.0f);
    std::vector<float> all(static_cast<size_t>(n_tokens * n_rows)), one(n_rows);
    matmul(w, x.data(), n_cols, n_tokens, all.data(), n_rows, 0, n_rows);
    for (int64_t t = 0; t < n_tokens; ++t) {
      matmul(w, x.data() + t * n_cols, n_cols, 1, one.data(), n_rows, 0, n_rows);
      ASSERT_EQ(std::memcmp(one.data(), all.data() + t * n_rows, n_rows * 4), 0)
          << ggml_type_info(type)->name << " token " << t;
    }
  }
}

// Inf or NaN in an activation block reaches Y as NaN (the exact path's behaviour for NaN;
// for Inf the exact sum may be Inf or NaN: NaN here), only for that token.
TEST_F(MatmulQ8, NonFiniteActivationsGiveNaN) {
  std::mt19937 rng(6);
  for (GgmlType type : kQ8Types) {
    const int64_t n_cols = k_quant(type) ? 256 : 96, n_rows = 5;
    const size_t row_bytes = packed_row_bytes(type, n_cols);
    const std::vector<uint8_t> wb = make_weights(type, n_rows, n_cols, row_bytes, rng);
    const WeightView w{type, wb.data(), n_cols, n_rows, row_bytes};
    for (float bad : {std::numeric_limits<float>::quiet_NaN(), INFINITY}) {
      std::vector<float> x(3 * n_cols, 0.5f), y(3 * n_rows);
      x[n_cols + 70] = bad;  // token 1, block 2
      matmul(w, x.data(), n_cols, 3, y.data(), n_rows, 0, n_rows);
      for (int64_t r = 0; r < n_rows; ++r) {
        EXPECT_TRUE(std::isfinite(y[r]) && std::isfinite(y[2 * n_rows + r]));
        EXPECT_TRUE(std::isnan(y[n_rows + r])) << ggml_type_info(type)->name << " " << bad;
      }
    }
  }
}

// set_enabled(false) really selects the exact path: the same decode-sized problem then
// matches the f32 bound (which the 8-bit path misses by far).
TEST_F(MatmulQ8, TurningItOffRestoresTheExactPath) {
  matmul_set_q8(false);
  EXPECT_FALSE(matmul_q8_enabled());
  check_matmul(GgmlType::kQ4_1, Shape{576, 20, 3}, HWY_STATIC_TARGET, 78);
  matmul_set_q8(true);
  EXPECT_TRUE(matmul_q8_enabled());
}

// The reference quantizer on a hand-made block: amax 254 -> d = 2, codes x / 2 rounded to
// nearest even.
TEST(MatmulQ8Ref, QuantizesABlockByHand) {
  float x[32] = {};
  x[0] = 254.0f, x[1] = -127.0f, x[2] = 1.0f, x[3] = 3.0f, x[4] = 5.0f;
  const ref::Q8Block b = ref::quantize_q8_block(x);
  EXPECT_EQ(b.d, 2.0f);
  EXPECT_EQ(b.q[0], 127);
  EXPECT_EQ(b.q[1], -64);  // -63.5 -> -64 (even)
  EXPECT_EQ(b.q[2], 0);    // 0.5 -> 0 (even)
  EXPECT_EQ(b.q[3], 2);    // 1.5 -> 2
  EXPECT_EQ(b.q[4], 2);    // 2.5 -> 2
  EXPECT_EQ(b.sum, 127 - 64 + 2 + 2);
  const float zeros[32] = {};
  EXPECT_EQ(ref::quantize_q8_block(zeros).d, 0.0f);
}

}  // namespace
}  // namespace qevict
