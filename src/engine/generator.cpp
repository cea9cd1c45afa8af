// Generation loop (see generator.h).
#include "engine/generator.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <memory>
#include <vector>

#include "engine/prefill_share.h"
#include "engine/prompt_drive.h"

namespace qevict {

Status GenerateOptions::validate() const {
  if (prefill_chunk <= 0)
    return Status::error(fmt::format("prefill chunk must be positive, got {}", prefill_chunk));
  if (replay_group <= 0)
    return Status::error(fmt::format("replay group must be positive, got {}", replay_group));
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
  // Shared prefills: a source with dependents prefills through a recorder.
  std::vector<std::unique_ptr<RecordingKvCache>> recorders(requests.size());
  for (size_t i = 0; i < requests.size(); ++i) {
    const int src = requests[i].share_prefill_of;
    if (src < 0) continue;
    if (size_t(src) >= requests.size() || size_t(src) == i)
      return Status::error(
          fmt::format("request {}: share_prefill_of {} is not another request", i, src));
    const auto& s = requests[size_t(src)];
    if (s.share_prefill_of >= 0)
      return Status::error(
          fmt::format("request {}: its prefill source {} shares one itself", i, src));
    if (s.prompt != requests[i].prompt)
      return Status::error(fmt::format(
          "request {}: shares the prefill of request {} but the prompts differ", i, src));
    for (const SequenceKvCache* c : {s.cache, requests[i].cache}) {
      if (c->n_past() != 0)
        return Status::error(
            fmt::format("request {}: a shared prefill needs empty caches ({} holds {} tokens)", i,
                        c->describe(), c->n_past()));
      if (!c->prefill_keeps_everything())
        return Status::error(fmt::format(
            "request {}: {} compresses during prefill, so a prefill cannot be shared with it "
            "(use --prefill-route end)",
            i, c->describe()));
    }
    if (!recorders[size_t(src)])
      recorders[size_t(src)] = std::make_unique<RecordingKvCache>(s.cache, model.kv_shape());
  }
  using clock = std::chrono::steady_clock;

  // Prefill: chunk c of every prompt that still has one, batched in one forward call.
  auto t0 = clock::now();
  std::vector<PromptFeed> feeds;
  for (size_t i = 0; i < requests.size(); ++i) {
    auto& r = requests[i];
    if (r.share_prefill_of >= 0) continue;
    SequenceKvCache* c = recorders[i] ? recorders[i].get() : r.cache;
    feeds.push_back({c, r.prompt.data(), int64_t(r.prompt.size()), logits[i].data()});
    st.n_prompt += int64_t(r.prompt.size());
  }
  QEVICT_RETURN_IF_ERROR(prefill_prompts(model, feeds, opts.prefill_chunk, pool, false));
  // Seconds since t, and t moved to now: the prefill's parts.
  auto since = [&](clock::time_point& t) {
    const auto now = clock::now();
    const double s = std::chrono::duration<double>(now - t).count();
    t = now;
    return s;
  };
  auto tp = t0;
  st.prompt_model_seconds = since(tp);
  // The prompts are in: a cache with --prefill-route end compresses now, once (SPEC §4),
  // before the first token is sampled from the logits of the full-cache prefill.
  // The caches are distinct and none uses the pool in end_prompt(): they compress over the
  // threads (an eval sample's 50-odd caches, each scoring its prompt on one thread).
  auto held = [&] {
    size_t b = 0;
    for (const auto& r : requests) b += r.cache->bytes_held();
    st.peak_prompt_bytes = std::max(st.peak_prompt_bytes, b);
  };
  auto end_requests = [&](const std::vector<size_t>& which) -> Status {
    std::vector<SequenceKvCache*> caches;
    for (size_t i : which) caches.push_back(requests[i].cache);
    return end_prompts(caches, pool);
  };
  held();
  std::vector<size_t> own, shares;
  for (size_t i = 0; i < requests.size(); ++i)
    (requests[i].share_prefill_of >= 0 ? shares : own).push_back(i);
  QEVICT_RETURN_IF_ERROR(end_requests(own));
  st.prompt_end_seconds += since(tp);
  // Requests sharing a prefill replay their source's calls and take its last logits, a group
  // at a time, each group compressing before the next is replayed: the peak holds at most
  // replay_group whole prompts beside the sources, not one per request.
  for (size_t g0 = 0; g0 < shares.size(); g0 += size_t(opts.replay_group)) {
    const std::vector<size_t> group(
        shares.begin() + ptrdiff_t(g0),
        shares.begin() + ptrdiff_t(std::min(shares.size(), g0 + size_t(opts.replay_group))));
    for (size_t i : group) {
      auto& r = requests[i];
      const size_t src = size_t(r.share_prefill_of);
      QEVICT_RETURN_IF_ERROR(recorders[src]->replay(r.cache, pool));
      logits[i] = logits[src];
      st.n_prompt_shared += int64_t(r.prompt.size());
    }
    st.prompt_replay_seconds += since(tp);
    held();
    QEVICT_RETURN_IF_ERROR(end_requests(group));
    st.prompt_end_seconds += since(tp);
  }
  recorders.clear();  // the recordings' memory given back: part of the replays' cost
  st.prompt_replay_seconds += since(tp);
  st.prompt_seconds = std::chrono::duration<double>(tp - t0).count();  // the parts' sum

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
