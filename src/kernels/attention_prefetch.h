// Software prefetch of the KV windows fused_attention_partial reads next (attention.cpp).
// Internal to the kernels layer. Windows of both tiers sit in pool slots in no guaranteed
// order, so the hardware prefetcher cannot be relied on to bring them in ahead of the walk.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>

#include "kernels/attention.h"
#include "kernels/kv_quant.h"

namespace qevict::attn_prefetch {

// Asks for n bytes from a into L1 (a window's part, read a few windows later).
inline void prefetch_range(const uint8_t* a, size_t n) {
  for (size_t i = 0; i < n; i += 64) __builtin_prefetch(a + i);
  __builtin_prefetch(a + n - 1);
}
// What P·V reads of a window (value codes, scales, zeros), again before the run's P·V.
inline void prefetch_values(const QuantLayout& L, const uint8_t* win, int h) {
  prefetch_range(win + L.v_codes_off(h), L.v_head_code_bytes());
  prefetch_range(win + L.v_scale_off(h), 4 * size_t(L.window) * (L.head_dim / L.g()));
}
// Windows ahead of the one being read that are prefetched: far enough to hide a miss to
// DRAM behind the work on the windows between, near enough not to flood the fill buffers.
constexpr int kPrefetchAhead = 3;
// Blocks looked past for them (larger blocks in between are skipped, not counted).
constexpr int kPrefetchScan = 32;

// Keeps the next kPrefetchAhead windows after the one being read on their way into the
// cache: of a low-bit window, KV head h's whole part (codes, scales and zeros of keys and
// values, one contiguous run); of a full-tier window (16-bit rows, 1 KiB of keys and 1 KiB
// of values per head at head_dim 64), its key and value rows.
// Low-bit and full-tier windows interleave in position order and runs split the list, so
// the windows ahead are found by scanning the block list, across runs, not by index
// arithmetic. Blocks larger than a window (the sinks, pages of newest tokens) are left to
// the hardware prefetcher and not counted. Call touch(b) before reading block b (or a span
// ending at b), in order of b.
class WindowPrefetcher {
 public:
  WindowPrefetcher(const KvBlockRef* blocks, int n_blocks, const QuantLayout* L, int h)
      : blocks_(blocks), n_(n_blocks), L_(L), h_(h) {}
  void touch(int b) {
    if (!L_) return;
    while (count_ > 0 && asked_[first_] <= b) first_ = (first_ + 1) % kPrefetchAhead, --count_;
    if (next_ <= b) next_ = b + 1;
    const int lim = std::min(n_, b + 1 + kPrefetchScan);
    for (; count_ < kPrefetchAhead && next_ < lim; ++next_) {
      const KvBlockRef& blk = blocks_[next_];
      if (blk.k) {
        if (blk.n > L_->window || blk.ld != L_->head_dim) continue;
        const size_t bytes = sizeof(uint16_t) * size_t(blk.n) * size_t(blk.ld);
        prefetch_range(reinterpret_cast<const uint8_t*>(blk.k), bytes);
        prefetch_range(reinterpret_cast<const uint8_t*>(blk.v), bytes);
      } else {
        // Head h's part only. KV head 0's walk used to ask for the other heads' parts too,
        // into L2 (prefetcht1; +5 % at 8K when it came): since the 8-bit P·V and the work-cut
        // segments, dropping it shortens the 0.2 step by ~3 % at 16K and ~2 % at 8K (A/B,
        // BENCHMARKS §2 "Head 0 no longer prefetches"): those prefetches held fill buffers that
        // the windows being read needed.
        prefetch_range(blk.qwin + L_->k_codes_off(h_), L_->head_bytes());
      }
      asked_[(first_ + count_) % kPrefetchAhead] = next_;
      ++count_;
    }
  }

 private:
  const KvBlockRef* blocks_;
  int n_;
  const QuantLayout* L_;
  int h_;
  int next_ = 0;                 // blocks before next_ have been looked at
  int asked_[kPrefetchAhead]{};  // blocks asked for and not yet read, oldest at first_
  int first_ = 0, count_ = 0;
};

}  // namespace qevict::attn_prefetch
