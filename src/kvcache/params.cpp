// KvCacheParams validation: the fields, then the policy's registry row.
#include "kvcache/params.h"

#include <fmt/format.h>

#include <cmath>

#include "kvcache/registry.h"

namespace qevict {

Status KvCacheParams::validate() const {
  const PolicyInfo* row = find_policy(policy);
  if (!row)
    return Status::error(
        fmt::format("unknown KV policy '{}' (known: {})", policy, policy_names(", ")));
  if (prefill_route != "chunk" && prefill_route != "end")
    return Status::error(
        fmt::format("--prefill-route must be chunk or end, got '{}'", prefill_route));
  if (prefill_window < 0 || prefill_window > 4096)
    return Status::error(
        fmt::format("--prefill-window must be in [0, 4096], got {}", prefill_window));
  if (prefill_window > 0 && prefill_route != "end")
    return Status::error("--prefill-window scores the one routing of --prefill-route end");
  if (row->kind == CacheKind::kFull) return Status::ok();
  if (prefill_window > 0 && row->kind != CacheKind::kWindowed)
    return Status::error(fmt::format(
        "--prefill-window applies to windowed caches; {} ranks by its own score", policy));
  // Whether a budget was given (and only one form) is compute_budget's check (budget.cpp).
  if (budget_fraction < 0.0 || std::isnan(budget_fraction))
    return Status::error("--kv-budget must be positive");
  if (budget_tokens < 0) return Status::error("the token budget must be >= 0");
  if (!(q >= 0.0 && q <= 1.0))
    return Status::error(fmt::format("--kv-q must be in [0, 1], got {}", q));
  if (window < 1 || window > 4096)
    return Status::error(fmt::format("--kv-window must be in [1, 4096], got {}", window));
  if (route_every < 1)
    return Status::error(fmt::format("--kv-route-every must be >= 1, got {}", route_every));
  if (sink < 0) return Status::error("--kv-sink must be >= 0");
  if (local < 0 && !(row->kind == CacheKind::kPerHead && local == -1))
    return Status::error("--kv-local must be >= 0");
  if (bits == 0 && row->kind != CacheKind::kWindowed)
    return Status::error(fmt::format(
        "--kv-bits auto applies to the tiered cache (qevict, streaming), not to {}", policy));
  if (policy == "kvquant" ? (bits < 2 || bits > 4) : (bits != 0 && bits != 2 && bits != 4))
    return Status::error(fmt::format("--kv-bits must be 2, 4 or auto{}, got {}",
                                     policy == "kvquant" ? " (kvquant: 2, 3 or 4)" : "", bits));
  if (value_group < 0) return Status::error("--kv-group must be >= 0");
  if (value_bits != 0 && value_bits != 2 && value_bits != 4)
    return Status::error(fmt::format("--kv-value-bits must be 2 or 4, got {}", value_bits));
  if (value_bits != 0 && row->kind != CacheKind::kWindowed)
    return Status::error(fmt::format(
        "--kv-value-bits applies to the tiered cache (qevict, streaming), not to {}", policy));
  if (value_bits != 0 && bits == 0)
    return Status::error("--kv-value-bits needs --kv-bits 2 or 4, not auto");
  if (score != "sum" && score != "age")
    return Status::error(fmt::format("--kv-score must be sum or age, got '{}'", score));
  if (pool < 0 || pool > 64)
    return Status::error(fmt::format("--kv-pool must be in [0, 64], got {}", pool));
  if (pool != 0 && !row->uses_score)
    return Status::error(fmt::format("--kv-pool applies to the qevict policy, not to {}", policy));
  if (pool_side != "both" && pool_side != "after")
    return Status::error(fmt::format("--kv-pool-side must be both or after, got '{}'", pool_side));
  if (pool_side != "both" && !row->uses_score)
    return Status::error(
        fmt::format("--kv-pool-side applies to the qevict policy, not to {}", policy));
  if (score != "sum" && !row->uses_score)
    return Status::error(fmt::format("--kv-score applies to the qevict policy, not to {}", policy));
  return Status::ok();
}

}  // namespace qevict
