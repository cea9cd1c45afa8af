// Faithfulness against the reference implementations (issue 10 item 2): on the committed
// prompts of tests/golden/faithfulness.json, every eviction baseline compresses the prompt once
// at its end (--prefill-route end), as the references do, and the token set each (layer, KV
// head) keeps must match the reference's — NVIDIA kvpress 0.5.4's presses (StreamingLLM,
// SnapKV, PyramidKV, AdaKV, CriticalKV, CriticalAdaKV) and a NumPy transcription of
// FFY0/DefensiveKV's rule (DefensiveKV, Layer-DefensiveKV) — by Jaccard index, recorded by
// tools/faithfulness/make_golden.py on the same GGUF loaded in transformers (dequantized to
// f32). Each case runs at the reference's kept count: kvpress keeps n_kept = int(n·(1 − cr))
// tokens per KV head, the 32-token window included; our per-head caches take budget_tokens =
// n_kept (sink 0 + recent 32 + n_kept − 32 heavy), the windowed StreamingLLM cache the bytes
// of 4 sink + 32 recent + n_kept − 36 history tokens.
//
// One prefill per prompt (through FullKV, recorded) is replayed into every case's cache. The
// table this prints (min and mean Jaccard over layers × KV heads, per method and ratio, over
// the prompts) is BENCHMARKS.md's faithfulness table. QEVICT_FAITH_PROMPTS=all runs every
// prompt (the table); by default only the shortest (CI); QEVICT_FAITH_METHODS=a,b only those.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "e2e/real_model_fixture.h"
#include "engine/prefill_share.h"
#include "kvcache/budget.h"
#include "kvcache/factory.h"
#include "kvcache/params.h"
#include "kvcache/policies/adakv_policy.h"
#include "kvcache/registry.h"
#include "kvcache/report.h"

