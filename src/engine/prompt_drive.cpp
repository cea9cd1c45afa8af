// prefill_prompts, end_prompts (see prompt_drive.h).
#include "engine/prompt_drive.h"

#include <algorithm>

namespace qevict {

Status prefill_prompts(Model& model, const std::vector<PromptFeed>& seqs, int64_t chunk,
                       ThreadPool& pool, bool end, const PromptCallback& on_call) {
  if (chunk <= 0) return Status::error("prefill chunk must be positive");
  int64_t call = 0;
  for (int64_t off = 0;; off += chunk, ++call) {
    std::vector<BatchSegment> segs;
    int64_t first_n = 0;
    for (const PromptFeed& f : seqs) {
      if (off >= f.n) continue;
      const int64_t n = std::min(f.n - off, chunk);
      const bool last = off + n == f.n;
      float* out = f.all_logits || f.every_call || last ? f.logits : nullptr;
      segs.push_back({f.cache, f.tokens + off, n, f.all_logits, out});
      if (segs.size() == 1) first_n = n;
    }
    if (segs.empty()) break;
    QEVICT_RETURN_IF_ERROR(model.forward(segs, pool));
    if (on_call) QEVICT_RETURN_IF_ERROR(on_call(call, off, first_n));
  }
  if (!end) return Status::ok();
  std::vector<SequenceKvCache*> caches;
  for (const PromptFeed& f : seqs) caches.push_back(f.cache);
  return end_prompts(caches, pool);
}

Status end_prompts(const std::vector<SequenceKvCache*>& caches, ThreadPool& pool) {
  if (caches.empty()) return Status::ok();
  if (caches.size() == 1) return caches[0]->end_prompt_alone(pool);
  std::vector<Status> ended(caches.size());
  pool.parallel_for(int64_t(caches.size()), 1, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) ended[size_t(i)] = caches[size_t(i)]->end_prompt();
  });
  for (const Status& x : ended) QEVICT_RETURN_IF_ERROR(x);
  return Status::ok();
}

}  // namespace qevict
