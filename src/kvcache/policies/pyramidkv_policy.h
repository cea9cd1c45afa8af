// PyramidKV (Cai et al., 2024, arXiv 2406.02069, "PyramidKV: Dynamic KV Cache Compression
// based on Pyramidal Information Funneling"): SnapKV's scores and per-head selection, with a
// budget that falls linearly from the first layer to the last (more tokens where attention
// is spread, fewer where it is focused); the layers' mean is SnapKV's budget.
//
// Where the rule and the defaults come from (../shared/ref/BASELINES.md, "PyramidKV"):
//  - kvpress kvpress/presses/pyramidkv_press.py:L70-84 (from KVCache-Factory
//    pyramidkv_utils.py#L197), with T' = n(1−cr) the tokens SnapKV keeps per head (window
//    included), n the sequence length and w the window:
//      min = T'/β,  max = 2T' − min;  if max ≥ n − w: max = n − w, min = 2T' − max;
//      kept_l = round(max − l·(max − min)/(L − 1)) tokens, window included;
//      SnapKV's uniform T' for every layer unless n ≥ max ≥ min ≥ w.
//    Here T' = C, the cache's tokens per head (sink + recent + history), w = the recent region
//    (L, the observation window's tokens), so layer l keeps kept_l − S − L history tokens per
//    head. Pairs of layers l and L−1−l sum to 2T' and round (half to even, Python's round)
//    to the same sum, so the layers together keep what SnapKV would: equal bytes. We compute
//    in exact (integer) arithmetic: kvpress's floats can round an exact half either way.
//  - Defaults: β = 20 (kvpress), SnapKV's w = 32, k = 5, avgpool and 2048 tokens per head
//    (snapkv_policy.h); with β = 20 the pyramid needs T' ≥ 20w (640 tokens per head at
//    w = 32), below which kvpress, and we, fall back to SnapKV's uniform budget.
// Prefill and decode as SnapKV (snapkv_policy.h); the layer budgets follow n as it grows.
#pragma once

#include "kvcache/policies/snapkv_policy.h"

namespace qevict {

struct PyramidKVOptions {
  SnapKVOptions snap;
  int beta = 20;
};

class PyramidKVPolicy final : public RoutingPolicy {
 public:
  // `recent` = S + L, the tokens per head every layer keeps outside the history.
  PyramidKVPolicy(PyramidKVOptions o, int recent) : o_(o), recent_(recent) {}
  void plan(const RoutingRequest& req, RoutingPlan* plan) override;
  std::string name() const override { return "pyramidkv"; }
  PolicyNeeds needs() const override;
  int64_t layer_budget(int layer, int n_layers, int n_heads, int64_t heavy,
                       int64_t n_hist) const override;

  // kvpress's get_layer_budget: tokens (window included) layer `layer` of `n_layers` keeps
  // per head, for a mean of `mean` tokens, a sequence of n tokens and a window of w.
  static int64_t layer_tokens(int layer, int n_layers, int64_t mean, int64_t n, int w, int beta);

 private:
  PyramidKVOptions o_;
  int recent_;
  std::vector<double> score_;
  std::vector<int32_t> order_;
};

}  // namespace qevict
