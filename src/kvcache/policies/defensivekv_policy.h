// DefensiveKV and Layer-DefensiveKV (Feng et al., 2025, arXiv 2510.13334): SnapKV-style
// observation-window attention aggregated *defensively* — a token scores the largest
// attention any query of the window and any query head of the group paid it (after
// pooling), never less than its head's mean — weighted by its value-projected norm
// (CriticalKV), with a first stage that keeps the tokens holding 90 % of the attention mass,
// and a budget shared by the heads of a layer (DefensiveKV) or by every layer and head
// (Layer-DefensiveKV).
//
// Where the rule and the defaults come from (../shared/ref/BASELINES.md, "DefensiveKV"):
//  - FFY0/DefensiveKV@9251b95 kvpress/presses/efficient_defensivekv_press.py:L158-227 (w 32,
//    k 5): A = the last w queries' softmax over every key, prefix columns (per query head);
//    each row pooled along the keys (avg, k 5, padding 2) and rescaled to its pre-pool sum
//    (L201-209); m_i = max over the G heads and the w queries; s_i = max(m_i, mean_j m_j) per
//    head (L213-214); s_i ×= ν_i / Σ_heads ν_i, ν = mean over the group of ‖v W_O^h‖₁,
//    normalised across the KV heads (vwl1norm, L54-55); stage 1 (L95-110): per head, sort the
//    mean attention (over G and w, normalised to sum 1) and force-keep the tokens before the
//    cumulative sum first reaches 0.9 − window_bias, at most ⌊(n − w)(1−cr) − w⌋ of them
//    (L67: its q_len there is the prefix's, values[..., :-w])
//    (window_bias: the mean over heads and queries of the attention on the last w prefix
//    columns — the reference's quirk, kept, L152-154); the window is always kept.
//  - DefensiveKV's allocation (efficient_ada_scorer_press.py:L89-96): one global top
//    ⌊n(1−cr)⌋·H per layer over every head's scores, no floor.
//  - Layer-DefensiveKV (efficient_ada_global_scorer_press.py:L164-192): the global top runs
//    over every layer and head at once, setting each layer's budget; the reference keeps the
//    whole prompt until then (its own warning, L56-60); here the cache scores every layer
//    first and then routes, so the sum over layers holds the bytes (RoutingPolicy::
//    layer_budget reports the layer budgets it chose).
//  - Defaults: cr = 0.8 (evaluation/evaluate.sh): --kv-budget 0.2 when none is given.
// In this cache the always-kept tokens are the R = S + L sink and recent tokens (the
// reference's window; defaults S = 0, L = w) and the candidates are the rest of each head.
// Decode (the reference compresses only once, L171): as SnapKV (snapkv_policy.h), every
// Ω = w steps over the kept tokens plus those that left the recent window; the heads then
// hold different tokens, so ν is normalised over the heads that hold the position. The
// window is then the decode queries since the last routing event, which the cache does not
// keep: it keeps each token's running max of the pooled rows (RoutingRequest::obs_max),
// pooled along every token the head holds rather than along the candidates (a token next to
// the sink or the recent region sees those neighbours, not zero padding).
// Forced (stage-1) tokens rank above every other (the reference sets them to the layer's
// maximum score, which the top maximum token shares; we break that tie for the forced ones).
// Layer-DefensiveKV's top over all layers then always keeps them, where the reference
// compares them at their layer's maximum (the faithfulness check measures what that costs).
#pragma once

#include <vector>

#include "kvcache/policies/snapkv_policy.h"

namespace qevict {

struct DefensiveKVOptions {
  int window = 32;
  int kernel = 5;
  double mass = 0.9;         // stage-1 threshold before the window bias
  bool over_layers = false;  // Layer-DefensiveKV
};

class DefensiveKVPolicy final : public RoutingPolicy {
 public:
  // `recent` = S + L, the tokens per head kept outside the history.
  DefensiveKVPolicy(DefensiveKVOptions o, int recent) : o_(o), recent_(recent) {}
  void plan(const RoutingRequest& req, RoutingPlan* plan) override;
  std::string name() const override { return o_.over_layers ? "layer-defensivekv" : "defensivekv"; }
  PolicyNeeds needs() const override;
  // Layer-DefensiveKV: the layer budgets its prepare() pass chose.
  int64_t layer_budget(int layer, int n_layers, int n_heads, int64_t heavy,
                       int64_t n_hist) const override;
  void prepare(const RoutingRequest& req) override;
  void prepare_done(int64_t heavy) override;

  // The final scores of every candidate of the request (forced ones +inf), f64 [candidates].
  void scores(const RoutingRequest& req, std::vector<double>* out);

 private:
  DefensiveKVOptions o_;
  int recent_;
  // Scratch.
  std::vector<double> row_, pooled_, mx_, ave_, nu_sum_;
  std::vector<int32_t> order_;
  std::vector<std::vector<double>> head_score_;
  std::vector<int64_t> budget_;
  // Layer-DefensiveKV: scores of every layer's candidates from prepare(), and the layers'
  // budgets (history tokens per head) chosen from them.
  std::vector<std::vector<double>> layer_score_;    // [layer] f64 [candidates]
  std::vector<std::vector<int64_t>> layer_begin_;   // [layer] head_begin of its request
  std::vector<int64_t> layer_tokens_;               // [layer] history tokens it keeps
  std::vector<std::vector<int64_t>> layer_counts_;  // [layer][head] of them per head
};

}  // namespace qevict
