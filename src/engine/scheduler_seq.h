// The scheduler's record of one request (engine/scheduler.h), shared by scheduler.cpp and
// scheduler_sessions.cpp. Internal to the engine.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "engine/sampling.h"
#include "engine/scheduler.h"
#include "kvcache/report.h"

namespace qevict {

struct Scheduler::Seq {
  ServeRequest req;
  std::shared_ptr<ServeStream> out;
  std::unique_ptr<SequenceKvCache> cache;
  KvCacheParams kv;       // the cache's params (reuse: a fraction budget made bytes)
  int64_t cache_ctx = 0;  // the cache's context
  bool floored = false;   // the budget was floored (KvBudget::floored)
  std::string key;        // kv_params_key(kv)
  std::string id;         // its session's id (reuse on)
  bool named = false;
  int64_t cached = 0;               // prompt tokens reused from a session
  std::vector<int32_t> out_tokens;  // generated, a stop token included
  KvLayerReport base;               // a resumed cache's counters when it was resumed
  size_t reserved = 0;
  int64_t fed = 0;        // prompt tokens given to the model
  int64_t overtaken = 0;  // PrefillWait::overtaken; while waiting, admissions past it
  bool decoding = false;
  bool done = false;
  bool failed = false;
  int generated = 0;
  int32_t next = -1;
  std::vector<float> logits;
  std::unique_ptr<Sampler> sampler;
};

}  // namespace qevict
