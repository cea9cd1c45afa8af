// Prometheus text of the scheduler's metrics (see metrics.h).
#include "server/metrics.h"

#include <fmt/format.h>

#include <array>
#include <optional>

namespace qevict {

namespace {

constexpr const char* kCounter = "counter";
constexpr const char* kGauge = "gauge";

// One metric of the exposition: its HELP and TYPE lines, then one line of `value`, or with
// `by_tier` one line per tier (label tier="full", "quant", "sink").
struct Row {
  const char* name;  // after the prefix qevict_
  const char* help;
  const char* type;
  double value = 0.0;
  std::optional<std::array<size_t, 3>> by_tier = std::nullopt;
};

}  // namespace

std::string prometheus_metrics(const SchedulerMetrics& m) {
  using Tiers = std::array<size_t, 3>;
  const Row rows[] = {
      {"requests_total", "requests received", kCounter, double(m.requests)},
      {"requests_refused_total", "requests refused with 429 (queue full)", kCounter,
       double(m.refused_queue_full)},
      {"requests_finished_total", "requests answered", kCounter, double(m.finished)},
      {"requests_cancelled_total", "requests whose client left", kCounter, double(m.cancelled)},
      {"requests_failed_total", "requests that failed", kCounter, double(m.failed)},
      {"kv_budget_floored_total",
       "requests whose KV budget fraction was raised to the policy's fixed regions (short context)",
       kCounter, double(m.budget_floored)},
      {"prompt_tokens_total", "prompt tokens processed", kCounter, double(m.prompt_tokens)},
      {"generated_tokens_total", "tokens generated", kCounter, double(m.generated_tokens)},
      {"queue_depth", "requests waiting for room in the KV pool", kGauge, double(m.waiting)},
      {"active_sequences", "sequences in the batch", kGauge, double(m.active)},
      {"kv_pool_bytes", "the KV byte pool", kGauge, double(m.pool_bytes)},
      {"kv_reserved_bytes", "bytes reserved by admitted requests", kGauge,
       double(m.reserved_bytes)},
      {"kv_held_bytes", "bytes the running requests' caches hold (real allocations)", kGauge,
       double(m.held_bytes)},
      {"kv_held_max_bytes",
       "the most held after any step (running requests and idle conversations)", kGauge,
       double(m.max_held_bytes)},
      {"kv_tier_bytes", "bytes in use by tier", kGauge, 0.0,
       Tiers{m.held_full, m.held_quant, m.held_sink}},
      {"evictions_total", "windows/tokens evicted (finished sequences)", kCounter,
       double(m.evictions)},
      {"promotions_total", "windows promoted Q to F (finished sequences)", kCounter,
       double(m.promotions)},
      // Conversation reuse (engine/scheduler.h).
      {"sessions_in_memory", "idle conversations whose cache is in memory", kGauge,
       double(m.sessions_in_memory)},
      {"sessions_on_disk", "idle conversations held only in --session-dir", kGauge,
       double(m.sessions_on_disk)},
      {"session_hits_total", "requests that resumed a conversation", kCounter,
       double(m.session_hits)},
      {"session_misses_total", "requests that started a new cache (reuse on)", kCounter,
       double(m.session_misses)},
      {"prompt_tokens_reused_total", "prompt tokens taken from a conversation's cache", kCounter,
       double(m.reused_tokens)},
      {"sessions_written_total", "session files written to --session-dir", kCounter,
       double(m.sessions_written)},
      {"sessions_dropped_total", "idle conversations dropped for room (not written)", kCounter,
       double(m.sessions_dropped)},
      {"sessions_restored_total", "conversations read back from --session-dir", kCounter,
       double(m.sessions_restored)},
      {"session_bytes", "bytes idle conversations hold in the KV pool", kGauge,
       double(m.session_bytes)},
      {"session_tier_bytes", "bytes idle conversations hold, by tier", kGauge, 0.0,
       Tiers{m.session_full, m.session_quant, m.session_sink}},
      {"steps_total", "scheduler steps (forward calls)", kCounter, double(m.steps)},
      {"decode_tokens_per_second", "tokens per second of decoding steps", kGauge,
       m.decode_seconds > 0 ? double(m.decode_tokens) / m.decode_seconds : 0.0},
  };
  static constexpr const char* kTierNames[] = {"full", "quant", "sink"};
  std::string s;
  for (const Row& r : rows) {
    s += fmt::format("# HELP qevict_{0} {1}\n# TYPE qevict_{0} {2}\n", r.name, r.help, r.type);
    if (!r.by_tier) {
      s += fmt::format("qevict_{} {}\n", r.name, r.value);
      continue;
    }
    for (size_t t = 0; t < r.by_tier->size(); ++t)
      s += fmt::format("qevict_{}{{tier=\"{}\"}} {}\n", r.name, kTierNames[t], (*r.by_tier)[t]);
  }
  return s;
}

}  // namespace qevict
