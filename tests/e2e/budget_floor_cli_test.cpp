// `qevict generate -p "Hi" -n 8 --kv-budget 0.2` runs for every budgeted policy (issue 50 item
// 3): a one-token prompt is far below the policy's fixed regions, so the fraction is floored at
// the smallest valid budget (and --kv-stats says so) instead of refused; --kv-budget-bytes
// stays exact and is refused with a clear message.
#include <gtest/gtest.h>

#include <string>

#include "e2e/e2e_process.h"
#include "kvcache/registry.h"

namespace qevict {
namespace {

class CliBudgetFloor : public CliTest {
 protected:
  // generate's exit status; its stderr in stderr_.
  int generate(const std::string& kv) {
    const CliRun r = run("generate -t 2 -p Hi -n 8 --temp 0 --kv-stats " + kv);
    stderr_ = r.err;
    return r.rc;
  }
  std::string stderr_;
};

TEST_F(CliBudgetFloor, GenerateWithAShortPromptRunsForEveryBudgetedPolicy) {
  for (const auto& row : policy_registry()) {
    if (row.kind != CacheKind::kWindowed && row.kind != CacheKind::kPerHead) continue;
    SCOPED_TRACE(row.name);
    EXPECT_EQ(generate("--kv-policy " + row.name + " --kv-budget 0.2"), 0) << stderr_;
    EXPECT_NE(stderr_.find("kv-stats: budget floored at "), std::string::npos) << stderr_;
  }
}

TEST_F(CliBudgetFloor, BudgetInBytesBelowTheSinkAndLocalRegionIsRefused) {
  EXPECT_NE(generate("--kv-policy qevict --kv-budget-bytes 7000"), 0);
  EXPECT_NE(stderr_.find("does not cover the sink"), std::string::npos) << stderr_;
}

}  // namespace
}  // namespace qevict
