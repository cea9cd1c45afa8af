// attend_blocks and attend_shared_blocks (attention.h), optimized path: the split of a call
// over threads, the merge of the partial states and the masses, around fused_attention_partial
// (fused_attention.cpp). ref::attention_materialized (ref/attention_ref.h) is the reference.
#include "kernels/attention.h"

#include <algorithm>
#include <cassert>
#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>
#include <tuple>
#include <utility>
#include <vector>

#include "kernels/pool_slots.h"
#include "kernels/token_masses.h"

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

// Gives buffer I of every slot the largest capacity any slot's has.
template <size_t I>
void even_out_buffer(std::vector<FusedAttnScratch>& slots) {
  size_t cap = 0;
  for (FusedAttnScratch& s : slots)
    cap = std::max(cap, std::get<I>(FusedAttnScratch::buffers(s)).capacity());
  for (FusedAttnScratch& s : slots) std::get<I>(FusedAttnScratch::buffers(s)).reserve(cap);
}
template <size_t... I>
void even_out_buffers(std::vector<FusedAttnScratch>& slots, std::index_sequence<I...>) {
  (even_out_buffer<I>(slots), ...);
}

}  // namespace

void BlockAttnScratch::even_out() {
  if (threads.size() < 2) return;
  using Buffers = decltype(FusedAttnScratch::buffers(threads[0]));
  even_out_buffers(threads, std::make_index_sequence<std::tuple_size_v<Buffers>>());
}

size_t BlockAttnScratch::bytes() const {
  size_t b = (parts.capacity() + block_ml.capacity() + gml.capacity()) * 4 +
             (unit_off.capacity() + seg_lo.capacity() + tok_pos.capacity()) * 8 +
             tok_k.capacity() * sizeof(const uint16_t*) +
             threads.capacity() * sizeof(FusedAttnScratch);
  for (const FusedAttnScratch& t : threads) b += t.bytes();
  return b;
}

