// qevict perplexity: teacher-forced evaluation of a text file in chunks of -c tokens;
// prints perplexity and can dump every position's logits as float32 .npy [n_positions, n_vocab].
#include <cstdio>

#include <fmt/format.h>

#include "cli_common.h"
#include "commands.h"
#include "core/npy.h"
#include "engine/perplexity.h"
#include "kvcache/full_cache.h"

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
  bool add_bos = false;
};

int run_perplexity(const PerplexityArgs& a) {
  auto loaded = load_model(a.model);
  if (!loaded) return fail(loaded.error());
  Model& model = *loaded->model;
  auto text = read_prompt("", a.file);
  if (!text) return fail(text.error());
  std::vector<int32_t> tokens = loaded->tokenizer->encode(*text, /*add_special=*/false, /*parse_special=*/false);
  if (a.add_bos && loaded->tokenizer->bos() >= 0) tokens.insert(tokens.begin(), loaded->tokenizer->bos());
  if (a.max_tokens > 0 && int64_t(tokens.size()) > a.max_tokens) tokens.resize(size_t(a.max_tokens));
  if (tokens.size() < 2) return fail(fmt::format("{}: needs at least 2 tokens, has {}", a.file, tokens.size()));

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
  ThreadPool pool(threads);
  std::fprintf(stderr, "perplexity: %zu tokens, chunks of %lld, %d threads\n", tokens.size(), (long long)a.n_ctx, threads);
  PerplexityResult r;
  int last_pct = -1;
  Status s = evaluate_perplexity(
      model, pool, tokens, po,
      [&](int64_t n) { return std::make_unique<FullKvCache>(model.kv_shape(), n); },
      a.logits_out.empty() ? LogitsSink() : LogitsSink([&](int64_t, const float* z) { return npy.append_rows(z, 1); }),
      [&](int64_t done, int64_t total) {
        const int pct = int(100 * done / total);
        if (pct != last_pct) {
          std::fprintf(stderr, "\r[%3d%%] %lld / %lld tokens", pct, (long long)done, (long long)total);
          last_pct = pct;
        }
      },
      &r);
  std::fprintf(stderr, "\n");
  if (!s) return fail(s.message());
  if (!a.logits_out.empty()) {
    Status c = npy.close();
    if (!c) return fail(c.message());
    std::fprintf(stderr, "wrote logits [%lld, %d] to %s\n", (long long)npy.rows(), model.config().n_vocab,
                 a.logits_out.c_str());
  }
  std::printf("perplexity: %.4f (mean NLL %.5f nats over %lld positions) in %.2f s (%.1f tok/s)\n", r.perplexity,
              r.mean_nll, (long long)r.n_scored, r.seconds, tokens.size() / std::max(r.seconds, 1e-9));
  return 0;
}

}  // namespace

Runner add_perplexity(CLI::App& app) {
  auto a = std::make_shared<PerplexityArgs>();
  add_model_options(app, a->model);
  app.add_option("-f,--file", a->file, "text file to evaluate")->required()->check(CLI::ExistingFile);
  app.add_option("-c,--ctx-size", a->n_ctx, "tokens per chunk (each chunk starts with an empty cache)")
      ->capture_default_str()->check(CLI::Range(int64_t(2), int64_t(1) << 24));
  app.add_option("-b,--batch", a->batch, "tokens per forward call")->capture_default_str()->check(CLI::PositiveNumber);
  app.add_option("--prefill", a->prefill,
                 "first N tokens of each chunk fed in batches, the rest one token per call (-1: all batched)")
      ->capture_default_str();
  app.add_option("--max-tokens", a->max_tokens, "evaluate only the first N tokens of the file")->capture_default_str();
  app.add_flag("--add-bos", a->add_bos, "prepend the BOS token");
  app.add_option("--logits-out", a->logits_out, "write float32 logits [n_positions, n_vocab] to this .npy file");
  return [a] { return run_perplexity(*a); };
}

}  // namespace qevict::cli
