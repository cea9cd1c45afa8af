// ThreadPool::parallel_for that also tells fn which of the pool's threads runs it, so that
// a kernel keeps its per-thread working memory in a caller's struct (BlockAttnScratch's
// slots, whose bytes count as the cache's) instead of thread_local storage nobody counts.
// Internal to the kernels layer.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstdint>

#include "core/thread_pool.h"

namespace qevict {

// Splits [0, n) into chunks as pool.parallel_for does (at least `grain` items, ~4 per
// thread, handed out dynamically) and calls fn(t, begin, end), t < pool.size() the index of
// the calling thread: no two calls with the same t run at once.
template <typename Fn>
void parallel_for_slots(ThreadPool& pool, int64_t n, int64_t grain, const Fn& fn) {
  if (n <= 0) return;
  grain = std::max<int64_t>(1, grain);
  if (pool.size() == 1 || n <= grain) {
    fn(0, int64_t(0), n);
    return;
  }
  const int64_t chunk = std::max<int64_t>(grain, n / (int64_t(pool.size()) * 4));
  std::atomic<int64_t> next{0};
  pool.run([&](int t) {
    for (;;) {
      const int64_t b = next.fetch_add(chunk, std::memory_order_relaxed);
      if (b >= n) break;
      fn(t, b, std::min(n, b + chunk));
    }
  });
}

}  // namespace qevict
