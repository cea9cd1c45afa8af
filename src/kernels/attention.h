// Fused attention over mixed-tier KV blocks with per-block probability mass (SPEC §6).
// For one query token and one KV head's group of query heads, one pass over the blocks:
// 16-bit blocks (sink, full-tier windows, local tokens, current chunk) are read directly;
// low-bit windows are decoded with SIMD (kernels/lowbit.h) into a per-run scratch of at most
// 256 tokens, keys rotated only by their in-window RoPE R(t) while the query carries each
// window's R(p0)ᵀ — nothing is materialized for the whole cache and no table grows with
// the positions. Online
// softmax keeps, per head, the running (m, l, o) and, per block, the block's own (m_b, l_b),
// so each block's probability mass comes out at the end without a second pass:
//   mass_b = l_b · exp(m_b − M) / L   with the global max M and denominator L.
// ref::attention_materialized (ref/attention_ref.h) computes the same from full matrices.
// attend_blocks() is the one attention loop of every cache: it splits a call over threads
// by (KV head, run of queries, range of blocks) and merges the partial states.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <tuple>
#include <vector>

#include "core/thread_pool.h"
#include "kernels/kv_quant.h"
#include "kernels/ops.h"
#include "kernels/rope.h"
#include "kernels/softmax_state.h"

namespace qevict {

// A run of cached tokens of one KV head.
struct KvBlockRef {
  int64_t pos0 = 0;  // position of the block's first token
  int32_t n = 0;     // tokens in the block
  // 16-bit source in a list every KV head shares (attend_shared_blocks): head h's rows start
  // h · head_rows · ld halfs after k (and v). Unused in per-head lists.
  int32_t head_rows = 0;
  // 16-bit source: post-RoPE keys and values, rows of head_dim at stride ld (in halfs).
  const uint16_t* k = nullptr;
  const uint16_t* v = nullptr;
  int64_t ld = 0;
  // Low-bit source (used when k is null): a quantized window (QuantLayout), keys pre-RoPE.
  const uint8_t* qwin = nullptr;
};

struct FusedAttnParams {
  HalfType dtype = HalfType::kF16;
  int group = 1;  // query heads sharing this KV head
  int head_dim = 0;
  float scale = 1.0f;                    // 1/sqrt(head_dim)
  int kv_head = 0;                       // which head of a quantized window to decode
  const QuantLayout* qlayout = nullptr;  // for low-bit blocks
  const RopeTable* rope = nullptr;       // for low-bit blocks (covers their positions; fixed size)
  // Masses per token instead of per block: block_ml then holds one (m, l) per token, in
  // block order (per-token scores such as H2O's, FullKV's attention observer).
  bool token_ml = false;
  // Softmax statistics and masses only: the value sums are skipped (the outputs come out 0),
  // for callers that want where the attention goes, not what it returns.
  bool stats_only = false;

