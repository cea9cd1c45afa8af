// Scalar reference dequantizers for the ggml block formats that GGUF weights use.
// Reference path: plain loops, one element at a time, written for clarity; the SIMD
// matmul (kernels/simd/) is tested against these.
#pragma once

#include <cstdint>

#include "gguf/ggml_types.h"

namespace qevict::ref {

// True for the types dequantize_row handles: F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0,
// Q4_K, Q6_K.
bool can_dequantize(GgmlType type);

// Decodes n consecutive elements of a row stored as `type` at src into dst (f32 [n]).
// Preconditions: can_dequantize(type) and n a multiple of the type's block_elems
// (32 for Q4_0..Q8_0, 256 for the K-quants, 1 for the float types); an unsupported type
// fills dst with NaN. src need not be aligned. Block layouts follow ggml-common.h
// (block_q4_0, block_q4_K, ...).
//
// Every quantized value is decoded with a single rounding (the products q*d are exact in
// f32), so the SIMD decoders produce bit-identical weights.
void dequantize_row(GgmlType type, const void* src, float* dst, int64_t n);

// Q4_K's 6-bit scale and min of sub-block s (0..7) from the 12 packed bytes of its block.
void q4_k_scale_min(const uint8_t* sc, int s, int* scale, int* min);

// The code of element e (0..255) of a K-quant block `b` as stored, before scales: Q4_K's
// 4-bit q (x = d·scale·q − dmin·min), Q6_K's 6-bit q (x = d·scale·(q − 32)). Shared by the
// dequantizers and the reference 8-bit matmul, which needs the codes themselves.
int q4_k_code(const uint8_t* b, int e);
int q6_k_code(const uint8_t* b, int e);

}  // namespace qevict::ref
