// Observers of routing events, kept out of the cache's routing code: the JSONL trace
// (--kv-trace) and the clock behind the routing times in KvReport.
#pragma once

#include <chrono>
#include <cstdio>
#include <memory>
#include <string>

#include "core/atomic_file.h"
#include "core/status.h"
#include "kvcache/window_store.h"

namespace qevict {

class RoutingObserver {
 public:
  virtual ~RoutingObserver() = default;
  // A routing event starts at n_past; `decode` when Ω decode steps triggered it.
  virtual void on_event_begin(int64_t event, int64_t n_past, bool decode) {}
  // Layer `layer` has applied its plan.
  virtual void on_layer_routed(int64_t event, int64_t n_past, int layer, const WindowStore& s) {}
  virtual void on_event_end(int64_t event) {}
};

// Wall time of routing events: all of them, and those that decode steps triggered.
class RoutingClock final : public RoutingObserver {
 public:
  void on_event_begin(int64_t, int64_t, bool decode) override {
    decode_ = decode;
    t0_ = std::chrono::steady_clock::now();
  }
  void on_event_end(int64_t) override {
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0_).count();
    seconds += s;
    if (decode_) seconds_decode += s;
  }
  void reset() { seconds = seconds_decode = 0.0; }
  double seconds = 0.0, seconds_decode = 0.0;

 private:
  bool decode_ = false;
  std::chrono::steady_clock::time_point t0_;
};

// --kv-trace: one JSON line per routing event and layer with the tier of every window and
// its score: {"event":E,"n_past":N,"layer":l,"tiers":"LFQE...","scores":[...]}. Lines go to a
// temporary file beside the destination, renamed over it when the trace is closed (the cache is
// destroyed), so a killed run never leaves a truncated trace under the given name.
class RoutingTrace final : public RoutingObserver {
 public:
  static Expected<std::unique_ptr<RoutingTrace>> open(const std::string& path);
  ~RoutingTrace() override;
  void on_layer_routed(int64_t event, int64_t n_past, int layer, const WindowStore& s) override;

 private:
  RoutingTrace() = default;
  AtomicFile file_;
};

}  // namespace qevict
