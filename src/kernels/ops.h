// Element-wise and attention primitives used by the forward pass and the KV caches.
// Dispatching entry points: each forwards to the best Highway target chosen once at first
// use (simd/ops.cpp); the plain scalar references with the same signatures are in
// ref/ops_ref.h and are what the tests compare against.
#pragma once

#include <cstdint>

namespace qevict {

// Storage type of cached keys/values: IEEE half or bfloat16, both 16 bits.
enum class HalfType { kF16, kBF16 };

// y[i] = x[i] / sqrt(mean(x^2) + eps) * w[i], i < n (RMSNorm, llama.cpp's ggml_rms_norm * w).
void rmsnorm(const float* x, const float* w, float* y, int64_t n, float eps);

// out[i] = silu(gate[i]) * up[i]; silu(x) = x / (1 + exp(-x)) (SwiGLU).
void swiglu(const float* gate, const float* up, float* out, int64_t n);

// dst[i] = half(src[i]), round to nearest even.
void f32_to_half(HalfType t, const float* src, uint16_t* dst, int64_t n);
// dst[i] = float(src[i]).
void half_to_f32(HalfType t, const uint16_t* src, float* dst, int64_t n);

// GQA score block: for each of g query heads (q rows at q + h*ldq, d floats each) and each
// of n keys (key j at k + j*ldk, d halfs): scores[h*lds + j] = scale * dot(q_h, k_j).
// Each key row is read once for all g heads. Bit for bit what qk_scores_f32 gives on the
// rows converted by half_to_f32 (the same kernel after an exact conversion).
void qk_scores(HalfType t, const float* q, int64_t ldq, int g, const uint16_t* k, int64_t ldk,
               int64_t n, int d, float scale, float* scores, int64_t lds);

// GQA value accumulation: out[h*ldo + c] += sum_{j<n} p[h*ldp + j] * v_j[c], c < d, h < g.
// Each value row is read once for all g heads.
void pv_accumulate(HalfType t, const float* p, int64_t ldp, int g, const uint16_t* v, int64_t ldv,
                   int64_t n, int d, float* out, int64_t ldo);

// The same two for many rows at once — every (query, head) pair of a prefill run — over key
// and value rows given by pointers (k[j], v[j]: head_dim halfs each; null: a row of zeros),
// so a run of blocks scattered in memory (8-token windows in pool slots) is one call. Row r
// of q is q + r*ldq, of scores scores + r*lds, of p p + r*ldp, of out out + r*ldo. Keys and
// values are converted once for all rows and the rows share them from registers. The scores
// sum channels in order (a few ulps from qk_scores' tree of partial sums); the value sums
// are bit for bit pv_accumulate's with g = m over the same rows (channels past the last full
// SIMD vector: one sum over all n rows, added at the end).
void qk_scores_rows(HalfType t, const float* q, int64_t ldq, int m, const uint16_t* const* k,
                    int64_t n, int d, float scale, float* scores, int64_t lds);
void pv_accumulate_rows(HalfType t, const float* p, int64_t ldp, int m, const uint16_t* const* v,
                        int64_t n, int d, float* out, int64_t ldo);

// The same two operations on f32 key/value rows (decoded low-bit windows).
void qk_scores_f32(const float* q, int64_t ldq, int g, const float* k, int64_t ldk, int64_t n,
                   int d, float scale, float* scores, int64_t lds);
void pv_accumulate_f32(const float* p, int64_t ldp, int g, const float* v, int64_t ldv, int64_t n,
                       int d, float* out, int64_t ldo);

// Numerically stable in-place softmax over x[0..n); returns the max it subtracted.
float softmax_inplace(float* x, int64_t n);

// max_i x[i] over n > 0 elements.
float max_of(const float* x, int64_t n);
// x[i] = exp(x[i] - m) in place; returns the sum of the new values (online-softmax step).
float exp_sub_sum(float* x, int64_t n, float m);
// exp_sub_sum for m ≥ every x[i] with a cheaper exp (within 3e-7 relative; x − m < −87.33
// gives exactly 0) that also sums each 8-token group:
// sums[k] = ((x0+x1)+(x2+x3)) + ((x4+x5)+(x6+x7)) over x[8k, 8k + 8) after the exp (a last
// partial group as if padded with zeros); sums holds ceil(n / 8). A decode's per-window
// masses, in vectors instead of 8 scalar adds a window and head.
float exp_sub_sum8(float* x, int64_t n, float m, float* sums);
// acc[i] += exp(s[i] - m) * inv for i < n (probabilities added to double masses).
void exp_scale_accumulate(const float* s, int64_t n, float m, float inv, double* acc);

// Name of the SIMD target the dispatcher chose (for logs and benchmarks).
const char* simd_target_name();

}  // namespace qevict
