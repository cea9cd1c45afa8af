// The plan type, its budget check and the fill rule shared by the ranking policies (see
// routing_policy.h).
#include "kvcache/policies/routing_policy.h"

#include <fmt/format.h>

namespace qevict {

void RoutingPlan::reset(const RoutingRequest& req) {
  entries.resize(req.candidates.size());
  for (size_t i = 0; i < entries.size(); ++i) entries[i] = {req.candidates[i].id, Tier::kEvicted};
}

namespace {
size_t full_cost(const RoutingBudget& b, const RoutingCandidate& c) {
  // A window keeps (or gets) a ledger entry when it is or was in Q; in strict mode that copy
  // is charged to the full tier too.
  return b.window_full + (b.strict_ledger && c.has_ledger ? b.window_quant : 0);
}
}  // namespace

PlanCost plan_cost(const RoutingRequest& req, const RoutingPlan& plan) {
  PlanCost c;
  for (size_t i = 0; i < plan.entries.size() && i < req.candidates.size(); ++i) {
    if (plan.entries[i].to == Tier::kFull) c.full += full_cost(req.budget, req.candidates[i]);
    if (plan.entries[i].to == Tier::kQuant) c.quant += req.budget.window_quant;
  }
  return c;
}

Status check_plan(const RoutingRequest& req, const RoutingPlan& plan) {
  if (plan.entries.size() != req.candidates.size())
    return Status::error(fmt::format("routing plan answers {} of {} candidates",
                                     plan.entries.size(), req.candidates.size()));
  for (size_t i = 0; i < plan.entries.size(); ++i) {
    const PlanEntry& e = plan.entries[i];
    if (e.id != req.candidates[i].id)
      return Status::error(fmt::format("routing plan entry {} is for window {}, not {}", i, e.id,
                                       req.candidates[i].id));
    if (e.to != Tier::kFull && e.to != Tier::kQuant && e.to != Tier::kEvicted)
      return Status::error(
          fmt::format("routing plan sends window {} to tier {}", e.id, tier_char(e.to)));
  }
  const PlanCost c = plan_cost(req, plan);
  const RoutingBudget& b = req.budget;
  if (c.quant > b.quant_bytes || c.full + c.quant > b.full_bytes + b.quant_bytes)
    return Status::error(
        fmt::format("routing plan keeps F {} B + Q {} B, over the budget of F {} B + Q {} B",
                    c.full, c.quant, b.full_bytes, b.quant_bytes));
  return Status::ok();
}

void fill_tiers_in_order(const std::vector<int32_t>& order, const RoutingRequest& req,
                         RoutingPlan* plan) {
  plan->reset(req);
  const RoutingBudget& b = req.budget;
  size_t full_left = b.full_bytes, quant_left = b.quant_bytes;
  bool full_open = true;
  for (int32_t i : order) {
    const size_t f_cost = full_cost(b, req.candidates[i]);
    if (full_open && f_cost <= full_left) {
      plan->set(i, Tier::kFull);
      full_left -= f_cost;
      continue;
    }
    full_open = false;  // rank order: once a window misses F, no lower-ranked window takes F
    if (b.window_quant > 0 && b.window_quant <= quant_left) {
      plan->set(i, Tier::kQuant);
      quant_left -= b.window_quant;
    }
  }
}

bool RoutingThreads::prepare(const RoutingPolicy& own, int n_threads) {
  for (int t = int(workers_.size()); t < n_threads - 1; ++t) {
    Worker w;
    w.policy = own.clone();
    if (!w.policy) return false;
    workers_.push_back(std::move(w));
  }
  return true;
}

RoutingThreads::Slot RoutingThreads::slot(int t, RoutingPolicy& own, RoutingRequest& request,
                                          RoutingPlan& plan) {
  if (t == 0) return {own, request, plan};
  Worker& w = workers_[size_t(t - 1)];
  return {*w.policy, w.request, w.plan};
}

void RoutingThreads::free_scratch() {
  for (Worker& w : workers_) {
    std::vector<RoutingCandidate>().swap(w.request.candidates);
    std::vector<PlanEntry>().swap(w.plan.entries);
  }
}

size_t RoutingThreads::bytes() const {
  size_t b = 0;
  for (const Worker& w : workers_)
    b += sizeof(w) + w.request.candidates.capacity() * sizeof(RoutingCandidate) +
         w.plan.entries.capacity() * sizeof(PlanEntry);
  return b;
}

}  // namespace qevict
