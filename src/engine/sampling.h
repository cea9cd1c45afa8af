// Token sampling: greedy, or temperature with top-k, top-p and min-p truncation, applied in
// llama.cpp's default order (top-k → top-p → min-p → temperature → draw). Deterministic
// for a given seed.
#pragma once

#include <cstdint>
#include <random>
#include <vector>

#include "core/status.h"

namespace qevict {

struct SamplingParams {
  float temperature = 0.8f;  // <= 0: greedy (argmax)
  int top_k = 40;            // <= 0: off
  float top_p = 0.95f;       // 1: off
  float min_p = 0.05f;       // 0: off; keeps tokens with p >= min_p * p_max
  uint64_t seed = 0;         // RNG seed (tools draw a random one when the user gives none)

  Status validate() const;
  bool greedy() const { return temperature <= 0.0f; }
};

class Sampler {
 public:
  explicit Sampler(const SamplingParams& p);
  // Picks a token from logits f32 [n_vocab]. Ties in greedy mode go to the lowest id.
  int32_t sample(const float* logits, int32_t n_vocab);

 private:
  SamplingParams p_;
  std::mt19937_64 rng_;
  std::vector<std::pair<float, int32_t>> cand_;  // (logit or prob, id) scratch
};

// Index of the largest logit (lowest id on ties).
int32_t argmax(const float* logits, int32_t n);

}  // namespace qevict
