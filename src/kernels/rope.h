// Rotary position embedding (RoPE) as llama.cpp applies it: "normal" mode rotates adjacent
// pairs (x[2i], x[2i+1]) — what GGUF llama-arch files expect, since the converter permutes
// Q/K weights for it — and NeoX mode rotates (x[i], x[i + n_rot/2]) (qwen2).
// theta_i = pos * base^(-2i / n_rot), i < n_rot/2 (RoFormer Eq. 34). Scalar: the cost is a
// few hundred flops per head per token, far below the matmuls.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace qevict {

enum class RopeStyle { kNormal, kNeox };

struct RopeParams {
  RopeStyle style = RopeStyle::kNormal;
  int n_rot = 0;  // rotated dims per head (<= head_dim; the rest pass through)
  float freq_base = 10000.0f;
  float freq_scale = 1.0f;  // linear position scaling (positions are multiplied by it)
};

// cos/sin of theta_i for one position, i < n_rot/2. Computed in double, stored as float.
void rope_cos_sin(const RopeParams& p, int64_t pos, float* cos_out, float* sin_out);

// Rotates n_heads vectors of head_dim floats (stride ld) in place with the precomputed
// cos/sin of one position. inverse = true applies the exact inverse rotation (angle -theta).
void rope_apply(const RopeParams& p, const float* cos_t, const float* sin_t, float* x, int n_heads,
                int head_dim, int64_t ld, bool inverse = false);

// cos/sin of every position up to a bound, [pos][n_rot/2] each, grown on demand: lets
// caches re-rotate decoded keys without recomputing transcendental functions.
class RopeTable {
 public:
  explicit RopeTable(const RopeParams& p = {}) : p_(p) {}
  const RopeParams& params() const { return p_; }
  // Makes positions [0, n) available.
  void ensure(int64_t n);
  const float* cos_at(int64_t pos) const { return cos_.data() + pos * (p_.n_rot / 2); }
  const float* sin_at(int64_t pos) const { return sin_.data() + pos * (p_.n_rot / 2); }
  int64_t size() const { return n_; }
  size_t bytes() const { return (cos_.capacity() + sin_.capacity()) * sizeof(float); }

 private:
  RopeParams p_;
  int64_t n_ = 0;
  std::vector<float> cos_, sin_;
};

}  // namespace qevict
