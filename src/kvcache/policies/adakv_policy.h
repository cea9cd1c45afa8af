// AdaKV (Feng et al., 2024, arXiv 2407.11550, "Ada-KV: Optimizing KV Cache Eviction by
// Adaptive Budget Allocation"), on SnapKV's scores (Ada-SnapKV): the layer's budget of H·B
// history tokens is shared among its KV heads by where the highest scores are, with a floor
// of ⌊α·B⌋ per head; each head then keeps its own top tokens. Heads keep different numbers
// of tokens, and the per-head cache stores exactly those (each head's rows are its own
// variable-length storage: a head given fewer tokens holds fewer bytes), where kvpress masks.
//
// Where the rule and the defaults come from (../shared/ref/BASELINES.md, "AdaKV"):
//  - FFY0/AdaKV@efe4e2e adaptive_snapkv/monkeypatch/snapkv_utils.py: SnapKV scores (mean over
//    the w window queries, pool; L335-370), aggregated over a GQA group by mean (L351-358);
//    base budget B = budget − w per head (L303); global top-H·B over every head's scores,
//    c_h = how many fall in head h; B_h = round(c_h·(1 − α) + ⌊α·B⌋) (torch.round: half to
//    even; L445-460); each head keeps its top-B_h plus the window, flattened with per-head
//    lengths (L477-501).
//  - Defaults: w = 32, k = 7, maxpool (monkeypatch.py:L34); α = floor_alpha = 0.2 (the
//    LongBench runs, experiments/LongBench/pred.py:L27-29, and GQA_eval_longbench.sh's advice
//    for GQA models); budget: SnapKV's 2048 tokens per head (the AdaKV experiments sweep
//    128–2048 with no single default).
// Two departures, both to hold the bytes: rounding can give the heads together up to H/2
// tokens more than H·B — we take the excess back from the heads that rounded up most (ties:
// higher head first); and a head with fewer candidates than B_h (decode: heads have
// evicted different tokens) keeps them all, the rest of its share unused.
// Prefill and decode as SnapKV (snapkv_policy.h): once at the end of the prompt, then every Ω
// decode steps over the kept tokens plus those that left the recent window.
#pragma once

#include "kvcache/policies/snapkv_policy.h"

namespace qevict {

struct AdaKVOptions {
  SnapKVOptions snap{32, 7, ObsPool::kMax};
  double alpha = 0.2;  // floor_alpha (kFloor) or alpha_safeguard (kSafeguard)
  // How the layer's H·B history tokens are shared among its heads:
  //  kFloor      FFY0/AdaKV (above): B_h = round(c_h·(1 − α) + ⌊α·B⌋).
  //  kSafeguard  NVIDIA kvpress AdaKVPress (kvpress/presses/adakv_press.py:L63-78, alpha 0.2,
  //              on SnapKVPress scores): each head first keeps its top ⌊α·n_kept⌋ tokens,
  //              n_kept = B + w counting the window (whose padded scores put it first), then
  //              one global top over every head fills the layer's H·n_kept. What the
  //              faithfulness check compares with kvpress (tests/e2e/faithfulness_test.cpp).
  enum class Share { kFloor, kSafeguard } share = Share::kFloor;
};

class AdaKVPolicy final : public RoutingPolicy {
 public:
  // recent: the always-kept recent tokens per head (the window w; kSafeguard counts them).
  explicit AdaKVPolicy(AdaKVOptions o = {}, int recent = 0) : o_(o), recent_(recent) {}
  void plan(const RoutingRequest& req, RoutingPlan* plan) override;
  std::string name() const override { return "adakv"; }
  PolicyNeeds needs() const override;

  // AdaKV's allocation: per-head budgets B_h from every head's scores (scores[h], n_h values
  // each), base budget B per head and floor α (the departures above included). counts: out.
  static void allocate(const std::vector<std::vector<double>>& scores, int64_t base, double alpha,
                       std::vector<int64_t>* counts);

 private:
  AdaKVOptions o_;
  int recent_ = 0;
  std::vector<std::vector<double>> score_;
  std::vector<int64_t> budget_;
  std::vector<int32_t> order_;
};

}  // namespace qevict
