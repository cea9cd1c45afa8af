// Generation loop: chunked prefill of each prompt, then batched one-token decode steps over
// all live sequences (one forward call per step for the whole batch), sampling each
// sequence with its own sampler, streaming tokens through a callback.
#pragma once

#include <functional>
#include <vector>

#include "core/status.h"
#include "core/thread_pool.h"
#include "engine/sampling.h"
#include "kvcache/kv_cache.h"
#include "model/model.h"

namespace qevict {

struct GenerationRequest {
  SequenceKvCache* cache = nullptr;  // empty or holding a previous turn's tokens
  std::vector<int32_t> prompt;       // tokens to append before generating (non-empty)
  int n_predict = 128;               // generate at most this many tokens
  SamplingParams sampling;
  std::vector<int32_t> stop_tokens;  // generation ends after emitting one of these
  // Shared prefill (engine/prefill_share.h): the index of another request in the same call
  // with the same prompt whose prefill this one reuses instead of running the model on its
  // prompt. -1: its own prefill. Both caches must start empty and keep every prompt token
  // until end_prompt() (SequenceKvCache::prefill_keeps_everything); the source must not
  // itself share.
  int share_prefill_of = -1;

  // Results.
  std::vector<int32_t> output;  // generated tokens (a stop token included)
  bool hit_stop = false;
};

struct GenerateOptions {
  int prefill_chunk = 512;  // prompt tokens per forward call
  // Requests sharing a prefill are replayed and end their prompt this many at a time, so at
  // most this many copies of a whole prompt are held at once beside the sources (an eval
  // sample replays into ~60 caches: at 16K tokens, ~200 MB each on Qwen 0.5B).
  int replay_group = 8;
  Status validate() const;
};

struct GenerationStats {
  int64_t n_prompt = 0;                // prompt tokens processed by the model
  int64_t n_prompt_shared = 0;         // prompt tokens replayed from another request's prefill
  int64_t n_decode_calls = 0;          // decode forward calls (tokens per sequence after the first)
  int64_t n_generated = 0;             // tokens sampled, all sequences
  double prompt_seconds = 0.0;         // prefill wall time: the three parts below
  double prompt_model_seconds = 0.0;   // the model's forward calls over the prompts
  double prompt_replay_seconds = 0.0;  // shared prefills replayed (and their masses computed)
  double prompt_end_seconds = 0.0;     // end_prompt(): the caches compressing the prompt
  double decode_seconds = 0.0;         // decode wall time
  // The most bytes the requests' caches held together while the prompts went in (sampled
  // after the prefill and after each replay group, before it ends its prompt).
  size_t peak_prompt_bytes = 0;
};

// Called for every generated token of request `index`; return false to stop that request.
using TokenCallback = std::function<bool(size_t index, int32_t token)>;

Status generate(Model& model, ThreadPool& pool, std::vector<GenerationRequest>& requests,
                const GenerateOptions& opts, const TokenCallback& on_token, GenerationStats* stats);

}  // namespace qevict
