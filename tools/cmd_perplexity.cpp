// qevict perplexity: teacher-forced evaluation of a text file in chunks of -c tokens;
// prints perplexity and can dump every position's logits as float32 .npy [n_positions, n_vocab].
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "cli_common.h"
#include "commands.h"
#include "core/npy.h"
#include "engine/perplexity.h"
#include "engine/sampling.h"

namespace qevict::cli {

namespace {

struct PerplexityArgs {
  ModelOptions model;
  std::string file;
  int64_t n_ctx = 1024;
  int batch = 256;
  int64_t prefill = -1;
  int64_t max_tokens = -1;
  std::string logits_out;
  std::string kl_base;
  bool add_bos = false;
  KvOptions kv;
};

int run_perplexity(const PerplexityArgs& a) {
  // Flags and the prompt are checked before the model loads: a bad value fails fast.
  auto text = read_prompt("", a.file);
  if (!text) return fail(text.error());
  auto kvp = kv_params(a.kv);
  if (!kvp) return fail(kvp.error());
  auto loaded = load_model(a.model);
  if (!loaded) return fail(loaded.error());
  Model& model = *loaded->model;
  std::vector<int32_t> tokens =
      loaded->tokenizer->encode(*text, /*add_special=*/false, /*parse_special=*/false);
  if (a.add_bos && loaded->tokenizer->bos() >= 0)
    tokens.insert(tokens.begin(), loaded->tokenizer->bos());
  if (a.max_tokens > 0 && int64_t(tokens.size()) > a.max_tokens)
    tokens.resize(size_t(a.max_tokens));
  if (tokens.size() < 2)
    return fail(fmt::format("{}: needs at least 2 tokens, has {}", a.file, tokens.size()));

  NpyArray base;
  if (!a.kl_base.empty()) {
    auto b = read_npy(a.kl_base);
    if (!b) return fail(b.error());
    base = std::move(*b);
    if (base.cols != model.config().n_vocab)
      return fail(fmt::format("{}: has {} columns, the model's vocabulary has {}", a.kl_base,
                              base.cols, model.config().n_vocab));
    if (base.rows < int64_t(tokens.size()))
      return fail(
          fmt::format("{}: has {} rows for {} positions", a.kl_base, base.rows, tokens.size()));
  }
  double kl_sum = 0.0;
  int64_t kl_n = 0, agree = 0;
  std::vector<double> kls;
  std::unique_ptr<SequenceKvCache> last_cache;
  double decode_seconds_hint = 0.0;

  PerplexityOptions po;
  po.n_ctx = a.n_ctx;
  po.batch = a.batch;
  po.prefill = a.prefill;
  NpyWriter npy;
  if (!a.logits_out.empty()) {
    Status s = npy.open(a.logits_out, model.config().n_vocab);
    if (!s) return fail(s.message());
  }
  const int threads = resolve_threads(a.model.threads);
  if (Status st = prepare_kv_params(*loaded, &*kvp, threads); !st.is_ok())
    return fail(st.message());
  ThreadPool pool(threads);
  std::fprintf(stderr, "perplexity: %zu tokens, chunks of %lld, %d threads\n", tokens.size(),
               (long long)a.n_ctx, threads);
  PerplexityResult r;
  int last_pct = -1;
  std::string cache_error;
  Status s = evaluate_perplexity(
      model, pool, tokens, po,
      [&](int64_t n) -> SequenceKvCache* {
        auto c = make_kv_cache(model.kv_shape(), n, *kvp);
        if (!c) {
          cache_error = c.error();  // the reason, reported instead of the generic failure
          return nullptr;
        }
        last_cache = std::move(*c);
        return last_cache.get();
      },
      [&](int64_t pos, const float* z) -> Status {
        if (!a.logits_out.empty()) QEVICT_RETURN_IF_ERROR(npy.append_rows(z, 1));
        if (!base.data.empty()) {
          // KL(base || ours) of the softmax distributions, in double.
          const int32_t V = model.config().n_vocab;
          const float* zb = base.data.data() + pos * V;
          const double kl = kl_divergence_logits(zb, z, V);
          const int32_t ab = argmax(zb, V), ao = argmax(z, V);
          if (pos >= a.prefill || a.prefill < 0) {  // score what routing can affect
            kl_sum += kl;
            kls.push_back(kl);
            ++kl_n;
            agree += ab == ao;
          }
        }
        return Status::ok();
      },
      [&](int64_t done, int64_t total) {
        const int pct = int(100 * done / total);
        if (pct != last_pct) {
          std::fprintf(stderr, "\r[%3d%%] %lld / %lld tokens", pct, (long long)done,
                       (long long)total);
          last_pct = pct;
        }
      },
      &r);
  std::fprintf(stderr, "\n");
  if (!s) return fail(cache_error.empty() ? s.message() : cache_error);
  if (!a.logits_out.empty()) {
    Status c = npy.close();
    if (!c) return fail(c.message());
    std::fprintf(stderr, "wrote logits [%lld, %d] to %s\n", (long long)npy.rows(),
                 model.config().n_vocab, a.logits_out.c_str());
  }
  if (a.kv.stats && last_cache) print_kv_stats(*last_cache, decode_seconds_hint);
  if (!base.data.empty() && kl_n > 0) {
    std::sort(kls.begin(), kls.end());
    std::printf("vs %s: mean KL %.6f (p99 %.6f), top-1 agreement %.4f over %lld positions%s\n",
                a.kl_base.c_str(), kl_sum / double(kl_n),
                kls[size_t(0.99 * double(kls.size() - 1))], double(agree) / double(kl_n),
                (long long)kl_n, a.prefill >= 0 ? " (teacher-forced part only)" : "");
  }
  std::printf("perplexity: %.4f (mean NLL %.5f nats over %lld positions) in %.2f s (%.1f tok/s)\n",
              r.perplexity, r.mean_nll, (long long)r.n_scored, r.seconds,
              tokens.size() / std::max(r.seconds, 1e-9));
  return 0;
}

}  // namespace

Runner add_perplexity(CLI::App& app) {
  auto a = std::make_shared<PerplexityArgs>();
  add_model_options(app, a->model, MatmulMode::kF32);
  app.add_option("-f,--file", a->file, "text file to evaluate")
      ->required()
      ->check(CLI::ExistingFile);
  app.add_option("-c,--ctx-size", a->n_ctx,
                 "tokens per chunk (each chunk starts with an empty cache)")
      ->capture_default_str()
      ->check(CLI::Range(int64_t(2), int64_t(1) << 24));
  app.add_option("-b,--batch", a->batch, "tokens per forward call")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--prefill", a->prefill,
                 "first N tokens of each chunk fed in batches, the rest one token per call (-1: "
                 "all batched)")
      ->capture_default_str();
  app.add_option("--max-tokens", a->max_tokens, "evaluate only the first N tokens of the file")
      ->capture_default_str();
  app.add_flag("--add-bos", a->add_bos, "prepend the BOS token");
  app.add_option("--logits-out", a->logits_out,
                 "write float32 logits [n_positions, n_vocab] to this .npy file");
  app.add_option(
         "--kl-base", a->kl_base,
         "compare with logits saved by another run (--logits-out): mean KL, top-1 agreement")
      ->check(CLI::ExistingFile);
  add_kv_options(app, a->kv);
  return [a] { return run_perplexity(*a); };
}

}  // namespace qevict::cli
