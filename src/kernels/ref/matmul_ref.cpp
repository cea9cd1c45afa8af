// Scalar reference matmul (see matmul_ref.h).
#include "kernels/ref/matmul_ref.h"

#include <vector>

#include "kernels/ref/dequant.h"

namespace qevict::ref {

void matmul(const WeightView& w, const float* x, int64_t ldx, int64_t n_tokens, float* y,
            int64_t ldy, int64_t row_begin, int64_t row_end) {
  std::vector<float> row(static_cast<size_t>(w.n_cols));
  for (int64_t r = row_begin; r < row_end; ++r) {
    dequantize_row(w.type, w.data + static_cast<size_t>(r) * w.row_bytes, row.data(), w.n_cols);
    for (int64_t t = 0; t < n_tokens; ++t) {
      const float* xt = x + t * ldx;
      double sum = 0.0;
      for (int64_t k = 0; k < w.n_cols; ++k) {
        sum += static_cast<double>(row[k]) * static_cast<double>(xt[k]);
      }
      y[t * ldy + r] = static_cast<float>(sum);
    }
  }
}

}  // namespace qevict::ref
