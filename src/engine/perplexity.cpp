// Teacher-forced perplexity (see perplexity.h). NLL at position i = -log softmax(z_i)[t_{i+1}],
// computed in double.
#include "engine/perplexity.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>

#include "engine/prompt_drive.h"

namespace qevict {

Status PerplexityOptions::validate() const {
  if (n_ctx < 2)
    return Status::error(fmt::format("context must be at least 2 tokens, got {}", n_ctx));
  if (batch <= 0) return Status::error("batch must be positive");
  return Status::ok();
}

double kl_divergence_logits(const float* zp, const float* zq, int32_t n) {
  double mp = zp[0], mq = zq[0];
  for (int32_t i = 1; i < n; ++i) {
    mp = std::max(mp, double(zp[i]));
    mq = std::max(mq, double(zq[i]));
  }
  double sp = 0.0, sq = 0.0;
  for (int32_t i = 0; i < n; ++i) {
    sp += std::exp(double(zp[i]) - mp);
    sq += std::exp(double(zq[i]) - mq);
  }
  const double lp = std::log(sp), lq = std::log(sq);
  double kl = 0.0;
  for (int32_t i = 0; i < n; ++i) {
    const double a = double(zp[i]) - mp - lp, b = double(zq[i]) - mq - lq;
    kl += std::exp(a) * (a - b);
  }
  return std::max(kl, 0.0);
}

Status evaluate_perplexity(Model& model, ThreadPool& pool, const std::vector<int32_t>& tokens,
                           const PerplexityOptions& opts,
                           const std::function<SequenceKvCache*(int64_t)>& make_cache,
                           const LogitsSink& sink,
                           const std::function<void(int64_t, int64_t)>& progress,
                           PerplexityResult* result) {
  QEVICT_RETURN_IF_ERROR(opts.validate());
  const int64_t n = static_cast<int64_t>(tokens.size());
  if (n < 2) return Status::error(fmt::format("need at least 2 tokens to score, got {}", n));
  const int32_t V = model.config().n_vocab;
  auto t0 = std::chrono::steady_clock::now();
  double nll_sum = 0.0;
  int64_t n_scored = 0;
  std::vector<float> logits;
  for (int64_t c0 = 0; c0 < n; c0 += opts.n_ctx) {
    const int64_t len = std::min(opts.n_ctx, n - c0);
    if (len < 2 && c0 > 0) break;  // a 1-token tail has nothing to predict within its chunk
    SequenceKvCache* cache = make_cache(len);
    if (!cache) return Status::error("could not create a KV cache");
    const int64_t pre = opts.prefill < 0 ? len : std::min(opts.prefill, len);
    // Scores the logits of positions [c0 + i, c0 + i + step), rows of `logits`.
    auto score = [&](int64_t i, int64_t step) -> Status {
      for (int64_t j = 0; j < step; ++j) {
        const int64_t pos = c0 + i + j;
        const float* z = logits.data() + j * V;
        if (sink) QEVICT_RETURN_IF_ERROR(sink(pos, z));
        if (i + j + 1 < len) {
          double mx = z[0];
          for (int32_t v = 1; v < V; ++v) mx = std::max(mx, double(z[v]));
          double s = 0.0;
          for (int32_t v = 0; v < V; ++v) s += std::exp(double(z[v]) - mx);
          nll_sum += -(double(z[tokens[size_t(pos + 1)]]) - mx - std::log(s));
          ++n_scored;
        }
      }
      if (progress) progress(c0 + i + step, n);
      return Status::ok();
    };
    // The batched part is the prompt: --prefill-route end compresses at its end (SPEC §4).
    logits.resize(size_t(std::min<int64_t>(opts.batch, std::max<int64_t>(pre, 1)) * V));
    QEVICT_RETURN_IF_ERROR(prefill_prompts(
        model, {{cache, tokens.data() + c0, pre, logits.data(), true}}, opts.batch, pool, true,
        [&](int64_t, int64_t off, int64_t step) { return score(off, step); }));
    // The rest is teacher-forced one token per call: routing runs as in decode.
    logits.resize(size_t(V));
    for (int64_t i = pre; i < len; ++i) {
      std::vector<BatchSegment> segs{{cache, tokens.data() + c0 + i, 1, true, logits.data()}};
      QEVICT_RETURN_IF_ERROR(model.forward(segs, pool));
      QEVICT_RETURN_IF_ERROR(score(i, 1));
    }
  }
  PerplexityResult r;
  r.n_scored = n_scored;
  r.mean_nll = n_scored ? nll_sum / double(n_scored) : 0.0;
  r.perplexity = std::exp(r.mean_nll);
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (result) *result = r;
  return Status::ok();
}

}  // namespace qevict
