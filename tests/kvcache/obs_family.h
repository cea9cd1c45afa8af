// Shared by the SnapKV-family tests (snapkv, pyramidkv, adakv, criticalkv, defensivekv): an
// independent double-precision model of a per-head token cache, written from the rules and
// not from HeadKvCache, and a driver that runs a policy's cache call by call and checks
//  - after every call: outputs finite and equal (within f32 roundoff) to attention over
//    exactly the tokens the cache kept before the call plus the call's own tokens;
//  - after every call: the budgeted bytes of the kept tokens within the budget (plus the
//    decode tokens since the last routing event, and the whole prompt while it is pending
//    under --prefill-route end), and the real bytes held within the budget plus a constant;
//  - at every routing event: the kept sets equal those of a brute-force model of the rule,
//    fed with observation-window probabilities (and value norms) computed here in double:
//    during the prompt the last w queries', during decode the queries' since the last routing
//    event (the cache sums them as they run), with DefensiveKV's running max of pooled rows.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <random>
#include <set>
#include <vector>

#include "common/kv_names.h"
#include "kvcache/cache_peers.h"
#include "kvcache/head_cache.h"
#include "kvcache/registry.h"

namespace qevict::obs_family {

inline KvShape small_shape(int n_layers = 3, int n_q_heads = 4, int n_kv_heads = 2,
                           int head_dim = 8) {
  KvShape s;
  s.n_layers = n_layers;
  s.n_q_heads = n_q_heads;
  s.n_kv_heads = n_kv_heads;
  s.head_dim = head_dim;  // RoPE n_rot = 0: keys arrive rotated
  return s;
}

// M: one token of one KV head = K + V (16-bit) + its int32 position.
inline size_t token_head_bytes(const KvShape& s) { return size_t(2) * s.head_dim * 2 + 4; }

// What a brute-force rule sees at a routing event, for one layer.
struct RouteInput {
  int layer = 0, n_layers = 1;
  int64_t n_past = 0;
  int64_t heavy = 0;  // the budget's history tokens per head (mean over layers)
  int group = 1, n_obs = 0;
  std::vector<std::vector<int32_t>> cand;  // [head] candidate positions, ascending
  std::vector<std::vector<double>> obs;    // [head] f64 [group][n_obs][n_cand]
  std::vector<std::vector<double>> nu;     // [head] f64 [n_cand] value norms (if bound)
  // Decode with DriveOptions::obs_max_kernel: per candidate the max over rows (query, query
  // head) of the row pooled along every token the head held and rescaled to its sum.
  std::vector<std::vector<double>> mx;  // [head] f64 [n_cand], or empty
  double obs_at(int h, int j, int r, size_t i) const {
    return obs[size_t(h)][(size_t(j) * n_obs + r) * cand[size_t(h)].size() + i];
  }
};

// A rule's answer: the candidates each head keeps; `ambiguous` when a kept/evicted boundary
// was a near tie (within `tol` of relative score), so the cache may legitimately differ.
struct RuleOutput {
  std::vector<std::set<int32_t>> keep;  // [head]
  std::vector<bool> ambiguous;          // [head]
};
using Rule = std::function<RuleOutput(const RouteInput&)>;
// A rule over every layer at once (budgets shared by the layers): outputs per layer.
using LayersRule = std::function<std::vector<RuleOutput>(const std::vector<RouteInput>&)>;

// Sorts idx by (score desc, position asc) — selection sort, obviously right — and says
// whether ranks k−1 and k are within tol (relative) of each other without being equal
// (equal scores come from the same values, e.g. max pooling, and are broken by position in
// both implementations; close ones could swap under a different rounding order).
inline bool rank_desc(const std::vector<double>& score, const std::vector<int32_t>& pos,
                      std::vector<int>* idx, int64_t k, double tol = 1e-4) {
  const int n = int(score.size());
  idx->resize(size_t(n));
  for (int i = 0; i < n; ++i) (*idx)[size_t(i)] = i;
  for (int i = 0; i < n; ++i)
    for (int j = i + 1; j < n; ++j) {
      const int a = (*idx)[size_t(i)], c = (*idx)[size_t(j)];
      if (score[size_t(c)] > score[size_t(a)] ||
          (score[size_t(c)] == score[size_t(a)] && pos[size_t(c)] < pos[size_t(a)]))
        std::swap((*idx)[size_t(i)], (*idx)[size_t(j)]);
    }
  if (k <= 0 || k >= n) return false;
  const double a = score[size_t((*idx)[size_t(k - 1)])], b = score[size_t((*idx)[size_t(k)])];
  return a != b && std::fabs(a - b) <= tol * std::max(std::fabs(a), std::fabs(b)) + 1e-12;
}

// 1-D pool (width k odd, padding k/2, stride 1): avg counts the zero padding, max pads −inf.
inline std::vector<double> pool_ref(const std::vector<double>& x, int k, bool max_pool) {
  const int n = int(x.size()), r = k / 2;
  std::vector<double> y(x.size());
  for (int i = 0; i < n; ++i) {
    double acc = max_pool ? -INFINITY : 0.0;
    for (int t = i - r; t <= i + r; ++t) {
      const double v = t >= 0 && t < n ? x[size_t(t)] : (max_pool ? -INFINITY : 0.0);
      acc = max_pool ? std::max(acc, v) : acc + v;
    }
    y[size_t(i)] = max_pool ? acc : acc / k;
  }
  return y;
}

// SnapKV's per-head score, from the rule: mean over the window queries, pool, mean over the
// group's query heads.
inline std::vector<double> snap_scores_ref(const RouteInput& in, int h, int k, bool max_pool) {
  const size_t n = in.cand[size_t(h)].size();
  std::vector<double> out(n, 0.0);
  for (int j = 0; j < in.group; ++j) {
    std::vector<double> mean(n, 0.0);
    for (int r = 0; r < in.n_obs; ++r)
      for (size_t i = 0; i < n; ++i) mean[i] += in.obs_at(h, j, r, i) / in.n_obs;
    const std::vector<double> p = pool_ref(mean, k, max_pool);
    for (size_t i = 0; i < n; ++i) out[i] += p[i] / in.group;
  }
  return out;
}

// A random per-layer request: H heads with their own candidates, obs rows that are random
// probabilities (not normalized: the rule does not care), budget `quota` tokens per head.
inline RoutingRequest random_request(std::mt19937& rng, int H, int g, int n_obs, int64_t quota,
                                     bool ties) {
  RoutingRequest req;
  req.n_heads = H;
  req.group = g;
  req.n_obs = n_obs;
  req.n_past = 1000;
  req.head_begin.push_back(0);
  for (int h = 0; h < H; ++h) {
    const int n = int(rng() % 40);
    int32_t pos = int32_t(rng() % 3);
    for (int i = 0; i < n; ++i) {
      RoutingCandidate c;
      c.id = c.pos0 = pos;
      c.head = h;
      c.tier = rng() % 2 ? Tier::kFull : Tier::kLocal;
      req.candidates.push_back(c);
      pos += 1 + int32_t(rng() % 3);
    }
    req.head_begin.push_back(int64_t(req.candidates.size()));
  }
  std::uniform_real_distribution<float> u(0.0f, 1.0f);
  req.obs.resize(size_t(g) * n_obs * req.candidates.size());
  for (float& x : req.obs) x = ties ? float(rng() % 3) / 4.0f : u(rng);
  req.value_norm.resize(req.candidates.size());
  for (float& x : req.value_norm) x = ties ? float(1 + rng() % 2) : 0.5f + u(rng);
  req.budget.window_full = 36;
  req.budget.full_bytes = size_t(quota) * H * 36 + rng() % 36;
  return req;
}

// The request seen as the brute-force rules see it (f64).
inline RouteInput as_input(const RoutingRequest& req) {
  RouteInput in;
  in.group = req.group;
  in.n_obs = req.n_obs;
  in.cand.resize(size_t(req.n_heads));
  in.obs.resize(size_t(req.n_heads));
  in.nu.resize(size_t(req.n_heads));
  for (int h = 0; h < req.n_heads; ++h) {
    for (int64_t i = 0; i < req.n_cand(h); ++i)
      in.cand[size_t(h)].push_back(req.candidates[size_t(req.cand_begin(h) + i)].id);
    for (int j = 0; j < req.group; ++j)
      for (int r = 0; r < req.n_obs; ++r)
        for (int64_t i = 0; i < req.n_cand(h); ++i)
          in.obs[size_t(h)].push_back(req.obs_row(h, j, r)[i]);
    for (int64_t i = 0; i < req.n_cand(h); ++i)
      in.nu[size_t(h)].push_back(req.value_norm[size_t(req.cand_begin(h) + i)]);
  }
  return in;
}

inline std::set<int32_t> kept_of(const RoutingRequest& req, const RoutingPlan& plan, int h) {
  std::set<int32_t> s;
  for (int64_t i = 0; i < req.n_cand(h); ++i) {
    const size_t c = size_t(req.cand_begin(h) + i);
    if (plan.entries[c].to == Tier::kFull) s.insert(req.candidates[c].id);
    EXPECT_NE(int(plan.entries[c].to), int(Tier::kQuant));
  }
  return s;
}

struct DriveOptions {
  std::vector<int64_t> calls;  // tokens per call: prefill chunks, then 1s (decode)
  int64_t n_prompt = 0;        // end_prompt() after this many tokens (0: never called)
  uint32_t seed = 1;
  const OutputProjection* wo = nullptr;  // bound to the cache (value-norm policies)
  std::vector<double> wo_f64;            // the same W_O, f64 [n_embd][q_width]
  int64_t n_embd = 0;
  // Layer budgets may differ (PyramidKV, Layer-DefensiveKV): check the budget over all
  // layers together, not per layer.
  bool budget_over_layers = false;
  int obs_max_kernel = 0;  // the policy's PolicyNeeds::obs_max_kernel (DefensiveKV: 5)
};

struct DriveResult {
  int64_t routing_events = 0, checked_heads = 0, ambiguous_heads = 0, evictions = 0;
  bool heads_differ = false;  // some layer's KV heads kept different numbers of tokens
  bool sets_differ = false;   // some layer's KV heads kept different positions
};

class Driver {
 public:
  // The cache runs `policy`, or p.policy's registry rule when null.
  Driver(const KvShape& s, const KvCacheParams& p, int64_t n_ctx,
         std::unique_ptr<RoutingPolicy> policy = nullptr)
      : s_(s), p_(p), n_ctx_(n_ctx) {
    auto b = compute_budget(CacheKind::kPerHead, s, n_ctx, p);
    EXPECT_TRUE(b.has_value()) << b.error();
    if (!policy) policy = find_policy(p.policy)->make_policy(p);
    c_ = std::make_unique<HeadKvCache>(s, n_ctx, p, *b, std::move(policy));
    K_.resize(size_t(s.n_layers));
    V_.resize(size_t(s.n_layers));
    Q_.resize(size_t(s.n_layers));
    kept_.assign(size_t(s.n_layers) * s.n_kv_heads, {});
  }
  HeadKvCache& cache() { return *c_; }

