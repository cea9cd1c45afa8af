// GET /metrics: the scheduler's counters and gauges in Prometheus' text format (version
// 0.0.4), every name prefixed qevict_, each with its HELP and TYPE lines.
#pragma once

#include <string>

#include "engine/scheduler.h"

namespace qevict {

std::string prometheus_metrics(const SchedulerMetrics& m);

}  // namespace qevict
