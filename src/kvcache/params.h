// KV-cache options (one struct, defaults from SPEC §1–5) and the factory that builds a
// sequence cache from them.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "core/status.h"
#include "kvcache/kv_cache.h"

namespace qevict {

struct KvCacheParams {
  std::string policy = "full";      // "full" | "qevict" | "streaming" | "h2o"
  HalfType dtype = HalfType::kF16;  // full-precision storage type
  // Budget per layer: a fraction of the full-precision cache for n_ctx tokens (the paper's
  // "20 % budget") or an exact byte count. One of the two must be set for qevict.
  double budget_fraction = 0.0;
  int64_t budget_bytes = 0;
  double q = 0.70;      // share of the history budget given to the low-bit tier
  int window = 8;       // ω: tokens per window
  int route_every = 8;  // Ω: decode steps between routing events
  int sink = 5;         // S: first tokens, always full precision
  int local = 32;       // L: newest tokens, always full precision (h2o: -1 = half the budget)
  int bits = 2;         // low-bit tier: 2 or 4
  int value_group = 0;  // g: value quantization group (0: head_dim)
  bool strict_ledger = false;  // charge ledger copies of promoted windows to the budget
  // How the tiered cache ranks windows: "sum" = the cumulative score S̄(w) (paper Eq. 1);
  // "age" = S̄(w) divided by the query tokens that have seen the window (n_past − its first
  // position): the mean attention per step, SPEC §2's first fix for young-window bias.
  std::string score = "sum";
  std::string trace_path;  // --kv-trace: JSONL record per routing event

  Status validate() const;

  // B_total per layer (SPEC §3): budget_bytes, or budget_fraction of the 16-bit cache of
  // n_ctx tokens.
  size_t budget_per_layer(const KvShape& shape, int64_t n_ctx) const;
  // Windows reserved for the local region: ceil(L/ω) + 1 (the newest L tokens can straddle
  // one more window than L/ω).
  int64_t local_windows() const { return (int64_t(local) + window - 1) / window + 1; }
};

// Which KvCacheParams fields the user set explicitly (the CLI marks them).
struct KvParamsGiven {
  bool window = false, route_every = false, sink = false, local = false, q = false, bits = false;
};

// Gives the fields the user did not set the published defaults of the chosen policy:
//   streaming  S = 4, ω = 1 (token level), Ω = 1 (evict as soon as a token leaves), q = 0
//   h2o        S = 0, Ω = 1, recent window = half the budget (local = -1), token level
// qevict and full keep SPEC's defaults. Errors on options a policy has no use for.
Status apply_policy_defaults(KvCacheParams* p, const KvParamsGiven& given);

// Builds the cache for one sequence of at most n_ctx tokens.
Expected<std::unique_ptr<SequenceKvCache>> make_kv_cache(const KvShape& shape, int64_t n_ctx,
                                                         const KvCacheParams& params);

}  // namespace qevict
