// Micro-benchmarks of the low-bit window kernels (kernels/lowbit.h) at SmolLM2's shape
// (head_dim 64, 3 KV heads, 8-token INT2 windows): qwin_keys (decode + in-window rotation)
// and qwin_pv_accumulate (P·V from the codes, 3 query heads). Args: {windows, prefetch
// distance, huge pages, sequential}:
//   windows     1: one window that stays in L1 ("hot"); 65,536: a 107 MB pool ("cold");
//   prefetch    0: none, else the head's bytes of the window that many ahead (the attention
//               kernel uses 3);
//   huge        1: the pool on transparent 2 MiB pages (madvise), 0: 4 KiB pages;
//   sequential  1: windows visited in address order, 0: in a shuffled order (as pool slots
//               are, in no order the hardware can follow).
// What it showed on the 2-vCPU Xeon VM (BENCHMARKS §2, "The 8-bit decode path"; two runs,
// this VM's timings move by 30 %): a shuffled walk costs ~2x the hot kernel per window
// (keys 162-175 vs 77-85 ns, P·V 203-219 vs 94-96) and software prefetching does not help it
// at any distance; 2 MiB pages take ~15 % off; in address order it costs 1.1-1.5x hot.
//   build/bench/qevict_lowbit_bench   (configure with -DQEVICT_BUILD_BENCH=ON)
#include <benchmark/benchmark.h>
#include <sys/mman.h>

#include <algorithm>
#include <cstdint>
#include <numeric>
#include <random>
#include <vector>

#include "kernels/kv_quant.h"
#include "kernels/lowbit.h"
#include "kernels/rope.h"

namespace qevict {
namespace {

struct Pool {
  QuantLayout L{2, 3, 64, 8, 0};
  RopeTable rope;
  std::vector<uint8_t> bytes;
  std::vector<size_t> order;  // the visiting order of the windows
  Pool(size_t n_windows, bool huge, bool sequential) {
    RopeParams rp;
    rp.n_rot = 64;
    rope = RopeTable(rp, 64, 1 << 16);
    std::mt19937 rng(7);
    std::normal_distribution<float> dist(0.0f, 1.0f);
    std::vector<float> k(8 * 3 * 64), v(k.size());
    for (auto& x : k) x = dist(rng);
    for (auto& x : v) x = dist(rng);
    const size_t two_mib = size_t(2) << 20;
    bytes.reserve(n_windows * L.window_bytes() + 2 * two_mib);
    if (huge) {  // the whole 2 MiB pages inside the buffer
      const uintptr_t a = reinterpret_cast<uintptr_t>(bytes.data());
      const uintptr_t lo = (a + two_mib - 1) & ~(uintptr_t(two_mib) - 1);
      madvise(reinterpret_cast<void*>(lo), bytes.capacity() - (lo - a) - two_mib, MADV_HUGEPAGE);
    }
    bytes.resize(n_windows * L.window_bytes());
    quantize_window(L, k.data(), v.data(), 8, bytes.data());
    for (size_t i = 1; i < n_windows; ++i)
      std::copy_n(bytes.data(), L.window_bytes(), bytes.data() + i * L.window_bytes());
    order.resize(n_windows);
    std::iota(order.begin(), order.end(), size_t{0});
    if (!sequential) std::shuffle(order.begin(), order.end(), rng);
  }
  const uint8_t* win(size_t i) const { return bytes.data() + order[i] * L.window_bytes(); }
  void prefetch(size_t i, int h) const {
    const uint8_t* a = win(i % order.size()) + L.k_codes_off(h);
    for (size_t b = 0; b < L.head_bytes(); b += 64) __builtin_prefetch(a + b);
  }
};

void BM_QwinKeys(benchmark::State& st) {
  const size_t n = size_t(st.range(0)), ahead = size_t(st.range(1));
  const Pool p(n, st.range(2) != 0, st.range(3) != 0);
  std::vector<float> k(8 * 64);
  size_t i = 0;
  for (auto _ : st) {
    if (ahead > 0) p.prefetch(i + ahead, 1);
    qwin_keys(p.L, p.win(i), 1, 8, p.rope, 0, k.data(), 64);
    benchmark::DoNotOptimize(k.data());
    i = (i + 1) % n;
  }
  st.SetItemsProcessed(st.iterations());
}

void BM_QwinPv(benchmark::State& st) {
  const size_t n = size_t(st.range(0)), ahead = size_t(st.range(1));
  const Pool p(n, st.range(2) != 0, st.range(3) != 0);
  std::vector<float> prob(3 * 8, 0.1f), out(3 * 64, 0.0f);
  size_t i = 0;
  for (auto _ : st) {
    if (ahead > 0) p.prefetch(i + ahead, 1);
    qwin_pv_accumulate(p.L, p.win(i), 1, 8, prob.data(), 8, 3, out.data(), 64);
    benchmark::DoNotOptimize(out.data());
    i = (i + 1) % n;
  }
  st.SetItemsProcessed(st.iterations());
}

void Shapes(benchmark::internal::Benchmark* b) {
  b->Args({1, 0, 0, 0});
  for (int seq : {0, 1})
    for (int huge : {0, 1})
      for (int ahead : {0, 3, 16}) b->Args({1 << 16, ahead, huge, seq});
}
BENCHMARK(BM_QwinKeys)->Apply(Shapes);
BENCHMARK(BM_QwinPv)->Apply(Shapes);

}  // namespace
}  // namespace qevict
