// Bytes held = budget (SPEC §3, issue 9 item 2; --prefill-route chunk): a budgeted tiered
// cache driven through make_kv_cache to 16,384 positions (prefill in chunks, then decode
// steps) holds at most its budget plus a stated constant, and nothing it holds grows with
// the positions: the RoPE table has a fixed size, evicted windows' entries are dropped, pools
// give chunks back and attention scratch is bounded by the batch.
#include "common/bytes_bound.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <random>
#include <vector>

#include "common/kv_names.h"
#include "common/kv_shape.h"
#include "common/random_wo.h"
#include "kvcache/cache_peers.h"
#include "kvcache/factory.h"
#include "kvcache/params.h"
#include "kvcache/registry.h"
#include "kvcache/slot_pool.h"
#include "kvcache/window_store.h"

namespace qevict {
namespace {

KvShape small_shape() { return test::rope_shape(2, 2, 1, 32); }

void step(SequenceKvCache& c, const KvShape& s, int64_t n, ThreadPool& pool, std::mt19937& r) {
  std::normal_distribution<float> dist(0.0f, 1.0f);
  ASSERT_TRUE(c.begin(n).is_ok());
  std::vector<float> q(size_t(n) * s.q_width()), k(size_t(n) * s.kv_width()), v(k.size()),
      o(q.size());
  for (int l = 0; l < s.n_layers; ++l) {
    for (auto& x : q) x = 2.0f * dist(r);
    for (auto& x : k) x = 2.0f * dist(r);
    for (auto& x : v) x = dist(r);
    c.attend(l, q.data(), k.data(), v.data(), o.data(), pool);
  }
  ASSERT_TRUE(c.commit().is_ok());
}

TEST(TieredBytesHeld, WithinBudgetPlusConstantAndFlatFrom8KTo16K) {
  const KvShape s = small_shape();
  const int64_t n_ctx = 16384 + 16;
  ThreadPool pool(2);
  for (bool strict :
       {false}) {  // (strict mode: the same minus the ledger term; not rerun for time)
    KvCacheParams p;
    p.policy = "qevict";
    // 5 %: the budget is full from ~2K positions on (INT2 windows are ~3.5× cheaper), so 8K
    // and 16K are both in steady state.
    p.budget_fraction = 0.05;
    p.strict_ledger = strict;
    // Budget + constant from the first chunk on is --prefill-route chunk's bound; end holds
    // the whole prompt until its one routing event (prefill_route_test.cpp).
    p.prefill_route = PrefillRoute::kChunk;
    auto made = make_kv_cache(s, n_ctx, p);
    ASSERT_TRUE(made.has_value()) << made.error();
    SequenceKvCache& c = **made;
    KvReport rep;
    c.report(&rep);
    const size_t budget = rep.budget.total * size_t(s.n_layers);
    const size_t constant = bytes_held_constant(s, rep.budget);
    std::mt19937 rng(77);
    size_t held_8k = 0;
    int64_t n_past = 0;
    for (int64_t mark : {int64_t(2048), int64_t(8192), int64_t(16384)}) {
      while (n_past < mark - 8) {
        const int64_t n = std::min<int64_t>(512, mark - 8 - n_past);
        step(c, s, n, pool, rng);
        n_past += n;
      }
      while (n_past < mark) {  // decode steps: one routing event at every Ω = 8
        step(c, s, 1, pool, rng);
        ++n_past;
      }
      c.report(&rep);
      const KvLayerReport tot = rep.total();
      // Ledger copies kept by promoted windows are real memory outside the budget unless
      // the ledger is strict (SPEC §3: reported separately).
      const size_t ledger = strict ? 0 : tot.bytes_ledger_of_full;
      std::printf(
          "strict %d n_past %lld: held %zu (pools+sinks %zu, in use F %zu Q %zu), budget %zu, "
          "ledger of F %zu, constant %zu\n",
          int(strict), (long long)n_past, rep.bytes_held, tot.bytes_allocated, tot.bytes_full,
          tot.bytes_quant, budget, ledger, constant);
      EXPECT_LE(double(rep.bytes_held), 1.05 * double(budget) + double(ledger + constant))
          << "n_past " << n_past;
      if (mark == 8192) held_8k = rep.bytes_held;
      if (mark == 16384) {
        // No growth with the positions: what 8K → 16K may add is bounded by pool chunks
        // changing hands between tiers and promoted windows' ledger copies, not 8K tokens.
        EXPECT_LE(double(rep.bytes_held), double(held_8k) + double(ledger) +
                                              double(s.n_layers * pool_chunks_bytes(rep.budget)))
            << "held at 8K " << held_8k << ", at 16K " << rep.bytes_held;
      }
    }
  }
}

// The one routing event of --prefill-route end drops every evicted window of the prompt at
// once; the window tables then give their room back like after a chunk's routing.
// StreamingLLM (ω = 1: an entry, 32 B, a token) keeping half of a 4,096-token prompt: a rule
// that shrank a table only past twice its size kept the whole prompt's entries (4,096 a
// layer for ~2,000 kept), 6 % of the budget on a 2-KV-head model at 16K.
TEST(TieredBytesHeld, PromptEndRoutingGivesTheEntriesRoomBack) {
  const KvShape s = test::rope_shape(2, 14, 2, 64);
  ThreadPool pool(2);
  for (const char* route : {"end", "chunk"}) {
    SCOPED_TRACE(route);
    KvCacheParams p;
    p.policy = "streaming";
    p.budget_fraction = 0.5;
    p.prefill_route = test::route_of(route);
    KvParamsGiven given;
    given.prefill_route = true;
    ASSERT_TRUE(apply_policy_defaults(&p, given).is_ok());  // ω = Ω = 1
    auto c = TieredKvCacheTestPeer::make(s, 4096 + 64, p);
    ASSERT_NE(c, nullptr);
    std::mt19937 rng(11);
    for (int i = 0; i < 8; ++i) step(*c, s, 512, pool, rng);
    ASSERT_TRUE(c->end_prompt().is_ok());
    for (int i = 0; i < 16; ++i) step(*c, s, 1, pool, rng);
    KvReport rep;
    c->report(&rep, ReportDetail::kSummary);
    size_t bound = 0;
    for (const KvLayerReport& l : rep.layers) {
      const int64_t kept = l.windows_full + l.windows_quant + l.windows_local;
      EXPECT_GT(kept, 1900);
      // Kept windows, the last event's evicted ones (dropped at the next), room for a
      // quarter more and the rule's slack.
      bound += size_t(kept + 4 + (kept + 4) / 4 + 64) * sizeof(WindowStore::Window);
    }
    EXPECT_LE(TieredKvCacheTestPeer(*c).store().entry_bytes(), bound);
  }
}

// At a small budget the constant must not dominate (issue 10: matched bytes): SmolLM2's
// geometry, a 2,048-token context at 5 % (77 KiB a layer), 1,024 prompt tokens in 512-token
// chunks and 64 decode steps. StreamingLLM (ω = 1, F only) and the two-tier cache hold no RoPE
// table; pool chunks are ~1/64 of a layer's budget; a prefill chunk's window entries and
// scratch are given back. With 64 KiB chunks and an always-built table these held 2.0× and
// 1.7× the budget; before M_f charged a window's 32-B entry, StreamingLLM held 1.08× (an
// entry a token).
TEST(TieredBytesHeld, SmallBudgetHoldsCloseToIt) {
  const KvShape s = test::rope_shape(30, 9, 3, 64, 100000.0f);
  ThreadPool pool(2);
  struct Case {
    const char* policy;
    double kv_q;  // < 0: the policy's default
    double max_ratio;
  };
  for (const Case& k :
       {Case{"streaming", -1, 1.05}, Case{"qevict", -1, 1.10}, Case{"qevict", 0.0, 1.03}}) {
    KvCacheParams p;
    p.policy = k.policy;
    p.budget_fraction = 0.05;
    p.prefill_route = PrefillRoute::kChunk;
    KvParamsGiven given;
    given.prefill_route = true;
    if (k.kv_q >= 0) p.q = k.kv_q, given.q = true;
    ASSERT_TRUE(apply_policy_defaults(&p, given).is_ok());  // StreamingLLM: ω = Ω = 1
    auto made = make_kv_cache(s, 2048, p);
    ASSERT_TRUE(made.has_value()) << made.error();
    SequenceKvCache& c = **made;
    std::mt19937 rng(5);
    for (int i = 0; i < 2; ++i) step(c, s, 512, pool, rng);
    for (int i = 0; i < 64; ++i) step(c, s, 1, pool, rng);
    KvReport rep;
    c.report(&rep);
    const double budget = double(rep.budget.total) * s.n_layers;
    const double ledger = double(rep.total().bytes_ledger_of_full);
    std::printf("%s q %.2f: held %zu, budget %.0f, ledger of F %.0f: %.3f x budget\n", k.policy,
                k.kv_q, rep.bytes_held, budget, ledger, (rep.bytes_held - ledger) / budget);
    EXPECT_LE(double(rep.bytes_held) - ledger, k.max_ratio * budget) << k.policy << " q " << k.kv_q;
  }
}

// The per-head caches (every registered kPerHead policy) under a budget in bytes: what they
// hold — K/V rows, positions, scores and value norms of capacity + Ω tokens per head, the
// observation window's queries — stays within budget × 1.05 plus one layer's attention scratch
// (masses and block refs: < 64 B per token a layer's heads hold) and 64 KiB, after the prompt's
// compression and through decode (measured after every call: the routing request, freed after
// each routing event, is not held between them).
TEST(PerHeadBytesHeld, EveryPerHeadPolicyWithinBudgetPlusOneLayersScratch) {
  const KvShape s = test::rope_shape(4, 4, 2, 32);
  const int64_t n_ctx = 2048;
  const int64_t n_embd = 64;
  std::mt19937 wrng(3);
  const test::RandomWo wo(s, n_embd, wrng);
  ThreadPool pool(1);
  int tested = 0;
  for (const PolicyInfo& row : policy_registry()) {
    if (row.kind != CacheKind::kPerHead) continue;
    for (double fraction : {0.2, 0.1}) {
      SCOPED_TRACE(row.name + " at " + std::to_string(fraction));
      KvCacheParams p;
      p.policy = row.name;
      KvParamsGiven given;
      ASSERT_TRUE(apply_policy_defaults(&p, given).is_ok());
      p.budget_tokens = 0;
      p.budget_fraction = fraction;
      auto made = make_kv_cache(s, n_ctx, p);
      ASSERT_TRUE(made.has_value()) << made.error();
      SequenceKvCache& c = **made;
      c.set_output_projection(&wo.proj);
      KvReport rep;
      c.report(&rep);
      const size_t budget = rep.budget.total * size_t(s.n_layers);
      const size_t steady = size_t(rep.budget.head_capacity + std::max(p.route_every, 1));
      const size_t constant = size_t(64 << 10) + size_t(s.n_kv_heads) * steady * 64;
      std::mt19937 rng(11);
      for (int i = 0; i < 2; ++i) step(c, s, 256, pool, rng);  // a 512-token prompt
      ASSERT_TRUE(c.end_prompt().is_ok());
      const size_t after_prompt = c.bytes_held();
      size_t worst = after_prompt;
      for (int t = 0; t < 160; ++t) {  // five routing events at the family's Ω = 32
        step(c, s, 1, pool, rng);
        worst = std::max(worst, c.bytes_held());
      }
      std::printf(
          "%-18s %.2f: held %zu B after the prompt, at most %zu B = %.3f x budget (%zu B), "
          "bound %zu B, at the end %zu\n",
          row.name.c_str(), fraction, after_prompt, worst, double(worst) / double(budget), budget,
          size_t(double(budget) * 1.05) + constant, c.bytes_held());
      EXPECT_LE(worst, size_t(double(budget) * 1.05) + constant);
      ++tested;
    }
  }
  EXPECT_GE(tested,
            14);  // h2o, snapkv, pyramidkv, adakv, criticalkv, criticaladakv, defensivekv, ...
}

}  // namespace
}  // namespace qevict
