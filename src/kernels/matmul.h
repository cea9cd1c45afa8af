// Matrix multiplication with a quantized GGUF weight: the public entry of the kernels
// layer. Dispatches once per call to the best SIMD target (kernels/simd/matmul.cpp);
// ref::matmul (kernels/ref/matmul_ref.h) is the scalar reference it is tested against.
#pragma once

#include <cstddef>
#include <cstdint>

#include "core/status.h"
#include "gguf/ggml_types.h"

namespace qevict {

// A 2-D GGUF weight, not owned: n_rows rows of n_cols elements, each row stored as
// consecutive blocks of `type` and starting row_bytes after the previous one.
struct WeightView {
  GgmlType type = GgmlType::kF32;
  const uint8_t* data = nullptr;  // [n_rows][row_bytes]
  int64_t n_cols = 0;             // elements per row (the reduction length K)
  int64_t n_rows = 0;             // output features
  size_t row_bytes = 0;           // >= n_cols / block_elems * block_bytes
};

// Ok when matmul can use w: the type can be dequantized (ref::can_dequantize), n_cols is
// a multiple of its block size, row_bytes covers a row, and data is set (unless empty).
Status check_weight_view(const WeightView& w);

// Y[t*ldy + r] = sum_k W[r,k] * X[t*ldx + k]   for t in [0, n_tokens), r in [row_begin, row_end)
// X: f32 [n_tokens][ldx] (ldx >= n_cols), Y: f32 [n_tokens][ldy] (ldy >= row_end); no
// alignment needed, only the listed Y elements are written. Single-threaded and
// reentrant: callers split the row range across threads. Weights are decoded exactly
// (bit-identical to ref::dequantize_row); the products are summed in f32 in L lanes (16
// with AVX-512), so |error| <= (K/L + log2 L + K%L + 1) * 2^-24 * sum_k |W[r,k] X[t,k]|
// (the exact path; calls of >= 32 tokens take the AMX path below where it is on).
// Precondition: check_weight_view(w) is ok and 0 <= row_begin <= row_end <= n_rows;
// otherwise the listed Y elements are set to NaN.
void matmul(const WeightView& w, const float* x, int64_t ldx, int64_t n_tokens, float* y,
            int64_t ldy, int64_t row_begin, int64_t row_end);

// The AMX prefill path (kernels/simd/matmul_amx.h: calls of >= 32 tokens on CPUs with
// AMX-BF16; split-bf16 products, |error| <= (2^-14 + (3K + 8) 2^-24) sum|W X|): on by
// default, off with matmul_set_amx(false) (the CLI's --amx off, or QEVICT_AMX=0 read by the
// frontends: tools/kernel_switches.h), which restores the exact path
// above for every call (and with it exact batch invariance).
bool matmul_amx_enabled();
void matmul_set_amx(bool on);

// The most tokens a call may have for every token's result to be what a call of that token
// alone gives, whichever paths are on (the AMX path starts at one more).
constexpr int64_t kMatmulPerTokenMaxTokens = 31;

// The 8-bit-activation path (kernels/simd/matmul_q8.h: calls of fewer than 32 tokens with
// Q4_0/Q4_1/Q5_0/Q5_1/Q8_0/Q4_K/Q6_K weights, on CPUs with AVX-512 VNNI; X quantized per 32-block
// to d q with d = amax / 127, as llama.cpp does, so |error| <= sum_k |W[r,k]| d_k / 2 + f32
// summation): on by default, off with matmul_set_q8(false) (the CLI's --matmul f32, or QEVICT_Q8=0
// read by the frontends), which restores the exact path for those calls. A token's result does not
// depend on the other tokens of its call.
bool matmul_q8_enabled();
void matmul_set_q8(bool on);

// Rows per work chunk when a caller splits matmuls of n_tokens tokens and total_rows rows
// over n_threads threads: many small chunks for decode (few tokens), fewer for prefill, and
// about one per thread on the AMX path, where every call converts its X once more.
int64_t matmul_row_grain(int64_t n_tokens, int64_t total_rows, int n_threads);

// Types with a dedicated SIMD kernel: F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K,
// Q6_K, i.e. every type ref::can_dequantize accepts. (A type added to the reference but not
// here would be decoded row by row with the scalar dequantizer, then use the F32 kernel.)
bool matmul_supported(GgmlType t);

}  // namespace qevict