  DriveResult run(const DriveOptions& o, int obs_window, const Rule& rule) {
    return run_layers(o, obs_window, [&](const std::vector<RouteInput>& ins) {
      std::vector<RuleOutput> outs;
      for (const RouteInput& in : ins) outs.push_back(rule(in));
      return outs;
    });
  }
  DriveResult run_layers(const DriveOptions& o, int obs_window, const LayersRule& rule) {
    DriveResult res;
    ThreadPool pool(2);
    std::mt19937 rng(o.seed);
    std::normal_distribution<float> dist(0.0f, 1.0f);
    const int L = s_.n_layers, H = s_.n_kv_heads, d = s_.head_dim, g = s_.group();
    const int qw = s_.q_width(), kvw = s_.kv_width();
    const KvReport r0 = report_of(*c_);
    const KvBudget& b = r0.budget;
    const size_t M = token_head_bytes(s_);
    EXPECT_EQ(b.head_token_bytes, M);
    int64_t n_past = 0, events = 0, since = 0;
    bool pending = false;
    // The cache's observation window: the last w queries until the prompt is routed, then
    // (online) the `acc` decode queries since the last routing event.
    bool online = false;
    int64_t acc = 0;
    for (size_t call = 0; call < o.calls.size(); ++call) {
      const int64_t n = o.calls[call];
      if (n == 1 && !pending && !online) online = true, acc = 0;
      const bool online_before = online;
      if (o.wo) c_->set_output_projection(o.wo);
      EXPECT_TRUE(c_->begin(n).is_ok());
      for (int l = 0; l < L; ++l) {
        std::vector<float> q(size_t(n) * qw), k(size_t(n) * kvw), v(k.size());
        for (float& x : q) x = 2.0f * dist(rng);
        for (float& x : k) x = 2.0f * dist(rng);
        for (float& x : v) x = dist(rng);
        std::vector<float> out(q.size(), NAN);
        c_->attend(l, q.data(), k.data(), v.data(), out.data(), pool);
        store(l, q, k, v, n);
        for (int h = 0; h < H; ++h)
          for (int64_t t = 0; t < n; ++t) kept(l, h).push_back(int32_t(n_past + t));
        // Attention over exactly what the cache held plus the call's tokens (causal).
        for (int64_t t = 0; t < n; ++t)
          for (int h = 0; h < H; ++h)
            for (int j = 0; j < g; ++j) {
              const int qh = h * g + j;
              std::vector<double> p;
              std::vector<int32_t> keys;
              probs(l, h, qh, n_past + t, kept(l, h), &keys, &p);
              for (int c = 0; c < d; ++c) {
                double want = 0.0, vmax = 0.0;
                for (size_t i = 0; i < keys.size(); ++i) {
                  const double x = V_[size_t(l)][size_t(keys[i]) * kvw + h * d + c];
                  want += p[i] * x;
                  vmax = std::max(vmax, std::fabs(x));
                }
                const float got = out[size_t(t) * qw + qh * d + c];
                EXPECT_TRUE(std::isfinite(got));
                EXPECT_NEAR(got, want, 2e-5 * (1.0 + vmax) * std::sqrt(double(keys.size())))
                    << "call " << call << " layer " << l << " head " << qh << " token " << t;
                if (::testing::Test::HasFailure()) return res;
              }
            }
      }
      EXPECT_TRUE(c_->commit().is_ok());
      n_past += n;
      if (n > 1 && p_.prefill_route == PrefillRoute::kEnd) pending = true;
      if (online) acc += n;
      if (o.n_prompt > 0 && n_past == o.n_prompt) {
        EXPECT_TRUE(c_->end_prompt().is_ok());
      }
      const KvReport rep = report_of(*c_);
      if (rep.routing_events != events) {
        events = rep.routing_events;
        ++res.routing_events;
        pending = false;
        since = 0;
        const int64_t n_obs = online_before ? acc : std::min<int64_t>(obs_window, n_past);
        check_routing(b, n_past, n_obs, online_before ? o.obs_max_kernel : 0, o, rule, &res);
        acc = 0;
        if (::testing::Test::HasFailure()) return res;
      } else if (n == 1) {
        ++since;
      }
      // The prompt is routed (at end_prompt(), or at the first decode step): decode sums start.
      if (!online && ((o.n_prompt > 0 && n_past == o.n_prompt) || n == 1)) online = true, acc = 0;
      for (int l = 0; l < L; ++l)
        for (int h = 0; h < H; ++h)
          EXPECT_EQ(HeadKvCacheTestPeer(*c_).kept_positions(l, h), kept(l, h))
              << "call " << call << ": the driver's kept set drifted";
      // Budgeted bytes: kept tokens × M per layer (all layers when budgets move between them).
      if (!pending) {
        size_t all = 0;
        for (int l = 0; l < L; ++l) {
          size_t layer = 0;
          for (int h = 0; h < H; ++h) layer += kept(l, h).size() * M;
          all += layer;
          const size_t slack = size_t(H) * since * M;
          if (!o.budget_over_layers) {
            EXPECT_LE(layer, b.total + slack) << "layer " << l << " after call " << call;
          }
        }
        EXPECT_LE(all, L * (b.total + size_t(H) * since * M)) << "after call " << call;
        // Real bytes: the kept tokens' storage (+ 4 B per token for a value norm) and the
        // decode room of Ω tokens per head, plus scratch bounded by the budget, not the
        // sequence: the last w queries (f32 per layer), and per token a head may hold its
        // routing request and plan entries, its observation rows (g·w floats for w = 8) and
        // attention state (g·2 floats): under 96·g bytes.
        if (n == 1) {
          const size_t per_tok = M + (o.wo ? 4 : 0);
          const size_t bound = L * (b.total / M + size_t(H) * (p_.route_every + 1)) * per_tok +
                               size_t(L) * obs_window * qw * 4 + 64 * 1024 +
                               size_t(H) * (b.head_capacity + p_.route_every) * 96 * g;
          EXPECT_LE(c_->bytes_held(), bound) << "after call " << call;
        }
      }
      if (::testing::Test::HasFailure()) return res;
    }
    res.evictions = report_of(*c_).total().evictions;
    return res;
  }

