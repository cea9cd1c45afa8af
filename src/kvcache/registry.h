// The policy registry: one row per KV policy — its name, what it is, where its defaults
// come from, the kind of cache it runs on, the options it takes, and how to make its
// RoutingPolicy. The CLI (tools/cli_common.cpp, cmd_eval.cpp), the Python bindings, eval and
// diagnose (eval/eval_runner.cpp, diagnose_runner.cpp) and the server's scheduler
// (engine/scheduler.cpp) read it; adding a policy is one policy file plus one row here (or
// register_policy() from a test).
#pragma once

#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "core/status.h"
#include "kvcache/budget.h"
#include "kvcache/params.h"
#include "kvcache/policies/routing_policy.h"

namespace qevict {

struct PolicyInfo {
  std::string name;     // --kv-policy NAME
  std::string summary;  // one line for --help and docs
  std::string source;   // where the rule and its defaults come from
  CacheKind kind = CacheKind::kWindowed;
  bool uses_score = false;  // --kv-score applies
  // Gives the options the user did not set (given) the policy's defaults; errors on options
  // the policy has no use for. Null: SPEC's defaults, every option allowed.
  std::function<Status(KvCacheParams*, const KvParamsGiven&)> apply_defaults;
  // The routing rule (null for kFull).
  std::function<std::unique_ptr<RoutingPolicy>(const KvCacheParams&)> make_policy;
};

// Every registered policy, built-ins first.
const std::deque<PolicyInfo>& policy_registry();  // deque: rows never move
const PolicyInfo* find_policy(const std::string& name);
// The names joined by `sep`.
std::string policy_names(const std::string& sep);
// Adds a row; errors when the name is taken or the row is incomplete. Not thread-safe: call
// before caches are made (tests register their toy policies at start-up).
Status register_policy(PolicyInfo row);

// Applies p->policy's row defaults for the options not in `given` (errors: unknown policy,
// options the policy cannot use).
Status apply_policy_defaults(KvCacheParams* p, const KvParamsGiven& given);

}  // namespace qevict
