// Rotary position embedding (RoPE) as llama.cpp applies it: "normal" mode rotates adjacent
// pairs (x[2i], x[2i+1]) — what GGUF llama-arch files expect, since the converter permutes
// Q/K weights for it — and NeoX mode rotates (x[i], x[i + n_rot/2]) (qwen2).
// theta_i = pos * base^(-2i / n_rot), i < n_rot/2 (RoFormer Eq. 34). rope_apply is scalar:
// the cost is a few hundred flops per head per token, far below the matmuls. RopeTable
// gives cos/sin of any position from a table whose size does not depend on the context.
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

// The channel that channel c is rotated with (c itself past n_rot).
inline int rope_partner(const RopeParams& p, int c) {
  if (c >= p.n_rot) return c;
  if (p.style == RopeStyle::kNormal) return c ^ 1;
  const int half = p.n_rot / 2;
  return c < half ? c + half : c - half;
}

// cos/sin of any position below a bound fixed at construction, from a table of fixed size
// (at most 256 rows a level; the top level only the rows below the bound)
// (SPEC §3: nothing in a budgeted cache grows with the positions). RoPE is a rotation by
// pos·theta_i, so R(a + b) = R(a)·R(b): a position is split into base-256 digits,
// pos = Σ_l d_l·256^l, and its cos/sin are the complex product of one row per level, each
// row computed in double and rounded once. With L levels the result is within about 2L
// float roundings of the directly computed cos/sin (tested). Rows are "expanded" to
// head_dim channels so that SIMD code rotates a row with two multiplies:
//   x'[c] = x[c]·cosx[c] + x[partner(c)]·sinx[c]
//   cosx[c] = cos of c's pair (1 past n_rot), sinx[c] = −sin for the pair's first channel,
//   +sin for its second (0 past n_rot). The inverse rotation negates sinx.
class RopeTable {
 public:
  static constexpr int kLevelBits = 8;
  static constexpr int kLevelRows = 1 << kLevelBits;

  RopeTable() = default;
  // Covers positions [0, n_pos) (at least one level).
  RopeTable(const RopeParams& p, int head_dim, int64_t n_pos);

  const RopeParams& params() const { return p_; }
  int head_dim() const { return d_; }
  int levels() const { return levels_; }
  // Positions [0, limit) are covered.
  int64_t limit() const {
    return levels_ == 0 ? 0 : int64_t(top_rows_) << (kLevelBits * (levels_ - 1));
  }
  // Expanded rows of the first level, positions [0, 256): in-window offsets.
  const float* cosx_row(int64_t t) const { return cos_.data() + size_t(t) * d_; }
  const float* sinx_row(int64_t t) const { return sin_.data() + size_t(t) * d_; }
  // First-level rows by channel pair, for kernels that hold the two channels of a pair in
  // two vectors (simd/lowbit-inl.h: INT4 key codes, a byte of which is channels 2i, 2i + 1):
  // f32 [head_dim / 2] each, the cos of every pair and the sin its second channel takes
  // (+sin), the expanded rows' own values, pairs in "nibble order": kNormal pair i (channels
  // 2i, 2i + 1) at i; kNeox the even pairs (channels 2i, 2i + d/2) first, then the odd ones.
  // Present (has_pair_rows) for kNormal with an even head_dim and for kNeox with full
  // rotation and head_dim % 4 == 0.
  bool has_pair_rows() const { return !pair_cos_.empty(); }
  const float* pair_cos_row(int64_t t) const { return pair_cos_.data() + size_t(t) * (d_ / 2); }
  const float* pair_sin_row(int64_t t) const { return pair_sin_.data() + size_t(t) * (d_ / 2); }
  // Expanded cos/sin of pos, f32 [head_dim] each (pos < limit()).
  void expanded(int64_t pos, float* cosx, float* sinx) const;
  // Plain cos/sin of pos, f32 [n_rot/2] each, as rope_cos_sin gives them (for rope_apply).
  void cos_sin(int64_t pos, float* cos_out, float* sin_out) const;
  size_t bytes() const {
    return (cos_.capacity() + sin_.capacity() + pair_cos_.capacity() + pair_sin_.capacity()) *
           sizeof(float);
  }

 private:
  RopeParams p_;
  int d_ = 0;
  int levels_ = 0;
  int top_rows_ = 0;              // rows of the top level: ceil(n_pos / 256^(levels-1)), or 256
  std::vector<float> cos_, sin_;  // f32 [levels][256][head_dim], expanded
  std::vector<float> pair_cos_, pair_sin_;  // f32 [256][head_dim / 2], nibble order
};

}  // namespace qevict
