// Test helper: a toy prompt with one needle, driven through a cache's forward calls. Shared by
// the prefill-route and --kv-adapt tests, whose claims are about where the prompt's end looks.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <random>
#include <vector>

#include "common/kv_shape.h"
#include "core/thread_pool.h"
#include "kvcache/kv_cache.h"

namespace qevict::test {

// What a token carries (see NeedleDriver).
enum class Role { kRandom, kHaystack, kQuestion };

// The toy shape: 2 layers, 2 query heads on 1 KV head of 16 channels, RoPE. The prefill-route
// tests that drive no needle use it too, so both kinds run on one shape.
inline KvShape needle_shape() { return rope_shape(2, 2, 1, 16); }

// Builds the q/k/v rows of a call from a token's position and role, the same for every layer
// (shape: needle_shape()):
//   sink keys      3·e1 (haystack queries put much of their mass there, as in real models)
//   haystack keys  e1 + 0.3·noise,  values noise (channel 5 zero)
//   needle keys    4·e0 (positions [needle0, needle0 + 8): one ω-window), values 10·e5
//   haystack query 8·e1 + noise: logit 2 on the haystack, 6 on the sink, ~0 on the needle
//   question query 6·e0: logit 6 on the needle, ~0 elsewhere (the question reads the needle)
//   random         every row 2·noise (keys, queries) or noise (values)
struct NeedleDriver {
  explicit NeedleDriver(uint32_t seed = 2024) : rng(seed) {}

  KvShape s = needle_shape();
  int64_t needle0 = 5 + 2 * 8;  // window 2, early in the prompt
  std::mt19937 rng;
  std::normal_distribution<float> noise{0.0f, 1.0f};

  // One forward call of n tokens from position n_past; returns layer 0's output.
  std::vector<float> call(SequenceKvCache& c, int64_t n, Role role, ThreadPool& pool) {
    const int64_t p0 = c.n_past();
    const int qw = s.q_width(), kw = s.kv_width(), d = s.head_dim;
    std::vector<float> q(size_t(n) * qw, 0.0f), k(size_t(n) * kw, 0.0f), v(k.size(), 0.0f),
        o(q.size()), o0;
    for (int64_t t = 0; t < n; ++t) {
      const int64_t pos = p0 + t;
      float* kt = k.data() + t * kw;
      float* vt = v.data() + t * kw;
      if (role == Role::kRandom) {
        for (int i = 0; i < kw; ++i) kt[i] = 2.0f * noise(rng), vt[i] = noise(rng);
        for (int i = 0; i < qw; ++i) q[size_t(t) * qw + i] = 2.0f * noise(rng);
        continue;
      }
      if (pos < 5) {
        kt[1] = 3.0f;
      } else if (pos >= needle0 && pos < needle0 + 8) {
        kt[0] = 4.0f;
        vt[5] = 10.0f;
      } else {
        kt[1] = 1.0f;
        for (int i = 2; i < d; ++i) kt[i] = 0.3f * noise(rng);
        for (int i = 0; i < d; ++i) vt[i] = noise(rng);
        vt[5] = 0.0f;
      }
      for (int h = 0; h < s.n_q_heads; ++h) {
        float* qt = q.data() + size_t(t) * qw + h * d;
        if (role == Role::kQuestion) {
          qt[0] = 6.0f;
        } else {
          qt[1] = 8.0f;
          for (int i = 2; i < d; ++i) qt[i] = 0.3f * noise(rng);
        }
      }
    }
    EXPECT_TRUE(c.begin(n).is_ok());
    for (int l = 0; l < s.n_layers; ++l) {
      c.attend(l, q.data(), k.data(), v.data(), o.data(), pool);
      if (l == 0) o0 = o;
    }
    EXPECT_TRUE(c.commit().is_ok());
    return o0;
  }
};

}  // namespace qevict::test
