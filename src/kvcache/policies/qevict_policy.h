// QEvict routing (paper Eq. 4–6, Algorithm 1; SPEC §4): rank candidates by score (ties:
// older window first), the top windows that fit the full tier's bytes go to F, the next
// that fit the low-bit tier's bytes go to Q, the rest are evicted. With a zero low-bit
// budget this is the two-tier (F + E) variant. One addition to the paper: when all
// candidates fit in F within the whole history budget, all stay in F (so a budget that
// covers the full cache is exactly FullKV's storage).
//
// The score a window is ranked by (SPEC §2):
//   kSum  its cumulative score S̄(w) (Eq. 1), the paper's;
//   kAge  S̄(w) divided by the query tokens that have seen it, n_past − pos0 (at least 1;
//         n_past − scores_from for windows older than a prompt-end observation window that
//         restarted the scores): the mean attention per step, SPEC §2's first fix for
//         young-window bias.
// With pool = r > 0, a window is ranked by the highest score among the windows within r
// window ids of it (its own included; evicted neighbours are gone and count for nothing),
// ties by its own score, then older first: SnapKV's pooling of scores along the key axis
// (BASELINES.md), at window granularity. A value that spans windows — a UUID is ~25 tokens —
// draws the question's attention to its first window; the windows after it rank with it
// instead of being evicted at the prompt's end, when nothing has read them yet. With
// `after_only`, only the r windows before a window pool into it (ids in [id − r, id]): the
// windows that follow a peak rise with it, the ones before it do not — half the budget
// symmetric pooling spends on a text with many peaks.
#pragma once

#include <algorithm>

#include "kvcache/policies/routing_policy.h"

namespace qevict {

class QEvictPolicy final : public RoutingPolicy {
 public:
  explicit QEvictPolicy(ScoreMode mode = ScoreMode::kSum, int pool = 0, bool after_only = false)
      : mode_(mode), pool_(pool), after_only_(after_only) {}
  void plan(const RoutingRequest& req, RoutingPlan* plan) override;
  std::string name() const override { return "qevict"; }
  std::unique_ptr<RoutingPolicy> clone() const override {
    return std::make_unique<QEvictPolicy>(mode_, pool_, after_only_);
  }

  // What a candidate is ranked by at position n_past; `scores_from` as in RoutingRequest.
  static double rank_score(ScoreMode mode, const RoutingCandidate& c, int64_t n_past,
                           int64_t scores_from = 0) {
    const int64_t seen = n_past - std::max(c.pos0, scores_from);
    return mode == ScoreMode::kAge ? c.score / double(std::max<int64_t>(1, seen)) : c.score;
  }

 private:
  ScoreMode mode_;
  int pool_;
  bool after_only_;
  std::vector<int32_t> order_, by_id_;  // reused: routing allocates nothing in steady state
  std::vector<double> rank_, pooled_;
};

}  // namespace qevict
