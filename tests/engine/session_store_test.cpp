// The server's idle conversations (engine/session_store.h) without a model: a fake cache that
// has n_past tokens, holds `bytes`, and can drop tokens only back to `floor` (FullKV: 0; a
// compressed cache: its local region's start). Which session a prompt resumes, how far it
// rewinds or why it misses, least-recently-used order and the bytes the store counts.
#include "engine/session_store.h"

#include <gtest/gtest.h>

#include <numeric>

namespace qevict {
namespace {

class FakeCache : public SequenceKvCache {
 public:
  FakeCache(int64_t n_past, int64_t floor, size_t bytes) : n_(n_past), floor_(floor), b_(bytes) {}
  int64_t n_past() const override { return n_; }
  int64_t n_ctx() const override { return 1 << 20; }
  Status begin(int64_t) override { return Status::ok(); }
  void attend(int, const float*, const float*, const float*, float*, ThreadPool&) override {}
  Status commit() override { return Status::ok(); }
  void clear() override { n_ = 0; }
  bool can_truncate(int64_t n) const override { return n <= n_ && n >= floor_; }
  Status truncate(int64_t n) override {
    if (!can_truncate(n)) return Status::error("fake: cannot truncate");
    n_ = n;
    return Status::ok();
  }
  size_t bytes_held() const override { return b_; }
  std::string describe() const override { return "fake"; }
  void report(KvReport*, ReportDetail) const override {}

