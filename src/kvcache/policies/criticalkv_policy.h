// CriticalKV and CriticalAdaKV (Feng et al., 2025, arXiv 2502.03805, "Identify Critical KV
// Cache in LLM Inference from an Output Perturbation Perspective"): a token's importance is
// its attention times how much its value moves the output, ‖v_i W_O^h‖₁, in two stages: half
// the budget goes to the top tokens by attention alone, the rest by (attention + ε)·ν.
//
// Where the rule and the defaults come from (../shared/ref/BASELINES.md, "CriticalKV"):
//  - kvpress kvpress/presses/criticalkv_press.py (FFY0/AdaKV-in-NVIDIA-kvpress branch
//    criticalkv has the same logic):
//    CriticalKVPress (L57-92): base scores s (SnapKV), budget K = ⌊(1−cr)·n⌋ per head;
//      stage 1 force-keeps the top ⌊0.5·K⌋ by s; stage 2 ranks by (s + 1e-4)·ν with
//      ν_i = mean over the G query heads h of ‖v_i W_O^h‖₁ (vwl1norm, W_O^h the head_dim ×
//      hidden slice of o_proj); keeps the top K (forced tokens first).
//    CriticalAdaKVPress (L137-194): n_kept = K, α = 0.2 safeguard: each head's top ⌊α·K⌋
//      by s are forced; head budgets K_h = counts in the global top H·K over all heads;
//      stage 1 forces each head's top ⌊0.5·K_h⌋; stage 2 keeps each head's top K_h by
//      (s + 1e-4)·ν (kvpress then prunes the global bottom, which keeps exactly those).
//  - Defaults: ε = 1e-4, first_stage_ratio = 0.5, α = 0.2 (L37, L118-121); base scorer
//    SnapKV as DefensiveKV's kvpress fork runs it (kvpress/presses/snapkv_press.py:L29-30:
//    w = 32, k = 5, avgpool); 2048 tokens per head (SnapKV's capacity; kvpress has none).
//  - kvpress's K counts the window, which SnapKV's scores always rank first: the window takes
//    its w tokens out of stage 1's ⌊0.5·K⌋ (and out of the safeguard's ⌊α·K⌋ and each K_h).
//    Here the always-kept tokens are the R = S + L sink and recent tokens, K = C = R + the
//    history budget, and the history gets ⌊0.5·K⌋ − R stage-1 tokens (never below 0).
// ν is computed by the cache from the model's W_O (HeadKvCache::set_output_projection),
// once per token (4 bytes per token and head, held outside M). Prefill and decode as SnapKV
// (snapkv_policy.h).
#pragma once

#include "kvcache/policies/snapkv_policy.h"

namespace qevict {

struct CriticalKVOptions {
  SnapKVOptions snap;  // w = 32, k = 5, avgpool
  double epsilon = 1e-4;
  double first_stage = 0.5;
  double alpha = 0.2;     // CriticalAdaKV's safeguard
  bool adaptive = false;  // CriticalAdaKV
};

class CriticalKVPolicy final : public RoutingPolicy {
 public:
  // `recent` = S + L, the tokens per head kept outside the history (kvpress's window).
  CriticalKVPolicy(CriticalKVOptions o, int recent) : o_(o), recent_(recent) {}
  void plan(const RoutingRequest& req, RoutingPlan* plan) override;
  std::string name() const override { return o_.adaptive ? "criticaladakv" : "criticalkv"; }
  PolicyNeeds needs() const override;

 private:
  // Per head: force the top `n_forced` of s (they become +inf), then keep the top `keep` by
  // (s + ε)·ν. s: the head's scores, modified.
  void two_stage(const RoutingRequest& req, int h, std::vector<double>& s, int64_t n_forced,
                 int64_t keep, RoutingPlan* plan);
  // Sets the top `n` of s (score desc, position asc) of head h to +inf.
  void force_top(const RoutingRequest& req, int h, std::vector<double>& s, int64_t n);

  CriticalKVOptions o_;
  int recent_;
  std::vector<std::vector<double>> score_;
  std::vector<double> s2_;
  std::vector<int64_t> budget_;
  std::vector<int32_t> order_;
};

}  // namespace qevict
