// Micro-benchmarks of the low-bit window kernels (kernels/lowbit.h) at SmolLM2's shape
// (head_dim 64, 3 KV heads, 8-token windows): qwin_keys (decode + in-window rotation) and
// qwin_pv_accumulate (P·V from the codes, 3 query heads) on INT2 windows, and the decode
// step's unit on the default K4V2 tier (BM_DecodeWindowK4V2, BM_DecodeSegK4V2, below).
// Args of the first two: {windows, prefetch distance, huge pages, sequential}:
//   windows     1: one window that stays in L1 ("hot"); 65,536: a 132 MB pool ("cold");
//   prefetch    0: none, else the head's bytes of the window that many ahead (the attention
//               kernel uses 3);
//   huge        1: the pool on transparent 2 MiB pages (madvise), 0: 4 KiB pages;
//   sequential  1: windows visited in address order, 0: in a shuffled order.
// What they showed on the 2-vCPU Xeon VM (BENCHMARKS §2, "The 8-bit decode path"; this VM's
// timings move by 30 %): a shuffled walk costs ~2x the hot kernel per window and software
// prefetching does not help it; 2 MiB pages take ~15 % off; in address order 1.1-1.5x hot.
// The K4V2 unit (BENCHMARKS §2 "Segments head after head", 2026-12-05): 195 ns hot (161-179
// ns after 40126ff: BENCHMARKS §2 "Fewer instructions per low-bit window"); one
// head's walk over a pool of 3-head windows in address order ~320-370 ns; the 3 heads of
// 64-window segments one after another ~225 ns; one head's plane ~215-235 ns.
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
  QuantLayout L;
  RopeTable rope;
  std::vector<uint8_t> bytes;
  std::vector<size_t> order;  // the visiting order of the windows
  Pool(size_t n_windows, bool huge, bool sequential, QuantLayout layout = {2, 3, 64, 8, 0})
      : L(layout) {
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

// The decode path of the default low-bit tier (K4V2: INT4 keys, INT2 values) on one KV
// head's part of a window: the 3 query heads' scores straight from the key codes
// (qwin_scores, table rows lo + t) then P·V from the value codes, with the attention
// kernel's prefetch of the part `ahead` windows ahead. One item = one window of one KV
// head, the unit a decode step repeats ~39,000 times at 8K positions on a 0.2 budget.
// Args {windows, ahead, huge, sequential, planes[, i8]}: the first four as above; planes 1 =
// a pool of one KV head's parts only (672 B apart: what a layout with one plane per head
// would give), 0 = windows of 3 heads side by side (2,016 B), as the pool holds them; i8 1 =
// P·V by qwin_pv_accumulate_i8 (8-bit weights, VNNI; skipped where the CPU lacks it).
void BM_DecodeWindowK4V2(benchmark::State& st) {
  const size_t n = size_t(st.range(0)), ahead = size_t(st.range(1));
  const bool planes = st.range(4) != 0;
  const bool i8 = st.range(5) != 0;
  const int h = planes ? 0 : 1;
  const Pool p(n, st.range(2) != 0, st.range(3) != 0, QuantLayout{4, planes ? 1 : 3, 64, 8, 0, 2});
  if (i8 && !qwin_pv_i8_supported(p.L, 3)) {
    st.SkipWithError("no AVX-512 VNNI + VBMI");
    return;
  }
  std::vector<float> q(3 * 64, 0.05f), sc(3 * 8), out(3 * 64, 0.0f);
  size_t i = 0;
  for (auto _ : st) {
    if (ahead > 0) p.prefetch(i + ahead, h);
    qwin_scores(p.L, p.win(i), h, 8, p.rope, int(i % 32) * 8, q.data(), 64, 3, 0.125f, sc.data(),
                8);
    if (i8) {
      qwin_pv_accumulate_i8(p.L, p.win(i), h, 8, sc.data(), 8, 3, out.data(), 64);
    } else {
      qwin_pv_accumulate(p.L, p.win(i), h, 8, sc.data(), 8, 3, out.data(), 64);
    }
    benchmark::DoNotOptimize(out.data());
    i = (i + 1) % n;
  }
  st.SetItemsProcessed(st.iterations());
}

// Every KV head of a segment of `seg` windows (pool order, 3 heads side by side), head after
// head, as attend_blocks orders a decode's tasks: the heads after the first read windows
// the first one's walk brought into L2. seg = 1: window by window, the 3 heads back to back.
// Head 0 prefetches 3 windows ahead: the whole window (`whole` = 1) or its own part. Args
// {windows, seg, whole}; one item = one window of one KV head.
void BM_DecodeSegK4V2(benchmark::State& st) {
  const size_t n = size_t(st.range(0)), seg = size_t(st.range(1));
  const bool whole = st.range(2) != 0;
  const Pool p(n, false, true, QuantLayout{4, 3, 64, 8, 0, 2});
  std::vector<float> q(3 * 64, 0.05f), sc(3 * 8), out(3 * 64, 0.0f);
  size_t i0 = 0;
  for (auto _ : st) {
    for (int h = 0; h < 3; ++h)
      for (size_t i = i0; i < i0 + seg; ++i) {
        const uint8_t* ahead = p.win((i + 3) % n);
        if (h == 0 && whole) {
          for (size_t b = 0; b < p.L.window_bytes(); b += 64) __builtin_prefetch(ahead + b);
        } else if (seg == 1 || h == 0) {
          for (size_t b = 0; b < p.L.head_bytes(); b += 64)
            __builtin_prefetch(ahead + p.L.k_codes_off(h) + b);
        }
        qwin_scores(p.L, p.win(i), h, 8, p.rope, int(i % 32) * 8, q.data(), 64, 3, 0.125f,
                    sc.data(), 8);
        qwin_pv_accumulate(p.L, p.win(i), h, 8, sc.data(), 8, 3, out.data(), 64);
        benchmark::DoNotOptimize(out.data());
      }
    i0 = (i0 + seg) % n;
  }
  st.SetItemsProcessed(int64_t(st.iterations() * seg * 3));
}

void Shapes(benchmark::internal::Benchmark* b) {
  b->Args({1, 0, 0, 0});
  for (int seq : {0, 1})
    for (int huge : {0, 1})
      for (int ahead : {0, 3, 16}) b->Args({1 << 16, ahead, huge, seq});
}
BENCHMARK(BM_QwinKeys)->Apply(Shapes);
BENCHMARK(BM_QwinPv)->Apply(Shapes);
BENCHMARK(BM_DecodeWindowK4V2)
    ->Args({1, 0, 0, 0, 0, 0})
    ->Args({1, 0, 0, 0, 0, 1})
    ->Args({65536, 3, 0, 0, 0, 0})
    ->Args({65536, 3, 0, 1, 0, 0})
    ->Args({65536 * 3, 0, 0, 1, 1, 0})
    ->Args({65536 * 3, 3, 0, 1, 1, 0})
    ->Args({65536 * 3, 8, 0, 1, 1, 0});
BENCHMARK(BM_DecodeSegK4V2)
    ->Args({65536, 1, 0})
    ->Args({65536, 1, 1})
    ->Args({65536, 64, 0})
    ->Args({65536, 64, 1})
    ->Args({65536, 512, 1});

}  // namespace
}  // namespace qevict
