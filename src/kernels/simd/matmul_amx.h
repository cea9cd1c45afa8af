// Prefill matmul on Intel AMX tiles (bf16 products, f32 sums): the compute-bound regime of
// qevict::matmul when the CPU and the OS offer AMX-BF16. Internal to the kernels layer:
// matmul-inl.h calls it from its prefill branch with a decoder for the weight type.
//
// Numerics differ from the f32 path: X and the decoded weights are each split into two
// bf16 parts (v = hi + lo, ~16 significant bits) and three of the four part products are
// summed in f32 (matmul_amx.cpp), so |Y - exact| <= (2^-14 + (3K + 8) 2^-24) sum_k
// |W[r,k] X[t,k]| (to first order): ~100x the f32 path's error at K = 576, ~1/200 of one
// bf16 product's. Decode (few tokens) keeps the exact f32 path.
#pragma once

#include <cstddef>

namespace qevict::amx {

// Calls of this many tokens or more take the AMX path where it is on: below it, converting
// X and packing the weights costs more than it saves.
constexpr size_t kMinTokens = 32;

// True when the CPU has AMX-TILE, AMX-BF16 and AVX512-BF16 and the kernel granted the
// tile state (asked once, process-wide).
bool available();
// True when matmul takes the AMX path for prefill: available() and switched on, which it
// is until set_enabled(false) is called (the CLI does for --amx off or QEVICT_AMX=0:
// tools/kernel_switches.h). With it, a token's logits depend in their last bits on how many
// tokens share its batch (32 or more take this path), as in llama.cpp: the engine's batch
// invariance (a request decodes the same alone or joined) is exact only with it off.
bool enabled();
// Turns the AMX path on or off (on a CPU without AMX, true changes nothing). Not
// thread-safe against concurrent matmuls.
void set_enabled(bool on);

// Writes n_rows f32 rows (consecutive weight rows starting at row0 of the call's range),
// `stride` floats apart, each n_cols long.
using DecodeRowsFn = void (*)(const void* ctx, size_t row0, size_t n_rows, float* out,
                              size_t stride);

// y[t * ldy + r] = sum_k W[r, k] x[t * ldx + k] for t < n_tokens, r < n_rows, where the
// rows of W come from decode(ctx, ...). Precondition: enabled().
void matmul_bf16(const float* x, size_t ldx, size_t n_tokens, size_t n_cols, size_t n_rows,
                 DecodeRowsFn decode, const void* ctx, float* y, size_t ldy);

}  // namespace qevict::amx
