// The lockstep diagnostics runner (QEvict §3, SPEC §8): FullKV and every variant decode the
// same token stream — FullKV's greedy continuation of a prompt, teacher-forced into each
// variant — in one batch per step. FullKV reports its attention (layer- and head-averaged
// per position) and each variant its tiers; the metrics of eval/metrics.h turn both into
// FMM over decode steps, mass by tier, churn, global LIR (online and oracle), score cosine
// on low-bit keys, ledger overhead and young-window eviction. The result is one JSON
// document (numbers and configuration); diagnose_markdown() summarises it.
#pragma once

#include <cstdint>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/status.h"
#include "core/thread_pool.h"
#include "kvcache/params.h"
#include "model/model.h"

namespace qevict::eval {

struct DiagnoseOptions {
  int64_t prefill = 512;  // prompt tokens
  int64_t gen = 256;      // decode steps (FullKV's greedy tokens)
  int chunk = 256;        // prompt tokens per forward call
  // Equal bytes for every variant: a fraction of the full cache for prefill + gen tokens, or
  // an exact byte count per layer.
  double budget = 0.2;
  int64_t budget_bytes = 0;
  // R1 token level (ω = 1, F+E), R2 two tiers (ω = 8, F+E), R3 QEvict (ω = 8, F+Q+E),
  // R4 (ω = 32, F+Q+E), or any registered policy (kvcache/registry.h) with its authors'
  // defaults, e.g. streaming (StreamingLLM), h2o (H2O).
  std::vector<std::string> variants = {"R1", "R2", "R3", "R4", "streaming", "h2o"};
  int map_layer = -1;  // layer of the tier map (-1: the R3 layer with the most tier moves)
  // Shared cache options (dtype, S, L, Ω, q, bits) for R1–R4; the baselines take their
  // authors' defaults.
  KvCacheParams base;
  Status validate() const;
};

// The cache options of one named variant at the options' budget.
Expected<KvCacheParams> variant_params(const std::string& name, const DiagnoseOptions& o);

// Runs the diagnostics on `prompt` (at least opts.prefill tokens; the first prefill are used).
// progress(done, total) is called after every forward call. fullkv_attention, when given,
// receives FullKV's attention of every decode step averaged over layers and heads:
// f32 [gen][prefill + gen] (positions not yet written are 0).
Expected<nlohmann::json> run_diagnose(Model& model, ThreadPool& pool,
                                      const std::vector<int32_t>& prompt,
                                      const DiagnoseOptions& opts,
                                      const std::function<void(int64_t, int64_t)>& progress,
                                      std::vector<float>* fullkv_attention = nullptr);

// A markdown summary of run_diagnose's JSON.
std::string diagnose_markdown(const nlohmann::json& j);

}  // namespace qevict::eval
