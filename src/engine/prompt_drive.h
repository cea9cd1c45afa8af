// How a prompt goes into caches (SPEC §4), the one path every caller takes — generate, the
// scheduler, perplexity, diagnose and bench: the prompt in chunks, every sequence's chunk in one
// forward call, then the prompt's end, where a cache with --prefill-route end compresses once
// (end_prompts). Decode loops stay the callers' own: they differ in what a step does (sampling,
// teacher forcing, timing, lockstep comparison).
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "core/status.h"
#include "core/thread_pool.h"
#include "kvcache/kv_cache.h"
#include "model/model.h"

namespace qevict {

// One sequence's prompt.
struct PromptFeed {
  SequenceKvCache* cache = nullptr;
  const int32_t* tokens = nullptr;  // the prompt, n tokens
  int64_t n = 0;
  // Logits out, null for none: with all_logits f32 [chunk][n_vocab], every position of each
  // call (read them in on_call); else f32 [n_vocab], the prompt's last position.
  float* logits = nullptr;
  bool all_logits = false;
  // Logits of every call's last position (f32 [n_vocab]), not only the prompt's last: a
  // reference cache compared call by call (diagnose).
  bool every_call = false;
};

// Called after forward call `call` (0-based), which fed each sequence's tokens [offset,
// offset + n) (the same for all: lockstep; n is the first sequence's).
using PromptCallback = std::function<Status(int64_t call, int64_t offset, int64_t n)>;

// Feeds the prompts in chunks of `chunk` tokens (prompts of different lengths drop out as
// they end), then, with `end`, ends every prompt (end_prompts).
Status prefill_prompts(Model& model, const std::vector<PromptFeed>& seqs, int64_t chunk,
                       ThreadPool& pool, bool end, const PromptCallback& on_call = nullptr);

// The prompts are complete: each cache compresses now if it defers its prompt. One cache runs
// alone on the pool (end_prompt_alone: its routing spread over the threads); several run one a
// thread, side by side (an eval sample's 50-odd caches). The result is the same either way.
Status end_prompts(const std::vector<SequenceKvCache*>& caches, ThreadPool& pool);

}  // namespace qevict
