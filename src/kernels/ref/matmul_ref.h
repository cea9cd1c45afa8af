// Scalar reference matmuls: dequantize one weight row with ref::dequantize_row, then a
// plain dot product in double per token (matmul); and the 8-bit-activation form of the
// same product that the VNNI path computes (matmul_q8). The fast kernels are tested
// against these.
#pragma once

#include <cstdint>

#include "kernels/matmul.h"

namespace qevict::ref {

// Same contract as qevict::matmul (kernels/matmul.h): Y[t*ldy + r] = sum_k W[r,k] *
// X[t*ldx + k] for t in [0, n_tokens), r in [row_begin, row_end). The sum is computed in
// double and rounded once to f32.
void matmul(const WeightView& w, const float* x, int64_t ldx, int64_t n_tokens, float* y,
            int64_t ldy, int64_t row_begin, int64_t row_end);

// One block of 32 activations quantized to 8 bits (the Q8 form of matmul_q8): x[i] ~ d q[i].
// amax = max |x[i]|; amax == 0 gives d = 0 and q = 0; a non-finite amax gives d = NaN and
// q = 0 (so NaN reaches Y); otherwise d = amax / 127 and q[i] = nearest-even(x[i] * (127 /
// amax)), each a single f32 operation, so |x[i] - d q[i]| <= d / 2 (to rounding). sum = sum q.
struct Q8Block {
  float d = 0.0f;
  int32_t sum = 0;
  int8_t q[32] = {};
};
Q8Block quantize_q8_block(const float* x);

// True for the weight types matmul_q8 takes: the 32-element block types Q4_0, Q4_1, Q5_0,
// Q5_1, Q8_0, and the K-quants Q4_K and Q6_K (their 32-element sub-blocks).
bool q8_supported(GgmlType t);

// Y as matmul, with every 32-block of X replaced by its Q8Block and the block products
// formed from integers: for weight block (d_w, m_w, codes c) and activation block (d, q),
//   Q4_0: d_w d (sum c q - 8 sum q)    Q5_0: d_w d (sum c q - 16 sum q)
//   Q4_1, Q5_1: d_w d sum c q + m_w d sum q          Q8_0: d_w d sum c q
//   Q4_K (sub-block scale s, min m): d s d sum c q - dmin m d sum q
//   Q6_K: per 16 elements with their scale s: d s d (sum c q - 32 sum q)
// (c the unsigned 4/5-bit codes, or Q8_0's signed bytes), summed over blocks in double and
// rounded once. Precondition: q8_supported(w.type).
void matmul_q8(const WeightView& w, const float* x, int64_t ldx, int64_t n_tokens, float* y,
               int64_t ldy, int64_t row_begin, int64_t row_end);

}  // namespace qevict::ref
