// Decode-regime matmul with 8-bit activations and integer dot products (AVX-512 VNNI), for
// the 32-element block types Q4_0, Q4_1, Q5_0, Q5_1 and Q8_0 and the K-quants Q4_K and Q6_K
// (per 32-element sub-block, X quantized the same way): what llama.cpp does for these types
// (Q4_K_M files are mostly Q4_K and Q6_K: without them the 1.5B model decoded every weight to
// f32). Internal to the kernels layer: matmul-inl.h calls it for calls of fewer than
// amx::kMinTokens tokens where it is on.
//
// Why: at short context a decode step is the weights, and the exact path decodes every
// weight to f32 and multiplies in f32 FMAs, ~14 vector operations per 32-weight block and
// row; here a block pair is unpacked to bytes once and multiplied by the activation bytes
// in one vpdpbusd (~7 per block).
//
// Numerics: X is quantized per 32-block as ref::quantize_q8_block does (d = amax / 127,
// nearest-even codes), so Y differs from the exact product by at most
// sum_k |W[r,k]| d_b / 2 (d_b the activation block's step) plus f32 summation; the block
// products themselves are exact integers. ref::matmul_q8 is the scalar reference. A token's
// result does not depend on the other tokens of the call.
#pragma once

#include <cstddef>
#include <cstdint>

#include "gguf/ggml_types.h"

namespace qevict::q8 {

// True when the CPU and OS have AVX-512 F/BW/VL and VNNI, F16C and FMA (cpu::avx512_vnni).
bool available();
// True when matmul takes this path for the calls it covers: available() and switched on,
// which it is until set_enabled(false) is called (the CLI does for --matmul f32 or QEVICT_Q8=0:
// tools/kernel_switches.h).
bool enabled();
void set_enabled(bool on);
// The types this path takes (ref::q8_supported).
bool supports(GgmlType t);

// y[t * ldy + r] = sum_k W[r, k] x[t * ldx + k] for t < n_tokens, r < n_rows, W's rows
// row_bytes apart from w, n_cols a multiple of 32. Precondition: enabled(), supports(type).
void matmul(GgmlType type, const uint8_t* w, size_t row_bytes, size_t n_rows, size_t n_cols,
            const float* x, size_t ldx, size_t n_tokens, float* y, size_t ldy);

}  // namespace qevict::q8
