// KvCacheParams validation and the cache factory.
#include "kvcache/params.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "kvcache/full_cache.h"
#include "kvcache/head_cache.h"
#include "kvcache/policies/h2o_policy.h"
#include "kvcache/policies/qevict_policy.h"
#include "kvcache/policies/streaming_policy.h"
#include "kvcache/tiered_cache.h"

namespace qevict {

Status KvCacheParams::validate() const {
  if (policy != "full" && policy != "qevict" && policy != "streaming" && policy != "h2o")
    return Status::error(
        fmt::format("unknown KV policy '{}' (known: full, qevict, streaming, h2o)", policy));
  if (policy == "full") return Status::ok();
  if (budget_fraction > 0.0 && budget_bytes > 0)
    return Status::error(
        "give the KV budget either as a fraction (--kv-budget) or in bytes (--kv-budget-bytes), "
        "not both");
  if (!(budget_fraction > 0.0) && budget_bytes <= 0)
    return Status::error(fmt::format(
        "the {} policy needs a budget: --kv-budget FRACTION or --kv-budget-bytes N", policy));
  if (budget_fraction < 0.0 || std::isnan(budget_fraction))
    return Status::error("--kv-budget must be positive");
  if (!(q >= 0.0 && q <= 1.0))
    return Status::error(fmt::format("--kv-q must be in [0, 1], got {}", q));
  if (window < 1 || window > 4096)
    return Status::error(fmt::format("--kv-window must be in [1, 4096], got {}", window));
  if (route_every < 1)
    return Status::error(fmt::format("--kv-route-every must be >= 1, got {}", route_every));
  if (sink < 0) return Status::error("--kv-sink must be >= 0");
  if (local < 0 && !(policy == "h2o" && local == -1))
    return Status::error("--kv-local must be >= 0");
  if (bits != 2 && bits != 4)
    return Status::error(fmt::format("--kv-bits must be 2 or 4, got {}", bits));
  if (value_group < 0) return Status::error("--kv-group must be >= 0");
  if (score != "sum" && score != "age")
    return Status::error(fmt::format("--kv-score must be sum or age, got '{}'", score));
  if (score != "sum" && policy != "qevict")
    return Status::error(fmt::format("--kv-score applies to the qevict policy, not to {}", policy));
  return Status::ok();
}

size_t KvCacheParams::budget_per_layer(const KvShape& shape, int64_t n_ctx) const {
  return budget_bytes > 0
             ? size_t(budget_bytes)
             : size_t(std::floor(budget_fraction * double(n_ctx) * double(shape.token_bytes())));
}

Status apply_policy_defaults(KvCacheParams* p, const KvParamsGiven& given) {
  if (p->policy == "streaming") {
    if (!given.sink) p->sink = 4;
    if (!given.window) p->window = 1;
    if (!given.route_every) p->route_every = 1;
    if (!given.q) p->q = 0.0;
  } else if (p->policy == "h2o") {
    if (given.window || given.q || given.bits)
      return Status::error(
          "--kv-window, --kv-q and --kv-bits do not apply to h2o (token level, full precision)");
    if (!given.sink) p->sink = 0;
    if (!given.route_every) p->route_every = 1;
    if (!given.local) p->local = -1;
    p->window = 1;
    p->q = 0.0;
  }
  return Status::ok();
}

Expected<std::unique_ptr<SequenceKvCache>> make_kv_cache(const KvShape& shape, int64_t n_ctx,
                                                         const KvCacheParams& p) {
  QEVICT_RETURN_IF_ERROR(shape.validate());
  QEVICT_RETURN_IF_ERROR(p.validate());
  if (n_ctx <= 0) return Status::error("context size must be positive");
  if (p.policy == "full")
    return std::unique_ptr<SequenceKvCache>(new FullKvCache(shape, n_ctx, p.dtype));
  if (p.policy == "h2o") {
    KvCacheParams hp = p;
    if (hp.local < 0) {
      // H2O's default: the budget split equally between heavy hitters and recent tokens.
      const int64_t per_head =
          int64_t(hp.budget_per_layer(shape, n_ctx) / size_t(shape.n_kv_heads) /
                  HeadKvCache::token_head_bytes(shape));
      hp.local = int(std::max<int64_t>(0, per_head - hp.sink) / 2);
    }
    QEVICT_RETURN_IF_ERROR(HeadKvCache::check_budget(shape, n_ctx, hp));
    return std::unique_ptr<SequenceKvCache>(
        new HeadKvCache(shape, n_ctx, hp, std::make_unique<H2OPolicy>()));
  }
  QuantLayout ql{p.bits, shape.n_kv_heads, shape.head_dim, p.window, p.value_group};
  QEVICT_RETURN_IF_ERROR(ql.validate());
  if (shape.head_dim > 1024)
    return Status::error("head_dim above 1024 is not supported by the low-bit tier");
  const size_t token_bytes = shape.token_bytes();
  const size_t budget = p.budget_per_layer(shape, n_ctx);
  const size_t fixed =
      size_t(p.sink) * token_bytes + size_t(p.local_windows()) * size_t(p.window) * token_bytes;
  if (budget <= fixed)
    return Status::error(fmt::format(
        "KV budget of {} bytes per layer does not cover the sink ({} tokens) and local region ({} "
        "tokens, {} "
        "windows of {}): they need {} bytes; raise --kv-budget or lower --kv-sink/--kv-local",
        budget, p.sink, p.local, p.local_windows(), p.window, fixed));
  std::unique_ptr<RoutingPolicy> policy;
  if (p.policy == "streaming")
    policy = std::make_unique<StreamingPolicy>();
  else
    policy = std::make_unique<QEvictPolicy>();
  return std::unique_ptr<SequenceKvCache>(new TieredKvCache(shape, n_ctx, p, std::move(policy)));
}

}  // namespace qevict
