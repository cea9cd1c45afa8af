// KvCacheParams validation: the fields, then the policy's registry row.
#include "kvcache/params.h"

#include <fmt/format.h>

#include <cmath>

#include "kvcache/registry.h"

namespace qevict {

const char* to_string(PrefillRoute r) {
  switch (r) {
    case PrefillRoute::kEnd:
      return "end";
    case PrefillRoute::kStaged:
      return "staged";
    case PrefillRoute::kChunk:
      break;
  }
  return "chunk";
}
const char* to_string(ScoreMode s) { return s == ScoreMode::kAge ? "age" : "sum"; }
const char* to_string(PoolSide s) { return s == PoolSide::kAfter ? "after" : "both"; }

namespace {

// The fields of the budgeted caches (windowed and per-head).
Status validate_routed(const KvCacheParams& p, const PolicyInfo& row) {
  if (p.prefill_window > 0 && row.kind != CacheKind::kWindowed)
    return Status::error(fmt::format(
        "--prefill-window applies to windowed caches; {} ranks by its own score", p.policy));
  if (p.budget_tokens < 0) return Status::error("the token budget must be >= 0");
  if (!(p.q >= 0.0 && p.q <= 1.0))
    return Status::error(fmt::format("--kv-q must be in [0, 1], got {}", p.q));
  if (p.window < 1 || p.window > 4096)
    return Status::error(fmt::format("--kv-window must be in [1, 4096], got {}", p.window));
  if (p.route_every < 1)
    return Status::error(fmt::format("--kv-route-every must be >= 1, got {}", p.route_every));
  if (p.sink < 0) return Status::error("--kv-sink must be >= 0");
  if (p.local < 0) return Status::error("--kv-local must be >= 0");
  if (p.local_half_budget && row.kind != CacheKind::kPerHead)
    return Status::error("a recent window of half the budget applies to per-head caches");
  if (p.bits == 0 && row.kind != CacheKind::kWindowed)
    return Status::error(fmt::format(
        "--kv-bits auto applies to the tiered cache (qevict, streaming), not to {}", p.policy));
  if (p.bits != 0 && p.bits != 2 && p.bits != 4)
    return Status::error(fmt::format("--kv-bits must be 2, 4 or auto, got {}", p.bits));
  if (p.value_group < 0) return Status::error("--kv-group must be >= 0");
  if (p.value_bits != 0 && p.value_bits != 2 && p.value_bits != 4)
    return Status::error(fmt::format("--kv-value-bits must be 2 or 4, got {}", p.value_bits));
  if (p.value_bits != 0 && row.kind != CacheKind::kWindowed)
    return Status::error(fmt::format(
        "--kv-value-bits applies to the tiered cache (qevict, streaming), not to {}", p.policy));
  if (p.key_meta != 8 && p.key_meta != 16)
    return Status::error(fmt::format("--kv-key-meta must be 16 or 8, got {}", p.key_meta));
  if (p.key_meta != 16 && row.kind != CacheKind::kWindowed)
    return Status::error(fmt::format(
        "--kv-key-meta applies to the tiered cache (qevict, streaming), not to {}", p.policy));
  if (p.value_bits != 0 && p.bits == 0)
    return Status::error("--kv-value-bits needs --kv-bits 2 or 4, not auto");
  if (!(p.adapt >= 0.0 && p.adapt <= 100.0))
    return Status::error(fmt::format("--kv-adapt must be in [0, 100] nats, got {}", p.adapt));
  if (p.adapt > 0.0 && (!row.uses_score || row.kind != CacheKind::kWindowed))
    return Status::error(
        fmt::format("--kv-adapt applies to the qevict policy, not to {}", p.policy));
  if (p.adapt > 0.0 && (p.prefill_route != PrefillRoute::kEnd || p.prefill_window <= 0))
    return Status::error(
        "--kv-adapt chooses the low-bit tier at the prompt's end, from its observation window: "
        "it needs --prefill-route end and --prefill-window > 0 (qevict's defaults)");
  if (p.pool < 0 || p.pool > 64)
    return Status::error(fmt::format("--kv-pool must be in [0, 64], got {}", p.pool));
  if (p.pool != 0 && !row.uses_score)
    return Status::error(
        fmt::format("--kv-pool applies to the qevict policy, not to {}", p.policy));
  if (p.pool_side != PoolSide::kBoth && !row.uses_score)
    return Status::error(
        fmt::format("--kv-pool-side applies to the qevict policy, not to {}", p.policy));
  if (p.score != ScoreMode::kSum && !row.uses_score)
    return Status::error(
        fmt::format("--kv-score applies to the qevict policy, not to {}", p.policy));
  return Status::ok();
}

}  // namespace

KvCacheParams coverage_params(const KvCacheParams& p) {
  KvCacheParams c = p;
  c.bits = 2;
  c.value_bits = 2;
  c.key_meta = 8;
  c.q = 0.95;
  c.adapt = 0.0;
  return c;
}

Status KvCacheParams::validate() const {
  const PolicyInfo* row = find_policy(policy);
  if (!row)
    return Status::error(
        fmt::format("unknown KV policy '{}' (known: {})", policy, policy_names(", ")));
  if (prefill_window < 0 || prefill_window > 4096)
    return Status::error(
        fmt::format("--prefill-window must be in [0, 4096], got {}", prefill_window));
  if (prefill_window > 0 && !defers_prompt())
    return Status::error(
        "--prefill-window scores the one routing of --prefill-route end or staged");
  if (row->kind == CacheKind::kFull) return Status::ok();
  // Staging needs the tiered cache's low-bit tier: the prompt's aged windows are kept there.
  if (prefill_route == PrefillRoute::kStaged && row->kind != CacheKind::kWindowed)
    return Status::error(fmt::format(
        "--prefill-route staged applies to the tiered cache (qevict), not to {}", policy));
  if (prefill_route == PrefillRoute::kStaged && !(q > 0.0))
    return Status::error(fmt::format(
        "--prefill-route staged keeps the prompt in the low-bit tier, which {} has none of "
        "(--kv-q 0)",
        policy));
  // Whether a budget was given (and only one form) is compute_budget's check (budget.cpp).
  if (budget_fraction < 0.0 || std::isnan(budget_fraction))
    return Status::error("--kv-budget must be positive");
  if (row->kind == CacheKind::kQuantized) {
    // The family's own settings are its config's to check (KiviConfig, KvQuantConfig,
    // ZipCacheConfig, when the row makes the cache); the shared ones here.
    if (prefill_window > 0)
      return Status::error(fmt::format("--prefill-window does not apply to {}", policy));
    if (pool != 0 || pool_side != PoolSide::kBoth || score != ScoreMode::kSum)
      return Status::error(fmt::format(
          "--kv-pool, --kv-pool-side and --kv-score apply to qevict, not to {}", policy));
    if (key_meta != 16)
      return Status::error(fmt::format(
          "--kv-key-meta applies to the tiered cache (qevict, streaming), not to {}", policy));
    if (value_bits != 0)
      return Status::error(fmt::format(
          "--kv-value-bits applies to the tiered cache (qevict, streaming), not to {}", policy));
    if (bits == 0)
      return Status::error(fmt::format(
          "--kv-bits auto applies to the tiered cache (qevict, streaming), not to {}", policy));
    return Status::ok();
  }
  return validate_routed(*this, *row);
}

}  // namespace qevict
