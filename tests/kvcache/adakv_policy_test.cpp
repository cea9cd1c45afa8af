// AdaKV: its head budget allocation against a brute-force transcription of AdaKV's rule (and a
// case worked by hand), the whole policy against brute force on random requests, and the
// cache running it against the independent model of obs_family.h: heads keep different
// numbers of tokens and hold only their own bytes.
#include "kvcache/policies/adakv_policy.h"

#include <gtest/gtest.h>

#include <cmath>
#include <tuple>

#include "kvcache/obs_family.h"

namespace qevict {
namespace {

using obs_family::RouteInput;
using obs_family::RuleOutput;

double round_half_even(double x) {
  const double f = std::floor(x);
  if (x - f == 0.5) return std::fmod(f, 2.0) == 0.0 ? f : f + 1;
  return std::floor(x + 0.5);
}

// AdaKV's allocation, brute force: rank every (head, token) by (score desc, head asc, index
// asc) with a selection sort, count the top H·B per head, B_h = round(c_h(1−α) + int(αB)),
// then take back any excess over H·B one token at a time from the head whose rounding added
// the most (ties: the higher head).
std::vector<int64_t> allocate_ref(const std::vector<std::vector<double>>& s, int64_t B,
                                  double alpha, bool* ambiguous) {
  const int H = int(s.size());
  std::vector<std::tuple<double, int, int>> all;
  for (int h = 0; h < H; ++h)
    for (int i = 0; i < int(s[size_t(h)].size()); ++i)
      all.push_back({s[size_t(h)][size_t(i)], h, i});
  for (size_t a = 0; a < all.size(); ++a)
    for (size_t b = a + 1; b < all.size(); ++b) {
      const auto& x = all[a];
      const auto& y = all[b];
      const bool y_first = std::get<0>(y) > std::get<0>(x) ||
                           (std::get<0>(y) == std::get<0>(x) &&
                            (std::get<1>(y) < std::get<1>(x) || (std::get<1>(y) == std::get<1>(x) &&
                                                                 std::get<2>(y) < std::get<2>(x))));
      if (y_first) std::swap(all[a], all[b]);
    }
  const int64_t top = std::min<int64_t>(int64_t(H) * B, int64_t(all.size()));
  if (ambiguous && top > 0 && top < int64_t(all.size())) {
    const double a = std::get<0>(all[size_t(top - 1)]), b = std::get<0>(all[size_t(top)]);
    *ambiguous |= std::get<1>(all[size_t(top - 1)]) != std::get<1>(all[size_t(top)]) && a != b &&
                  std::fabs(a - b) <= 1e-4 * std::max(std::fabs(a), std::fabs(b)) + 1e-12;
  }
  std::vector<int64_t> c(size_t(H), 0), out(static_cast<size_t>(H));
  for (int64_t r = 0; r < top; ++r) ++c[size_t(std::get<1>(all[size_t(r)]))];
  const int64_t fl = int64_t(double(B) * alpha);
  std::vector<double> raw(static_cast<size_t>(H));
  int64_t sum = 0;
  for (int h = 0; h < H; ++h) {
    raw[size_t(h)] = double(c[size_t(h)]) * (1 - alpha) + double(fl);
    out[size_t(h)] = int64_t(round_half_even(raw[size_t(h)]));
    sum += out[size_t(h)];
  }
  while (sum > int64_t(H) * B) {
    int pick = -1;
    for (int h = 0; h < H; ++h)
      if (out[size_t(h)] > 0 &&
          (pick < 0 || out[size_t(h)] - raw[size_t(h)] >= out[size_t(pick)] - raw[size_t(pick)]))
        pick = h;
    --out[size_t(pick)];
    --sum;
  }
  return out;
}

TEST(AdaKVPolicy, AllocationMatchesAdaKVsRule) {
  // By hand: B = 10, α = 0.2 (floor 2), global top-30 counts (7, 7, 16): raw 7.6, 7.6, 14.8
  // round to 8, 8, 15 = 31 > 30; heads 0 and 1 rounded up most (0.4): the higher gives one.
  std::vector<std::vector<double>> s(3);
  for (int i = 0; i < 7; ++i) s[0].push_back(10 + i), s[1].push_back(20 + i);
  for (int i = 0; i < 16; ++i) s[2].push_back(30 + i);
  for (int i = 0; i < 20; ++i)
    s[0].push_back(0.001 * i), s[1].push_back(0.001 * i), s[2].push_back(0.001 * i);
  std::vector<int64_t> got;
  AdaKVPolicy::allocate(s, 10, 0.2, &got);
  EXPECT_EQ(got, (std::vector<int64_t>{8, 7, 15}));
  std::mt19937 rng(3);
  for (int trial = 0; trial < 500; ++trial) {
    const int H = 1 + int(rng() % 5);
    std::vector<std::vector<double>> sc(static_cast<size_t>(H));
    for (auto& v : sc) {
      v.resize(rng() % 30);
      for (double& x : v) x = trial % 3 == 0 ? double(rng() % 4) : std::ldexp(double(rng()), -32);
    }
    const int64_t B = int64_t(rng() % 25);
    const double alpha = trial % 2 ? 0.2 : 0.5;
    AdaKVPolicy::allocate(sc, B, alpha, &got);
    ASSERT_EQ(got, allocate_ref(sc, B, alpha, nullptr)) << "trial " << trial;
    int64_t sum = 0;
    for (int64_t x : got) sum += x;
    ASSERT_LE(sum, int64_t(H) * B);
  }
}

// AdaKV's rule, brute force: SnapKV's per-head scores (maxpool k = 7), the allocation, then
// each head's top B_h.
RuleOutput adakv_rule(const RouteInput& in, int64_t B, double alpha, int k, bool max_pool) {
  const int H = int(in.cand.size());
  std::vector<std::vector<double>> s(static_cast<size_t>(H));
  for (int h = 0; h < H; ++h) s[size_t(h)] = obs_family::snap_scores_ref(in, h, k, max_pool);
  bool amb = false;
  int64_t n_all = 0;
  for (const auto& c : in.cand) n_all += int64_t(c.size());
  const std::vector<int64_t> budget = allocate_ref(s, std::min(B, n_all), alpha, &amb);
  RuleOutput out;
  for (int h = 0; h < H; ++h) {
    std::vector<int> idx;
    const bool a = obs_family::rank_desc(s[size_t(h)], in.cand[size_t(h)], &idx, budget[size_t(h)]);
    out.ambiguous.push_back(a || amb);
    std::set<int32_t> keep;
    for (int64_t r = 0; r < std::min<int64_t>(budget[size_t(h)], int64_t(idx.size())); ++r)
      keep.insert(in.cand[size_t(h)][size_t(idx[size_t(r)])]);
    out.keep.push_back(keep);
  }
  return out;
}

TEST(AdaKVCache, MatchesBruteForceModelWithVariableHeadStorage) {
  const KvShape s = obs_family::small_shape(2, 6, 3, 8);
  const int recent = 4;
  for (const std::string route : {"end", "chunk"}) {
    SCOPED_TRACE("prefill-route " + route);
    // 16 tokens per head: 4 recent + B = 12 history on average.
    KvCacheParams p = obs_family::family_params("adakv", 16, recent, 4, route);
    obs_family::DriveOptions o;
    o.calls = {37, 29};
    o.n_prompt = 66;
    o.calls.insert(o.calls.end(), 30, 1);
    o.seed = 21;
    AdaKVOptions ao;
    ao.snap = {8, 7, ObsPool::kMax};
    obs_family::Driver drv(s, p, 200, std::make_unique<AdaKVPolicy>(ao));
    const auto res =
        drv.run(o, 8, [&](const RouteInput& in) { return adakv_rule(in, 12, 0.2, 7, true); });
    if (HasFailure()) return;
    EXPECT_LT(res.ambiguous_heads * 10, res.checked_heads);
    EXPECT_TRUE(res.heads_differ) << "every head kept the same number of tokens";
    EXPECT_GT(res.evictions, 0);
    // Real bytes per head follow the head's own length: every (layer, head) holds storage
    // for its kept tokens plus Ω = 4 decode tokens at most (no score, no value norm here; the
    // decode observation window's sums, one float per query head of the group).
    const KvReport r = report_of(drv.cache());
    const size_t M = obs_family::token_head_bytes(s) + size_t(s.group()) * sizeof(float);
    for (int l = 0; l < s.n_layers; ++l) {
      size_t want = 0;
      for (int h = 0; h < s.n_kv_heads; ++h)
        want += (HeadKvCacheTestPeer(drv.cache()).kept_positions(l, h).size() + 4) * M;
      EXPECT_LE(r.layers[size_t(l)].bytes_allocated, want) << "layer " << l;
    }
  }
}

// kvpress's AdaKVPress (AdaKVOptions::Share::kSafeguard), brute force: SnapKV's per-head scores
// (avg pool, k = 5); each head's top n_safe = max(0, int(α·(B + w)) − w) history tokens are
// kept first; then one ranking of every (head, token) by (forced first, score desc, head asc,
// position asc), selection-sorted, keeps the first H·B.
RuleOutput safeguard_rule(const RouteInput& in, int64_t B, double alpha, int w) {
  const int H = int(in.cand.size());
  int64_t n_all = 0;
  for (const auto& c : in.cand) n_all += int64_t(c.size());
  B = std::min(B, n_all);
  const int64_t n_safe = std::max<int64_t>(0, int64_t(alpha * double(B + w)) - w);
  RuleOutput out;
  out.keep.resize(size_t(H));
  out.ambiguous.assign(size_t(H), false);
  std::vector<std::tuple<double, int, int32_t>> all;  // (score, head, position)
  for (int h = 0; h < H; ++h) {
    std::vector<double> s = obs_family::snap_scores_ref(in, h, 5, false);
    std::vector<int> idx;
    out.ambiguous[size_t(h)] = obs_family::rank_desc(s, in.cand[size_t(h)], &idx,
                                                     std::min<int64_t>(n_safe, int64_t(s.size())));
    for (int64_t r = 0; r < std::min<int64_t>(n_safe, int64_t(idx.size())); ++r)
      s[size_t(idx[size_t(r)])] = HUGE_VAL;
    for (size_t i = 0; i < s.size(); ++i) all.push_back({s[i], h, in.cand[size_t(h)][i]});
  }
  for (size_t a = 0; a < all.size(); ++a)
    for (size_t b = a + 1; b < all.size(); ++b)
      if (std::get<0>(all[b]) > std::get<0>(all[a]) ||
          (std::get<0>(all[b]) == std::get<0>(all[a]) &&
           std::make_pair(std::get<1>(all[b]), std::get<2>(all[b])) <
               std::make_pair(std::get<1>(all[a]), std::get<2>(all[a]))))
        std::swap(all[a], all[b]);
  const int64_t top = std::min<int64_t>(int64_t(H) * B, int64_t(all.size()));
  if (top > 0 && top < int64_t(all.size())) {
    const double a = std::get<0>(all[size_t(top - 1)]), b = std::get<0>(all[size_t(top)]);
    if (std::isfinite(a) && std::fabs(a - b) <= 1e-4 * std::max(std::fabs(a), std::fabs(b)) + 1e-12)
      out.ambiguous.assign(size_t(H), true);
  }
  for (int64_t r = 0; r < top; ++r)
    out.keep[size_t(std::get<1>(all[size_t(r)]))].insert(std::get<2>(all[size_t(r)]));
  return out;
}

TEST(AdaKVCache, KvpressSafeguardMatchesBruteForceModel) {
  const KvShape s = obs_family::small_shape(2, 6, 3, 8);
  const int recent = 4;
  for (const double alpha : {0.2, 0.6}) {
    SCOPED_TRACE(alpha);
    KvCacheParams p = obs_family::family_params("adakv", 16, recent, 4, "end");
    obs_family::DriveOptions o;
    o.calls = {37, 29};
    o.n_prompt = 66;
    o.calls.insert(o.calls.end(), 30, 1);
    o.seed = 23;
    AdaKVOptions ao;
    ao.snap = {8, 5, ObsPool::kAvg};
    ao.alpha = alpha;
    ao.share = AdaKVOptions::Share::kSafeguard;
    obs_family::Driver drv(s, p, 200, std::make_unique<AdaKVPolicy>(ao, recent));
    const auto res =
        drv.run(o, 8, [&](const RouteInput& in) { return safeguard_rule(in, 12, alpha, recent); });
    if (HasFailure()) return;
    EXPECT_LT(res.ambiguous_heads * 10, res.checked_heads);
    EXPECT_TRUE(res.heads_differ) << "every head kept the same number of tokens";
  }
}

}  // namespace
}  // namespace qevict
