// Fused mixed-tier attention (see attention.h). Optimized path: the inner products run on
// the Highway kernels of ops.h; this file only walks blocks and keeps softmax bookkeeping.
#include "kernels/attention.h"

#include <algorithm>
#include <cassert>
#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>
#include <vector>

#include "kernels/lowbit.h"

namespace qevict {

void attn_state_init(float* state, int group, int head_dim) {
  const int st = attn_state_stride(head_dim);
  for (int h = 0; h < group; ++h) {
    state[h * st] = -std::numeric_limits<float>::infinity();
    state[h * st + 1] = 0.0f;
    for (int c = 0; c < head_dim; ++c) state[h * st + 2 + c] = 0.0f;
  }
}

void attn_merge(const float* parts, int n_parts, int64_t part_stride, int group, int head_dim,
                float* out, float* global_ml) {
  const int st = attn_state_stride(head_dim);
  for (int h = 0; h < group; ++h) {
    float M = -std::numeric_limits<float>::infinity();
    for (int i = 0; i < n_parts; ++i) M = std::max(M, parts[i * part_stride + h * st]);
    float L = 0.0f;
    float* o = out + size_t(h) * head_dim;
    for (int c = 0; c < head_dim; ++c) o[c] = 0.0f;
    for (int i = 0; i < n_parts; ++i) {
      const float* s = parts + i * part_stride + h * st;
      if (s[1] == 0.0f) continue;
      const float w = std::exp(s[0] - M);
      L += s[1] * w;
      for (int c = 0; c < head_dim; ++c) o[c] += s[2 + c] * w;
    }
    const float inv = L > 0.0f ? 1.0f / L : 0.0f;
    for (int c = 0; c < head_dim; ++c) o[c] *= inv;
    global_ml[2 * h] = M;
    global_ml[2 * h + 1] = L;
  }
}

namespace {

// Blocks are processed in runs of up to kRunTokens tokens: scores of a run live in one
// buffer, so the softmax bookkeeping (max, exp, rescaling of the running state) is done
// once per run with full vectors instead of once per 8-token window.
constexpr int kRunTokens = 256;
constexpr float kMasked = -1e30f;  // score of a masked token: exp() underflows to exactly 0
// Tasks a call aims for at least when it splits blocks into ranges (decode: few heads, one
// query). A constant, not the thread count, so that results do not depend on -t; 8 keeps up
// to 8 threads busy.
constexpr int64_t kTargetTasks = 8;
// A block's share of a decode's work by source, relative: a 16-bit window's head part cost
// ~311 ns in a 16K decode against ~248 ns for a K4V2 one (per-segment timings of `qevict
// bench -d 16384 --kv-budget 0.2`, SmolLM2), about 5 : 4. A heuristic for the split only:
// the results do not depend on it beyond the order of the segments' merge.
constexpr int64_t kHalfCost = 5, kLowBitCost = 4;

// The first block of each of `segs` segments of a head's nb blocks, and nb. Segment i's
// share of the head's work W (kHalfCost or kLowBitCost a block) is a_i = segs − i + segs/2
// over Σa (decreasing: 12 … 5 for 8 segments), so segment s starts at the first block whose
// work up to its end, times Σa, exceeds W·(a_0 + … + a_{s−1}). Work, not counts: a 16-bit
// window costs more than a low-bit one, and the segments of a tiered cache's first windows
// (mostly 16-bit) cost ~15 % more than the rest by count. Decreasing: the threads claim the
// segments in order, so the last ones claimed are the smallest and the two threads end
// closer together — in a 16K decode, alternating token by token within one run, the
// attention took 0.8-1.1 % less time than with equal shares (A/A 0.25 %; a steeper profile,
// a_i = segs − i, no better). Two walks of the list, no per-block storage (a budgeted
// cache's scratch must not grow with its blocks). Needs segs ≤ kMaxSegments.
constexpr int64_t kMaxSegments = 64;
static_assert(kTargetTasks <= kMaxSegments, "segments per head are at most kTargetTasks");
inline void segment_starts(const KvBlockRef* blocks, int64_t nb, int64_t segs, int64_t* lo) {
  assert(segs >= 1 && segs <= kMaxSegments);
  int64_t share[kMaxSegments + 1] = {0};  // share[s] = a_0 + … + a_{s−1}
  for (int64_t i = 0; i < segs; ++i) share[i + 1] = share[i] + (segs - i + segs / 2);
  int64_t W = 0;
  for (int64_t b = 0; b < nb; ++b) W += blocks[b].k ? kHalfCost : kLowBitCost;
  lo[0] = 0;
  int64_t s = 1, w = 0;
  for (int64_t b = 0; b < nb && s < segs; ++b) {
    w += blocks[b].k ? kHalfCost : kLowBitCost;
    while (s < segs && w * share[segs] > W * share[s]) lo[s++] = b;
  }
  while (s <= segs) lo[s++] = nb;
}

// Tokens of `blk` that a query at position qpos may see (causal).
inline int visible(const KvBlockRef& blk, int64_t qpos) {
  return static_cast<int>(std::min<int64_t>(blk.n, std::max<int64_t>(qpos - blk.pos0 + 1, 0)));
}

// A span: consecutive blocks [b, e) of a run that one kernel call can read as one.
struct Span {
  int b = 0, e = 0;
  int64_t pos0 = 0;
  int n = 0;  // tokens
};

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
// of values per head at head_dim 64), its key and value rows. Windows of both tiers sit in
// pool slots in no guaranteed order, so the hardware prefetcher cannot be relied on.
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

// The first-level table row at which a low-bit window's keys start their rotation: its
// offset within the 256-position stretch it lies in, when the whole window fits in that
// stretch (the query then carries R(pos0 - row)ᵀ only), else 0 (the query carries R(pos0)ᵀ).
// A window's own property, so that a run of queries and a lone query round alike.
inline int key_row0(const KvBlockRef& blk) {
  const int64_t lo = blk.pos0 & (RopeTable::kLevelRows - 1);
  return lo + blk.n <= RopeTable::kLevelRows ? static_cast<int>(lo) : 0;
}

bool continues(const KvBlockRef& a, const KvBlockRef& b) {
  if (a.pos0 + a.n != b.pos0) return false;
  if (!a.k || !b.k) return !a.k && !b.k;  // low-bit windows are decoded side by side
  return a.ld == b.ld && b.k == a.k + a.n * a.ld && b.v == a.v + a.n * a.ld;
}

}  // namespace

void fused_attention_partial(const FusedAttnParams& p, const float* q, int64_t ldq, int nq,
                             int64_t qpos0, const KvBlockRef* blocks, int n_blocks, float* state,
                             float* block_ml, int64_t ml_stride) {
  const int g = p.group, d = p.head_dim, st = attn_state_stride(d);
  thread_local std::vector<float> scores, kbuf, vbuf, rot, qrot, qhi, hirot, kwin, qall, mscores,
      qprep;
  thread_local std::vector<int> off;
  thread_local std::vector<float> gsum;
  thread_local std::vector<const uint16_t*> krows, vrows;
  thread_local std::vector<Span> spans;
  if (scores.size() < size_t(g) * kRunTokens) scores.resize(size_t(g) * kRunTokens);
  if (qrot.size() < size_t(g) * d) qrot.resize(size_t(g) * d);
  if (qhi.size() < size_t(g) * d) qhi.resize(size_t(g) * d);
  if (hirot.size() < size_t(2) * d) hirot.resize(size_t(2) * d);
  // Decode (one query) sums low-bit values straight from their codes; a run of queries
  // (prefill) decodes the run's values once and sums the rows for each query. The two round
  // differently (ulps, tested): a query's output depends on whether it is alone.
  const bool pv_from_codes = p.qlayout && nq == 1 && qwin_pv_supported(*p.qlayout, g);
  // ...with the weights in 8 bits where the CPU and the layout allow (qwin_pv_accumulate_i8:
  // INT2 values, AVX-512 VNNI; QEVICT_PV_INT8=0 keeps the float path).
  const bool pv_i8 = pv_from_codes && qwin_pv_i8_supported(*p.qlayout, g);
  // One query (decode) decodes each low-bit window's keys just before scoring them, into a
  // window-sized buffer that stays in L1; a run of queries decodes the run's keys once for
  // all of them. The decoded values and the scoring are the same either way.
  const bool keys_per_window = p.qlayout && nq == 1;
  // ...or, where the kernel allows (qwin_scores_supported), scores it straight from the codes
  // with the same operations, keeping each key row in registers.
  const bool scores_from_codes =
      keys_per_window && p.rope && qwin_scores_supported(*p.qlayout, *p.rope, g);
  // The query as qwin_scores_prepared reads it: made when the query's rotation changes (a
  // 256-position stretch), not for every window.
  // 64-byte aligned: the kernel loads each of its vectors once per token (a load across two
  // cache lines costs two).
  if (scores_from_codes && qprep.size() < size_t(g) * d + 16) qprep.resize(size_t(g) * d + 16);
  float* const qp =
      reinterpret_cast<float*>((reinterpret_cast<uintptr_t>(qprep.data()) + 63) & ~uintptr_t(63));
  if (keys_per_window && kwin.size() < size_t(p.qlayout->window) * d)
    kwin.resize(size_t(p.qlayout->window) * d);
  // A run of queries over 16-bit blocks only (prefill over f16/bf16 pages, the current
  // chunk, full-tier windows) scores and accumulates all its queries' heads with one call of
  // qk_scores_rows and one of pv_accumulate_rows per run, over the run's rows by pointer:
  // every key and value row is converted once for the run instead of once per query. The
  // value sums are a lone query's, order included (masked tokens add 0); the scores sum
  // channels in order, a few ulps from a lone query's (tested).
  WindowPrefetcher prefetcher(blocks, n_blocks, p.qlayout, p.kv_head);
  const int M = nq * g;    // (query, head) rows, row i*g + h
  bool have_qall = false;  // the queries as M contiguous rows, copied for the first batched run
  int64_t tok_base = 0;    // tokens of the runs before this one (token_ml units)
  for (int b0 = 0; b0 < n_blocks;) {
    // Form a run [b0, b1) and its spans.
    int b1 = b0, run = 0;
    off.clear();
    spans.clear();
    while (b1 < n_blocks && (b1 == b0 || run + blocks[b1].n <= kRunTokens)) {
      off.push_back(run);
      if (b1 > b0 && continues(blocks[b1 - 1], blocks[b1])) {
        spans.back().e = b1 + 1;
        spans.back().n += blocks[b1].n;
      } else {
        spans.push_back({b1, b1 + 1, blocks[b1].pos0, blocks[b1].n});
      }
      run += blocks[b1].n;
      ++b1;
    }
    if (scores.size() < size_t(g) * run) scores.resize(size_t(g) * run);
    const int R = run;
    bool batch = nq > 1;
    for (int b = b0; b < b1 && batch; ++b) batch = blocks[b].k != nullptr;
    int n_rows = 0;  // the run's tokens up to the last one any query sees
    if (batch) {
      if (mscores.size() < size_t(M) * R) mscores.resize(size_t(M) * R);
      krows.resize(size_t(R));
      vrows.resize(size_t(R));
      // The rows of every block of the run, in run order, as one list: one kernel call for
      // the run however its blocks lie in memory. Tokens no query sees are null (zero rows;
      // every query masks them).
      for (int b = b0; b < b1; ++b) {
        const KvBlockRef& blk = blocks[b];
        const int o = off[b - b0], n = visible(blk, qpos0 + nq - 1);
        for (int j = 0; j < blk.n; ++j) {
          krows[o + j] = j < n ? blk.k + j * blk.ld : nullptr;
          vrows[o + j] = j < n ? blk.v + j * blk.ld : nullptr;
        }
        if (n > 0) n_rows = o + n;
      }
      if (n_rows > 0 && !have_qall) {
        if (qall.size() < size_t(M) * d) qall.resize(size_t(M) * d);
        for (int i = 0; i < nq; ++i)
          std::memcpy(qall.data() + size_t(i) * g * d, q + i * ldq, sizeof(float) * size_t(g) * d);
        have_qall = true;
      }
      if (n_rows > 0)
        qk_scores_rows(p.dtype, qall.data(), d, M, krows.data(), n_rows, d, p.scale, mscores.data(),
                       R);
    }
    // Decode the run's low-bit windows once for all queries (SIMD, kernels/lowbit.h): keys
    // rotated by R(r + t) from the table's first level (r = key_row0), values as they are;
    // and each window's R(p0 - r), which the queries carry instead
    // (q·R(p0 + t)k = (R(p0 - r)ᵀq)·(R(r + t)k)).
    if (kbuf.size() < size_t(R) * d) kbuf.resize(size_t(R) * d), vbuf.resize(size_t(R) * d);
    if (rot.size() < size_t(b1 - b0) * 2 * d) rot.resize(size_t(b1 - b0) * 2 * d);
    for (int b = b0; b < b1; ++b) {
      const KvBlockRef& blk = blocks[b];
      if (blk.k) continue;
      const int n_max = visible(blk, qpos0 + nq - 1);
      if (n_max <= 0) continue;
      const size_t o = size_t(off[b - b0]) * d;
      if (!keys_per_window) prefetcher.touch(b);
      const int row0 = key_row0(blk);
      if (!keys_per_window)
        qwin_keys(*p.qlayout, blk.qwin, p.kv_head, n_max, *p.rope, row0, kbuf.data() + o, d);
      if (!pv_from_codes && !p.stats_only)
        qwin_values(*p.qlayout, blk.qwin, p.kv_head, n_max, vbuf.data() + o, d);
      if (keys_per_window) continue;  // one query: its rotation per window, below
      float* cs = rot.data() + size_t(b - b0) * 2 * d;
      p.rope->expanded(blk.pos0 - row0, cs, cs + d);
    }
    for (int i = 0; i < nq; ++i) {
      const float* qi = q + i * ldq;
      float* si = state + size_t(i) * g * st;
      float* ml_i = block_ml ? block_ml + i * ml_stride : nullptr;
      const int64_t qpos = qpos0 + i;
      // This query's scores, [g][R]: its rows of the run's batch, or its own.
      float* const sc = batch ? mscores.data() + size_t(i) * g * R : scores.data();
      bool any = false;
      // One query: p0 = hi + lo with lo < 256; R(hi)ᵀq is shared by the 32 windows of a
      // 256-position stretch, and the keys start their rotation at row lo of the table's first
      // level (R(lo)ᵀ on the query instead for a window that would run past it).
      int64_t hi_cur = -1;
      bool qp_is_qhi = false;  // qp holds qhi (the stretch's query) in the kernel's layout
      for (const Span& sp : spans) {
        const int o = off[sp.b - b0];
        const int n =
            static_cast<int>(std::min<int64_t>(sp.n, std::max<int64_t>(qpos - sp.pos0 + 1, 0)));
        if (n > 0) any = true;
        if (n > 0 && !batch) {  // a batched run's scores are in sc already
          const KvBlockRef& blk = blocks[sp.b];
          if (blk.k) {
            if (keys_per_window) prefetcher.touch(sp.e - 1);
            qk_scores(p.dtype, qi, d, g, blk.k, blk.ld, n, d, p.scale, sc + o, R);
          } else {
            // Window by window: the query carries R(p0 − row0)ᵀ, shared by the windows of a
            // 256-position stretch (R(hi)ᵀ), the keys the rest.
            for (int b = sp.b, ob = o; b < sp.e && ob < o + n; ob += blocks[b].n, ++b) {
              const int nb = std::min(blocks[b].n, o + n - ob);
              // The keys' rotation starts at table row `row0`; the query carries the rest.
              const float* qw = qrot.data();
              const int row0 = key_row0(blocks[b]);
              if (keys_per_window) {
                const int64_t lo = blocks[b].pos0 & (RopeTable::kLevelRows - 1);
                const int64_t hi = blocks[b].pos0 - lo;
                if (hi != hi_cur) {
                  hi_cur = hi;
                  qp_is_qhi = false;  // qhi changes
                  if (hi == 0) {
                    std::memcpy(qhi.data(), qi, sizeof(float) * size_t(g) * d);
                  } else {
                    p.rope->expanded(hi, hirot.data(), hirot.data() + d);
                    rope_rows(p.rope->params(), d, hirot.data(), hirot.data() + d,
                              /*inverse=*/true, qi, d, g, qhi.data(), d);
                  }
                }
                if (lo == row0) {
                  // q·R(hi + lo + t)k = (R(hi)ᵀq)·(R(lo + t)k): the keys take rows lo + t of
                  // the table's first level, and the query needs no rotation of its own.
                  qw = qhi.data();
                } else {  // a window across a 256-position boundary: R(lo)ᵀ on the query
                  rope_rows(p.rope->params(), d, p.rope->cosx_row(lo), p.rope->sinx_row(lo),
                            /*inverse=*/true, qhi.data(), d, g, qrot.data(), d);
                }
              } else {
                const float* cs = rot.data() + size_t(b - b0) * 2 * d;  // R(p0 - row0)
                rope_rows(p.rope->params(), d, cs, cs + d, /*inverse=*/true, qi, d, g, qrot.data(),
                          d);
              }
              if (scores_from_codes) {
                prefetcher.touch(b);
                // qrot is made for its one window; qhi serves the stretch's windows.
                if (qw != qhi.data() || !qp_is_qhi) {
                  qwin_scores_query(*p.qlayout, *p.rope, qw, d, g, qp);
                  qp_is_qhi = qw == qhi.data();
                }
                qwin_scores_prepared(*p.qlayout, blocks[b].qwin, p.kv_head, nb, *p.rope, row0, qp,
                                     g, p.scale, sc + ob, R);
                continue;
              }
              const float* kw = kbuf.data() + size_t(ob) * d;
              if (keys_per_window) {  // decode: the window's keys stay in L1
                prefetcher.touch(b);
                qwin_keys(*p.qlayout, blocks[b].qwin, p.kv_head, nb, *p.rope, row0, kwin.data(), d);
                kw = kwin.data();
              }
              qk_scores_f32(qw, d, g, kw, d, nb, d, p.scale, sc + ob, R);
            }
          }
        }
        for (int h = 0; h < g; ++h)
          for (int j = n; j < sp.n; ++j) sc[size_t(h) * R + o + j] = kMasked;
      }
      const int used = R;  // scores[0, R) are filled (masked tokens hold kMasked)
      if (!any) {
        if (ml_i) {
          // Units of the run: its blocks, or (token_ml) its tokens.
          const int64_t u0 = p.token_ml ? tok_base : b0, u1 = p.token_ml ? tok_base + R : b1;
          for (int64_t u = u0; u < u1; ++u)
            for (int h = 0; h < g; ++h) {
              float* ml = ml_i + (size_t(u) * g + h) * 2;
              ml[0] = -std::numeric_limits<float>::infinity();
              ml[1] = 0.0f;
            }
        }
        if (batch) std::fill(sc, sc + size_t(g) * R, 0.0f);  // adds nothing to the run's P·V
        continue;
      }
      // A run of whole, visible 8-token blocks (a decode's windows) sums its blocks' masses
      // in vectors along with the exp (exp_sub_sum8); other runs block by block.
      bool groups8 = ml_i && !p.token_ml;
      for (int b = b0; b < b1 && groups8; ++b)
        groups8 = blocks[b].n == 8 && visible(blocks[b], qpos) == 8;
      if (groups8 && gsum.size() < size_t(R / 8)) gsum.resize(size_t(R / 8));
      for (int h = 0; h < g; ++h) {
        float* sh = sc + size_t(h) * R;
        float* s = si + h * st;
        const float m = max_of(sh, used);
        // sh[j] = exp(s_j - m); masked → 0
        const float l = groups8 ? exp_sub_sum8(sh, used, m, gsum.data()) : exp_sub_sum(sh, used, m);
        if (ml_i && p.token_ml) {
          // One (m, l) per token: l = its own exp(s - m); masked tokens hold exactly 0.
          for (int j = 0; j < R; ++j) {
            float* ml = ml_i + (size_t(tok_base + j) * g + h) * 2;
            ml[0] = m;
            ml[1] = sh[j];
          }
        } else if (ml_i && groups8) {
          for (int b = b0; b < b1; ++b) {
            float* ml = ml_i + (size_t(b) * g + h) * 2;
            ml[0] = m;  // every block of the run shares the run's max
            ml[1] = gsum[b - b0];
          }
        } else if (ml_i) {
          for (int b = b0; b < b1; ++b) {
            const int o = off[b - b0];
            const int n = visible(blocks[b], qpos);
            float* ml = ml_i + (size_t(b) * g + h) * 2;
            if (n <= 0) {
              ml[0] = -std::numeric_limits<float>::infinity();
              ml[1] = 0.0f;
              continue;
            }
            float lb = 0.0f;
            for (int j = 0; j < n; ++j) lb += sh[o + j];
            ml[0] = m;  // every block of the run shares the run's max
            ml[1] = lb;
          }
        }
        const float m_new = std::max(s[0], m);
        const float alpha = std::exp(s[0] - m_new);  // 0 when the state was empty
        const float beta = std::exp(m - m_new);
        s[0] = m_new;
        s[1] = s[1] * alpha + l * beta;
        if (alpha != 1.0f)
          for (int c = 0; c < d; ++c) s[2 + c] *= alpha;
        if (beta != 1.0f)
          for (int j = 0; j < used; ++j) sh[j] *= beta;
      }
      if (batch || p.stats_only) continue;  // P·V below, for every query of the run at once
      for (const Span& sp : spans) {
        const int o = off[sp.b - b0];
        const int n =
            static_cast<int>(std::min<int64_t>(sp.n, std::max<int64_t>(qpos - sp.pos0 + 1, 0)));
        if (n <= 0) continue;
        const KvBlockRef& blk = blocks[sp.b];
        const float* pb = sc + o;
        if (blk.k) {
          pv_accumulate(p.dtype, pb, R, g, blk.v, blk.ld, n, d, si + 2, st);
        } else if (pv_from_codes) {
          for (int b = sp.b, ob = o; b < sp.e && ob < o + n; ob += blocks[b].n, ++b) {
            if (b + kPrefetchAhead < b1 && !blocks[b + kPrefetchAhead].k)
              prefetch_values(*p.qlayout, blocks[b + kPrefetchAhead].qwin, p.kv_head);
            const int nb = std::min(blocks[b].n, o + n - ob);
            if (pv_i8) {
              qwin_pv_accumulate_i8(*p.qlayout, blocks[b].qwin, p.kv_head, nb, sc + ob, R, g,
                                    si + 2, st);
            } else {
              qwin_pv_accumulate(*p.qlayout, blocks[b].qwin, p.kv_head, nb, sc + ob, R, g, si + 2,
                                 st);
            }
          }
        } else {
          pv_accumulate_f32(pb, R, g, vbuf.data() + size_t(o) * d, d, n, d, si + 2, st);
        }
      }
    }
    if (batch && n_rows > 0 && !p.stats_only) {
      // Row i*g + h of the probabilities is query i's head h; its state is at the same row
      // of `state` (stride st). Tokens a query may not see have probability 0.
      pv_accumulate_rows(p.dtype, mscores.data(), R, M, vrows.data(), n_rows, d, state + 2, st);
    }
    b0 = b1;
    tok_base += R;
  }
}

namespace {

// attend_blocks' masses per token over 16-bit blocks: mass[u] += Σ exp(s − M) / L over the
// tile's queries and each KV head's query heads, (M, L) every (query, head)'s final softmax
// max and sum (gml, [query][KV head][g][2]), s the score recomputed by qk_scores_rows — what
// the attention computed for runs of queries, so exp(s − M) ≤ 1. Work is split over the pool
// by (head, chunk of units) when heads write their own masses, else by chunk; each unit sums
// its terms in one fixed order (heads, queries, query heads), so the result does not depend
// on the threads. Queries before a chunk's first position skip it.
void token_masses(const FusedAttnParams& fp, int H, const float* q, int64_t ldq, int64_t n_q,
                  int64_t qpos0, const KvBlockRef* blocks, const int64_t* head_off,
                  const int64_t* unit_off, const float* gml, double* mass, MassLayout layout,
                  BlockAttnScratch& sc, ThreadPool& pool) {
  const int g = fp.group, d = fp.head_dim;
  // Every head's tokens in unit order: key row and position (the caller's scratch: it grows
  // with the tokens, so it counts as the cache's bytes).
  const int64_t n_units = unit_off[head_off[H]];
  std::vector<const uint16_t*>& tok_k = sc.tok_k;
  std::vector<int64_t>& tok_pos = sc.tok_pos;
  tok_k.resize(size_t(n_units));
  tok_pos.resize(size_t(n_units));
  for (int64_t b = 0; b < head_off[H]; ++b)
    for (int j = 0; j < blocks[b].n; ++j) {
      tok_k[unit_off[b] + j] = blocks[b].k + j * blocks[b].ld;
      tok_pos[unit_off[b] + j] = blocks[b].pos0 + j;
    }
  const bool per_head = layout == MassLayout::kPerHeadBlock;
  int64_t nu_max = 0;
  for (int h = 0; h < H; ++h)
    nu_max = std::max(nu_max, unit_off[head_off[h + 1]] - unit_off[head_off[h]]);
  constexpr int64_t kChunk = 256, kQ = 16;
  const int64_t chunks = (nu_max + kChunk - 1) / kChunk;
  const int64_t tasks = per_head ? H * chunks : chunks;
  const uint16_t* const* tk = tok_k.data();
  const int64_t* tp = tok_pos.data();
  pool.parallel_for(tasks, 1, [&](int64_t k0, int64_t k1) {
    thread_local std::vector<float> qrows, S;
    thread_local std::vector<double> acc;
    qrows.resize(size_t(kQ) * g * d);
    S.resize(size_t(kQ) * g * kChunk);
    acc.resize(size_t(kChunk));
    for (int64_t k = k0; k < k1; ++k) {
      const int64_t c = k % chunks;
      const int h_lo = per_head ? int(k / chunks) : 0, h_hi = per_head ? h_lo + 1 : H;
      for (int h = h_lo; h < h_hi; ++h) {
        const int64_t u0 = unit_off[head_off[h]], nu = unit_off[head_off[h + 1]] - u0;
        const int64_t b0 = c * kChunk, b1 = std::min(nu, b0 + kChunk);
        if (b0 >= b1) continue;
        const int n = int(b1 - b0);
        const int64_t* pos = tp + u0 + b0;  // ascending: blocks are in position order
        std::fill(acc.begin(), acc.begin() + n, 0.0);
        for (int64_t t0 = std::max<int64_t>(0, pos[0] - qpos0); t0 < n_q; t0 += kQ) {
          const int nq = int(std::min(kQ, n_q - t0));
          for (int i = 0; i < nq; ++i)
            std::memcpy(qrows.data() + size_t(i) * g * d, q + (t0 + i) * ldq + size_t(h) * g * d,
                        sizeof(float) * size_t(g) * d);
          // Tokens past the group's last query are seen by none of it.
          const int n_any = int(std::upper_bound(pos, pos + n, qpos0 + t0 + nq - 1) - pos);
          qk_scores_rows(fp.dtype, qrows.data(), d, nq * g, tk + u0 + b0, n_any, d, fp.scale,
                         S.data(), kChunk);
          for (int i = 0; i < nq; ++i) {
            const int64_t qpos = qpos0 + t0 + i;
            const int nv = int(std::upper_bound(pos, pos + n_any, qpos) - pos);
            if (nv == 0) continue;
            const float* ml = gml + (size_t(t0 + i) * H + h) * g * 2;
            for (int j = 0; j < g; ++j) {
              const float M = ml[2 * j], L = ml[2 * j + 1];
              if (!(L > 0.0f)) continue;
              exp_scale_accumulate(S.data() + size_t(i * g + j) * kChunk, nv, M, 1.0f / L,
                                   acc.data());
            }
          }
        }
        double* mh = per_head ? mass + u0 + b0 : mass + b0;
        for (int u = 0; u < n; ++u) mh[u] += acc[u];
      }
    }
  });
}

}  // namespace

namespace {

// The KV heads' block lists: per head (blocks[head_off[h], head_off[h + 1])), or one list of
// `shared` blocks for every head (shared >= 0; attend_shared_blocks).
struct HeadLists {
  const KvBlockRef* blocks;
  const int64_t* head_off;
  int64_t shared;
  const KvBlockRef* list(int64_t h) const { return shared >= 0 ? blocks : blocks + head_off[h]; }
  int64_t count(int64_t h) const { return shared >= 0 ? shared : head_off[h + 1] - head_off[h]; }
  // Blocks of the heads before h: where head h's part of the masses and block_ml starts.
  int64_t first(int64_t h) const { return shared >= 0 ? h * shared : head_off[h]; }
};

void attend_lists(const FusedAttnParams& fp, int n_kv_heads, const float* q, int64_t ldq,
                  int64_t n_q, int64_t qpos0, const HeadLists& hl, float* out, double* mass,
                  MassLayout layout, BlockAttnScratch& sc, ThreadPool& pool) {
  const int H = n_kv_heads, g = fp.group, d = fp.head_dim, st = attn_state_stride(d);
  const bool shared = hl.shared >= 0;
  assert(!(shared && fp.token_ml));
  int64_t nb_max = 0;
  for (int h = 0; h < H; ++h) nb_max = std::max(nb_max, hl.count(h));
  const int64_t n_blocks = hl.first(H);  // every head's blocks
  // Mass units: blocks, or (token_ml, per-head lists only) tokens; unit(b) = units before
  // block b of the heads' lists one after another (blocks: b itself, no table to fill).
  std::vector<int64_t>& unit_off = sc.unit_off;
  if (fp.token_ml) {
    unit_off.resize(size_t(n_blocks) + 1);
    unit_off[0] = 0;
    for (int64_t b = 0; b < n_blocks; ++b) unit_off[b + 1] = unit_off[b] + hl.blocks[b].n;
  }
  const auto unit = [&](int64_t b) { return fp.token_ml ? unit_off[size_t(b)] : b; };
  // Outer tiles of query tokens bound the per-block scratch. Inside a tile, a task is
  // (KV head, run of up to kRun queries, segment of blocks): the run shares every decoded
  // low-bit window; segments split the blocks only when runs × heads are too few for the
  // threads (decode).
  constexpr int64_t kRun = 16;
  // Token masses over 16-bit blocks only (a prompt's per-token scores): computed directly
  // from each query's final (M, L) after the attention (token_masses), not from a (m, l) per
  // query, head and token written during it — n_q × tokens × g pairs, the bulk of the work
  // at long context.
  bool direct = mass && fp.token_ml;
  for (int64_t b = 0; b < n_blocks && direct; ++b) direct = hl.blocks[b].k != nullptr;
  const bool use_ml = mass && !direct;
  const int64_t ml_tok = unit(n_blocks) * g * 2;  // block_ml floats per query token
  const int64_t T =
      use_ml ? std::clamp<int64_t>((int64_t(1) << 20) / std::max<int64_t>(ml_tok, 1), 1, n_q) : n_q;
  for (int64_t t0 = 0; t0 < n_q; t0 += T) {
    const int64_t tn = std::min(T, n_q - t0);
    const int64_t runs = (tn + kRun - 1) / kRun;
    const int64_t base = runs * H;
    // Split so that the tasks are a multiple of kTargetTasks: 3 KV heads in 3 segments made
    // 9 tasks, 5 on one of 2 threads and 4 on the other.
    const int64_t segs =
        std::clamp<int64_t>(base >= kTargetTasks ? 1 : kTargetTasks / std::gcd(base, kTargetTasks),
                            1, std::max<int64_t>(nb_max, 1));
    sc.parts.resize(size_t(tn * H * segs) * g * st);  // [token][head][seg][g][st]
    // Segment s of head h: blocks [seg_lo[h][s], seg_lo[h][s + 1]) of its list, cut by work
    // in decreasing shares (segment_starts). Equal counts left the segments of a tiered
    // cache's first windows, mostly 16-bit, ~15 % costlier than the rest, and the thread that
    // took the last one finished ~5 % of the attention's time after the other.
    sc.seg_lo.resize(size_t(H) * (segs + 1));
    for (int h = 0; h < H; ++h) {
      int64_t* lo = sc.seg_lo.data() + size_t(h) * (segs + 1);
      if (shared && h > 0) {  // one list: the same cuts (two walks of it, not 2·H)
        std::copy(sc.seg_lo.data(), sc.seg_lo.data() + segs + 1, lo);
      } else {
        segment_starts(hl.list(h), hl.count(h), segs, lo);
      }
    }
    if (use_ml) sc.block_ml.resize(size_t(tn) * ml_tok);
    float* block_ml = use_ml ? sc.block_ml.data() : nullptr;
    // Tasks in (run, segment, head) order, heads innermost, and chunks of at least H tasks:
    // a thread takes one segment's heads one after another. A tiered cache's heads share
    // their windows (a low-bit window holds every KV head's part, side by side), so the heads
    // after the first find the segment's windows in the core's L2, brought in by the first
    // head's walk (WindowPrefetcher) and the hardware's stream prefetch; head by head across
    // the whole list, every head went to memory for the same windows (bench/lowbit_bench.cpp:
    // a K4V2 window's head part 367 ns → 225 ns a visit). The split and the merge are the
    // same as before, so are the results.
    pool.parallel_for(base * segs, H, [&](int64_t b0, int64_t b1) {
      for (int64_t task = b0; task < b1; ++task) {
        const int64_t h = task % H, s = (task / H) % segs, r = task / H / segs;
        const int64_t i0 = r * kRun, nq = std::min(kRun, tn - i0);
        const int64_t blo = sc.seg_lo[size_t(h) * (segs + 1) + s];
        const int64_t bhi = sc.seg_lo[size_t(h) * (segs + 1) + s + 1];
        FusedAttnParams hp = fp;
        hp.kv_head = int(h);
        // A shared list's 16-bit blocks point at head 0's rows: head h's entries, made here
        // (a segment's worth, in this thread's cache) rather than by the caller for all heads.
        const KvBlockRef* seg_blocks = hl.list(h) + blo;
        if (shared && h > 0) {
          thread_local std::vector<KvBlockRef> own;
          own.assign(seg_blocks, seg_blocks + (bhi - blo));
          for (KvBlockRef& r : own)
            if (r.k) {
              const int64_t off = h * int64_t(r.head_rows) * r.ld;
              r.k += off;
              r.v += off;
            }
          seg_blocks = own.data();
        }
        // The run's states are strided by heads × segs in parts: gather them contiguously.
        thread_local std::vector<float> run_state;
        run_state.resize(size_t(nq) * g * st);
        for (int64_t i = 0; i < nq; ++i) attn_state_init(run_state.data() + i * g * st, g, d);
        fused_attention_partial(
            hp, q + (t0 + i0) * ldq + h * g * d, ldq, int(nq), qpos0 + t0 + i0, seg_blocks,
            int(bhi - blo), run_state.data(),
            block_ml ? block_ml + size_t(i0) * ml_tok + unit(hl.first(h) + blo) * g * 2 : nullptr,
            ml_tok);
        for (int64_t i = 0; i < nq; ++i)
          std::memcpy(sc.parts.data() + ((size_t(i0 + i) * H + h) * segs + s) * g * st,
                      run_state.data() + i * g * st, sizeof(float) * g * st);
      }
    });
    // Merge segments per (token, head): the outputs and each head's global (M, L).
    sc.gml.resize(size_t(tn) * H * g * 2);
    for (int64_t t = 0; t < tn; ++t)
      for (int h = 0; h < H; ++h)
        attn_merge(sc.parts.data() + ((size_t(t) * H + h) * segs) * g * st, int(segs),
                   int64_t(g) * st, g, d, out + (t0 + t) * ldq + h * g * d,
                   sc.gml.data() + (size_t(t) * H + h) * g * 2);
    if (!mass) continue;
    if (direct) {
      token_masses(fp, H, q + t0 * ldq, ldq, tn, qpos0 + t0, hl.blocks, hl.head_off,
                   unit_off.data(), sc.gml.data(), mass, layout, sc, pool);
      continue;
    }
    // Block (m_b, l_b) into masses, m_b += l_b · exp(m_b − M) / L (attn_block_mass), each
    // unit's terms added in the order of its queries, heads and query heads. Units are split
    // over the pool (a unit's sum does not depend on the split); the innermost loop walks
    // units, whose m_b is shared by a run's tokens, so its exp is computed once per run.
    const bool per_head = layout == MassLayout::kPerHeadBlock;
    int64_t nu_max = 0;
    for (int h = 0; h < H; ++h)
      nu_max = std::max(nu_max, unit(hl.first(h + 1)) - unit(hl.first(h)));
    constexpr int64_t kUnitChunk = 512;
    const int64_t chunks = (nu_max + kUnitChunk - 1) / kUnitChunk;
    // Tasks: (head, chunk) when heads write their own masses, else chunks of the shared ones.
    const int64_t tasks = per_head ? H * chunks : chunks;
    pool.parallel_for(tasks, 1, [&](int64_t k0, int64_t k1) {
      for (int64_t k = k0; k < k1; ++k) {
        const int64_t c = k % chunks;
        const int h_lo = per_head ? int(k / chunks) : 0, h_hi = per_head ? h_lo + 1 : H;
        for (int64_t t = 0; t < tn; ++t)
          for (int h = h_lo; h < h_hi; ++h) {
            const int64_t u0 = unit(hl.first(h)), nu = unit(hl.first(h + 1)) - u0;
            const int64_t b0 = c * kUnitChunk, b1 = std::min(nu, b0 + kUnitChunk);
            const float* ml = block_ml + size_t(t) * ml_tok + u0 * g * 2;
            double* mh = per_head ? mass + u0 : mass;
            const float* gml = sc.gml.data() + (size_t(t) * H + h) * g * 2;
            for (int j = 0; j < g; ++j) {
              const float M = gml[2 * j], L = gml[2 * j + 1];
              float m_last = std::numeric_limits<float>::quiet_NaN(), e_last = 0.0f;
              for (int64_t b = b0; b < b1; ++b) {
                const float* mlb = ml + (size_t(b) * g + j) * 2;
                if (mlb[1] == 0.0f) continue;  // attn_block_mass's 0 (adds nothing)
                if (!(mlb[0] == m_last)) {
                  m_last = mlb[0];
                  e_last = __builtin_expf(mlb[0] - M);
                }
                mh[b] += mlb[1] * e_last / L;
              }
            }
          }
      }
    });
  }
}

}  // namespace

void attend_blocks(const FusedAttnParams& fp, int n_kv_heads, const float* q, int64_t ldq,
                   int64_t n_q, int64_t qpos0, const KvBlockRef* blocks, const int64_t* head_off,
                   float* out, double* mass, MassLayout layout, BlockAttnScratch& sc,
                   ThreadPool& pool) {
  attend_lists(fp, n_kv_heads, q, ldq, n_q, qpos0, HeadLists{blocks, head_off, -1}, out, mass,
               layout, sc, pool);
}

void attend_shared_blocks(const FusedAttnParams& fp, int n_kv_heads, const float* q, int64_t ldq,
                          int64_t n_q, int64_t qpos0, const KvBlockRef* blocks, int64_t n_blocks,
                          float* out, double* mass, MassLayout layout, BlockAttnScratch& sc,
                          ThreadPool& pool) {
  attend_lists(fp, n_kv_heads, q, ldq, n_q, qpos0, HeadLists{blocks, nullptr, n_blocks}, out, mass,
               layout, sc, pool);
}

}  // namespace qevict
