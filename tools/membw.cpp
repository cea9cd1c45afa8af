// qevict-membw: memory read bandwidth (GB/s = 1e9 B/s), the ceiling a memory-bound decode step
// runs against. N threads each sum-reduce their own slice of a buffer much larger than the
// last-level cache (default 1 GiB); the median over several passes is printed as JSON.
// A standalone measuring tool, not part of the engine (it uses none of src/).
//
// Why the reads cannot be optimized away: the buffer holds the words 0, 1, 2, ... and every
// pass checks that the sum equals n (n - 1) / 2 (mod 2^64). The loop uses 64-byte vectors
// (GCC vector extension) with four independent accumulators so it is not latency-bound; on
// x86-64 it is compiled for AVX-512, AVX2 and baseline, picked at run time (target_clones).
#include <CLI/CLI.hpp>
#include <algorithm>
#include <atomic>
#include <barrier>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <nlohmann/json.hpp>
#include <thread>
#include <vector>

namespace {

using Vec = uint64_t __attribute__((vector_size(64)));  // 8 x u64, one cache line
constexpr size_t kUnroll = 4;                           // vectors per loop step (accumulators)
constexpr size_t kChunk = sizeof(Vec) * kUnroll;        // 256 B: each slice is a multiple

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define MEMBW_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define MEMBW_CLONES
#endif

// Sum of the u64 words in p[0, n_vec) (n_vec a multiple of kUnroll).
MEMBW_CLONES uint64_t sum_words(const Vec* p, size_t n_vec) {
  Vec a0 = {}, a1 = {}, a2 = {}, a3 = {};
  for (size_t i = 0; i < n_vec; i += kUnroll) {
    a0 += p[i];
    a1 += p[i + 1];
    a2 += p[i + 2];
    a3 += p[i + 3];
  }
  const Vec a = a0 + a1 + a2 + a3;
  uint64_t s = 0;
  for (int k = 0; k < 8; ++k) s += a[k];
  return s;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t m = v.size() / 2;
  return v.size() % 2 ? v[m] : 0.5 * (v[m - 1] + v[m]);
}

}  // namespace

int main(int argc, char** argv) {
  int threads = 2;
  double size_mib = 1024;
  int reps = 7;
  CLI::App app{
      "Memory read bandwidth: N threads sum a large buffer; prints the median GB/s as JSON"};
  app.add_option("-t,--threads", threads, "threads reading")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("-s,--size-mib", size_mib, "buffer size in MiB (much larger than the LLC)")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("-r,--reps", reps, "timed passes over the buffer (median reported)")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  CLI11_PARSE(app, argc, argv);

  // Equal slices, each a whole number of 256-byte steps.
  const size_t step_bytes = kChunk * size_t(threads);
  const size_t bytes = std::max<size_t>(1, size_t(size_mib * 1048576.0) / step_bytes) * step_bytes;
  const size_t n_words = bytes / sizeof(uint64_t);
  const size_t slice_vec = bytes / sizeof(Vec) / size_t(threads);
  auto* buf = static_cast<Vec*>(std::aligned_alloc(sizeof(Vec), bytes));
  if (buf == nullptr) {
    std::fprintf(stderr, "error: cannot allocate %zu bytes\n", bytes);
    return 1;
  }
  const uint64_t expected = (n_words % 2 == 0) ? (n_words / 2) * (n_words - 1)
                                               : n_words * ((n_words - 1) / 2);  // mod 2^64

  // Each thread writes (first touch) and then reads its own slice; the barrier lines the
  // threads up so one pass's time is from the first start to the last finish.
  std::vector<uint64_t> partial(static_cast<size_t>(threads));
  std::barrier sync(threads + 1);
  std::atomic<bool> quit{false};
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t) {
    pool.emplace_back([&, t] {
      const Vec* p = buf + size_t(t) * slice_vec;
      auto* w = reinterpret_cast<uint64_t*>(buf) + size_t(t) * slice_vec * 8;
      const size_t first = size_t(t) * slice_vec * 8;
      for (size_t i = 0; i < slice_vec * 8; ++i) w[i] = first + i;
      sync.arrive_and_wait();  // filled
      for (;;) {
        sync.arrive_and_wait();  // start of a pass
        if (quit.load()) return;
        partial[size_t(t)] = sum_words(p, slice_vec);
        sync.arrive_and_wait();  // end of the pass
      }
    });
  }
  sync.arrive_and_wait();

  std::vector<double> gbs;
  bool ok = true;
  for (int r = 0; r <= reps; ++r) {  // pass 0 warms up (TLB, frequency) and is not timed
    auto t0 = std::chrono::steady_clock::now();
    sync.arrive_and_wait();
    sync.arrive_and_wait();
    auto t1 = std::chrono::steady_clock::now();
    uint64_t total = 0;
    for (uint64_t s : partial) total += s;
    if (total != expected) ok = false;
    if (r > 0) gbs.push_back(double(bytes) / std::chrono::duration<double>(t1 - t0).count() / 1e9);
  }
  quit.store(true);
  sync.arrive_and_wait();
  for (auto& th : pool) th.join();
  std::free(buf);
  if (!ok) {
    std::fprintf(stderr, "error: checksum mismatch (the reads were not all done)\n");
    return 1;
  }

  nlohmann::json out = {{"tool", "qevict-membw"},   {"threads", threads},
                        {"buffer_bytes", bytes},    {"reps", reps},
                        {"read_gb_s", median(gbs)}, {"runs_gb_s", gbs}};
  std::printf("%s\n", out.dump().c_str());
  return 0;
}
