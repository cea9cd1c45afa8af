// fused_attention_partial (attention.h): one thread's pass over a KV head's blocks for a run
// of queries. Optimized path: the inner products run on the Highway kernels of ops.h and
// lowbit.h; this file only walks blocks and keeps softmax bookkeeping.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <tuple>
#include <type_traits>
#include <vector>

#include "kernels/attention.h"
#include "kernels/attention_prefetch.h"
#include "kernels/lowbit.h"

namespace qevict {
namespace {

// Blocks are processed in runs of up to kRunTokens tokens: scores of a run live in one
// buffer, so the softmax bookkeeping (max, exp, rescaling of the running state) is done
// once per run with full vectors instead of once per 8-token window.
constexpr int kRunTokens = 256;
constexpr float kMasked = -1e30f;  // score of a masked token: exp() underflows to exactly 0

// Tokens of `blk` that a query at position qpos may see (causal).
inline int visible(const KvBlockRef& blk, int64_t qpos) {
  return static_cast<int>(std::min<int64_t>(blk.n, std::max<int64_t>(qpos - blk.pos0 + 1, 0)));
}

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

using Span = FusedAttnScratch::Span;
using attn_prefetch::kPrefetchAhead;
using attn_prefetch::prefetch_values;
using attn_prefetch::WindowPrefetcher;

// One call of fused_attention_partial: its inputs, the paths it takes and the run of blocks
// [b0_, b1_) being processed. The 16-bit path (score_run_rows16 for a batched run, a span's
// qk_scores in score_query, pv_accumulate in pv_query) reads rows by pointer; the low-bit path
// (decode_run_windows, score_windows, the windows' P·V in pv_query) decodes windows' codes
// (kernels/lowbit.h).
class PartialAttention {
 public:
  PartialAttention(const FusedAttnParams& p, const float* q, int64_t ldq, int nq, int64_t qpos0,
                   const KvBlockRef* blocks, int n_blocks, float* state, float* block_ml,
                   int64_t ml_stride, FusedAttnScratch& ws);
  void run();

 private:
  // A lone query's rotation across a stretch's windows (score_windows): p0 = hi + lo with
  // lo < 256; R(hi)ᵀq is shared by the 32 windows of a 256-position stretch.
  struct QueryRot {
    int64_t hi_cur = -1;
    bool qp_is_qhi = false;  // qp holds qhi (the stretch's query) in the kernel's layout
  };
  void form_run(int b0);
  void score_run_rows16();
  void decode_run_windows();
  bool score_query(int i, float* sc);
  void score_windows(const Span& sp, int o, int n, const float* qi, float* sc, QueryRot& rot);
  void clear_masses(float* ml_i, float* sc);
  void softmax_update(int i, float* sc);
  void pv_query(int i, const float* sc);
  // Tokens of span sp that a query at qpos may see (causal).
  static int visible_n(const Span& sp, int64_t qpos) {
    return static_cast<int>(std::min<int64_t>(sp.n, std::max<int64_t>(qpos - sp.pos0 + 1, 0)));
  }