  // The fields every cache sets alike: KV type, GQA group, head_dim and the softmax scale
  // 1/sqrt(head_dim).
  static FusedAttnParams make(HalfType dtype, int group, int head_dim) {
    FusedAttnParams p;
    p.dtype = dtype;
    p.group = group;
    p.head_dim = head_dim;
    p.scale = 1.0f / std::sqrt(float(head_dim));
    return p;
  }
};

// Makes v at least n long; when it must grow, to exactly n (no geometric slack), so that a
// scratch buffer's capacity is the most any call asked of it.
template <typename T>
void scratch_fit(std::vector<T>& v, size_t n) {
  if (v.size() >= n) return;
  if (v.capacity() < n) v.reserve(n);
  v.resize(n);
}

// Working memory of one thread's fused_attention_partial calls (and of the per-thread parts
// of attend_blocks): buffers sized by a run of up to 256 tokens, the group and head_dim, kept
// between calls so that decode allocates nothing. Owned by the caller (one per thread,
// BlockAttnScratch::slot), so that its bytes count as the cache's.
struct FusedAttnScratch {
  // A span: consecutive blocks [b, e) of a run that one kernel call can read as one.
  struct Span {
    int b = 0, e = 0;
    int64_t pos0 = 0;
    int n = 0;  // tokens
  };
  // f32 [group][run]: one query's scores, then weights; token_masses' [≤ 16 · group][≤ 256]:
  // its queries' scores over a chunk of tokens (the two never run at once).
  std::vector<float> scores;
  std::vector<float> mscores;          // f32 [queries · group][run]: a batched run's
  std::vector<float> kbuf, vbuf;       // f32 [run][head_dim]: a run's decoded keys, values
  std::vector<float> rot;              // f32 [run's blocks][2][head_dim]: windows' R(p0 − r)
  std::vector<float> qrot, qhi;        // f32 [group][head_dim]: the query per window, stretch
  std::vector<float> hirot;            // f32 [2][head_dim]: the stretch's cos/sin
  std::vector<float> kwin;             // f32 [window][head_dim]: one window's keys (decode)
  std::vector<float> qall;             // f32 [queries · group][head_dim]: a run of queries
  std::vector<float> qprep;            // f32 [group · head_dim + 16]: the query for qwin_scores
  std::vector<float> gsum;             // f32 [run / 8]: 8-token blocks' sums
  std::vector<int> off;                // [run's blocks]: each block's first token in the run
  std::vector<const uint16_t*> krows;  // [run]: a batched run's key rows
  std::vector<const uint16_t*> vrows;  // and value rows
  std::vector<Span> spans;             // the run's spans
  // attend_blocks' per-task parts.
  std::vector<KvBlockRef> own;   // a segment's blocks of a shared list, moved to head h's rows
  std::vector<float> run_state;  // f32 [queries][group][head_dim + 2]: a run's states
  // token_masses' (token_masses.h).
  std::vector<float> qrows;  // f32 [≤ 16 · group][head_dim]: a run of queries
  std::vector<double> acc;   // f64 [≤ 256]: a chunk's masses

