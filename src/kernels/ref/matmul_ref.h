// Scalar reference matmul: dequantize one weight row with ref::dequantize_row, then a
// plain dot product in double per token. The fast kernels are tested against this.
#pragma once

#include <cstdint>

#include "kernels/matmul.h"

namespace qevict::ref {

// Same contract as qevict::matmul (kernels/matmul.h): Y[t*ldy + r] = sum_k W[r,k] *
// X[t*ldx + k] for t in [0, n_tokens), r in [row_begin, row_end). The sum is computed in
// double and rounded once to f32.
void matmul(const WeightView& w, const float* x, int64_t ldx, int64_t n_tokens, float* y,
            int64_t ldy, int64_t row_begin, int64_t row_end);

}  // namespace qevict::ref
