// When a cache routes (SPEC §1, §4): one schedule shared by every cache with a rule — the
// tiered cache, the per-head caches and the quantizers that compress a prompt (KIVI,
// ZipCache). It counts decode steps since the last routing event, defers the prompt's routing
// with --prefill-route end (the prompt held) or staged (the prompt staged at low bits) until it
// is complete, tracks the most bytes held and times events.
// The cache asks it what a commit calls for and does that; the schedule never touches storage.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "core/byte_io.h"
#include "core/status.h"
#include "kvcache/params.h"
#include "kvcache/routing_observer.h"

namespace qevict {

class RoutingSchedule {
 public:
  // What a commit calls for.
  enum class Due {
    kNothing,      // a decode step before Ω steps have passed since the last event
    kHoldPrompt,   // a prefill chunk of a deferred prompt (end): keep it, route nothing yet
    kStagePrompt,  // a prefill chunk of a staged prompt: quantize the windows that left the
                   // local region into the low-bit tier, evict nothing, route nothing yet
    kPrompt,       // the first decode step after a deferred prompt: route the prompt now
    kChunk,        // a prefill chunk (--prefill-route chunk): route after it
    kDecode,       // Ω decode steps since the last event
  };

  RoutingSchedule(PrefillRoute route, int route_every) : route_(route), route_every_(route_every) {}

  // A call of n_new tokens was committed and the cache now holds `bytes_held`: counts the
  // step, notes the peak, and says what is due. A chunk of a deferred prompt marks the
  // prompt pending (kHoldPrompt, kStagePrompt).
  Due on_commit(int64_t n_new, size_t bytes_held) {
    ++steps_;
    note_bytes(bytes_held);
    const bool chunk = n_new > 1;
    if (defers_prompt()) {
      if (chunk) {
        pending_ = true;
        return route_ == PrefillRoute::kStaged ? Due::kStagePrompt : Due::kHoldPrompt;
      }
      if (pending_) return Due::kPrompt;
    }
    if (chunk) return Due::kChunk;
    return steps_ >= route_every_ ? Due::kDecode : Due::kNothing;
  }

  // --prefill-route end or staged: the prompt is routed once, at end_prompt().
  bool defers_prompt() const { return route_ != PrefillRoute::kChunk; }
  // --prefill-route end: until then every prompt token is held in full precision.
  bool holds_prompt() const { return route_ == PrefillRoute::kEnd; }
  // Prompt tokens committed and not yet routed.
  bool prompt_pending() const { return pending_; }
  // For caches that decide themselves when a prompt call is held (the quantizers).
  void hold_prompt() { pending_ = true; }
  void prompt_routed() { pending_ = false; }

  // A routing event's bounds: the clock (and an observer, e.g. the trace) around it; the
  // event count and the step count restart.
  void event_begin(int64_t n_past, bool decode, RoutingObserver* obs = nullptr) {
    clock_.on_event_begin(events_, n_past, decode);
    if (obs) obs->on_event_begin(events_, n_past, decode);
  }
  void event_end(RoutingObserver* obs = nullptr) {
    clock_.on_event_end(events_);
    if (obs) obs->on_event_end(events_);
    ++events_;
    steps_ = 0;
  }

  void note_bytes(size_t bytes_held) { peak_ = std::max(peak_, bytes_held); }
  int64_t events() const { return events_; }
  size_t peak_bytes() const { return peak_; }
  const RoutingClock& clock() const { return clock_; }
  int route_every() const { return route_every_; }

  // Sessions: the step count, events, peak and pending flag (the clock's times restart).
  void save(ByteWriter& w) const {
    w.put<int32_t>(steps_);
    w.put<int64_t>(events_);
    w.put<uint64_t>(peak_);
    w.put<uint8_t>(pending_);
  }
  Status load(ByteReader& r) {
    int32_t steps = 0;
    int64_t events = 0;
    uint64_t peak = 0;
    uint8_t pending = 0;
    QEVICT_RETURN_IF_ERROR(r.get(&steps));
    QEVICT_RETURN_IF_ERROR(r.get(&events));
    QEVICT_RETURN_IF_ERROR(r.get(&peak));
    QEVICT_RETURN_IF_ERROR(r.get(&pending));
    if (steps < 0 || events < 0 || pending > 1)
      return Status::error("session state: a corrupt routing schedule");
    steps_ = steps, events_ = events, peak_ = size_t(peak), pending_ = pending != 0;
    return Status::ok();
  }

  // Forgets the sequence (clear()).
  void reset() {
    steps_ = 0;
    events_ = 0;
    peak_ = 0;
    pending_ = false;
    clock_.reset();
  }

 private:
  PrefillRoute route_;
  int route_every_;
  int steps_ = 0;
  int64_t events_ = 0;
  size_t peak_ = 0;  // most bytes held after any call (before its routing)
  bool pending_ = false;
  RoutingClock clock_;
};

// The last N queries of a prompt per layer (a SnapKV-style observation window: the tiered
// cache's --prefill-window, the SnapKV family's w), oldest first. A call's queries are kept
// by keep() for each layer, then commit() counts them once for all layers.
class QueryWindow {
 public:
  QueryWindow(int n_layers, int64_t n, int64_t q_width)
      : n_layers_(n_layers), n_(n), qw_(q_width) {}

  int64_t capacity() const { return n_; }
  // Queries held per layer (≤ N), before this call's.
  int64_t held() const { return held_; }
  // Queries per layer once keep() has taken a call of n_new: the window's rows for it.
  int64_t held_after(int64_t n_new) const {
    return std::min(held_, n_ - std::min(n_new, n_)) + std::min(n_new, n_);
  }
  // Allocates the window (every layer's N rows).
  void allocate() { q_.resize(size_t(n_layers_) * n_ * qw_); }
  // Frees the rows (held only while a prompt is read).
  void release() {
    held_ = 0;
    std::vector<float>().swap(q_);
  }
  // Keeps the last of this call's n_new queries (q f32 [n_new][q_width]) of `layer`, the
  // window spanning this call and earlier ones. allocate() first.
  void keep(int layer, const float* q, int64_t n_new) {
    float* ring = rows(layer);
    const int64_t kept = std::min(held_, n_ - std::min(n_new, n_));  // older rows that stay
    const int64_t fresh = std::min(n_new, n_);
    std::copy(ring + (held_ - kept) * qw_, ring + held_ * qw_, ring);
    std::copy(q + (n_new - fresh) * qw_, q + n_new * qw_, ring + kept * qw_);
  }
  // The call is committed (every layer kept its queries).
  void commit(int64_t n_new) { held_ = std::min<int64_t>(n_, held_ + n_new); }
  void reset_count() { held_ = 0; }
  // f32 [N][q_width] rows of `layer`, oldest first.
  float* rows(int layer) { return q_.data() + size_t(layer) * n_ * qw_; }
  const float* rows(int layer) const { return q_.data() + size_t(layer) * n_ * qw_; }
  size_t bytes() const { return q_.capacity() * sizeof(float); }
  bool allocated() const { return !q_.empty(); }

 private:
  int n_layers_;
  int64_t n_, qw_;
  int64_t held_ = 0;
  std::vector<float> q_;  // f32 [n_layers][N][q_width]
};

}  // namespace qevict
