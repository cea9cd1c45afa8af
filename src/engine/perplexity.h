// Teacher-forced evaluation: feeds a token stream through the model in chunks of n_ctx
// (each chunk on an empty cache, as llama.cpp's perplexity does), scores every position's
// prediction of the next token, and optionally hands each logits row to a sink.
#pragma once

#include <functional>
#include <vector>

#include "core/status.h"
#include "core/thread_pool.h"
#include "kvcache/kv_cache.h"
#include "model/model.h"

namespace qevict {

struct PerplexityOptions {
  int64_t n_ctx = 1024;  // tokens per chunk; each chunk starts from an empty cache
  int batch = 256;       // tokens per forward call during the prompt part
  // The first `prefill` tokens of each chunk are fed in batches of `batch`; the rest one
  // token per forward call, so caches with a routing policy route while being scored.
  // -1: the whole chunk in batches.
  int64_t prefill = -1;
  Status validate() const;
};

struct PerplexityResult {
  int64_t n_scored = 0;     // positions whose next-token NLL was counted
  double mean_nll = 0.0;    // nats
  double perplexity = 0.0;  // exp(mean_nll)
  double seconds = 0.0;
};

// Called with (position in the token stream, logits f32 [n_vocab]) for every position in
// order; a non-ok Status aborts the evaluation.
using LogitsSink = std::function<Status(int64_t pos, const float* logits)>;

// KL(P || Q) in nats between the softmax distributions of two logits rows of n entries,
// computed in double (fidelity of a compressed cache against FullKV's logits P).
double kl_divergence_logits(const float* p_logits, const float* q_logits, int32_t n);

// make_cache(n_ctx) makes (and owns) a fresh cache for each chunk; nullptr aborts.
Status evaluate_perplexity(Model& model, ThreadPool& pool, const std::vector<int32_t>& tokens,
                           const PerplexityOptions& opts,
                           const std::function<SequenceKvCache*(int64_t)>& make_cache,
                           const LogitsSink& sink,
                           const std::function<void(int64_t, int64_t)>& progress,
                           PerplexityResult* result);

}  // namespace qevict
