// GET /metrics's text (src/server/metrics.*): Prometheus' format, exact for chosen values.
#include "server/metrics.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <string>

namespace qevict {
namespace {

TEST(PrometheusMetrics, ExactLinesForChosenValues) {
  SchedulerMetrics m;
  m.requests = 12;
  m.refused_queue_full = 2;
  m.pool_bytes = size_t(1) << 29;
  m.held_full = 1000;
  m.held_quant = 250;
  m.held_sink = 0;
  m.decode_seconds = 2.0;
  m.decode_tokens = 45;
  const std::string s = prometheus_metrics(m);
  EXPECT_EQ(s.substr(0, s.find("# HELP qevict_requests_finished_total")),
            "# HELP qevict_requests_total requests received\n"
            "# TYPE qevict_requests_total counter\n"
            "qevict_requests_total 12\n"
            "# HELP qevict_requests_refused_total requests refused with 429 (queue full)\n"
            "# TYPE qevict_requests_refused_total counter\n"
            "qevict_requests_refused_total 2\n");
  EXPECT_NE(s.find("\nqevict_kv_pool_bytes 536870912\n"), std::string::npos) << s;
  EXPECT_NE(s.find("# HELP qevict_kv_tier_bytes bytes in use by tier\n"
                   "# TYPE qevict_kv_tier_bytes gauge\n"
                   "qevict_kv_tier_bytes{tier=\"full\"} 1000\n"
                   "qevict_kv_tier_bytes{tier=\"quant\"} 250\n"
                   "qevict_kv_tier_bytes{tier=\"sink\"} 0\n"),
            std::string::npos)
      << s;
  const std::string tail =
      "# HELP qevict_decode_tokens_per_second tokens per second of decoding steps\n"
      "# TYPE qevict_decode_tokens_per_second gauge\n"
      "qevict_decode_tokens_per_second 22.5\n";
  ASSERT_GE(s.size(), tail.size());
  EXPECT_EQ(s.substr(s.size() - tail.size()), tail);
  // Requests whose budget fraction was floored (issue 50 item 3).
  m.budget_floored = 3;
  const std::string floored = prometheus_metrics(m);
  EXPECT_NE(floored.find("# TYPE qevict_kv_budget_floored_total counter\n"
                         "qevict_kv_budget_floored_total 3\n"),
            std::string::npos)
      << floored;
  // 27 metrics of one value with their HELP and TYPE lines, then two by-tier metrics of 2 + 3
  // lines each (the running caches', the idle conversations').
  EXPECT_EQ(std::count(s.begin(), s.end(), '\n'), 27 * 3 + 2 * 5);
  // Conversation reuse (issue 50 item 2).
  m.sessions_in_memory = 4;
  m.sessions_on_disk = 7;
  m.session_hits = 11;
  m.session_misses = 5;
  m.reused_tokens = 4321;
  m.session_bytes = 123456;
  m.session_quant = 99;
  const std::string ses = prometheus_metrics(m);
  for (const char* line :
       {"\nqevict_sessions_in_memory 4\n", "\nqevict_sessions_on_disk 7\n",
        "\nqevict_session_hits_total 11\n", "\nqevict_session_misses_total 5\n",
        "\nqevict_prompt_tokens_reused_total 4321\n", "\nqevict_session_bytes 123456\n",
        "\nqevict_session_tier_bytes{tier=\"quant\"} 99\n"})
    EXPECT_NE(ses.find(line), std::string::npos) << line << ses;
}

// The conversation-reuse metrics (issue 50 item 2): every name, HELP text, TYPE and value, in
// order, for distinct values (dashboards and alerts key on the names and types).
TEST(PrometheusMetrics, SessionMetricsNamesTypesAndValues) {
  SchedulerMetrics m;
  m.sessions_in_memory = 1;
  m.sessions_on_disk = 2;
  m.session_hits = 3;
  m.session_misses = 4;
  m.reused_tokens = 5;
  m.sessions_written = 6;
  m.sessions_dropped = 7;
  m.sessions_restored = 8;
  m.session_bytes = 9;
  m.session_full = 10;
  m.session_quant = 11;
  m.session_sink = 12;
  const std::string s = prometheus_metrics(m);
  const size_t from = s.find("# HELP qevict_sessions_in_memory ");
  const size_t to = s.find("# HELP qevict_steps_total ");
  ASSERT_NE(from, std::string::npos) << s;
  ASSERT_NE(to, std::string::npos) << s;
  EXPECT_EQ(s.substr(from, to - from),
            "# HELP qevict_sessions_in_memory idle conversations whose cache is in memory\n"
            "# TYPE qevict_sessions_in_memory gauge\n"
            "qevict_sessions_in_memory 1\n"
            "# HELP qevict_sessions_on_disk idle conversations held only in --session-dir\n"
            "# TYPE qevict_sessions_on_disk gauge\n"
            "qevict_sessions_on_disk 2\n"
            "# HELP qevict_session_hits_total requests that resumed a conversation\n"
            "# TYPE qevict_session_hits_total counter\n"
            "qevict_session_hits_total 3\n"
            "# HELP qevict_session_misses_total requests that started a new cache (reuse on)\n"
            "# TYPE qevict_session_misses_total counter\n"
            "qevict_session_misses_total 4\n"
            "# HELP qevict_prompt_tokens_reused_total prompt tokens taken from a conversation's "
            "cache\n"
            "# TYPE qevict_prompt_tokens_reused_total counter\n"
            "qevict_prompt_tokens_reused_total 5\n"
            "# HELP qevict_sessions_written_total session files written to --session-dir\n"
            "# TYPE qevict_sessions_written_total counter\n"
            "qevict_sessions_written_total 6\n"
            "# HELP qevict_sessions_dropped_total idle conversations dropped for room (not "
            "written)\n"
            "# TYPE qevict_sessions_dropped_total counter\n"
            "qevict_sessions_dropped_total 7\n"
            "# HELP qevict_sessions_restored_total conversations read back from --session-dir\n"
            "# TYPE qevict_sessions_restored_total counter\n"
            "qevict_sessions_restored_total 8\n"
            "# HELP qevict_session_bytes bytes idle conversations hold in the KV pool\n"
            "# TYPE qevict_session_bytes gauge\n"
            "qevict_session_bytes 9\n"
            "# HELP qevict_session_tier_bytes bytes idle conversations hold, by tier\n"
            "# TYPE qevict_session_tier_bytes gauge\n"
            "qevict_session_tier_bytes{tier=\"full\"} 10\n"
            "qevict_session_tier_bytes{tier=\"quant\"} 11\n"
            "qevict_session_tier_bytes{tier=\"sink\"} 12\n");
}

}  // namespace
}  // namespace qevict