namespace qevict {
namespace {

std::vector<uint8_t> base64_decode(const std::string& s) {
  auto val = [](char c) -> int {
    if (c >= 'A' && c <= 'Z') return c - 'A';
    if (c >= 'a' && c <= 'z') return c - 'a' + 26;
    if (c >= '0' && c <= '9') return c - '0' + 52;
    if (c == '+') return 62;
    if (c == '/') return 63;
    return -1;
  };
  std::vector<uint8_t> out;
  uint32_t acc = 0;
  int bits = 0;
  for (char c : s) {
    const int v = val(c);
    if (v < 0) continue;  // '=' padding
    acc = (acc << 6) | uint32_t(v);
    bits += 6;
    if (bits >= 8) {
      bits -= 8;
      out.push_back(uint8_t((acc >> bits) & 0xff));
    }
  }
  return out;
}

struct Stats {
  double min = 1.0, sum = 0.0;
  int64_t n = 0, count_diff = 0;  // (layer, head) units; units whose kept counts differ
  void add(double j) {
    min = std::min(min, j);
    sum += j;
    ++n;
  }
  double mean() const { return n ? sum / double(n) : 0.0; }
};

// The floors this test holds each method to (min over units, mean), just under the table
// measured on all five prompts (BENCHMARKS.md §5); the target of issue 10 is 0.95. Below it:
// Layer-DefensiveKV at cr 0.8 (min 0.939: cross-layer budgets from near-tied scores), and
// PyramidKV at cr 0.5, whose layer budgets kvpress computes from the fractional mean
// n(1 − cr) = 226.5 tokens on the 453-token prompt, landing exactly on its own fallback test
// (min = w = 32: pyramid) where our integer mean 226 falls back to SnapKV's uniform budget
// (layer 29 keeps 32 tokens there and 226 here: Jaccard 0.14).
struct Floor {
  double min, mean;
};
const std::map<std::string, Floor>& floors() {
  static const std::map<std::string, Floor> f = {
      {"streaming", {1.0, 1.0}},     {"snapkv", {0.95, 0.99}},
      {"pyramidkv", {0.14, 0.92}},   {"adakv", {0.96, 0.99}},
      {"criticalkv", {0.97, 0.99}},  {"criticaladakv", {0.97, 0.99}},
      {"defensivekv", {0.95, 0.98}}, {"layer-defensivekv", {0.93, 0.98}},
  };
  return f;
}

// kvpress's AdaKVPress shares a layer's budget by its own rule (a per-head safeguard, then a
// global top) on SnapKVPress's scores (avg pool, k 5), where our `adakv` row runs FFY0/AdaKV's
// (floor α, max pool, k 7): this row is AdaKVPolicy set to kvpress's, registered here.
void register_adakv_kvpress() {
  if (find_policy("adakv-kvpress")) return;
  PolicyInfo r = *find_policy("adakv");
  r.name = "adakv-kvpress";
  r.summary = "AdaKV as kvpress's AdaKVPress(SnapKVPress(32, 5), alpha_safeguard 0.2)";
  r.make_policy = [](const KvCacheParams& p) -> std::unique_ptr<RoutingPolicy> {
    AdaKVOptions o;
    o.snap = SnapKVOptions{32, 5, ObsPool::kAvg};
    o.alpha = 0.2;
    o.share = AdaKVOptions::Share::kSafeguard;
    return std::make_unique<AdaKVPolicy>(o, p.sink + std::max(p.local, 0));
  };
  const Status st = register_policy(r);
  EXPECT_TRUE(st.is_ok()) << st.message();
}

// Our policy for a reference method: the registry row of the same name (AdaKV: the row above).
KvCacheParams params_for(const std::string& method, int64_t n_kept, const KvShape& shape) {
  KvCacheParams p;
  p.policy = method == "adakv" ? "adakv-kvpress" : method;
  p.prefill_route = PrefillRoute::kEnd;
  KvParamsGiven given;
  given.prefill_route = true;
  if (method == "streaming") {
    // Windowed cache, ω = 1, no low-bit tier: 4 sink + 32 local (+1 window the local region
    // reserves) + the history tokens, so sink + local + history = n_kept. The sink's tokens
    // cost their K and V; every other a window, M_f = its K and V + its entry.
    p.q = 0.0;
    given.q = true;
    p.local = 32;
    given.local = true;
    const int64_t sink = 4;  // StreamingLLM's default (apply_policy_defaults)
    p.budget_bytes = sink * int64_t(shape.token_bytes()) +
                     (n_kept + 1 - sink) * int64_t(shape.token_bytes() + kWindowEntryBytes);
  } else {
    p.budget_tokens = n_kept;
  }
  const Status st = apply_policy_defaults(&p, given);
  EXPECT_TRUE(st.is_ok()) << st.message();
  if (method == "streaming") {
    EXPECT_EQ(p.sink, 4);  // the budget above counts on it
  }
  return p;
}

class Faithfulness : public RealModelTest {};

TEST_F(Faithfulness, KeptSetsMatchTheReferences) {
  std::ifstream in(QEVICT_TEST_DATA_DIR "/golden/faithfulness.json");
  ASSERT_TRUE(in.good()) << "tests/golden/faithfulness.json";
  register_adakv_kvpress();
  const nlohmann::json g = nlohmann::json::parse(in);
  const KvShape shape = model_->kv_shape();
  const int L = shape.n_layers, H = shape.n_kv_heads;
  ASSERT_EQ(g["n_layers"].get<int>(), L);
  ASSERT_EQ(g["n_kv_heads"].get<int>(), H);
  // CI: the shortest prompt only (the last, 304 tokens; ~10 s); "all" for the table.
  const char* which = std::getenv("QEVICT_FAITH_PROMPTS");
  const bool all = which && std::string(which) == "all";
  const size_t n_prompts = all ? g["prompts"].size() : 1;
  const char* only = std::getenv("QEVICT_FAITH_METHODS");  // e.g. "defensivekv,snapkv"
  auto wanted = [&](const std::string& m) {
    return !only || ("," + std::string(only) + ",").find("," + m + ",") != std::string::npos;
  };
  const char* dump_path = std::getenv("QEVICT_FAITH_DUMP");  // our kept sets, for analysis
  nlohmann::json dump = nlohmann::json::array();

  std::map<std::pair<std::string, double>, Stats> table;
  for (size_t k = 0; k < n_prompts; ++k) {
    const size_t pi = all ? k : g["prompts"].size() - 1;
    const auto tokens = g["prompts"][pi]["tokens"].get<std::vector<int32_t>>();
    const int64_t n = int64_t(tokens.size());
    const auto t0 = std::chrono::steady_clock::now();
    // One prefill, recorded through FullKV.
    KvCacheParams fp;
    fp.policy = "full";
    auto full = make_kv_cache(shape, n, fp);
    ASSERT_TRUE(full.has_value()) << full.error();
    RecordingKvCache rec(full->get(), shape);
    for (int64_t at = 0; at < n; at += 512) {
      std::vector<BatchSegment> segs{
          {&rec, tokens.data() + at, std::min<int64_t>(512, n - at), false, nullptr}};
      const Status st = model_->forward(segs, pool_);
      ASSERT_TRUE(st.is_ok()) << st.message();
    }
    for (const auto& c : g["cases"]) {
      if (c["prompt"].get<size_t>() != pi) continue;
      const std::string method = c["method"];
      if (!wanted(method)) continue;
      const double ratio = c["ratio"];
      const int64_t n_kept = c["n_kept"];
      ASSERT_EQ(c["n"].get<int64_t>(), n);
      const KvCacheParams p = params_for(method, n_kept, shape);
      auto made = make_kv_cache(shape, n, p);
      ASSERT_TRUE(made.has_value()) << method << ": " << made.error();
      SequenceKvCache& cache = **made;
      Status st = rec.replay(&cache, pool_);
      ASSERT_TRUE(st.is_ok()) << st.message();
      st = cache.end_prompt();
      ASSERT_TRUE(st.is_ok()) << method << ": " << st.message();
      KvReport rep;
      cache.report(&rep, ReportDetail::kTiers);
      const std::vector<uint8_t> bits = base64_decode(c["kept"].get<std::string>());
      ASSERT_GE(bits.size() * 8, size_t(L) * H * n);
      Stats& s = table[{method, ratio}];
      nlohmann::json ours = nlohmann::json::array();
      for (int l = 0; l < L; ++l)
        for (int h = 0; h < H; ++h) {
          const size_t unit = rep.per_head ? size_t(l) * H + h : size_t(l);
          ASSERT_LT(unit, rep.position_tiers.size());
          const std::vector<Tier>& tiers = rep.position_tiers[unit];
          ASSERT_EQ(int64_t(tiers.size()), n);
          int64_t both = 0, either = 0, n_ref = 0, n_ours = 0;
          std::vector<int32_t> kept;
          for (int64_t i = 0; i < n; ++i) {
            const size_t b = (size_t(l) * H + h) * size_t(n) + size_t(i);
            const bool r = (bits[b / 8] >> (b % 8)) & 1;
            const bool o = tiers[size_t(i)] != Tier::kEvicted;
            both += r && o;
            either += r || o;
            n_ref += r;
            n_ours += o;
            if (o && dump_path) kept.push_back(int32_t(i));
          }
          s.add(either ? double(both) / double(either) : 1.0);
          s.count_diff += n_ref != n_ours;
          if (dump_path) ours.push_back(kept);
        }
      if (dump_path)
        dump.push_back({{"prompt", pi}, {"method", method}, {"ratio", ratio}, {"kept", ours}});
    }
    std::printf("prompt %s: %lld tokens, %.1f s\n",
                g["prompts"][pi]["name"].get<std::string>().c_str(), (long long)n,
                std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  std::printf(
      "\n| method | ratio (cr) | prompts | units | Jaccard min | Jaccard mean | units with another "
      "count |\n"
      "|---|---|---|---|---|---|---|\n");
  for (const auto& [key, s] : table)
    std::printf("| %s | %.1f | %zu | %lld | %.4f | %.4f | %lld |\n", key.first.c_str(), key.second,
                n_prompts, (long long)s.n, s.min, s.mean(), (long long)s.count_diff);
  for (const auto& [key, s] : table) {
    const auto f = floors().find(key.first);
    ASSERT_NE(f, floors().end()) << key.first;
    EXPECT_GE(s.min, f->second.min) << key.first << " at cr " << key.second;
    EXPECT_GE(s.mean(), f->second.mean) << key.first << " at cr " << key.second;
  }
  if (dump_path) {
    std::ofstream out(dump_path);
    out << dump.dump() << "\n";
  }
}

}  // namespace
}  // namespace qevict