 private:
  int64_t n_, floor_;
  size_t b_;
};

std::vector<int32_t> seq(int32_t from, int n) {
  std::vector<int32_t> v(static_cast<size_t>(n));
  std::iota(v.begin(), v.end(), from);
  return v;
}

std::vector<int32_t> cat(std::vector<int32_t> a, const std::vector<int32_t>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

// A session of `tokens` whose cache has consumed all but the last (the pending token).
SessionEntry entry(const std::string& id, const std::vector<int32_t>& tokens, int64_t floor,
                   size_t bytes, const std::string& key = "k") {
  SessionEntry e;
  e.id = id;
  e.tokens = tokens;
  e.n_past = int64_t(tokens.size()) - 1;
  e.n_ctx = 4096;
  e.key = key;
  e.cache = std::make_unique<FakeCache>(e.n_past, floor, bytes);
  e.bytes = bytes;
  return e;
}

const MatchRules kRules{32, 0.5};

TEST(PlanReuse, ExtendsKeepsEveryCachedTokenAndPrefillsTheRest) {
  const auto hist = seq(0, 100);  // n_past 99: token 99 pending
  FakeCache c(99, 0, 1);
  // The next turn: the whole history, then new tokens.
  auto m = plan_reuse(hist, 99, &c, cat(hist, seq(1000, 20)), kRules);
  ASSERT_TRUE(m);
  EXPECT_EQ(m->reuse, 99);
  EXPECT_FALSE(m->truncate);
}

TEST(PlanReuse, DivergingInsideTheHistoryRewindsWhenTheCacheCanElseMisses) {
  const auto hist = seq(0, 100);
  const auto prompt = cat(seq(0, 90), seq(5000, 10));  // shares 90 tokens
  FakeCache full(99, 0, 1);                            // FullKV: anywhere
  auto m = plan_reuse(hist, 99, &full, prompt, kRules);
  ASSERT_TRUE(m);
  EXPECT_EQ(m->reuse, 90);
  EXPECT_TRUE(m->truncate);
  FakeCache local(99, 80, 1);  // local region from 80: 90 is inside
  ASSERT_TRUE(plan_reuse(hist, 99, &local, prompt, kRules));
  FakeCache narrow(99, 95, 1);  // local region from 95: 90 is compressed already
  EXPECT_FALSE(plan_reuse(hist, 99, &narrow, prompt, kRules));
  // On disk (no cache here): taken to truncate; checked once restored.
  EXPECT_TRUE(plan_reuse(hist, 99, nullptr, prompt, kRules));
}

TEST(PlanReuse, APromptEqualToTheHistoryLeavesOneTokenToRun) {
  const auto hist = seq(0, 100);
  FakeCache c(100, 0, 1);  // every token in the cache, none pending
  auto m = plan_reuse(hist, 100, &c, hist, kRules);
  ASSERT_TRUE(m);
  EXPECT_EQ(m->reuse, 99);
  EXPECT_TRUE(m->truncate);
  FakeCache stuck(100, 100, 1);  // cannot drop even one
  EXPECT_FALSE(plan_reuse(hist, 100, &stuck, hist, kRules));
  // The last token pending: nothing to drop.
  FakeCache pend(99, 99, 1);
  m = plan_reuse(hist, 99, &pend, hist, kRules);
  ASSERT_TRUE(m);
  EXPECT_EQ(m->reuse, 99);
  EXPECT_FALSE(m->truncate);
}

TEST(PlanReuse, ShortPrefixesAreMisses) {
  FakeCache c(99, 0, 1);
  // 31 tokens shared: below 32.
  EXPECT_FALSE(plan_reuse(seq(0, 100), 99, &c, cat(seq(0, 31), seq(900, 5)), {32, 0.0}));
  EXPECT_TRUE(plan_reuse(seq(0, 100), 99, &c, cat(seq(0, 32), seq(900, 5)), {32, 0.0}));
  // 40 of a 100-token session: below half of it.
  EXPECT_FALSE(plan_reuse(seq(0, 100), 99, &c, cat(seq(0, 40), seq(900, 5)), kRules));
  EXPECT_TRUE(plan_reuse(seq(0, 100), 99, &c, cat(seq(0, 50), seq(900, 5)), kRules));
  // Nothing shared.
  EXPECT_FALSE(plan_reuse(seq(0, 100), 99, &c, seq(7, 100), {0, 0.0}));
}

TEST(SessionStore, LongestPrefixWinsAmongSessionsOfTheSameKeyAndContext) {
  SessionStore st;
  const auto a = seq(0, 100), b = cat(seq(0, 60), seq(700, 60));
  st.put(entry("a", a, 0, 10));
  st.put(entry("b", b, 0, 10));
  st.put(entry("other-key", a, 0, 10, "k2"));
  auto m = st.match("", cat(a, seq(2000, 5)), "k", 200, kRules);
  ASSERT_TRUE(m);
  EXPECT_EQ(m->id, "a");
  EXPECT_EQ(m->reuse, 99);
  m = st.match("", cat(b, seq(2000, 5)), "k", 200, kRules);
  ASSERT_TRUE(m);
  EXPECT_EQ(m->id, "b");
  // Another key (policy / budget), or a context the cache cannot take: a miss.
  EXPECT_FALSE(st.match("", cat(a, seq(2000, 5)), "k3", 200, kRules));
  EXPECT_FALSE(st.match("", cat(a, seq(2000, 5)), "k", 5000, kRules));
  // An id looks at that session only: b, rewound to the 60 tokens it shares with a.
  m = st.match("b", cat(a, seq(2000, 5)), "k", 200, kRules);
  ASSERT_TRUE(m);
  EXPECT_EQ(m->id, "b");
  EXPECT_EQ(m->reuse, 60);
  EXPECT_TRUE(m->truncate);
  EXPECT_FALSE(st.match("nobody", cat(a, seq(2000, 5)), "k", 200, kRules));
  // A named session is resumed under its name only.
  SessionEntry n = entry("named", cat(a, seq(3000, 50)), 0, 10);
  n.named = true;
  st.put(std::move(n));
  m = st.match("", cat(cat(a, seq(3000, 50)), seq(9, 2)), "k", 200, kRules);
  ASSERT_TRUE(m);
  EXPECT_EQ(m->id, "a");
  m = st.match("named", cat(cat(a, seq(3000, 50)), seq(9, 2)), "k", 200, kRules);
  ASSERT_TRUE(m);
  EXPECT_EQ(m->reuse, 149);
  m = st.match("a", cat(a, seq(2000, 5)), "k", 200, kRules);
  ASSERT_TRUE(m);
  EXPECT_EQ(m->id, "a");
}

TEST(SessionStore, BytesAndLeastRecentlyUsedOrderFollowPutTakeAndEviction) {
  SessionStore st;
  st.put(entry("x", seq(0, 50), 0, 100));
  st.put(entry("y", seq(100, 50), 0, 200));
  st.put(entry("z", seq(200, 50), 0, 300));
  EXPECT_EQ(st.bytes(), 600u);
  EXPECT_EQ(st.in_memory(), 3);
  EXPECT_EQ(st.lru_in_memory(), (std::vector<std::string>{"x", "y", "z"}));
  EXPECT_EQ(st.lru_in_memory("y"), (std::vector<std::string>{"x", "z"}));
  // x is resumed and comes back: now the most recent.
  SessionEntry x = st.take("x");
  EXPECT_EQ(st.bytes(), 500u);
  EXPECT_TRUE(x.in_memory());
  st.put(std::move(x));
  EXPECT_EQ(st.lru_in_memory(), (std::vector<std::string>{"y", "z", "x"}));
  // y goes to disk: its history stays as the index, its bytes leave.
  st.find("y")->path = "/tmp/y.qvs";
  st.to_disk("y");
  EXPECT_EQ(st.bytes(), 400u);
  EXPECT_EQ(st.in_memory(), 2);
  EXPECT_EQ(st.on_disk(), 1);
  EXPECT_EQ(st.lru_in_memory(), (std::vector<std::string>{"z", "x"}));
  auto m = st.match("", cat(seq(100, 50), seq(9, 3)), "k", 100, kRules);
  ASSERT_TRUE(m);
  EXPECT_EQ(m->id, "y");
  EXPECT_TRUE(m->on_disk);
  // The same id replaces, bytes included.
  st.put(entry("z", seq(200, 60), 0, 30));
  EXPECT_EQ(st.bytes(), 130u);
  st.erase("x");
  EXPECT_EQ(st.bytes(), 30u);
  EXPECT_EQ(st.in_memory(), 1);
}

TEST(SessionFileName, SafeIdsAsTheyAreOthersHashed) {
  EXPECT_EQ(session_file_name("conv-42_a.b"), "conv-42_a.b.qvs");
  const std::string h = session_file_name("../etc/passwd");
  EXPECT_EQ(h.size(), 1 + 16 + 4);
  EXPECT_EQ(h[0], 'h');
  EXPECT_EQ(h.find('/'), std::string::npos);
  EXPECT_NE(session_file_name("a b"), session_file_name("a c"));
  EXPECT_NE(session_file_name(".hidden")[0], '.');
}

TEST(KvParamsKey, EqualExactlyForTheSameCacheParams) {
  KvCacheParams a, b;
  EXPECT_EQ(kv_params_key(a), kv_params_key(b));
  b.budget_bytes = 4096;
  EXPECT_NE(kv_params_key(a), kv_params_key(b));
  b = a;
  b.policy = "qevict";
  EXPECT_NE(kv_params_key(a), kv_params_key(b));
}

TEST(BudgetFreeKey, AFractionRequestResumesASessionOfAnyByteBudget) {
  KvCacheParams req;  // the request: qevict at a fraction
  req.policy = "qevict";
  req.budget_fraction = 0.2;
  KvCacheParams first = req, later = req;  // what its turns' fractions were made into
  first.budget_fraction = later.budget_fraction = 0.0;
  first.budget_bytes = 150000;
  later.budget_bytes = 190000;
  EXPECT_NE(kv_params_key(first), kv_params_key(later));
  EXPECT_EQ(budget_free_key(req), budget_free_key(first));
  EXPECT_EQ(budget_free_key(first), budget_free_key(later));
  EXPECT_NE(budget_free_key(first), kv_params_key(first));  // marked apart
  KvCacheParams other = first;
  other.pool = 5;
  EXPECT_NE(budget_free_key(first), budget_free_key(other));

  SessionStore st;
  SessionEntry e = entry("a", seq(0, 100), 0, 10);
  e.kv = first;
  e.key = kv_params_key(first);
  st.put(std::move(e));
  const auto prompt = cat(seq(0, 100), seq(2000, 5));
  EXPECT_TRUE(st.match("", prompt, budget_free_key(req), 200, kRules));   // the fraction
  EXPECT_TRUE(st.match("", prompt, kv_params_key(first), 200, kRules));   // the same bytes
  EXPECT_FALSE(st.match("", prompt, kv_params_key(later), 200, kRules));  // other bytes
}

}  // namespace
}  // namespace qevict
