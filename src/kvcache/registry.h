// The policy registry: one row per KV policy — its name, what it is, where its defaults
// come from, the kind of cache it runs on, the options it takes, how to make its
// RoutingPolicy and its cache, and the most bytes that cache can hold. The CLI and its --help,
// `eval`, `diagnose`, `bench`, the server's admission and the Python bindings read it; adding
// a policy is one policy file plus one row here (or register_policy() from a test), adding a
// quantizer its rule and cache under kvcache/quantizers/ plus one row (CONTRIBUTING.md).
#pragma once

#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "core/status.h"
#include "kvcache/budget.h"
#include "kvcache/kv_cache.h"
#include "kvcache/params.h"
#include "kvcache/policies/routing_policy.h"

namespace qevict {

struct PolicyInfo {
  std::string name;     // --kv-policy NAME
  std::string summary;  // one line for --help and docs
  std::string source;   // where the rule and its defaults come from
  CacheKind kind = CacheKind::kWindowed;
  bool uses_score = false;  // --kv-score applies
  // The cache needs the model's calibration in params.quant.kvquant_calib, which running the
  // model makes (engine/kvquant_calibration.h; the CLI does it before making caches).
  bool needs_calibration = false;
  // Gives the options the user did not set (given) the policy's defaults; errors on options
  // the policy has no use for. Null: SPEC's defaults, every option allowed.
  std::function<Status(KvCacheParams*, const KvParamsGiven&)> apply_defaults;
  // The routing rule (null for kFull and kQuantized).
  std::function<std::unique_ptr<RoutingPolicy>(const KvCacheParams&)> make_policy;
  // Builds the cache for at most n_ctx tokens from validated params (make_kv_cache calls it).
  // Null: the cache of the row's kind (a routed kind with make_policy's rule); a quantizer
  // row must give its own.
  std::function<Expected<std::unique_ptr<SequenceKvCache>>(const KvShape&, int64_t n_ctx,
                                                           const KvCacheParams&)>
      make_cache;
  // The most bytes the cache can hold for a sequence of prompt_len + max_tokens tokens
  // prefilled in chunks of prefill_chunk (what a server reserves before admitting it).
  // Null: the bound of the row's kind (kind_max_bytes).
  std::function<Expected<size_t>(const KvShape&, int64_t prompt_len, int max_tokens,
                                 const KvCacheParams&, int prefill_chunk)>
      max_bytes;
};

// Every registered policy, built-ins first.
const std::deque<PolicyInfo>& policy_registry();  // deque: rows never move
const PolicyInfo* find_policy(const std::string& name);
// The names joined by `sep`.
std::string policy_names(const std::string& sep);
// Adds a row; errors when the name is taken or the row is incomplete. Not thread-safe: call
// before caches are made (tests register their toy policies at start-up).
Status register_policy(PolicyInfo row);

// What any cache holds beyond its tokens' storage: tables, scratch, pool chunks below one
// allocation (tests/common/bytes_bound.h has the tiered cache's; this rounds it up).
inline constexpr size_t kCacheConstantBytes = size_t(1) << 20;

// The bound of a row's kind, for rows without max_bytes: FullKV's pages; a budgeted cache's
// budget + one prefill chunk (or the whole prompt with --prefill-route end; a resumed
// session's new tokens only, over its budget); a quantizer's every token in f16 plus one layer
// of dequantization scratch. Each + 5 % and the constant.
Expected<size_t> kind_max_bytes(const PolicyInfo& row, const KvShape& shape, int64_t prompt_len,
                                int max_tokens, const KvCacheParams& p, int prefill_chunk,
                                int64_t resumed = 0);

// Applies p->policy's row defaults for the options not in `given` (errors: unknown policy,
// options the policy cannot use).
Status apply_policy_defaults(KvCacheParams* p, const KvParamsGiven& given);

}  // namespace qevict
