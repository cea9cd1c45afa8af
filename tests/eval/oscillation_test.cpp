// The oscillating ledger workload (eval/oscillation.h): churn happens, budgets hold, runs repeat.
#include "eval/oscillation.h"

#include <gtest/gtest.h>

#include <cstddef>
#include <cstdint>

namespace qevict::eval {
namespace {

constexpr int kDecodeSteps = 256;
constexpr int64_t kPromptWindows = 16, kOmega = 8;
// Events at the start may still be settling (the prompt's windows age in and get ranked).
constexpr size_t kWarmupEvents = 4;

// One run per mode, shared by the tests below (each run is ~256 decode steps).
const OscillationResult& result(bool strict) {
  static const OscillationResult lax = run_oscillation(false, kDecodeSteps);
  static const OscillationResult str = run_oscillation(true, kDecodeSteps);
  return strict ? str : lax;
}

void expect_oscillates(const OscillationResult& r) {
  ASSERT_GT(r.events.size(), kWarmupEvents + 4);
  size_t with_promo = 0, with_demo = 0, n = 0;
  for (size_t i = kWarmupEvents; i < r.events.size(); ++i, ++n) {
    with_promo += r.events[i].promotions >= 1;
    with_demo += r.events[i].demotions >= 1;
  }
  EXPECT_GT(2 * with_promo, n) << with_promo << " of " << n << " events promote";
  EXPECT_GT(2 * with_demo, n) << with_demo << " of " << n << " events demote";
  int64_t promos = 0, demos = 0;
  for (const auto& e : r.events) {
    promos += e.promotions;
    demos += e.demotions;
  }
  EXPECT_EQ(promos, r.promotions);
  EXPECT_EQ(demos, r.demotions);
  // Every window is quantized at most once, however often it swaps:
  // 16 prompt windows + 256 / 8 decode windows = 48.
  EXPECT_GT(r.quantizations, 0);
  EXPECT_LE(r.quantizations, kPromptWindows + kDecodeSteps / kOmega);
  // Swaps are many more than quantizations (the ledger is reused).
  EXPECT_GT(r.promotions, r.quantizations);
  // The F set changes almost entirely between routing events (mean Jaccard distance).
  EXPECT_GT(r.churn_full, 0.5);
  EXPECT_GT(r.capacity_full, 0);
  EXPECT_LE(r.max_ledger_bytes_of_full, size_t(r.capacity_full) * r.window_quant);
}

TEST(Oscillation, NonStrictOscillates) { expect_oscillates(result(false)); }

TEST(Oscillation, StrictOscillates) { expect_oscillates(result(true)); }

TEST(Oscillation, CapacityIsFourFullWindows) {
  // The workload sizes B_hist so that K_f = floor(0.3 B_hist / M_f) = 4.
  EXPECT_EQ(result(false).capacity_full, 4);
  EXPECT_EQ(result(true).capacity_full, 4);
}

TEST(Oscillation, StrictStaysWithinBudget) {
  const OscillationResult& r = result(true);
  ASSERT_TRUE(r.strict);
  for (size_t i = 0; i < r.events.size(); ++i)
    EXPECT_LE(r.events[i].budgeted_bytes, r.budget_bytes)
        << "event " << i << " n_past " << r.events[i].n_past;
  EXPECT_LE(r.max_budgeted_bytes, r.budget_bytes);
}

TEST(Oscillation, NonStrictHoldsLedgerOutsideBudget) {
  const OscillationResult& r = result(false);
  ASSERT_FALSE(r.strict);
  bool ledger_seen = false;
  for (size_t i = 0; i < r.events.size(); ++i) {
    ledger_seen |= r.events[i].ledger_bytes_of_full > 0;
    EXPECT_LE(r.events[i].budgeted_bytes, r.budget_bytes)
        << "event " << i << " n_past " << r.events[i].n_past;
  }
  EXPECT_TRUE(ledger_seen);
  EXPECT_GT(r.max_ledger_bytes_of_full, size_t(0));
}

void expect_same_events(const OscillationResult& a, const OscillationResult& b) {
  ASSERT_EQ(a.events.size(), b.events.size());
  for (size_t i = 0; i < a.events.size(); ++i) {
    const OscillationEvent &x = a.events[i], &y = b.events[i];
    EXPECT_EQ(x.n_past, y.n_past) << "event " << i;
    EXPECT_EQ(x.promotions, y.promotions) << "event " << i;
    EXPECT_EQ(x.demotions, y.demotions) << "event " << i;
    EXPECT_EQ(x.ledger_bytes_of_full, y.ledger_bytes_of_full) << "event " << i;
    EXPECT_EQ(x.budgeted_bytes, y.budgeted_bytes) << "event " << i;
    EXPECT_EQ(x.allocated_bytes, y.allocated_bytes) << "event " << i;
  }
  EXPECT_EQ(a.quantizations, b.quantizations);
  EXPECT_EQ(a.churn_full, b.churn_full);
}

TEST(Oscillation, Deterministic) {
  expect_same_events(result(false), run_oscillation(false, kDecodeSteps));
  expect_same_events(result(true), run_oscillation(true, kDecodeSteps));
}

}  // namespace
}  // namespace qevict::eval
