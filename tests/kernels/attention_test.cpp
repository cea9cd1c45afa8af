// Fused mixed-tier attention against the materializing reference: outputs and per-block
// masses, with 16-bit and low-bit blocks, odd sizes, blocks straddling the query position
// and fully masked blocks; masses sum to 1 per head.
#include "kernels/attention.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

#include "core/f16.h"
#include "core/thread_pool.h"
#include "kernels/kv_quant.h"
#include "kernels/lowbit.h"
#include "kernels/ref/attention_ref.h"
#include "kernels/ref/ops_ref.h"

namespace qevict {
namespace {

struct Shape {
  int group, dim, bits;
  HalfType dt;
  int64_t pos_base = 0;  // added to every position (RoPE composition past 65,536)
  int vbits = 0;         // the low-bit values' bits (0: bits)
};

class FusedAttention : public ::testing::TestWithParam<Shape> {};

TEST_P(FusedAttention, MatchesMaterializedReference) {
  const Shape sh = GetParam();
  const int g = sh.group, d = sh.dim, W = 8, H = 2;
  RopeParams rp;
  rp.n_rot = d;
  rp.freq_base = 10000.0f;
  RopeTable rope(rp, d, sh.pos_base + 400);
  QuantLayout ql{sh.bits, H, d, W, 0, sh.vbits};
  ASSERT_TRUE(ql.validate().is_ok());
  std::mt19937 rng(99);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  // Block plan: (kind, pos0, n). kind 0: half, 1: quantized window.
  struct Plan {
    int kind;
    int64_t pos0;
    int n;
  };
  const std::vector<Plan> plan = {{0, 0, 5},  {1, 5, 8},   {0, 13, 8}, {1, 21, 8},  {1, 29, 3},
                                  {0, 32, 1}, {0, 33, 37}, {1, 70, 8}, {0, 78, 13}, {0, 91, 9}};
  std::vector<std::vector<uint16_t>> halfs_k, halfs_v;
  std::vector<std::vector<uint8_t>> wins;
  std::vector<KvBlockRef> blocks;
  const int kv_head = 1;
  const int64_t ld = int64_t(H) * d + 3;  // rows of all heads, padded
  for (const auto& pl : plan) {
    KvBlockRef b;
    b.pos0 = sh.pos_base + pl.pos0;
    b.n = pl.n;
    if (pl.kind == 0) {
      halfs_k.emplace_back(size_t(pl.n) * ld);
      halfs_v.emplace_back(size_t(pl.n) * ld);
      for (auto& x : halfs_k.back()) x = ref::float_to_half(sh.dt, 2.0f * dist(rng));
      for (auto& x : halfs_v.back()) x = ref::float_to_half(sh.dt, dist(rng));
      b.k = halfs_k.back().data() + kv_head * d;
      b.v = halfs_v.back().data() + kv_head * d;
      b.ld = ld;
    } else {
      std::vector<float> k(size_t(W) * H * d), v(k.size());
      for (auto& x : k) x = 2.0f * dist(rng);
      for (auto& x : v) x = dist(rng);
      wins.emplace_back(ql.window_bytes());
      quantize_window(ql, k.data(), v.data(), pl.n, wins.back().data());
      b.qwin = wins.back().data();
    }
    blocks.push_back(b);
  }
  // vector pointer stability: halfs_k may reallocate; rebuild pointers
  {
    size_t hi = 0, wi = 0;
    for (size_t i = 0; i < plan.size(); ++i) {
      if (plan[i].kind == 0) {
        blocks[i].k = halfs_k[hi].data() + kv_head * d;
        blocks[i].v = halfs_v[hi].data() + kv_head * d;
        ++hi;
      } else {
        blocks[i].qwin = wins[wi++].data();
      }
    }
  }
  FusedAttnParams p;
  p.dtype = sh.dt;
  p.group = g;
  p.head_dim = d;
  p.scale = 1.0f / std::sqrt(float(d));
  p.kv_head = kv_head;
  p.qlayout = &ql;
  p.rope = &rope;
  std::vector<float> q(size_t(g) * d);
  for (auto& x : q) x = dist(rng);
  const int nb = int(blocks.size());
  // With the 8-bit P·V (qwin_pv_accumulate_i8, where the CPU has it) each low-bit window's
  // weights move by ≤ 1/254 of its largest p·s, so its part of the normalized output by at
  // most 8 tokens · code 3 · mass_b · max_t s_t / 254 (max p ≤ the window's mass · l). Both
  // paths are checked: the float one to 2e-5, the 8-bit one to the sum of those bounds.
  std::vector<float> vscale_max(blocks.size(), 0.0f);
  for (size_t b = 0; b < blocks.size(); ++b)
    if (!blocks[b].k)
      for (int t = 0; t < W; ++t)
        vscale_max[b] = std::max(
            vscale_max[b],
            f16_to_f32(load_f16_bits(blocks[b].qwin + ql.v_scale_off(kv_head), size_t(t))));
  FusedAttnScratch ws;
  for (int i8 : {0, 1})
    for (int64_t qrel : {int64_t(99), int64_t(50), int64_t(24), int64_t(3)}) {
      if (i8 && !qwin_pv_i8_layout(ql, g)) continue;
      set_qwin_pv_i8_enabled(i8 != 0);
      if (i8 && !qwin_pv_i8_supported(ql, g)) continue;  // not on this CPU
      const int64_t qpos = sh.pos_base + qrel;
      std::vector<float> want(size_t(g) * d), want_mass(size_t(nb) * g);
      ref::attention_materialized(p, q.data(), qpos, blocks.data(), nb, want.data(),
                                  want_mass.data());
      // Fused, split into 3 parts at awkward places, then merged.
      const int cuts[4] = {0, 3, 4, nb};
      const int st = attn_state_stride(d);
      std::vector<float> parts(size_t(3) * g * st), ml(size_t(nb) * g * 2);
      for (int i = 0; i < 3; ++i) {
        attn_state_init(parts.data() + i * g * st, g, d);
        fused_attention_partial(p, q.data(), 0, 1, qpos, blocks.data() + cuts[i],
                                cuts[i + 1] - cuts[i], parts.data() + i * g * st,
                                ml.data() + size_t(cuts[i]) * g * 2, 0, ws);
      }
      std::vector<float> got(size_t(g) * d), gml(size_t(g) * 2);
      attn_merge(parts.data(), 3, int64_t(g) * st, g, d, got.data(), gml.data());
      for (int i = 0; i < g * d; ++i) {
        float tol = 2e-5f;
        for (int b = 0; b < nb && i8; ++b)
          tol += 24.0f / 254.0f * want_mass[size_t(b) * g + i / d] * vscale_max[size_t(b)];
        ASSERT_NEAR(got[i], want[i], tol) << "qpos " << qpos << " index " << i << " i8 " << i8;
      }
      for (int h = 0; h < g; ++h) {
        double total = 0;
        for (int b = 0; b < nb; ++b) {
          const float m = attn_block_mass(ml.data() + (size_t(b) * g + h) * 2, gml.data() + 2 * h);
          total += m;
          ASSERT_NEAR(m, want_mass[b * g + h], 1e-6)
              << "qpos " << qpos << " block " << b << " head " << h;
          if (blocks[b].pos0 > qpos) {
            EXPECT_EQ(m, 0.0f);
          }
        }
        EXPECT_NEAR(total, 1.0, 1e-5) << "masses of head " << h << " at qpos " << qpos;
      }
    }
  set_qwin_pv_i8_enabled(true);
}

// Several queries in one call (prefill): each equals its own single-query run (up to the
// rounding of the low-bit window's value sum, which a lone query takes from the codes).
TEST(FusedAttentionMulti, RunOfQueriesEqualsSingleQueries) {
  const int g = 3, d = 16, H = 1;
  RopeParams rp;
  rp.n_rot = d;
  RopeTable rope(rp, d, 64);
  QuantLayout ql{2, H, d, 8, 0};
  std::mt19937 rng(7);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::vector<uint16_t> hk(size_t(20) * d), hv(hk.size());
  for (auto& x : hk) x = ref::float_to_half(HalfType::kF16, dist(rng));
  for (auto& x : hv) x = ref::float_to_half(HalfType::kF16, dist(rng));
  std::vector<float> k(size_t(8) * d), v(k.size());
  for (auto& x : k) x = dist(rng);
  for (auto& x : v) x = dist(rng);
  std::vector<uint8_t> win(ql.window_bytes());
  quantize_window(ql, k.data(), v.data(), 8, win.data());
  std::vector<KvBlockRef> blocks(3);
  blocks[0].pos0 = 0, blocks[0].n = 12, blocks[0].k = hk.data(), blocks[0].v = hv.data(),
  blocks[0].ld = d;
  blocks[1].pos0 = 12, blocks[1].n = 8, blocks[1].qwin = win.data();
  blocks[2].pos0 = 20, blocks[2].n = 8, blocks[2].k = hk.data() + 12 * d,
  blocks[2].v = hv.data() + 12 * d, blocks[2].ld = d;
  FusedAttnParams p;
  p.group = g, p.head_dim = d, p.scale = 0.25f, p.qlayout = &ql, p.rope = &rope;
  const int nq = 9;
  const int64_t qpos0 = 11;  // queries at 11..19: the later blocks are partly or fully masked
  const int st = attn_state_stride(d);
  std::vector<float> q(size_t(nq) * g * d + 5);
  for (auto& x : q) x = dist(rng);
  const int64_t ldq = int64_t(g) * d + 5 / nq;
  std::vector<float> multi(size_t(nq) * g * st), ml(size_t(nq) * 3 * g * 2);
  for (int i = 0; i < nq; ++i) attn_state_init(multi.data() + size_t(i) * g * st, g, d);
  FusedAttnScratch ws;
  fused_attention_partial(p, q.data(), ldq, nq, qpos0, blocks.data(), 3, multi.data(), ml.data(),
                          3 * g * 2, ws);
  for (int i = 0; i < nq; ++i) {
    std::vector<float> one(size_t(g) * st), ml1(size_t(3) * g * 2);
    attn_state_init(one.data(), g, d);
    fused_attention_partial(p, q.data() + i * ldq, 0, 1, qpos0 + i, blocks.data(), 3, one.data(),
                            ml1.data(), 0, ws);
    // Scores, maxima and sums are bit-identical; the value sums are too except for the
    // low-bit window, which a lone query sums from its codes and a run from decoded rows
    // (attention.cpp): the same products rounded in another order, a few ulps of the terms
    // (|p| ≤ 1, |v| ≲ 4, ≤ 28 tokens).
    for (int j = 0; j < g * st; ++j) {
      const float a = multi[size_t(i) * g * st + j], b = one[j];
      if (j % st < 2)
        ASSERT_EQ(a, b) << "query " << i << " index " << j;
      else
        ASSERT_NEAR(a, b, 28 * 4 * 8 * std::ldexp(1.0f, -24)) << "query " << i << " index " << j;
    }
    for (int j = 0; j < 3 * g * 2; ++j)
      ASSERT_EQ(ml[size_t(i) * 3 * g * 2 + j], ml1[j]) << "query " << i;
  }
}

// A run of queries over 16-bit blocks only (prefill) scores and sums all its (query, head)
// rows in one kernel call per span (qk_scores_rows, pv_accumulate_rows); every number must
// be what each query gets alone, up to the scores' order of summation (channels in order vs
// qk_scores' partial sums: a few ulps of Σ|q||k|, |q|, |k| ~ 1, d = 36 → ≤ 1e-5 relative).
// Awkward shapes: an odd head_dim with a scalar tail, a group of 5, blocks that are
// not contiguous (two spans), a run that starts among the queries (partly masked for some,
// unseen by the others), three runs of ≤ 256 tokens, 2 to 16 queries, bf16 and f16.
TEST(FusedAttentionMulti, RunOver16BitBlocksEqualsSingleQueries) {
  for (const HalfType t : {HalfType::kF16, HalfType::kBF16}) {
    const int g = 5, d = 36;
    std::mt19937 rng(11);
    std::normal_distribution<float> dist(0.0f, 1.0f);
    const int n_tok = 450;  // rows; the blocks hold 400 tokens in three runs of ≤ 256
    std::vector<uint16_t> hk(size_t(n_tok) * d), hv(hk.size());
    for (auto& x : hk) x = ref::float_to_half(t, dist(rng));
    for (auto& x : hv) x = ref::float_to_half(t, 2.0f * dist(rng));
    // Positions [0, 100) one span; [100, 130) a second (its rows elsewhere); [130, 370)
    // the second run; [370, 400) the third run, which queries 370.. see in part and the
    // queries before 370 not at all.
    std::vector<KvBlockRef> blocks(4);
    auto set = [&](KvBlockRef& b, int64_t pos0, int n, int row) {
      b.pos0 = pos0, b.n = n, b.k = hk.data() + size_t(row) * d, b.v = hv.data() + size_t(row) * d,
      b.ld = d;
    };
    set(blocks[0], 0, 100, 0);
    set(blocks[1], 100, 30, 420);
    set(blocks[2], 130, 240, 130);
    set(blocks[3], 370, 30, 370);
    FusedAttnParams p = FusedAttnParams::make(t, g, d);
    FusedAttnScratch ws;
    for (const int nq : {2, 9, 16}) {
      const int64_t qpos0 = 362;  // the third run starts at 370: some queries see none of it
      const int st = attn_state_stride(d);
      const int64_t ldq = int64_t(g) * d + 3;
      std::vector<float> q(size_t(nq) * ldq);
      for (auto& x : q) x = dist(rng);
      const int nb = 4;
      std::vector<float> multi(size_t(nq) * g * st), ml(size_t(nq) * nb * g * 2);
      for (int i = 0; i < nq; ++i) attn_state_init(multi.data() + size_t(i) * g * st, g, d);
      fused_attention_partial(p, q.data(), ldq, nq, qpos0, blocks.data(), nb, multi.data(),
                              ml.data(), nb * g * 2, ws);
      for (int i = 0; i < nq; ++i) {
        std::vector<float> one(size_t(g) * st), ml1(size_t(nb) * g * 2);
        attn_state_init(one.data(), g, d);
        fused_attention_partial(p, q.data() + i * ldq, 0, 1, qpos0 + i, blocks.data(), nb,
                                one.data(), ml1.data(), 0, ws);
        auto near = [](float a, float b) {
          return a == b || std::fabs(a - b) <= 1e-5f * (1.0f + std::fabs(b));
        };
        for (int j = 0; j < g * st; ++j)
          ASSERT_PRED2(near, multi[size_t(i) * g * st + j], one[j])
              << "nq " << nq << " query " << i << " index " << j;
        for (int j = 0; j < nb * g * 2; ++j)
          ASSERT_PRED2(near, ml[size_t(i) * nb * g * 2 + j], ml1[j])
              << "nq " << nq << " query " << i;
      }
    }
  }
}

// attend_blocks' masses per token (token_ml) over more units than one chunk (256) and one
// merge chunk (512), both layouts, against a direct double-precision softmax; and the same
// bits with 1 and 2 threads (units are split over the pool). Queries at the end (decode-like)
// and a prompt's worth in the middle: more than one group of 16, tokens past every query,
// chunks that start after some queries.
TEST(AttendBlocks, TokenMassesMatchDirectSoftmaxAndDoNotDependOnThreads) {
  for (const auto& [n_q, qpos0] : {std::pair<int64_t, int64_t>{6, 1094}, {40, 500}}) {
    const int H = 2, g = 3, d = 16;
    const int64_t n = 1100;
    std::mt19937 rng(11);
    std::normal_distribution<float> dist(0.0f, 1.0f);
    std::vector<uint16_t> hk(size_t(H) * n * d), hv(hk.size());
    for (auto& x : hk) x = ref::float_to_half(HalfType::kF16, dist(rng));
    for (auto& x : hv) x = ref::float_to_half(HalfType::kF16, dist(rng));
    // Head h: one block of 700 tokens and one of 400 (positions follow each other).
    std::vector<KvBlockRef> blocks;
    std::vector<int64_t> head_off{0};
    for (int h = 0; h < H; ++h) {
      for (auto [p0, len] : {std::pair<int64_t, int>{0, 700}, std::pair<int64_t, int>{700, 400}}) {
        KvBlockRef b;
        b.pos0 = p0, b.n = len, b.ld = d;
        b.k = hk.data() + (size_t(h) * n + p0) * d;
        b.v = hv.data() + (size_t(h) * n + p0) * d;
        blocks.push_back(b);
      }
      head_off.push_back(int64_t(blocks.size()));
    }
    FusedAttnParams p = FusedAttnParams::make(HalfType::kF16, g, d);
    p.token_ml = true;
    const int64_t ldq = int64_t(H) * g * d;
    std::vector<float> q(size_t(n_q) * ldq), out(q.size());
    for (auto& x : q) x = dist(rng);
    // Direct: per KV head, the group's softmax probabilities of every token, summed.
    std::vector<double> want(size_t(H) * n, 0.0), want_sum(size_t(n), 0.0);
    for (int64_t i = 0; i < n_q; ++i)
      for (int h = 0; h < H; ++h)
        for (int j = 0; j < g; ++j) {
          const float* qi = q.data() + i * ldq + (h * g + j) * d;
          std::vector<double> sc(size_t(qpos0 + i + 1));
          double mx = -1e300;
          for (size_t t = 0; t < sc.size(); ++t) {
            double dot = 0;
            for (int c = 0; c < d; ++c)
              dot += double(qi[c]) *
                     ref::half_to_float(HalfType::kF16, hk[(size_t(h) * n + t) * d + c]);
            sc[t] = dot * p.scale;
            mx = std::max(mx, sc[t]);
          }
          double z = 0;
          for (double& x : sc) z += (x = std::exp(x - mx));
          for (size_t t = 0; t < sc.size(); ++t) {
            want[size_t(h) * n + t] += sc[t] / z;
            want_sum[t] += sc[t] / z;
          }
        }
    for (MassLayout layout : {MassLayout::kPerHeadBlock, MassLayout::kSumOverHeads}) {
      const bool per_head = layout == MassLayout::kPerHeadBlock;
      std::vector<std::vector<double>> got;
      for (int threads : {1, 2}) {
        ThreadPool pool(threads);
        BlockAttnScratch scratch;
        got.emplace_back(per_head ? size_t(H) * n : size_t(n), 0.0);
        attend_blocks(p, H, q.data(), ldq, n_q, qpos0, blocks.data(), head_off.data(), out.data(),
                      got.back().data(), layout, scratch, pool);
      }
      ASSERT_EQ(got[0], got[1]) << "the masses depend on the thread count";
      {  // stats_only: the same masses, no outputs
        ThreadPool pool(2);
        BlockAttnScratch scratch;
        FusedAttnParams ps = p;
        ps.stats_only = true;
        std::vector<double> m(got[0].size(), 0.0);
        std::vector<float> o(out.size(), 1.0f);
        attend_blocks(ps, H, q.data(), ldq, n_q, qpos0, blocks.data(), head_off.data(), o.data(),
                      m.data(), layout, scratch, pool);
        ASSERT_EQ(m, got[0]) << "stats_only changed the masses";
        for (float x : o) ASSERT_EQ(x, 0.0f);
      }
      const std::vector<double>& w = per_head ? want : want_sum;
      for (size_t t = 0; t < w.size(); ++t)
        ASSERT_NEAR(got[0][t], w[t], 1e-5 * (1.0 + w[t]))
            << "unit " << t << " per_head " << per_head << " n_q " << n_q;
    }
  }
}

// One list every KV head shares (a tiered cache's: sink, 16-bit windows whose heads lie
// head_rows rows apart, low-bit windows with every head's part, a partial last window) gives
// bit for bit what per-head lists with each head's pointers give: outputs and masses, both
// layouts, decode (split into segments) and a run of queries, the threads as they come.
TEST(AttendBlocks, SharedListEqualsPerHeadLists) {
  const int H = 3, g = 3, d = 64, W = 8, S = 4;
  RopeParams rp;
  rp.n_rot = d;
  rp.freq_base = 10000.0f;
  RopeTable rope(rp, d, 4096);
  QuantLayout ql{4, H, d, W, 0, 2};
  ASSERT_TRUE(ql.validate().is_ok());
  std::mt19937 rng(5);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  const int n_win = 37;  // the last one partial
  const int64_t n_tok = S + int64_t(n_win - 1) * W + 5;
  std::vector<uint16_t> sink_k(size_t(H) * S * d), sink_v(sink_k.size());
  for (auto& x : sink_k) x = ref::float_to_half(HalfType::kF16, dist(rng));
  for (auto& x : sink_v) x = ref::float_to_half(HalfType::kF16, dist(rng));
  // Window i: 16-bit when i % 3 == 0 or i >= 33 (the recent ones), else low-bit.
  std::vector<std::vector<uint16_t>> fk(n_win), fv(n_win);
  std::vector<std::vector<uint8_t>> qw(n_win);
  std::vector<KvBlockRef> shared;
  KvBlockRef sink;
  sink.n = S, sink.k = sink_k.data(), sink.v = sink_v.data(), sink.ld = d, sink.head_rows = S;
  shared.push_back(sink);
  for (int i = 0; i < n_win; ++i) {
    KvBlockRef r;
    r.pos0 = S + int64_t(i) * W;
    r.n = i + 1 < n_win ? W : 5;
    if (i % 3 == 0 || i >= 33) {
      fk[i].resize(size_t(H) * W * d);
      fv[i].resize(fk[i].size());
      for (auto& x : fk[i]) x = ref::float_to_half(HalfType::kF16, 2.0f * dist(rng));
      for (auto& x : fv[i]) x = ref::float_to_half(HalfType::kF16, dist(rng));
      r.k = fk[i].data(), r.v = fv[i].data(), r.ld = d, r.head_rows = W;
    } else {
      std::vector<float> k(size_t(W) * H * d), v(k.size());
      for (auto& x : k) x = 2.0f * dist(rng);
      for (auto& x : v) x = dist(rng);
      qw[i].resize(ql.window_bytes());
      quantize_window(ql, k.data(), v.data(), r.n, qw[i].data());
      r.qwin = qw[i].data();
    }
    shared.push_back(r);
  }
  const int64_t nb = int64_t(shared.size());
  std::vector<KvBlockRef> per_head;
  std::vector<int64_t> head_off{0};
  for (int h = 0; h < H; ++h) {
    for (KvBlockRef r : shared) {
      if (r.k) r.k += int64_t(h) * r.head_rows * r.ld, r.v += int64_t(h) * r.head_rows * r.ld;
      r.head_rows = 0;
      per_head.push_back(r);
    }
    head_off.push_back(int64_t(per_head.size()));
  }
  FusedAttnParams p = FusedAttnParams::make(HalfType::kF16, g, d);
  p.qlayout = &ql;
  p.rope = &rope;
  const int64_t ldq = int64_t(H) * g * d;
  ThreadPool pool(2);
  for (int64_t n_q : {int64_t(1), int64_t(5)}) {
    const int64_t qpos0 = n_tok - n_q;
    std::vector<float> q(size_t(n_q) * ldq);
    for (auto& x : q) x = dist(rng);
    for (MassLayout layout : {MassLayout::kPerHeadBlock, MassLayout::kSumOverHeads}) {
      const size_t n_mass = layout == MassLayout::kPerHeadBlock ? size_t(H * nb) : size_t(nb);
      std::vector<float> out_a(q.size()), out_b(q.size());
      std::vector<double> mass_a(n_mass, 0.0), mass_b(n_mass, 0.0);
      BlockAttnScratch sa, sb;
      attend_blocks(p, H, q.data(), ldq, n_q, qpos0, per_head.data(), head_off.data(), out_a.data(),
                    mass_a.data(), layout, sa, pool);
      attend_shared_blocks(p, H, q.data(), ldq, n_q, qpos0, shared.data(), nb, out_b.data(),
                           mass_b.data(), layout, sb, pool);
      ASSERT_EQ(out_a, out_b) << "n_q " << n_q;
      ASSERT_EQ(mass_a, mass_b) << "n_q " << n_q;
      double total = 0.0;
      for (double m : mass_a) total += m;
      EXPECT_NEAR(total, double(n_q) * H * g, 1e-4);  // every query head's mass sums to 1
    }
  }
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, FusedAttention,
    // The second shape: a larger head dim within the first's group × dim, past position 256
    // (the lone query's R(hi) scratch must grow with the head dim alone).
    ::testing::Values(Shape{3, 64, 2, HalfType::kF16}, Shape{1, 128, 2, HalfType::kF16, 70000},
                      Shape{1, 64, 4, HalfType::kF16}, Shape{4, 32, 2, HalfType::kBF16},
                      Shape{7, 16, 2, HalfType::kF16}, Shape{2, 128, 4, HalfType::kBF16},
                      Shape{3, 64, 2, HalfType::kF16, 70000},
                      Shape{3, 40, 4, HalfType::kBF16, 65530},
                      Shape{2, 72, 2, HalfType::kF16, 1 << 20},
                      Shape{3, 64, 4, HalfType::kF16, 0, 2},  // 4-bit keys, 2-bit values
                      Shape{7, 40, 2, HalfType::kBF16, 65530, 4},
                      // Windows scored from their codes with one across a 256-position
                      // boundary (pos0 255: the query takes R(lo)ᵀ, the keys rows t) and the
                      // rest within one (the keys take rows lo + t).
                      Shape{3, 64, 2, HalfType::kF16, 250},
                      Shape{3, 64, 4, HalfType::kF16, 65530, 2}));

// The fixed-size table composes cos/sin from base-256 digits; each level adds at most a few
// float roundings to the directly computed (double) values: |error| <= 4·levels·2^-24 with
// |cos|, |sin| <= 1 (one product of two rounded values per extra level, plus the rows'
// own rounding). Checked at positions that use every level, past 65,536 included.
TEST(RopeTable, ComposedMatchesDirectComputationAndInverts) {
  for (RopeStyle style : {RopeStyle::kNormal, RopeStyle::kNeox}) {
    RopeParams rp;
    rp.style = style;
    rp.n_rot = 64;
    rp.freq_base = 100000.0f;
    const int64_t n_pos = int64_t(1) << 20;
    RopeTable t(rp, 72, n_pos);  // 8 channels pass through
    ASSERT_EQ(t.levels(), 3);
    ASSERT_GE(t.limit(), n_pos);
    const double tol = 4.0 * t.levels() * std::ldexp(1.0, -24);
    std::vector<float> c(32), s(32), tc(32), ts(32), cx(72), sx(72);
    std::mt19937 rng(3);
    std::normal_distribution<float> dist(0.0f, 1.0f);
    for (int64_t pos :
         {int64_t(0), int64_t(1), int64_t(17), int64_t(255), int64_t(256), int64_t(4095),
          int64_t(65535), int64_t(65536), int64_t(65537), int64_t(300001), int64_t(n_pos - 1)}) {
      rope_cos_sin(rp, pos, c.data(), s.data());
      t.cos_sin(pos, tc.data(), ts.data());
      double worst = 0;
      int wi = 0;
      for (int i = 0; i < 32; ++i) {
        const double e = std::max(std::fabs(double(c[i]) - tc[i]), std::fabs(double(s[i]) - ts[i]));
        if (e > worst) worst = e, wi = i;
      }
      ASSERT_LE(worst, tol) << "pos " << pos << " pair " << wi << ": cos " << c[wi] << " vs "
                            << tc[wi] << ", sin " << s[wi] << " vs " << ts[wi];
      t.expanded(pos, cx.data(), sx.data());
      for (int ch = 64; ch < 72; ++ch) {
        ASSERT_EQ(cx[ch], 1.0f);
        ASSERT_EQ(sx[ch], 0.0f);
      }
      std::vector<float> x(64), y;
      for (auto& e : x) e = dist(rng);
      y = x;
      rope_apply(rp, tc.data(), ts.data(), y.data(), 1, 64, 64);
      rope_apply(rp, tc.data(), ts.data(), y.data(), 1, 64, 64, /*inverse=*/true);
      for (int i = 0; i < 64; ++i)
        ASSERT_NEAR(y[i], x[i], 1e-6 * (std::fabs(x[i]) + 1.0)) << "pos " << pos;
    }
    // Two whole levels and the 16 top rows that positions below 2^20 use, and the first
    // level by pairs (kNormal; kNeox has them with full rotation only).
    const size_t pairs72 = style == RopeStyle::kNormal ? size_t(256) * 36 * 2 * sizeof(float) : 0;
    EXPECT_EQ(t.has_pair_rows(), style == RopeStyle::kNormal);
    EXPECT_EQ(t.bytes(), size_t(2 * 256 + 16) * 72 * 2 * sizeof(float) + pairs72);
    EXPECT_EQ(t.limit(), n_pos);
    const RopeTable small(rp, 64, 2048);  // a 2K context: two levels, 8 top rows, pair rows
    EXPECT_EQ(small.limit(), 2048);
    EXPECT_TRUE(small.has_pair_rows());
    EXPECT_EQ(small.bytes(), size_t(256 + 8) * 64 * 2 * sizeof(float) + size_t(256) * 32 * 2 * 4);
  }
}

// The pair rows (the INT4 key scorer's RoPE) are the expanded first-level rows' own values:
// for the pair in slot s, the cos of its first channel and the sinx (+sin) of its second;
// kNormal slot s = pair (2s, 2s + 1), kNeox the even pairs f = 2s (channels f, f + d/2) in
// the first d/4 slots, then the odd ones. Every pair once; none for kNeox's partial rotation
// or an odd head_dim.
TEST(RopeTable, PairRowsAreTheExpandedRowsByPair) {
  for (RopeStyle style : {RopeStyle::kNormal, RopeStyle::kNeox})
    for (int d : {64, 16, 128, 12}) {
      RopeParams rp;
      rp.style = style;
      rp.n_rot = d;
      rp.freq_base = 10000.0f;
      const RopeTable t(rp, d, 70000);
      ASSERT_TRUE(t.has_pair_rows()) << d;
      const int h2 = d / 2;
      for (int r : {0, 1, 77, 255}) {
        std::vector<int> seen(size_t(d), 0);
        for (int s = 0; s < h2; ++s) {
          int a = 2 * s, b = 2 * s + 1;
          if (style == RopeStyle::kNeox) {
            const int f = s < d / 4 ? 2 * s : 2 * (s - d / 4) + 1;
            a = f, b = f + h2;
          }
          ++seen[a], ++seen[b];
          ASSERT_EQ(t.pair_cos_row(r)[s], t.cosx_row(r)[a]) << d << " " << r << " " << s;
          ASSERT_EQ(t.pair_cos_row(r)[s], t.cosx_row(r)[b]);
          ASSERT_EQ(t.pair_sin_row(r)[s], t.sinx_row(r)[b]);
          ASSERT_EQ(t.pair_sin_row(r)[s], -t.sinx_row(r)[a]);
        }
        for (int c = 0; c < d; ++c) ASSERT_EQ(seen[c], 1) << "channel " << c;
      }
    }
  RopeParams partial;
  partial.style = RopeStyle::kNeox;
  partial.n_rot = 32;
  EXPECT_FALSE(RopeTable(partial, 64, 1024).has_pair_rows());
  RopeParams odd;
  odd.n_rot = 6;
  EXPECT_FALSE(RopeTable(odd, 7, 1024).has_pair_rows());
}

}  // namespace
}  // namespace qevict