  // Every buffer of s, for bytes() and BlockAttnScratch::even_out.
  template <typename Self>
  static auto buffers(Self& s) {
    return std::tie(s.scores, s.mscores, s.kbuf, s.vbuf, s.rot, s.qrot, s.qhi, s.hirot, s.kwin,
                    s.qall, s.qprep, s.gsum, s.off, s.krows, s.vrows, s.spans, s.own, s.run_state,
                    s.qrows, s.acc);
  }
  size_t bytes() const;
};

// Accumulates blocks[0..n_blocks) into the states of nq query tokens at positions
// qpos0 + i (i < nq): query i is q + i*ldq, f32 [group][head_dim] (stride head_dim); its
// state is state + i*group*(head_dim+2). Tokens after a query's position are masked
// (causal). Each low-bit block is decoded once for all nq queries. block_ml receives each
// block's (m_b, l_b) per head: f32 at block_ml + i*ml_stride + (b*group + h)*2
// (m_b = -inf, l_b = 0 for a block fully masked for that query); with p.token_ml the unit is
// the token (its index counted over the blocks' tokens) instead of b; block_ml may be null.
// Consecutive blocks whose positions follow each other and whose rows are contiguous in
// memory (or are low-bit windows, decoded side by side) are scored and accumulated with
// one kernel call each, so many small blocks (one per token) cost no more than one large.
// ws: the calling thread's working memory (no other thread may use it during the call).
void fused_attention_partial(const FusedAttnParams& p, const float* q, int64_t ldq, int nq,
                             int64_t qpos0, const KvBlockRef* blocks, int n_blocks, float* state,
                             float* block_ml, int64_t ml_stride, FusedAttnScratch& ws);

// Scratch of attend_blocks, kept by the caller between calls (its bytes count as the cache's).
struct BlockAttnScratch {
  std::vector<float> parts;            // f32 [tile][n_kv_heads][segments][group][head_dim + 2]
  std::vector<float> block_ml;         // f32 [tile][blocks][group][2]
  std::vector<float> gml;              // f32 [tile][n_kv_heads][group][2]: each head's (M, L)
  std::vector<int64_t> unit_off;       // mass units (blocks or tokens) before each block
  std::vector<int64_t> seg_lo;         // [n_kv_heads][segments + 1]: each segment's first block
  std::vector<const uint16_t*> tok_k;  // token masses: every unit's key row
  std::vector<int64_t> tok_pos;        // and position
  // [pool threads]: each thread's working memory. The threads take tasks dynamically, so
  // which slot grew for which task varies from call to call: even_out() after each parallel
  // region gives every slot the largest capacity of any, buffer by buffer, and the bytes held
  // depend on the calls only (every growth is to an exact size: scratch_fit).
  std::vector<FusedAttnScratch> threads;
  // Makes a slot for each of n threads (before a parallel region: the slots must not move
  // while threads use them).
  void reserve_slots(int n) {
    if (threads.size() < size_t(n)) threads.resize(size_t(n));
  }
  // Thread t's slot, for a caller outside a parallel region (one thread: slot(0)).
  FusedAttnScratch& slot(int t) {
    reserve_slots(t + 1);
    return threads[size_t(t)];
  }
  void even_out();
  size_t bytes() const;
  // Gives the memory back (after a prefill chunk: decode needs far less).
  void trim() {
    std::vector<float>().swap(parts);
    std::vector<float>().swap(block_ml);
    std::vector<float>().swap(gml);
    std::vector<const uint16_t*>().swap(tok_k);
    std::vector<int64_t>().swap(tok_pos);
    std::vector<FusedAttnScratch>().swap(threads);
  }
};

// How attend_blocks reports masses: per block of each head (mass[head_off[h] + b]), or summed
// over the KV heads per block index (mass[b]; every head has the same number of blocks, e.g.
// windows that span all heads).
enum class MassLayout { kPerHeadBlock, kSumOverHeads };

// Causal attention of n_q query tokens at positions qpos0 + t over per-KV-head block lists:
//   q     f32 [n_q][n_kv_heads · group · head_dim], row stride ldq (post-RoPE queries)
//   out   f32, the same layout as q
//   blocks  KV head h's blocks are blocks[head_off[h], head_off[h+1]), in position order
//   mass  f64 (or null): += Σ over the queries and the group's query heads of the
//         probability each block (p.token_ml: each token, in block order) received, laid out
//         as `layout` (with token_ml, kPerHeadBlock: head h's tokens follow head h-1's).
// Work is split over `pool` by (KV head, run of up to 16 queries, range of blocks); the
// split does not depend on the thread count, so neither do the results. Outer tiles of
// queries bound block_ml.
void attend_blocks(const FusedAttnParams& p, int n_kv_heads, const float* q, int64_t ldq,
                   int64_t n_q, int64_t qpos0, const KvBlockRef* blocks, const int64_t* head_off,
                   float* out, double* mass, MassLayout layout, BlockAttnScratch& scratch,
                   ThreadPool& pool);

// attend_blocks over one list of n_blocks blocks that every KV head shares (a tiered cache's
// windows span all heads): 16-bit blocks give head h's rows at h · head_rows · ld halfs past
// k and v, low-bit windows hold every head's part. The same results as attend_blocks over
// per-head lists with those pointers (mass layouts as there, kPerHeadBlock: mass[h·n_blocks
// + b]), with one entry a block for the caller to write instead of one per block and head.
// Needs !p.token_ml.
void attend_shared_blocks(const FusedAttnParams& p, int n_kv_heads, const float* q, int64_t ldq,
                          int64_t n_q, int64_t qpos0, const KvBlockRef* blocks, int64_t n_blocks,
                          float* out, double* mass, MassLayout layout, BlockAttnScratch& scratch,
                          ThreadPool& pool);

}  // namespace qevict
