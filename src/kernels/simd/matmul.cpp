// Optimized path: qevict::matmul, dispatched once per call to the best Highway target
// (foreach_target compiles matmul-inl.h once per target; MatmulImpl there picks the
// decoder and the decode/prefill regime).
#include "kernels/matmul.h"

#include <limits>
#include <string>

#include "kernels/ref/dequant.h"
#include "kernels/simd/matmul_amx.h"
#include "kernels/simd/matmul_q8.h"

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kernels/simd/matmul.cpp"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
// Must come after foreach_target.h.
#include "hwy/highway.h"
#include "kernels/simd/matmul-inl.h"

#if HWY_ONCE
namespace qevict {

HWY_EXPORT(MatmulImpl);

Status check_weight_view(const WeightView& w) {
  const GgmlTypeInfo* info = ggml_type_info(w.type);
  if (info == nullptr || !ref::can_dequantize(w.type)) {
    return Status::error("matmul: unsupported weight type " +
                         std::to_string(static_cast<uint32_t>(w.type)));
  }
  if (w.n_cols < 0 || w.n_rows < 0 || w.n_cols % info->block_elems != 0) {
    return Status::error("matmul: bad shape " + std::to_string(w.n_rows) + "x" +
                         std::to_string(w.n_cols) + " for " + std::string(info->name));
  }
  const int64_t need = w.n_cols / info->block_elems * info->block_bytes;
  if (w.row_bytes < static_cast<size_t>(need)) {
    return Status::error("matmul: row_bytes " + std::to_string(w.row_bytes) + " < " +
                         std::to_string(need));
  }
  if (w.data == nullptr && w.n_rows > 0 && w.n_cols > 0) {
    return Status::error("matmul: null weight data");
  }
  return Status::ok();
}

bool matmul_supported(GgmlType t) {
  switch (t) {
    case GgmlType::kF32:
    case GgmlType::kF16:
    case GgmlType::kBF16:
    case GgmlType::kQ4_0:
    case GgmlType::kQ4_1:
    case GgmlType::kQ5_0:
    case GgmlType::kQ5_1:
    case GgmlType::kQ8_0:
    case GgmlType::kQ4_K:
    case GgmlType::kQ6_K:
      return true;
    default:
      return false;
  }
}

static_assert(kMatmulPerTokenMaxTokens + 1 == static_cast<int64_t>(amx::kMinTokens),
              "the per-token bound of matmul.h must end where the AMX path starts");

bool matmul_amx_enabled() { return amx::enabled(); }
void matmul_set_amx(bool on) { amx::set_enabled(on); }

bool matmul_q8_enabled() { return q8::enabled(); }
void matmul_set_q8(bool on) { q8::set_enabled(on); }

int64_t matmul_row_grain(int64_t n_tokens, int64_t total_rows, int n_threads) {
  const int64_t t = HWY_MAX(n_threads, 1);
  if (n_tokens >= static_cast<int64_t>(amx::kMinTokens) && amx::enabled()) {
    return HWY_MAX((total_rows + t - 1) / t, int64_t{1});
  }
  // The 8-bit path quantizes X once per call: with several tokens, four chunks per thread
  // keep that small against the products (decode keeps 64-row chunks for balance).
  if (n_tokens > 1 && q8::enabled()) {
    return HWY_MAX((total_rows + 4 * t - 1) / (4 * t), int64_t{64});
  }
  return n_tokens >= 8 ? 16 : 64;
}

void matmul(const WeightView& w, const float* x, int64_t ldx, int64_t n_tokens, float* y,
            int64_t ldy, int64_t row_begin, int64_t row_end) {
  if (n_tokens <= 0 || row_begin >= row_end) return;
  const bool ok = check_weight_view(w).is_ok() && row_begin >= 0 && row_end <= w.n_rows &&
                  (n_tokens == 1 || (ldx >= w.n_cols && ldy >= row_end));
  if (!ok) {  // broken precondition: poison the outputs we were asked for
    for (int64_t t = 0; t < n_tokens; ++t) {
      for (int64_t r = HWY_MAX(row_begin, int64_t{0}); r < row_end; ++r) {
        y[t * ldy + r] = std::numeric_limits<float>::quiet_NaN();
      }
    }
    return;
  }
  if (w.n_cols == 0) {  // empty sums
    for (int64_t t = 0; t < n_tokens; ++t) {
      for (int64_t r = row_begin; r < row_end; ++r) y[t * ldy + r] = 0.0f;
    }
    return;
  }
  HWY_DYNAMIC_DISPATCH(MatmulImpl)(w, x, ldx, n_tokens, y, ldy, row_begin, row_end);
}

}  // namespace qevict
#endif  // HWY_ONCE
