// Generation loop (see generator.h).
#include "engine/generator.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>

namespace qevict {

Status GenerateOptions::validate() const {
  if (prefill_chunk <= 0)
    return Status::error(fmt::format("prefill chunk must be positive, got {}", prefill_chunk));
  return Status::ok();
}

Status generate(Model& model, ThreadPool& pool, std::vector<GenerationRequest>& requests,
                const GenerateOptions& opts, const TokenCallback& on_token,
                GenerationStats* stats) {
  QEVICT_RETURN_IF_ERROR(opts.validate());
  const int32_t n_vocab = model.config().n_vocab;
  GenerationStats st;
  std::vector<Sampler> samplers;
  std::vector<std::vector<float>> logits(requests.size(), std::vector<float>(size_t(n_vocab)));
  for (auto& r : requests) {
    if (!r.cache) return Status::error("generation request without a KV cache");
    if (r.prompt.empty()) return Status::error("empty prompt");
    if (r.n_predict < 0) return Status::error("n_predict must be >= 0");
    QEVICT_RETURN_IF_ERROR(r.sampling.validate());
    samplers.emplace_back(r.sampling);
    r.output.clear();
    r.hit_stop = false;
  }
  using clock = std::chrono::steady_clock;

  // Prefill: chunk c of every prompt that still has one, batched in one forward call.
  auto t0 = clock::now();
  for (size_t off = 0;; off += size_t(opts.prefill_chunk)) {
    std::vector<BatchSegment> segs;
    for (size_t i = 0; i < requests.size(); ++i) {
      auto& r = requests[i];
      if (off >= r.prompt.size()) continue;
      const size_t n = std::min(r.prompt.size() - off, size_t(opts.prefill_chunk));
      const bool last = off + n == r.prompt.size();
      segs.push_back(
          {r.cache, r.prompt.data() + off, int64_t(n), false, last ? logits[i].data() : nullptr});
      st.n_prompt += int64_t(n);
    }
    if (segs.empty()) break;
    QEVICT_RETURN_IF_ERROR(model.forward(segs, pool));
  }
  // The prompts are in: a cache with --prefill-route end compresses now, once (SPEC §4),
  // before the first token is sampled from the logits of the full-cache prefill.
  for (auto& r : requests) QEVICT_RETURN_IF_ERROR(r.cache->end_prompt());
  st.prompt_seconds = std::chrono::duration<double>(clock::now() - t0).count();

  // Decode: sample from the latest logits, then one forward over all live sequences.
  auto t1 = clock::now();
  std::vector<bool> live(requests.size(), true);
  std::vector<int32_t> next(requests.size());
  for (;;) {
    std::vector<BatchSegment> segs;
    for (size_t i = 0; i < requests.size(); ++i) {
      auto& r = requests[i];
      if (!live[i]) continue;
      if (int(r.output.size()) >= r.n_predict) {
        live[i] = false;
        continue;
      }
      const int32_t tok = samplers[i].sample(logits[i].data(), n_vocab);
      r.output.push_back(tok);
      ++st.n_generated;
      const bool keep = on_token ? on_token(i, tok) : true;
      if (std::find(r.stop_tokens.begin(), r.stop_tokens.end(), tok) != r.stop_tokens.end()) {
        r.hit_stop = true;
        live[i] = false;
        continue;
      }
      if (!keep || int(r.output.size()) >= r.n_predict || r.cache->n_past() >= r.cache->n_ctx()) {
        live[i] = false;
        continue;
      }
      next[i] = tok;
      segs.push_back({r.cache, &next[i], 1, false, logits[i].data()});
    }
    if (segs.empty()) break;
    QEVICT_RETURN_IF_ERROR(model.forward(segs, pool));
    ++st.n_decode_calls;
  }
  st.decode_seconds = std::chrono::duration<double>(clock::now() - t1).count();
  if (stats) *stats = st;
  return Status::ok();
}

}  // namespace qevict
