// make_kv_cache and the bounds of the cache kinds (see factory.h, registry.h).
#include "kvcache/factory.h"

#include <fmt/format.h>

#include <algorithm>

#include "kvcache/budget.h"
#include "kvcache/full_cache.h"
#include "kvcache/head_cache.h"
#include "kvcache/registry.h"
#include "kvcache/routing_observer.h"
#include "kvcache/tiered_cache.h"

namespace qevict {

namespace {

// The cache of a routed or full row without a make_cache of its own.
Expected<std::unique_ptr<SequenceKvCache>> make_cache_of_kind(const PolicyInfo& row,
                                                              const KvShape& shape, int64_t n_ctx,
                                                              const KvCacheParams& p) {
  if (row.kind == CacheKind::kFull)
    return std::unique_ptr<SequenceKvCache>(new FullKvCache(shape, n_ctx, p.dtype));
  if (row.kind == CacheKind::kQuantized)
    return Status::error(fmt::format("quantizer row '{}' has no make_cache", row.name));
  auto budget = compute_budget(row.kind, shape, n_ctx, p);
  if (!budget) return budget.status();
  if (row.kind == CacheKind::kPerHead) {
    auto policy = row.make_policy(p);
    QEVICT_RETURN_IF_ERROR(fit_head_budget(&*budget, shape, n_ctx, p, policy->needs()));
    return std::unique_ptr<SequenceKvCache>(
        new HeadKvCache(shape, n_ctx, p, *budget, std::move(policy)));
  }
  std::unique_ptr<RoutingObserver> trace;
  if (!p.trace_path.empty()) {
    auto t = RoutingTrace::open(p.trace_path);
    if (!t) return t.status();
    trace = std::move(*t);
  }
  KvCacheParams pw = p;
  pw.bits = budget->bits;  // --kv-bits auto resolved by the budget
  return std::unique_ptr<SequenceKvCache>(
      new TieredKvCache(shape, n_ctx, pw, *budget, row.make_policy(pw), std::move(trace)));
}

// Every kind's bound + 5 % and the constant (kCacheConstantBytes).
size_t with_margin(size_t peak) { return peak + peak / 20 + kCacheConstantBytes; }

}  // namespace

Expected<std::unique_ptr<SequenceKvCache>> make_kv_cache(const KvShape& shape, int64_t n_ctx,
                                                         const KvCacheParams& p) {
  QEVICT_RETURN_IF_ERROR(shape.validate());
  QEVICT_RETURN_IF_ERROR(p.validate());
  if (n_ctx <= 0) return Status::error("context size must be positive");
  const PolicyInfo* row = find_policy(p.policy);  // validate() found it
  if (row->kind == CacheKind::kQuantized)         // refuses a budget (budget.cpp)
    QEVICT_RETURN_IF_ERROR(compute_budget(row->kind, shape, n_ctx, p).status());
  if (row->make_cache) return row->make_cache(shape, n_ctx, p);
  return make_cache_of_kind(*row, shape, n_ctx, p);
}

Expected<size_t> kind_max_bytes(const PolicyInfo& row, const KvShape& shape, int64_t prompt_len,
                                int max_tokens, const KvCacheParams& p, int prefill_chunk,
                                int64_t resumed) {
  const int64_t n_ctx = prompt_len + max_tokens;
  const size_t token = shape.token_bytes() * size_t(shape.n_layers);
  if (row.kind == CacheKind::kFull) {
    const int64_t pages = (n_ctx + FullKvCache::kPageTokens - 1) / FullKvCache::kPageTokens;
    return size_t(pages * FullKvCache::kPageTokens) * token + kCacheConstantBytes;
  }
  auto b = compute_budget(row.kind, shape, n_ctx, p);
  if (!b) return b.status();
  // A per-head budget must also hold the policy's own state (make_kv_cache does the same):
  // refused here, before admission, as a request the server cannot take.
  if (row.kind == CacheKind::kPerHead)
    QEVICT_RETURN_IF_ERROR(fit_head_budget(&*b, shape, n_ctx, p, row.make_policy(p)->needs()));
  if (row.kind == CacheKind::kQuantized) {
    // A quantizer has no budget: bounded by every token in f16 (what it holds before its rule
    // quantizes them) plus its one-layer dequantization scratch, also f16.
    const size_t f16 = size_t(n_ctx) * token;
    const size_t peak = f16 + f16 / size_t(shape.n_layers);
    return with_margin(peak);
  }
  const size_t budget = b->total * size_t(shape.n_layers);
  size_t peak = budget + size_t(prefill_chunk) * token;
  // A deferred prompt (end, staged) also keeps the observation window's query rows (every
  // layer + one) until the prompt's end: counted, not left to the 5 % margin.
  const size_t window = p.defers_prompt()
                            ? size_t(shape.n_layers + 1) * size_t(std::max(p.prefill_window, 0)) *
                                  size_t(shape.q_width()) * sizeof(float)
                            : 0;
  if (resumed > 0 && p.defers_prompt()) {
    // A resumed conversation: its earlier turns are routed within the budget; the new turn is
    // held (end: in full precision; staged: at most that) until it ends, when routing brings
    // everything back within the budget. Meanwhile a call's scratch is at most a chunk of
    // tokens.
    const size_t fresh = size_t(prompt_len - std::min(resumed, prompt_len));
    return with_margin(budget + (fresh + size_t(prefill_chunk)) * token + window);
  }
  if (p.holds_prompt()) peak = std::max(peak, size_t(prompt_len) * token + window);
  if (p.prefill_route == PrefillRoute::kStaged)
    peak = std::max(
        peak, b->staged_prompt_bytes(prompt_len, prefill_chunk) * size_t(shape.n_layers) + window);
  return with_margin(peak);
}

Expected<size_t> max_cache_bytes(const KvShape& shape, int64_t prompt_len, int max_tokens,
                                 const KvCacheParams& p, int prefill_chunk, int64_t resumed) {
  const PolicyInfo* row = find_policy(p.policy);
  if (!row) return Status::error(fmt::format("unknown KV policy '{}'", p.policy));
  if (row->max_bytes) return row->max_bytes(shape, prompt_len, max_tokens, p, prefill_chunk);
  return kind_max_bytes(*row, shape, prompt_len, max_tokens, p, prefill_chunk, resumed);
}

}  // namespace qevict