namespace {

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

// One task of attend_lists: KV head h's blocks [blo, bhi) of its list for nq queries (q,
// ldq; positions qpos0 + i), block_ml as fused_attention_partial's; query i's state goes to
// parts + i·part_stride.
void attend_segment(const FusedAttnParams& fp, const HeadLists& hl, int h, int64_t blo, int64_t bhi,
                    const float* q, int64_t ldq, int nq, int64_t qpos0, float* block_ml,
                    int64_t ml_stride, FusedAttnScratch& ws, float* parts, int64_t part_stride) {
  const int g = fp.group, d = fp.head_dim, st = attn_state_stride(d);
  FusedAttnParams hp = fp;
  hp.kv_head = h;
  // A shared list's 16-bit blocks point at head 0's rows: head h's entries, made here
  // (a segment's worth, in this thread's cache) rather than by the caller for all heads.
  const KvBlockRef* seg_blocks = hl.list(h) + blo;
  if (hl.shared >= 0 && h > 0) {
    std::vector<KvBlockRef>& own = ws.own;
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
  std::vector<float>& run_state = ws.run_state;
  scratch_fit(run_state, size_t(nq) * g * st);
  for (int64_t i = 0; i < nq; ++i) attn_state_init(run_state.data() + i * g * st, g, d);
  fused_attention_partial(hp, q, ldq, nq, qpos0, seg_blocks, int(bhi - blo), run_state.data(),
                          block_ml, ml_stride, ws);
  for (int64_t i = 0; i < nq; ++i)
    std::memcpy(parts + i * part_stride, run_state.data() + i * g * st, sizeof(float) * g * st);
}

// Mass units: blocks, or (token_ml, per-head lists only) tokens; units(b) = units before
// block b of the heads' lists one after another (blocks: b itself, no table to fill).
struct Units {
  const int64_t* off;  // null: units are blocks
  int64_t operator()(int64_t b) const { return off ? off[size_t(b)] : b; }
};

// Block (m_b, l_b) into masses, m_b += l_b · exp(m_b − M) / L (attn_block_mass), each
// unit's terms added in the order of its queries, heads and query heads: block_ml
// f32 [tn][units][g][2] (ml_tok floats a query), gml f32 [tn][H][g][2]. Units are split
// over the pool (a unit's sum does not depend on the split); the innermost loop walks
// units, whose m_b is shared by a run's tokens, so its exp is computed once per run.
void block_masses(int H, int g, const HeadLists& hl, Units units, int64_t tn, const float* block_ml,
                  int64_t ml_tok, const float* gml_all, double* mass, MassLayout layout,
                  ThreadPool& pool) {
  const bool per_head = layout == MassLayout::kPerHeadBlock;
  int64_t nu_max = 0;
  for (int h = 0; h < H; ++h)
    nu_max = std::max(nu_max, units(hl.first(h + 1)) - units(hl.first(h)));
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
          const int64_t u0 = units(hl.first(h)), nu = units(hl.first(h + 1)) - u0;
          const int64_t b0 = c * kUnitChunk, b1 = std::min(nu, b0 + kUnitChunk);
          const float* ml = block_ml + size_t(t) * ml_tok + u0 * g * 2;
          double* mh = per_head ? mass + u0 : mass;
          const float* gml = gml_all + (size_t(t) * H + h) * g * 2;
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

void attend_lists(const FusedAttnParams& fp, int n_kv_heads, const float* q, int64_t ldq,
                  int64_t n_q, int64_t qpos0, const HeadLists& hl, float* out, double* mass,
                  MassLayout layout, BlockAttnScratch& sc, ThreadPool& pool) {
  const int H = n_kv_heads, g = fp.group, d = fp.head_dim, st = attn_state_stride(d);
  const bool shared = hl.shared >= 0;
  assert(!(shared && fp.token_ml));
  int64_t nb_max = 0;
  for (int h = 0; h < H; ++h) nb_max = std::max(nb_max, hl.count(h));
  const int64_t n_blocks = hl.first(H);  // every head's blocks
  // Mass units (Units): with token_ml, the tokens before each block.
  std::vector<int64_t>& unit_off = sc.unit_off;
  if (fp.token_ml) {
    unit_off.resize(size_t(n_blocks) + 1);
    unit_off[0] = 0;
    for (int64_t b = 0; b < n_blocks; ++b) unit_off[b + 1] = unit_off[b] + hl.blocks[b].n;
  }
  const Units units{fp.token_ml ? unit_off.data() : nullptr};
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
  const int64_t ml_tok = units(n_blocks) * g * 2;  // block_ml floats per query token
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
    sc.reserve_slots(pool.size());
    parallel_for_slots(pool, base * segs, H, [&](int thread, int64_t b0, int64_t b1) {
      FusedAttnScratch& ws = sc.threads[size_t(thread)];
      for (int64_t task = b0; task < b1; ++task) {
        const int64_t h = task % H, s = (task / H) % segs, r = task / H / segs;
        const int64_t i0 = r * kRun, nq = std::min(kRun, tn - i0);
        const int64_t blo = sc.seg_lo[size_t(h) * (segs + 1) + s];
        const int64_t bhi = sc.seg_lo[size_t(h) * (segs + 1) + s + 1];
        attend_segment(
            fp, hl, int(h), blo, bhi, q + (t0 + i0) * ldq + h * g * d, ldq, int(nq),
            qpos0 + t0 + i0,
            block_ml ? block_ml + size_t(i0) * ml_tok + units(hl.first(h) + blo) * g * 2 : nullptr,
            ml_tok, ws, sc.parts.data() + ((size_t(i0) * H + h) * segs + s) * g * st,
            int64_t(H) * segs * g * st);
      }
    });
    sc.even_out();
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
    block_masses(H, g, hl, units, tn, block_ml, ml_tok, sc.gml.data(), mass, layout, pool);
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
