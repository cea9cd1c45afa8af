// Sampler implementation (see sampling.h). Truncations follow llama.cpp's samplers:
// top-p keeps the smallest prefix whose probability reaches p (at least one token);
// min-p keeps p_i >= min_p * p_max; temperature divides the logits before the draw.
#include "engine/sampling.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

namespace qevict {

Status SamplingParams::validate() const {
  if (std::isnan(temperature)) return Status::error("temperature must be a number");
  if (!(top_p > 0.0f && top_p <= 1.0f))
    return Status::error(fmt::format("top-p must be in (0, 1], got {}", top_p));
  if (!(min_p >= 0.0f && min_p <= 1.0f))
    return Status::error(fmt::format("min-p must be in [0, 1], got {}", min_p));
  return Status::ok();
}

int32_t argmax(const float* logits, int32_t n) {
  int32_t best = 0;
  for (int32_t i = 1; i < n; ++i)
    if (logits[i] > logits[best]) best = i;
  return best;
}

Sampler::Sampler(const SamplingParams& p) : p_(p), rng_(p.seed) {}

int32_t Sampler::sample(const float* logits, int32_t n_vocab) {
  if (p_.greedy()) return argmax(logits, n_vocab);
  cand_.resize(size_t(n_vocab));
  for (int32_t i = 0; i < n_vocab; ++i) cand_[i] = {logits[i], i};
  auto by_logit = [](const auto& a, const auto& b) {
    return a.first > b.first || (a.first == b.first && a.second < b.second);
  };
  size_t n = cand_.size();
  if (p_.top_k > 0 && size_t(p_.top_k) < n) {
    std::partial_sort(cand_.begin(), cand_.begin() + p_.top_k, cand_.end(), by_logit);
    n = size_t(p_.top_k);
  } else {
    std::sort(cand_.begin(), cand_.end(), by_logit);
  }
  // Probabilities of the survivors (softmax at temperature 1, as llama.cpp's top-p/min-p).
  std::vector<double> prob(n);
  const double mx = cand_[0].first;
  double sum = 0.0;
  for (size_t i = 0; i < n; ++i) sum += (prob[i] = std::exp(double(cand_[i].first) - mx));
  for (auto& x : prob) x /= sum;
  if (p_.top_p < 1.0f) {
    double cum = 0.0;
    size_t keep = n;
    for (size_t i = 0; i < n; ++i) {
      cum += prob[i];
      if (cum >= p_.top_p) {
        keep = i + 1;
        break;
      }
    }
    n = keep;
  }
  if (p_.min_p > 0.0f) {
    size_t keep = 1;
    while (keep < n && prob[keep] >= p_.min_p * prob[0]) ++keep;
    n = keep;
  }
  // Draw from softmax(logit / T) over the survivors.
  std::vector<double> w(n);
  double wsum = 0.0;
  for (size_t i = 0; i < n; ++i)
    wsum += (w[i] = std::exp((double(cand_[i].first) - mx) / p_.temperature));
  std::uniform_real_distribution<double> u(0.0, wsum);
  double r = u(rng_);
  for (size_t i = 0; i < n; ++i) {
    r -= w[i];
    if (r < 0.0) return cand_[i].second;
  }
  return cand_[n - 1].second;
}

}  // namespace qevict
