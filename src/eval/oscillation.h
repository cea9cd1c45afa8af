// A synthetic workload built to make windows oscillate around the F/Q boundary (SPEC §8,
// "ledger overhead against churn"): every decode query attends to the windows the cache
// currently holds in Q, so at every routing event they outrank the F windows and swap
// places. It measures what the persistent ledger costs when churn is at its worst: ledger
// copies held by promoted windows (real memory beyond the budget unless --kv-strict-ledger
// charges them), quantizations (once per window, whatever the number of swaps) and moves.
#pragma once

#include <cstddef>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <vector>

namespace qevict::eval {

struct OscillationEvent {
  int64_t n_past = 0;
  int64_t promotions = 0, demotions = 0;  // in this routing event
  size_t ledger_bytes_of_full = 0;        // ledger copies held by windows in F
  size_t budgeted_bytes = 0;              // bytes charged to the budget
  size_t allocated_bytes = 0;             // pools + sink held by the process
};

struct OscillationResult {
  bool strict = false;
  size_t budget_bytes = 0, window_full = 0, window_quant = 0;
  int64_t capacity_full = 0, capacity_quant = 0;
  int64_t promotions = 0, demotions = 0, quantizations = 0;
  size_t max_ledger_bytes_of_full = 0, max_budgeted_bytes = 0, max_allocated_bytes = 0;
  double churn_full = 0.0;  // mean Jaccard distance of the F set between routing events
  std::vector<OscillationEvent> events;
};

// 1 layer, 1 query/KV head, head_dim 64 (one key direction per prompt window), no RoPE; a 1-token
// sink absorbs the prompt's attention so every window starts with the same score; 16 prompt windows
// of ω = 8, Ω = 8, L = 8, q = 0.7, a budget that holds K_f = 4 full windows; `decode_steps` steps.
OscillationResult run_oscillation(bool strict, int decode_steps = 256);

nlohmann::json oscillation_json(const OscillationResult& r);

}  // namespace qevict::eval
