// The server's prefill order (engine/scheduler.h, pick_prefill) without a model: shortest
// remaining prompt first, ties to the earlier admitted, and the starvation bound (a prompt
// overtaken `limit` times goes first; 0 is first come, first served). The scheduler's own
// counting is run on the real model in tests/e2e/scheduler_model_test.cpp.
#include <gtest/gtest.h>

#include "engine/scheduler.h"

namespace qevict {
namespace {

TEST(PickPrefill, TheShortestRemainingPromptGoesFirstNotTheFirstAdmitted) {
  // A long first turn admitted before a short follow-up: first come, first served took 0.
  EXPECT_EQ(pick_prefill({{4096, 0}, {300, 0}}, 64), 1);
  // Remaining tokens, not prompt length: a long prompt nearly read goes before a fresh one.
  EXPECT_EQ(pick_prefill({{300, 0}, {4000, 0}, {12, 0}, {300, 0}}, 64), 2);
}

TEST(PickPrefill, TiesGoToTheEarlierAdmitted) {
  EXPECT_EQ(pick_prefill({{256, 0}, {256, 0}, {256, 0}}, 64), 0);
  EXPECT_EQ(pick_prefill({{500, 0}, {256, 0}, {256, 0}}, 64), 1);
}

TEST(PickPrefill, APromptOvertakenLimitTimesGoesFirst) {
  EXPECT_EQ(pick_prefill({{4096, 63}, {16, 0}}, 64), 1);  // one short of the bound: yields
  EXPECT_EQ(pick_prefill({{4096, 64}, {16, 0}}, 64), 0);
  // Several at the bound: the earliest admitted of them, however long.
  EXPECT_EQ(pick_prefill({{16, 0}, {4096, 64}, {200, 64}, {8, 0}}, 64), 1);
}

TEST(PickPrefill, LimitZeroIsFirstComeFirstServed) {
  EXPECT_EQ(pick_prefill({{4096, 0}, {16, 0}, {1, 0}}, 0), 0);
}

TEST(PickPrefill, NothingToReadIsMinusOne) { EXPECT_EQ(pick_prefill({}, 64), -1); }

}  // namespace
}  // namespace qevict