  const FusedAttnParams& p_;
  const float* q_;
  int64_t ldq_;
  int nq_;
  int64_t qpos0_;
  const KvBlockRef* blocks_;
  int n_blocks_;
  float* state_;
  float* block_ml_;
  int64_t ml_stride_;
  FusedAttnScratch& ws_;
  const int g_, d_, st_;
  const int M_;  // (query, head) rows, row i*g + h
  bool pv_from_codes_ = false, pv_i8_ = false, keys_per_window_ = false;
  bool scores_from_codes_ = false;
  float* qp_ = nullptr;  // the query as qwin_scores_prepared reads it (64-byte aligned)
  WindowPrefetcher prefetcher_;
  bool have_qall_ = false;  // the queries as M contiguous rows, copied for the first batched run
  int64_t tok_base_ = 0;    // tokens of the runs before this one (token_ml units)
  // The current run.
  int b0_ = 0, b1_ = 0, R_ = 0;
  bool batch_ = false;
  int n_rows_ = 0;  // the run's tokens up to the last one any query sees (batched runs)
};

PartialAttention::PartialAttention(const FusedAttnParams& p, const float* q, int64_t ldq, int nq,
                                   int64_t qpos0, const KvBlockRef* blocks, int n_blocks,
                                   float* state, float* block_ml, int64_t ml_stride,
                                   FusedAttnScratch& ws)
    : p_(p),
      q_(q),
      ldq_(ldq),
      nq_(nq),
      qpos0_(qpos0),
      blocks_(blocks),
      n_blocks_(n_blocks),
      state_(state),
      block_ml_(block_ml),
      ml_stride_(ml_stride),
      ws_(ws),
      g_(p.group),
      d_(p.head_dim),
      st_(attn_state_stride(p.head_dim)),
      M_(nq * p.group),
      prefetcher_(blocks, n_blocks, p.qlayout, p.kv_head) {
  const int g = g_, d = d_;
  if (p.qlayout) {  // the low-bit path's (score_windows)
    scratch_fit(ws.qrot, size_t(g) * d);
    scratch_fit(ws.qhi, size_t(g) * d);
    scratch_fit(ws.hirot, size_t(2) * d);
  }
  // Decode (one query) sums low-bit values straight from their codes; a run of queries
  // (prefill) decodes the run's values once and sums the rows for each query. The two round
  // differently (ulps, tested): a query's output depends on whether it is alone.
  pv_from_codes_ = p.qlayout && nq == 1 && qwin_pv_supported(*p.qlayout, g);
  // ...with the weights in 8 bits where the CPU and the layout allow (qwin_pv_accumulate_i8:
  // INT2 values, AVX-512 VNNI; set_qwin_pv_i8_enabled(false) keeps the float path).
  pv_i8_ = pv_from_codes_ && qwin_pv_i8_supported(*p.qlayout, g);
  // One query (decode) decodes each low-bit window's keys just before scoring them, into a
  // window-sized buffer that stays in L1; a run of queries decodes the run's keys once for
  // all of them. The decoded values and the scoring are the same either way.
  keys_per_window_ = p.qlayout && nq == 1;
  // ...or, where the kernel allows (qwin_scores_supported), scores it straight from the codes
  // with the same operations, keeping each key row in registers.
  scores_from_codes_ = keys_per_window_ && p.rope && qwin_scores_supported(*p.qlayout, *p.rope, g);
  // The query as qwin_scores_prepared reads it: made when the query's rotation changes (a
  // 256-position stretch), not for every window.
  // 64-byte aligned: the kernel loads each of its vectors once per token (a load across two
  // cache lines costs two).
  if (scores_from_codes_) scratch_fit(ws.qprep, size_t(g) * d + 16);
  qp_ = reinterpret_cast<float*>((reinterpret_cast<uintptr_t>(ws.qprep.data()) + 63) &
                                 ~uintptr_t(63));
  if (keys_per_window_) scratch_fit(ws.kwin, size_t(p.qlayout->window) * d);
}

// A run of queries over 16-bit blocks only (prefill over f16/bf16 pages, the current
// chunk, full-tier windows) scores and accumulates all its queries' heads with one call of
// qk_scores_rows and one of pv_accumulate_rows per run, over the run's rows by pointer:
// every key and value row is converted once for the run instead of once per query. The
// value sums are a lone query's, order included (masked tokens add 0); the scores sum
// channels in order, a few ulps from a lone query's (tested).
void PartialAttention::run() {
  for (int b0 = 0; b0 < n_blocks_;) {
    form_run(b0);
    if (batch_) score_run_rows16();
    decode_run_windows();
    for (int i = 0; i < nq_; ++i) {
      // This query's scores, [g][R]: its rows of the run's batch, or its own.
      float* const sc = batch_ ? ws_.mscores.data() + size_t(i) * g_ * R_ : ws_.scores.data();
      if (!score_query(i, sc)) {
        clear_masses(block_ml_ ? block_ml_ + i * ml_stride_ : nullptr, sc);
        continue;
      }
      softmax_update(i, sc);
      if (batch_ || p_.stats_only) continue;  // P·V below, for every query of the run at once
      pv_query(i, sc);
    }
    if (batch_ && n_rows_ > 0 && !p_.stats_only) {
      // Row i*g + h of the probabilities is query i's head h; its state is at the same row
      // of `state` (stride st). Tokens a query may not see have probability 0.
      pv_accumulate_rows(p_.dtype, ws_.mscores.data(), R_, M_, ws_.vrows.data(), n_rows_, d_,
                         state_ + 2, st_);
    }
    b0 = b1_;
    tok_base_ += R_;
  }
}

// Forms the run [b0, b1_) of up to kRunTokens tokens (at least one block) and its spans.
void PartialAttention::form_run(int b0) {
  std::vector<int>& off = ws_.off;
  std::vector<Span>& spans = ws_.spans;
  int b1 = b0, run = 0;
  while (b1 < n_blocks_ && (b1 == b0 || run + blocks_[b1].n <= kRunTokens)) run += blocks_[b1++].n;
  // Exactly the run's blocks (FusedAttnScratch::fit: no slack beyond what a call asked).
  off.clear();
  spans.clear();
  if (off.capacity() < size_t(b1 - b0)) off.reserve(size_t(b1 - b0));
  if (spans.capacity() < size_t(b1 - b0)) spans.reserve(size_t(b1 - b0));
  b1 = b0, run = 0;
  while (b1 < n_blocks_ && (b1 == b0 || run + blocks_[b1].n <= kRunTokens)) {
    off.push_back(run);
    if (b1 > b0 && continues(blocks_[b1 - 1], blocks_[b1])) {
      spans.back().e = b1 + 1;
      spans.back().n += blocks_[b1].n;
    } else {
      spans.push_back({b1, b1 + 1, blocks_[b1].pos0, blocks_[b1].n});
    }
    run += blocks_[b1].n;
    ++b1;
  }
  scratch_fit(ws_.scores, size_t(g_) * run);
  b0_ = b0;
  b1_ = b1;
  R_ = run;
  batch_ = nq_ > 1;
  for (int b = b0; b < b1 && batch_; ++b) batch_ = blocks_[b].k != nullptr;
  n_rows_ = 0;
}

// 16-bit path, a batched run: every query's scores over the run's rows, [M][R] in mscores.
void PartialAttention::score_run_rows16() {
  const int R = R_, d = d_, g = g_;
  scratch_fit(ws_.mscores, size_t(M_) * R);
  scratch_fit(ws_.krows, size_t(R));
  scratch_fit(ws_.vrows, size_t(R));
  // The rows of every block of the run, in run order, as one list: one kernel call for
  // the run however its blocks lie in memory. Tokens no query sees are null (zero rows;
  // every query masks them).
  for (int b = b0_; b < b1_; ++b) {
    const KvBlockRef& blk = blocks_[b];
    const int o = ws_.off[b - b0_], n = visible(blk, qpos0_ + nq_ - 1);
    for (int j = 0; j < blk.n; ++j) {
      ws_.krows[o + j] = j < n ? blk.k + j * blk.ld : nullptr;
      ws_.vrows[o + j] = j < n ? blk.v + j * blk.ld : nullptr;
    }
    if (n > 0) n_rows_ = o + n;
  }
  if (n_rows_ > 0 && !have_qall_) {
    scratch_fit(ws_.qall, size_t(M_) * d);
    for (int i = 0; i < nq_; ++i)
      std::memcpy(ws_.qall.data() + size_t(i) * g * d, q_ + i * ldq_,
                  sizeof(float) * size_t(g) * d);
    have_qall_ = true;
  }
  if (n_rows_ > 0)
    qk_scores_rows(p_.dtype, ws_.qall.data(), d, M_, ws_.krows.data(), n_rows_, d, p_.scale,
                   ws_.mscores.data(), R);
}

// Low-bit path, a run of queries: decodes the run's low-bit windows once for all queries
// (SIMD, kernels/lowbit.h): keys rotated by R(r + t) from the table's first level
// (r = key_row0), values as they are; and each window's R(p0 - r), which the queries carry
// instead (q·R(p0 + t)k = (R(p0 - r)ᵀq)·(R(r + t)k)). A lone query only decodes the
// values here when it cannot sum them from the codes; its keys come window by window.
void PartialAttention::decode_run_windows() {
  const int R = R_, d = d_;
  bool lowbit = false;
  for (int b = b0_; b < b1_ && !lowbit; ++b) lowbit = !blocks_[b].k;
  if (!lowbit) return;
  // Buffers only for what this call decodes here (a decode's scratch stays small: it counts
  // in the cache's bytes).
  const bool keys = !keys_per_window_, values = !pv_from_codes_ && !p_.stats_only;
  if (keys) scratch_fit(ws_.kbuf, size_t(R) * d);
  if (values) scratch_fit(ws_.vbuf, size_t(R) * d);
  if (keys) scratch_fit(ws_.rot, size_t(b1_ - b0_) * 2 * d);
  for (int b = b0_; b < b1_; ++b) {
    const KvBlockRef& blk = blocks_[b];
    if (blk.k) continue;
    const int n_max = visible(blk, qpos0_ + nq_ - 1);
    if (n_max <= 0) continue;
    const size_t o = size_t(ws_.off[b - b0_]) * d;
    if (keys) prefetcher_.touch(b);
    const int row0 = key_row0(blk);
    if (keys)
      qwin_keys(*p_.qlayout, blk.qwin, p_.kv_head, n_max, *p_.rope, row0, ws_.kbuf.data() + o, d);
    if (values) qwin_values(*p_.qlayout, blk.qwin, p_.kv_head, n_max, ws_.vbuf.data() + o, d);
    if (!keys) continue;  // one query: its rotation per window, score_windows
    float* cs = ws_.rot.data() + size_t(b - b0_) * 2 * d;
    p_.rope->expanded(blk.pos0 - row0, cs, cs + d);
  }
}

// Query i's scores over the run into sc ([g][R], masked tokens kMasked); false when it sees
// none of the run's tokens.
bool PartialAttention::score_query(int i, float* sc) {
  const float* qi = q_ + i * ldq_;
  const int64_t qpos = qpos0_ + i;
  const int R = R_, d = d_, g = g_;
  bool any = false;
  QueryRot rot;
  for (const Span& sp : ws_.spans) {
    const int o = ws_.off[sp.b - b0_];
    const int n = visible_n(sp, qpos);
    if (n > 0) any = true;
    if (n > 0 && !batch_) {  // a batched run's scores are in sc already
      const KvBlockRef& blk = blocks_[sp.b];
      if (blk.k) {  // 16-bit path: the span's rows in one call
        if (keys_per_window_) prefetcher_.touch(sp.e - 1);
        qk_scores(p_.dtype, qi, d, g, blk.k, blk.ld, n, d, p_.scale, sc + o, R);
      } else {
        score_windows(sp, o, n, qi, sc, rot);
      }
    }
    for (int h = 0; h < g; ++h)
      for (int j = n; j < sp.n; ++j) sc[size_t(h) * R + o + j] = kMasked;
  }
  return any;
}

// Low-bit path: the scores of the first n tokens of span sp (low-bit windows, at o in the
// run) for query qi, window by window: the query carries R(p0 − row0)ᵀ, shared by the
// windows of a 256-position stretch (R(hi)ᵀ), the keys the rest.
void PartialAttention::score_windows(const Span& sp, int o, int n, const float* qi, float* sc,
                                     QueryRot& rot) {
  const int R = R_, d = d_, g = g_;
  const KvBlockRef* blocks = blocks_;
  float* const qhi = ws_.qhi.data();
  for (int b = sp.b, ob = o; b < sp.e && ob < o + n; ob += blocks[b].n, ++b) {
    const int nb = std::min(blocks[b].n, o + n - ob);
    // The keys' rotation starts at table row `row0`; the query carries the rest.
    const float* qw = ws_.qrot.data();
    const int row0 = key_row0(blocks[b]);
    if (keys_per_window_) {
      const int64_t lo = blocks[b].pos0 & (RopeTable::kLevelRows - 1);
      const int64_t hi = blocks[b].pos0 - lo;
      if (hi != rot.hi_cur) {
        rot.hi_cur = hi;
        rot.qp_is_qhi = false;  // qhi changes
        if (hi == 0) {
          std::memcpy(qhi, qi, sizeof(float) * size_t(g) * d);
        } else {
          p_.rope->expanded(hi, ws_.hirot.data(), ws_.hirot.data() + d);
          rope_rows(p_.rope->params(), d, ws_.hirot.data(), ws_.hirot.data() + d,
                    /*inverse=*/true, qi, d, g, qhi, d);
        }
      }
      if (lo == row0) {
        // q·R(hi + lo + t)k = (R(hi)ᵀq)·(R(lo + t)k): the keys take rows lo + t of
        // the table's first level, and the query needs no rotation of its own.
        qw = qhi;
      } else {  // a window across a 256-position boundary: R(lo)ᵀ on the query
        rope_rows(p_.rope->params(), d, p_.rope->cosx_row(lo), p_.rope->sinx_row(lo),
                  /*inverse=*/true, qhi, d, g, ws_.qrot.data(), d);
      }
    } else {
      const float* cs = ws_.rot.data() + size_t(b - b0_) * 2 * d;  // R(p0 - row0)
      rope_rows(p_.rope->params(), d, cs, cs + d, /*inverse=*/true, qi, d, g, ws_.qrot.data(), d);
    }
    if (scores_from_codes_) {
      prefetcher_.touch(b);
      // qrot is made for its one window; qhi serves the stretch's windows.
      if (qw != qhi || !rot.qp_is_qhi) {
        qwin_scores_query(*p_.qlayout, *p_.rope, qw, d, g, qp_);
        rot.qp_is_qhi = qw == qhi;
      }
      qwin_scores_prepared(*p_.qlayout, blocks[b].qwin, p_.kv_head, nb, *p_.rope, row0, qp_, g,
                           p_.scale, sc + ob, R);
      continue;
    }
    const float* kw = nullptr;
    if (keys_per_window_) {  // decode: the window's keys stay in L1
      prefetcher_.touch(b);
      qwin_keys(*p_.qlayout, blocks[b].qwin, p_.kv_head, nb, *p_.rope, row0, ws_.kwin.data(), d);
      kw = ws_.kwin.data();
    } else {
      kw = ws_.kbuf.data() + size_t(ob) * d;
    }
    qk_scores_f32(qw, d, g, kw, d, nb, d, p_.scale, sc + ob, R);
  }
}

// A query that sees none of the run: its units (the run's blocks, or with token_ml its
// tokens) get (m, l) = (−inf, 0), and a batched run's row of weights adds nothing.
void PartialAttention::clear_masses(float* ml_i, float* sc) {
  if (ml_i) {
    const int64_t u0 = p_.token_ml ? tok_base_ : b0_, u1 = p_.token_ml ? tok_base_ + R_ : b1_;
    for (int64_t u = u0; u < u1; ++u)
      for (int h = 0; h < g_; ++h) {
        float* ml = ml_i + (size_t(u) * g_ + h) * 2;
        ml[0] = -std::numeric_limits<float>::infinity();
        ml[1] = 0.0f;
      }
  }
  if (batch_) std::fill(sc, sc + size_t(g_) * R_, 0.0f);  // adds nothing to the run's P·V
}

// Online softmax over the run for query i: sc's scores become exp(s − m) (rescaled to the
// state's new max), the blocks' (or tokens') (m, l) go to block_ml, the state (m, l, o) is
// rescaled and takes the run's l.
void PartialAttention::softmax_update(int i, float* sc) {
  const int R = R_, g = g_, d = d_, st = st_;
  const int64_t qpos = qpos0_ + i;
  float* const si = state_ + size_t(i) * g * st;
  float* const ml_i = block_ml_ ? block_ml_ + i * ml_stride_ : nullptr;
  const int used = R;  // scores[0, R) are filled (masked tokens hold kMasked)
  // A run of whole, visible 8-token blocks (a decode's windows) sums its blocks' masses
  // in vectors along with the exp (exp_sub_sum8); other runs block by block.
  bool groups8 = ml_i && !p_.token_ml;
  for (int b = b0_; b < b1_ && groups8; ++b)
    groups8 = blocks_[b].n == 8 && visible(blocks_[b], qpos) == 8;
  if (groups8) scratch_fit(ws_.gsum, size_t(R / 8));
  for (int h = 0; h < g; ++h) {
    float* sh = sc + size_t(h) * R;
    float* s = si + h * st;
    const float m = max_of(sh, used);
    // sh[j] = exp(s_j - m); masked → 0
    const float l = groups8 ? exp_sub_sum8(sh, used, m, ws_.gsum.data()) : exp_sub_sum(sh, used, m);
    if (ml_i && p_.token_ml) {
      // One (m, l) per token: l = its own exp(s - m); masked tokens hold exactly 0.
      for (int j = 0; j < R; ++j) {
        float* ml = ml_i + (size_t(tok_base_ + j) * g + h) * 2;
        ml[0] = m;
        ml[1] = sh[j];
      }
    } else if (ml_i && groups8) {
      for (int b = b0_; b < b1_; ++b) {
        float* ml = ml_i + (size_t(b) * g + h) * 2;
        ml[0] = m;  // every block of the run shares the run's max
        ml[1] = ws_.gsum[b - b0_];
      }
    } else if (ml_i) {
      for (int b = b0_; b < b1_; ++b) {
        const int o = ws_.off[b - b0_];
        const int n = visible(blocks_[b], qpos);
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
}

// P·V of a lone query (or one of an unbatched run) over the run's spans: 16-bit rows, a
// lone query's windows from their codes, else the run's decoded values.
void PartialAttention::pv_query(int i, const float* sc) {
  const int R = R_, g = g_, d = d_, st = st_;
  const int64_t qpos = qpos0_ + i;
  float* const si = state_ + size_t(i) * g * st;
  for (const Span& sp : ws_.spans) {
    const int o = ws_.off[sp.b - b0_];
    const int n = visible_n(sp, qpos);
    if (n <= 0) continue;
    const KvBlockRef& blk = blocks_[sp.b];
    const float* pb = sc + o;
    if (blk.k) {
      pv_accumulate(p_.dtype, pb, R, g, blk.v, blk.ld, n, d, si + 2, st);
    } else if (pv_from_codes_) {
      for (int b = sp.b, ob = o; b < sp.e && ob < o + n; ob += blocks_[b].n, ++b) {
        if (b + kPrefetchAhead < b1_ && !blocks_[b + kPrefetchAhead].k)
          prefetch_values(*p_.qlayout, blocks_[b + kPrefetchAhead].qwin, p_.kv_head);
        const int nb = std::min(blocks_[b].n, o + n - ob);
        if (pv_i8_) {
          qwin_pv_accumulate_i8(*p_.qlayout, blocks_[b].qwin, p_.kv_head, nb, sc + ob, R, g, si + 2,
                                st);
        } else {
          qwin_pv_accumulate(*p_.qlayout, blocks_[b].qwin, p_.kv_head, nb, sc + ob, R, g, si + 2,
                             st);
        }
      }
    } else {
      pv_accumulate_f32(pb, R, g, ws_.vbuf.data() + size_t(o) * d, d, n, d, si + 2, st);
    }
  }
}

}  // namespace

void fused_attention_partial(const FusedAttnParams& p, const float* q, int64_t ldq, int nq,
                             int64_t qpos0, const KvBlockRef* blocks, int n_blocks, float* state,
                             float* block_ml, int64_t ml_stride, FusedAttnScratch& ws) {
  PartialAttention(p, q, ldq, nq, qpos0, blocks, n_blocks, state, block_ml, ml_stride, ws).run();
}

size_t FusedAttnScratch::bytes() const {
  const auto bytes_of = [](const auto& v) {
    return v.capacity() * sizeof(typename std::decay_t<decltype(v)>::value_type);
  };
  return std::apply([&](const auto&... v) { return (size_t(0) + ... + bytes_of(v)); },
                    buffers(*this));
}

}  // namespace qevict
