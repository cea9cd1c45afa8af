// Micro-benchmarks of qevict::matmul (SIMD) and ref::matmul (scalar reference) on the
// linear-layer shapes of SmolLM2-135M, at decode (1 token) and prefill (64 tokens).
// Reports GFLOP/s (2 * K * rows * tokens) and GB/s of weight bytes read once per call.
// Configure with -DQEVICT_BUILD_BENCH=ON, then e.g.
//   build/bench/qevict_matmul_bench --benchmark_filter=Q4_1
// (BM_FastAvx2 restricts dispatch to AVX2; Q4_1_sweep varies the token count.)
#include <benchmark/benchmark.h>

#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "core/f16.h"
#include "hwy/targets.h"
#include "kernels/matmul.h"
#include "kernels/ref/matmul_ref.h"

namespace qevict {
namespace {

// Random weights with sane f16 scales (speed does not depend on values, but Inf/NaN or
// denormal scales could). Scale offsets per block: Q4_0/Q4_1/Q8_0 d at 0 (Q4_1 m at 2),
// Q4_K d/dmin at 0/2, Q6_K d at 208.
std::vector<uint8_t> make_weights(GgmlType t, int64_t n_rows, int64_t n_cols) {
  const GgmlTypeInfo* info = ggml_type_info(t);
  const size_t bytes =
      static_cast<size_t>(n_rows * (n_cols / info->block_elems) * info->block_bytes);
  std::vector<uint8_t> w(bytes);
  std::mt19937 rng(42);
  for (auto& b : w) b = static_cast<uint8_t>(rng());
  const uint16_t small = f32_to_f16(0.01f);
  const size_t n_blocks = bytes / info->block_bytes;
  for (size_t b = 0; b < n_blocks; ++b) {
    uint8_t* blk = w.data() + b * info->block_bytes;
    switch (t) {
      case GgmlType::kF32: {  // one float per "block"
        const float v = 0.01f * static_cast<float>(blk[0] % 100);
        std::memcpy(blk, &v, 4);
        break;
      }
      case GgmlType::kF16:  // one half per "block"
      case GgmlType::kQ4_0:
      case GgmlType::kQ8_0:
        std::memcpy(blk, &small, 2);
        break;
      case GgmlType::kQ4_1:
      case GgmlType::kQ4_K:
        std::memcpy(blk, &small, 2);
        std::memcpy(blk + 2, &small, 2);
        break;
      case GgmlType::kQ6_K:
        std::memcpy(blk + 208, &small, 2);
        break;
      default:
        break;
    }
  }
  return w;
}

// args: n_cols (K), n_rows, n_tokens
void run(benchmark::State& state, GgmlType type, bool use_ref) {
  const int64_t n_cols = state.range(0), n_rows = state.range(1), n_tokens = state.range(2);
  const GgmlTypeInfo* info = ggml_type_info(type);
  const std::vector<uint8_t> wb = make_weights(type, n_rows, n_cols);
  const size_t row_bytes = wb.size() / static_cast<size_t>(n_rows);
  const WeightView w{type, wb.data(), n_cols, n_rows, row_bytes};
  std::vector<float> x(static_cast<size_t>(n_cols * n_tokens)),
      y(static_cast<size_t>(n_rows * n_tokens));
  std::mt19937 rng(1);
  for (float& v : x) v = std::uniform_real_distribution<float>(-1.0f, 1.0f)(rng);
  for (auto _ : state) {
    if (use_ref) {
      ref::matmul(w, x.data(), n_cols, n_tokens, y.data(), n_rows, 0, n_rows);
    } else {
      matmul(w, x.data(), n_cols, n_tokens, y.data(), n_rows, 0, n_rows);
    }
    benchmark::DoNotOptimize(y.data());
    benchmark::ClobberMemory();
  }
  using benchmark::Counter;
  state.counters["GFLOP/s"] =
      Counter(2.0 * n_cols * n_rows * n_tokens * 1e-9, Counter::kIsIterationInvariantRate);
  state.counters["GB/s"] =
      Counter(static_cast<double>(wb.size()) * 1e-9, Counter::kIsIterationInvariantRate);
  state.SetLabel(std::string(info->name));
}

void BM_Fast(benchmark::State& state, GgmlType type) { run(state, type, false); }
void BM_Ref(benchmark::State& state, GgmlType type) { run(state, type, true); }

// The fast path restricted to AVX2, to see what an AVX2-only machine would get.
void BM_FastAvx2(benchmark::State& state, GgmlType type) {
  if ((hwy::SupportedTargets() & HWY_AVX2) == 0) return state.SkipWithError("no AVX2");
  hwy::SetSupportedTargetsForTest(HWY_AVX2);
  run(state, type, false);
  hwy::SetSupportedTargetsForTest(0);
}

// SmolLM2-135M: hidden 576, kv 192, ffn 1536, vocab 49152 (Q8_0 tied output).
void ModelShapes(benchmark::internal::Benchmark* b) {
  for (int64_t t : {1, 64}) {
    b->Args({576, 576, t});
    b->Args({576, 192, t});
    b->Args({576, 1536, t});
    b->Args({1536, 576, t});
  }
  b->ArgNames({"K", "rows", "tokens"});
}
void OutputShapes(benchmark::internal::Benchmark* b) {
  b->Args({576, 49152, 1})->Args({576, 49152, 64})->ArgNames({"K", "rows", "tokens"});
}
void FfnShapes(benchmark::internal::Benchmark* b) {
  b->Args({576, 1536, 1})->Args({576, 1536, 64})->ArgNames({"K", "rows", "tokens"});
}
// K-quants need K % 256 == 0: the FFN down projection.
void DownShapes(benchmark::internal::Benchmark* b) {
  b->Args({1536, 576, 1})->Args({1536, 576, 64})->ArgNames({"K", "rows", "tokens"});
}
// Throughput against the number of tokens (where decode turns into prefill).
void TokenSweep(benchmark::internal::Benchmark* b) {
  for (int64_t t : {1, 2, 3, 4, 5, 6, 8, 12, 16, 32, 128, 512}) b->Args({576, 1536, t});
  b->ArgNames({"K", "rows", "tokens"});
}

BENCHMARK_CAPTURE(BM_Fast, Q4_1_fast, GgmlType::kQ4_1)->Apply(ModelShapes);
BENCHMARK_CAPTURE(BM_Ref, Q4_1_ref, GgmlType::kQ4_1)->Apply(ModelShapes);
BENCHMARK_CAPTURE(BM_Fast, Q8_0_fast, GgmlType::kQ8_0)->Apply(OutputShapes);
BENCHMARK_CAPTURE(BM_Ref, Q8_0_ref, GgmlType::kQ8_0)->Apply(OutputShapes);
BENCHMARK_CAPTURE(BM_Fast, Q8_0_fast, GgmlType::kQ8_0)->Apply(FfnShapes);
BENCHMARK_CAPTURE(BM_FastAvx2, Q4_1_fast_avx2, GgmlType::kQ4_1)->Apply(FfnShapes);
BENCHMARK_CAPTURE(BM_FastAvx2, Q8_0_fast_avx2, GgmlType::kQ8_0)->Apply(FfnShapes);
BENCHMARK_CAPTURE(BM_Fast, Q4_0_fast, GgmlType::kQ4_0)->Apply(FfnShapes);
BENCHMARK_CAPTURE(BM_Fast, Q4_K_fast, GgmlType::kQ4_K)->Apply(DownShapes);
BENCHMARK_CAPTURE(BM_Fast, Q6_K_fast, GgmlType::kQ6_K)->Apply(DownShapes);
BENCHMARK_CAPTURE(BM_Fast, Q4_1_sweep, GgmlType::kQ4_1)->Apply(TokenSweep);
BENCHMARK_CAPTURE(BM_Fast, F16_fast, GgmlType::kF16)->Apply(FfnShapes);
BENCHMARK_CAPTURE(BM_Fast, F32_fast, GgmlType::kF32)->Apply(FfnShapes);

}  // namespace
}  // namespace qevict