 private:
  std::vector<int32_t>& kept(int l, int h) { return kept_[size_t(l) * s_.n_kv_heads + h]; }

  void store(int l, const std::vector<float>& q, const std::vector<float>& k,
             const std::vector<float>& v, int64_t n) {
    for (const auto& [src, dst] : {std::pair{&k, &K_[size_t(l)]}, std::pair{&v, &V_[size_t(l)]}}) {
      std::vector<uint16_t> half(src->size());
      std::vector<float> back(src->size());
      f32_to_half(p_.dtype, src->data(), half.data(), int64_t(half.size()));
      half_to_f32(p_.dtype, half.data(), back.data(), int64_t(back.size()));
      dst->insert(dst->end(), back.begin(), back.end());
    }
    Q_[size_t(l)].insert(Q_[size_t(l)].end(), q.begin(), q.end());
    (void)n;
  }

  // Softmax of query head qh at position qpos over the held keys at positions <= qpos.
  void probs(int l, int h, int qh, int64_t qpos, const std::vector<int32_t>& held,
             std::vector<int32_t>* keys, std::vector<double>* p) const {
    const int d = s_.head_dim, kvw = s_.kv_width(), qw = s_.q_width();
    keys->clear();
    for (int32_t x : held)
      if (x <= qpos) keys->push_back(x);
    p->assign(keys->size(), 0.0);
    double mx = -INFINITY, sum = 0.0;
    const float* q = Q_[size_t(l)].data() + size_t(qpos) * qw + qh * d;
    for (size_t i = 0; i < keys->size(); ++i) {
      const double* kr = K_[size_t(l)].data() + size_t((*keys)[i]) * kvw + h * d;
      double dot = 0.0;
      for (int c = 0; c < d; ++c) dot += double(q[c]) * kr[c];
      (*p)[i] = dot / std::sqrt(double(d));
      mx = std::max(mx, (*p)[i]);
    }
    for (double& x : *p) sum += x = std::exp(x - mx);
    for (double& x : *p) x /= sum;
  }

