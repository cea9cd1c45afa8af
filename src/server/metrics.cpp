// Prometheus text of the scheduler's metrics (see metrics.h).
#include "server/metrics.h"

#include <fmt/format.h>

namespace qevict {

std::string prometheus_metrics(const SchedulerMetrics& m) {
  std::string s;
  auto add = [&](const char* name, const char* type, const char* help, double v) {
    s += fmt::format("# HELP qevict_{} {}\n# TYPE qevict_{} {}\nqevict_{} {}\n", name, help, name,
                     type, name, v);
  };
  add("requests_total", "counter", "requests received", double(m.requests));
  add("requests_refused_total", "counter", "requests refused with 429 (queue full)",
      double(m.refused_queue_full));
  add("requests_finished_total", "counter", "requests answered", double(m.finished));
  add("requests_cancelled_total", "counter", "requests whose client left", double(m.cancelled));
  add("requests_failed_total", "counter", "requests that failed", double(m.failed));
  add("kv_budget_floored_total", "counter",
      "requests whose KV budget fraction was raised to the policy's fixed regions (short context)",
      double(m.budget_floored));
  add("prompt_tokens_total", "counter", "prompt tokens processed", double(m.prompt_tokens));
  add("generated_tokens_total", "counter", "tokens generated", double(m.generated_tokens));
  add("queue_depth", "gauge", "requests waiting for room in the KV pool", double(m.waiting));
  add("active_sequences", "gauge", "sequences in the batch", double(m.active));
  add("kv_pool_bytes", "gauge", "the KV byte pool", double(m.pool_bytes));
  add("kv_reserved_bytes", "gauge", "bytes reserved by admitted requests",
      double(m.reserved_bytes));
  add("kv_held_bytes", "gauge", "bytes the running requests' caches hold (real allocations)",
      double(m.held_bytes));
  add("kv_held_max_bytes", "gauge",
      "the most held after any step (running requests and idle conversations)",
      double(m.max_held_bytes));
  s += "# HELP qevict_kv_tier_bytes bytes in use by tier\n# TYPE qevict_kv_tier_bytes gauge\n";
  s += fmt::format("qevict_kv_tier_bytes{{tier=\"full\"}} {}\n", m.held_full);
  s += fmt::format("qevict_kv_tier_bytes{{tier=\"quant\"}} {}\n", m.held_quant);
  s += fmt::format("qevict_kv_tier_bytes{{tier=\"sink\"}} {}\n", m.held_sink);
  add("evictions_total", "counter", "windows/tokens evicted (finished sequences)",
      double(m.evictions));
  add("promotions_total", "counter", "windows promoted Q to F (finished sequences)",
      double(m.promotions));
  add("sessions_in_memory", "gauge", "idle conversations whose cache is in memory",
      double(m.sessions_in_memory));
  add("sessions_on_disk", "gauge", "idle conversations held only in --session-dir",
      double(m.sessions_on_disk));
  add("session_hits_total", "counter", "requests that resumed a conversation",
      double(m.session_hits));
  add("session_misses_total", "counter", "requests that started a new cache (reuse on)",
      double(m.session_misses));
  add("prompt_tokens_reused_total", "counter", "prompt tokens taken from a conversation's cache",
      double(m.reused_tokens));
  add("sessions_written_total", "counter", "session files written to --session-dir",
      double(m.sessions_written));
  add("sessions_dropped_total", "counter", "idle conversations dropped for room (not written)",
      double(m.sessions_dropped));
  add("sessions_restored_total", "counter", "conversations read back from --session-dir",
      double(m.sessions_restored));
  add("session_bytes", "gauge", "bytes idle conversations hold in the KV pool",
      double(m.session_bytes));
  s += "# HELP qevict_session_tier_bytes bytes idle conversations hold, by tier\n"
       "# TYPE qevict_session_tier_bytes gauge\n";
  s += fmt::format("qevict_session_tier_bytes{{tier=\"full\"}} {}\n", m.session_full);
  s += fmt::format("qevict_session_tier_bytes{{tier=\"quant\"}} {}\n", m.session_quant);
  s += fmt::format("qevict_session_tier_bytes{{tier=\"sink\"}} {}\n", m.session_sink);
  add("steps_total", "counter", "scheduler steps (forward calls)", double(m.steps));
  add("decode_tokens_per_second", "gauge", "tokens per second of decoding steps",
      m.decode_seconds > 0 ? double(m.decode_tokens) / m.decode_seconds : 0.0);
  return s;
}

}  // namespace qevict
