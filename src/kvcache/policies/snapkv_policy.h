// SnapKV (Li et al., 2024, arXiv 2404.14469, "SnapKV: LLM Knows What You are Looking for
// Before Generation"): score every prefix token by the attention the last w prompt queries
// (the observation window) pay it, smooth the scores along the key axis with a 1-D pool, keep
// each head's top tokens plus the window.
//
// Where the rule and the defaults come from (../shared/ref/BASELINES.md, "SnapKV"):
//  - FasterDecoding/SnapKV@e216ddc snapkv/monkeypatch/snapkv_utils.py:L38-70: softmax of the
//    last w queries over all n keys (window causal), summed over the w queries, pooled along
//    the prefix keys (stride 1, padding k//2), per head top-(C − w) prefix tokens + the w
//    window tokens; nothing is evicted while n < C.
//  - Defaults of init_snapkv (L72-81): w = 32, C = max_capacity_prompt = 2048 tokens, k = 5,
//    avgpool (registry row "snapkv": budget_tokens 2048, local = w = 32, no sink).
//  - GQA: the original repeats the KV heads before selecting (one selection per query head,
//    a cache G× larger; SnapKV issues #16, #22). We select per KV head, averaging the G query
//    heads' pooled scores, as kvpress does (kvpress/presses/snapkv_press.py:L95-103) and as
//    AdaKV's gqa_support mean does (snapkv_utils.py:L351-358); a sum over w (SnapKV) and a
//    mean (kvpress) rank alike.
//  - avg pooling counts the zero padding (torch avg_pool1d's count_include_pad default);
//    max pooling pads with −inf (max_pool1d).
// In this cache (HeadKvCache, per_layer requests): the sink is empty (S = 0), the recent
// region L = w holds the window tokens, and the candidates are the history (prefix) tokens
// of each KV head; every head keeps K = C − w of them. The reference compresses once, at the
// end of prefill (our --prefill-route end, the row's default). Decode: the reference appends
// decode tokens uncompressed; we keep the budget by re-applying the same rule every Ω = w
// decode steps (row default) to the kept tokens plus those that left the recent window, the
// observation window being the decode queries since the last event (Ω of them; w at the row
// default), as kvpress's DecodingPress re-runs a press on buffered window queries
// (decoding_press.py:L113-179, every 512 steps there). Where kvpress buffers the queries, the
// cache sums their probabilities per kept token and query head as they run (no queries held:
// the window costs g floats per kept token, not w queries per layer); the mean over the window
// that SnapKV takes is the same. After evictions the pool runs over the kept tokens in position
// order (neighbours in the cache, not in the sequence).
#pragma once

#include <vector>

#include "kvcache/policies/routing_policy.h"

namespace qevict {

enum class ObsPool { kAvg, kMax };

struct SnapKVOptions {
  int window = 32;  // w: observation queries (init_snapkv)
  int kernel = 5;   // k: pool width (odd)
  ObsPool pool = ObsPool::kAvg;
};

// The family's shared pieces (also used by PyramidKV, AdaKV, CriticalKV).
namespace snapkv {

// SnapKV scores of KV head h's candidates: for each query head j of the group, the mean over
// the n_obs observation queries of obs, pooled along the candidates (width `kernel`, padding
// kernel/2, stride 1), then the mean over the group. out: f64 [n_cand(h)].
void head_scores(const RoutingRequest& req, int h, int kernel, ObsPool pool,
                 std::vector<double>* out);

// 1-D pool of x (n values) with width k (odd), padding k/2, stride 1, into y.
void pool1d(const double* x, int64_t n, int k, ObsPool pool, double* y);

// Marks, in plan, the top `keep` of `n` candidates starting at candidate `begin`, by
// (score desc, position asc) with score = scores[i − begin]; the rest stay as they are.
// order: scratch.
void keep_top(const RoutingRequest& req, int64_t begin, int64_t n, const double* scores,
              int64_t keep, std::vector<int32_t>* order, RoutingPlan* plan);

// History tokens per KV head the layer's budget gives: full_bytes / (window_full · n_heads).
int64_t per_head_quota(const RoutingRequest& req);

}  // namespace snapkv

class SnapKVPolicy final : public RoutingPolicy {
 public:
  explicit SnapKVPolicy(SnapKVOptions o = {}) : o_(o) {}
  // Per KV head: the top per_head_quota candidates by SnapKV score kept in F, the rest evicted.
  void plan(const RoutingRequest& req, RoutingPlan* plan) override;
  std::string name() const override { return "snapkv"; }
  PolicyNeeds needs() const override;

 private:
  SnapKVOptions o_;
  std::vector<double> score_;
  std::vector<int32_t> order_;
};

}  // namespace qevict
