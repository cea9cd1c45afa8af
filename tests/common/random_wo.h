// Test helper: a random output projection W_O (F32 weights, the same for every layer) for the
// policies that score by value-projected norms (CriticalKV, DefensiveKV): the cache tests hand it
// to SequenceKvCache::set_output_projection. With period p > 1, column c is scaled by
// 1 + c % p, so that value norms through it differ by query head and token; f64 is the same
// matrix in double, for brute-force models.
#pragma once

#include <cstdint>
#include <random>
#include <vector>

#include "kernels/matmul.h"
#include "kvcache/kv_cache.h"
#include "kvcache/shape.h"

namespace qevict::test {

struct RandomWo {
  std::vector<float> w;  // f32 [n_embd][q_width]
  std::vector<double> f64;
  OutputProjection proj;
  RandomWo(const KvShape& s, int64_t n_embd, std::mt19937& rng, int period = 1) {
    std::normal_distribution<float> d(0.0f, 1.0f);
    const int64_t qw = s.q_width();
    w.resize(size_t(n_embd * qw));
    for (int64_t e = 0; e < n_embd; ++e)
      for (int64_t c = 0; c < qw; ++c) w[size_t(e * qw + c)] = d(rng) * (1.0f + float(c % period));
    f64.assign(w.begin(), w.end());
    for (int l = 0; l < s.n_layers; ++l) {
      WeightView v;
      v.type = GgmlType::kF32;
      v.data = reinterpret_cast<const uint8_t*>(w.data());
      v.n_cols = s.q_width();
      v.n_rows = n_embd;
      v.row_bytes = size_t(s.q_width()) * sizeof(float);
      proj.wo.push_back(v);
    }
  }
};

}  // namespace qevict::test