  // n_obs: the rows (the queries at positions n_past − n_obs ...); mx_kernel > 0: also the
  // decode running max of pooled rows (RouteInput::mx).
  void check_routing(const KvBudget& b, int64_t n_past, int64_t n_obs, int mx_kernel,
                     const DriveOptions& o, const LayersRule& rule, DriveResult* res) {
    const int L = s_.n_layers, H = s_.n_kv_heads, g = s_.group(), d = s_.head_dim;
    const int kvw = s_.kv_width(), qw = s_.q_width();
    std::vector<RouteInput> ins(static_cast<size_t>(L));
    for (int l = 0; l < L; ++l) {
      RouteInput& in = ins[size_t(l)];
      in.layer = l;
      in.n_layers = L;
      in.n_past = n_past;
      in.heavy = b.head_heavy;
      in.group = g;
      in.n_obs = int(n_obs);
      in.cand.resize(size_t(H));
      in.obs.resize(size_t(H));
      in.nu.resize(size_t(H));
      for (int h = 0; h < H; ++h) {
        for (int32_t x : kept(l, h))
          if (x >= b.sink && x < n_past - b.local) in.cand[size_t(h)].push_back(x);
        const size_t nc = in.cand[size_t(h)].size();
        in.obs[size_t(h)].assign(size_t(g) * n_obs * nc, 0.0);
        if (mx_kernel > 0) in.mx.resize(size_t(H));
        if (mx_kernel > 0) in.mx[size_t(h)].assign(nc, 0.0);
        for (int j = 0; j < g; ++j)
          for (int64_t r = 0; r < n_obs; ++r) {
            std::vector<int32_t> keys;
            std::vector<double> p;
            probs(l, h, h * g + j, n_past - n_obs + r, kept(l, h), &keys, &p);
            // The row pooled along the keys the head held (those the query saw), rescaled.
            std::vector<double> pooled;
            if (mx_kernel > 0) {
              pooled = pool_ref(p, mx_kernel, false);
              double base = 0.0, ps = 0.0;
              for (double x : p) base += x;
              for (double x : pooled) ps += x;
              for (double& x : pooled) x = ps > 0.0 ? x / ps * base : 0.0;
            }
            for (size_t i = 0; i < nc; ++i) {
              const auto it = std::find(keys.begin(), keys.end(), in.cand[size_t(h)][i]);
              const double pr = it == keys.end() ? 0.0 : p[size_t(it - keys.begin())];
              in.obs[size_t(h)][(size_t(j) * n_obs + r) * nc + i] = pr;
              if (mx_kernel > 0 && it != keys.end())
                in.mx[size_t(h)][i] =
                    std::max(in.mx[size_t(h)][i], pooled[size_t(it - keys.begin())]);
            }
          }
        if (o.wo)
          for (int32_t x : in.cand[size_t(h)]) {
            // ν = mean over the group of ‖v W_O^{qh}‖₁.
            double nu = 0.0;
            for (int j = 0; j < g; ++j) {
              const int qh = h * g + j;
              for (int64_t e = 0; e < o.n_embd; ++e) {
                double y = 0.0;
                for (int c = 0; c < d; ++c)
                  y += o.wo_f64[size_t(e) * qw + qh * d + c] *
                       V_[size_t(l)][size_t(x) * kvw + h * d + c];
                nu += std::fabs(y);
              }
            }
            in.nu[size_t(h)].push_back(nu / g);
          }
      }
    }
    const std::vector<RuleOutput> outs = rule(ins);
    for (int l = 0; l < L; ++l) {
      const RuleOutput& want = outs[size_t(l)];
      std::vector<size_t> sizes;
      for (int h = 0; h < H; ++h) {
        const std::vector<int32_t> got_all = HeadKvCacheTestPeer(*c_).kept_positions(l, h);
        std::set<int32_t> got;
        for (int32_t x : got_all) {
          if (x >= b.sink && x < n_past - b.local) got.insert(x);
          // Everything outside the candidates stays.
        }
        for (int32_t x : kept(l, h)) {
          if (x < b.sink || x >= n_past - b.local) {
            EXPECT_TRUE(std::binary_search(got_all.begin(), got_all.end(), x))
                << "sink/recent position " << x << " evicted";
          }
        }
        ++res->checked_heads;
        if (want.ambiguous[size_t(h)]) {
          ++res->ambiguous_heads;
        } else {
          EXPECT_EQ(got, want.keep[size_t(h)])
              << "layer " << l << " head " << h << " at n_past " << n_past;
        }
        kept(l, h) = got_all;
        sizes.push_back(got_all.size());
      }
      for (int h = 1; h < H; ++h) {
        res->heads_differ |= sizes[size_t(h)] != sizes[0];
        res->sets_differ |= kept(l, h) != kept(l, 0);
      }
    }
  }

  KvShape s_;
  KvCacheParams p_;
  int64_t n_ctx_;
  std::unique_ptr<HeadKvCache> c_;
  std::vector<std::vector<double>> K_, V_;  // [layer] f64 [pos][kv_width], 16-bit rounded
  std::vector<std::vector<float>> Q_;       // [layer] f32 [pos][q_width]
  std::vector<std::vector<int32_t>> kept_;  // [layer][head] positions the cache holds
};

// Params of a family policy with its registry defaults, then the test's geometry.
inline KvCacheParams family_params(const std::string& policy, int64_t budget_tokens, int local,
                                   int route_every, const std::string& prefill_route = "end") {
  KvCacheParams p;
  p.policy = policy;
  KvParamsGiven given;
  given.local = given.route_every = given.prefill_route = true;
  p.local = local;
  p.route_every = route_every;
  p.prefill_route = test::route_of(prefill_route);
  p.budget_tokens = budget_tokens;
  EXPECT_TRUE(apply_policy_defaults(&p, given).is_ok());
  EXPECT_TRUE(p.validate().is_ok()) << p.validate().message();
  return p;
}

}  // namespace qevict::obs_family
