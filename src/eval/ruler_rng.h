// The random draws of the task generators (ruler_tasks.cpp, ruler_qa.cpp): std::mt19937, whose
// output sequence the standard fixes; the standard distributions are implementation-defined,
// so with them one seed could give another sample under another standard library.
#pragma once

#include <cstdint>
#include <random>
#include <utility>
#include <vector>

namespace qevict::eval {

class Rng {
 public:
  explicit Rng(uint64_t seed) : g_(uint32_t(seed ^ (seed >> 32))) {}
  // Uniform in [0, n), n in [1, 2^32], by rejection (no modulo bias).
  uint64_t below(uint64_t n) {
    const uint64_t range = uint64_t(1) << 32;
    const uint64_t limit = range - range % n;
    for (;;) {
      const uint64_t x = g_();
      if (x < limit) return x % n;
    }
  }
  // Uniform in [lo, hi] (inclusive, as Python's random.randint).
  int64_t between(int64_t lo, int64_t hi) { return lo + int64_t(below(uint64_t(hi - lo + 1))); }
  uint32_t bits32() { return g_(); }
  template <class T>
  void shuffle(std::vector<T>& v) {  // Fisher-Yates
    for (size_t i = v.size(); i > 1; --i) std::swap(v[i - 1], v[below(i)]);
  }
  // k distinct values of [0, n) in draw order (partial Fisher-Yates): the first draws do not
  // depend on k, so a sample's answers stay the same while its haystack size is searched.
  std::vector<int64_t> sample(int64_t n, int64_t k) {
    std::vector<int64_t> idx(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) idx[size_t(i)] = i;
    for (int64_t i = 0; i < k; ++i)
      std::swap(idx[size_t(i)], idx[size_t(i + int64_t(below(uint64_t(n - i))))]);
    idx.resize(size_t(k));
    return idx;
  }

 private:
  std::mt19937 g_;
};

}  // namespace qevict::eval
