// qevict generate: prompt (-p/-f, optionally wrapped in the model's chat template) →
// chunked prefill → streamed sampling; a timing line on stderr at the end. Like llama-cli and
// `qevict tokenize`, special-token text in the prompt (e.g. <|im_start|>) is read as those
// tokens unless --no-parse-special.
//
// --prompt-cache FILE (llama-cli's habit, issue 50): the run is a Session (engine/session.h)
// saved to FILE afterwards; a FILE saved before with this model and the same KV options and -c
// is resumed: the prompt's common prefix with its history is not prefilled again.
#include <fmt/format.h>

#include <cstdio>
#include <fstream>

#include "chat/chat_template.h"
#include "cli_common.h"
#include "commands.h"
#include "engine/generator.h"
#include "engine/session.h"

namespace qevict::cli {

namespace {

struct GenerateArgs {
  ModelOptions model;
  std::string prompt, prompt_file, system;
  int n_predict = 128;
  int64_t n_ctx = 4096;
  bool chat = false;
  bool ignore_eos = false;
  bool no_parse_special = false;
  SamplingParams sampling;
  int64_t seed = -1;
  int prefill_chunk = 512;
  KvOptions kv;
  int rss_every = 0;
  bool quiet = false;
  std::string prompt_cache;
};

// Resident set size of this process in KiB (Linux /proc), or -1.
long rss_kib() {
  std::FILE* f = std::fopen("/proc/self/status", "r");
  if (!f) return -1;
  char line[256];
  long kib = -1;
  while (std::fgets(line, sizeof line, f))
    if (std::sscanf(line, "VmRSS: %ld kB", &kib) == 1) break;
  std::fclose(f);
  return kib;
}

// generate --prompt-cache: resume FILE's session when it fits, generate, save it back.
int generate_in_session(const GenerateArgs& a, Loaded& l, const std::vector<int32_t>& prompt,
                        const KvCacheParams& kvp, const GenerationRequest& req, int threads,
                        const std::string& echo) {
  Model& model = *l.model;
  Tokenizer& tok = *l.tokenizer;
  ThreadPool pool(threads);
  const std::string& path = a.prompt_cache;
  const SessionOptions want = session_options(kvp, a.n_ctx, a.prefill_chunk);
  std::unique_ptr<Session> s;
  if (std::ifstream(path, std::ios::binary)) {
    auto loaded = load_session(model, path, pool, &want);
    if (!loaded) return fail("--prompt-cache " + loaded.error());
    s = std::move(*loaded);
    int64_t c = common_prefix(s->tokens(), prompt);
    // The model must run on at least the prompt's last token (its logits give the first new
    // one): a prompt the file holds whole is resumed one token short of it.
    if (c == int64_t(prompt.size())) --c;
    // A shared BOS alone is no common text.
    if (c == 1 && prompt[0] == tok.bos()) c = 0;
    if (c == 0) {
      std::fprintf(stderr, "prompt-cache: %s shares no prefix with this prompt; starting anew\n",
                   path.c_str());
      s.reset();
    } else if (!s->can_rewind(c)) {
      std::fprintf(stderr,
                   "prompt-cache: %s shares %lld tokens with this prompt, but its cache has "
                   "compressed beyond them (it holds %zu); starting anew\n",
                   path.c_str(), (long long)c, s->tokens().size());
      s.reset();
    } else if (Status st = s->rewind(c); !st) {
      return fail(st.message());
    }
  } else if (std::FILE* probe = std::fopen(path.c_str(), "rb")) {
    std::fclose(probe);
    return fail(fmt::format("--prompt-cache {}: cannot read the file", path));
  }
  if (!s) {
    auto created = Session::create(model, want);
    if (!created) return fail(created.error());
    s = std::move(*created);
  }
  const std::vector<int32_t> turn(prompt.begin() + int64_t(s->tokens().size()), prompt.end());
  if (int64_t(prompt.size()) + a.n_predict > a.n_ctx)
    return fail(fmt::format("prompt ({} tokens) + -n {} exceeds the context -c {}", prompt.size(),
                            a.n_predict, a.n_ctx));
  if (!echo.empty()) {
    std::fwrite(echo.data(), 1, echo.size(), stdout);
    std::fflush(stdout);
  }
  TokenText out(tok);
  Session::GenerateResult g;
  Status st = s->generate(
      turn, a.n_predict, req.sampling, req.stop_tokens, pool,
      [&](int32_t id) {
        if (!a.quiet) out.put(id);
        return true;
      },
      &g);
  out.end();
  if (!st) return fail(st.message());
  const TurnStats& t = s->turns().back();
  std::fprintf(stderr,
               "\nprompt-cache: reused %lld tokens, prefilled %lld | decode: %lld tokens in %.2f s "
               "(%.1f tok/s) | threads %d | kv %s, %.1f MiB | seed %llu\n",
               (long long)t.reused_tokens, (long long)t.prompt_tokens, (long long)t.generated,
               t.decode_seconds, t.generated / std::max(t.decode_seconds, 1e-9), threads,
               s->cache().describe().c_str(), s->cache().bytes_held() / 1048576.0,
               (unsigned long long)req.sampling.seed);
  Session::SaveMode mode;
  if (Status sv = s->save(path, &mode); !sv) return fail(sv.message());
  std::fprintf(stderr, "prompt-cache: saved %zu tokens to %s%s\n", s->tokens().size(), path.c_str(),
               mode == Session::SaveMode::kState ? "" : " (tokens only)");
  if (a.kv.stats) print_kv_stats(s->cache(), t.decode_seconds);
  return 0;
}

int run_generate(const GenerateArgs& a) {
  // Flags and the prompt are checked before the model loads: a bad value fails fast.
  auto text = read_prompt(a.prompt, a.prompt_file);
  if (!text) return fail(text.error());
  auto kvp = kv_params(a.kv);
  if (!kvp) return fail(kvp.error());
  if (Status s = a.sampling.validate(); !s) return fail(s.message());
  auto loaded = load_model(a.model);
  if (!loaded) return fail(loaded.error());
  Model& model = *loaded->model;
  Tokenizer& tok = *loaded->tokenizer;

  std::string prompt_text = *text;
  bool parse_special = !a.no_parse_special;
  if (a.chat) {
    std::vector<ChatMessage> msgs;
    if (!a.system.empty()) msgs.push_back({"system", a.system});
    msgs.push_back({"user", prompt_text});
    const std::string tmpl = model.gguf().get_string_or("tokenizer.chat_template", "");
    if (tmpl.empty()) {
      prompt_text = render_chatml(msgs, true);
    } else {
      auto ct = ChatTemplate::parse(tmpl);
      if (!ct) return fail("chat template: " + ct.error());
      auto r = ct->render(msgs, true, tok.token_to_piece(tok.bos(), true),
                          tok.token_to_piece(tok.eos(), true));
      if (!r) return fail("chat template: " + r.error());
      prompt_text = *r;
    }
    parse_special = true;  // the template's own tokens, whatever the flag says
  }
  GenerationRequest req;
  req.prompt = tok.encode(prompt_text, /*add_special=*/true, parse_special);
  if (req.prompt.empty()) return fail("the prompt has no tokens");
  if (int64_t(req.prompt.size()) + a.n_predict > a.n_ctx)
    return fail(fmt::format("prompt ({} tokens) + -n {} exceeds the context -c {}",
                            req.prompt.size(), a.n_predict, a.n_ctx));

  const int threads = resolve_threads(a.model.threads);
  if (Status st = prepare_kv_params(*loaded, &*kvp, threads); !st.is_ok())
    return fail(st.message());
  req.sampling = a.sampling;
  req.sampling.seed = resolve_seed(a.seed);
  if (!a.ignore_eos) req.stop_tokens = eog_tokens(tok);
  if (!a.prompt_cache.empty()) {
    return generate_in_session(a, *loaded, req.prompt, *kvp, req, threads,
                               a.chat || a.quiet ? std::string() : prompt_text);
  }
  // The cache holds prompt + generated tokens; a budget fraction is of that full cache (SPEC §3).
  auto cache_or = make_kv_cache(model.kv_shape(), int64_t(req.prompt.size()) + a.n_predict, *kvp);
  if (!cache_or) return fail(cache_or.error());
  SequenceKvCache& cache = **cache_or;
  req.cache = &cache;
  req.n_predict = a.n_predict;

  ThreadPool pool(threads);
  std::vector<GenerationRequest> reqs{std::move(req)};
  GenerateOptions go;
  go.prefill_chunk = a.prefill_chunk;
  GenerationStats st;
  TokenText out(tok);
  if (!a.chat && !a.quiet) {  // echo the prompt like llama.cpp does
    std::fwrite(prompt_text.data(), 1, prompt_text.size(), stdout);
    std::fflush(stdout);
  }
  int64_t n_out = 0;
  if (a.rss_every > 0)
    std::fprintf(stderr, "rss: generated %lld tokens, RSS %ld KiB, KV cache %zu bytes\n", 0LL,
                 rss_kib(), cache.bytes_held());
  Status s = generate(
      model, pool, reqs, go,
      [&](size_t, int32_t id) {
        ++n_out;
        if (a.rss_every > 0 && n_out % a.rss_every == 0)
          std::fprintf(stderr, "rss: generated %lld tokens, RSS %ld KiB, KV cache %zu bytes\n",
                       (long long)n_out, rss_kib(), cache.bytes_held());
        if (!a.quiet) out.put(id);
        return true;
      },
      &st);
  out.end();
  if (!s) return fail(s.message());
  std::fprintf(
      stderr,
      "\nprompt: %lld tokens in %.2f s (%.1f tok/s) | decode: %lld tokens in %.2f s (%.1f tok/s) | "
      "threads %d | kv %s, %.1f MiB | seed %llu\n",
      (long long)st.n_prompt, st.prompt_seconds, st.n_prompt / std::max(st.prompt_seconds, 1e-9),
      (long long)st.n_decode_calls, st.decode_seconds,
      st.n_decode_calls / std::max(st.decode_seconds, 1e-9), threads, cache.describe().c_str(),
      cache.bytes_held() / 1048576.0, (unsigned long long)reqs[0].sampling.seed);
  if (a.kv.stats) print_kv_stats(cache, st.decode_seconds);
  return 0;
}

}  // namespace

Runner add_generate(CLI::App& app) {
  auto a = std::make_shared<GenerateArgs>();
  add_model_options(app, a->model);
  app.add_option("-p,--prompt", a->prompt, "prompt text");
  app.add_option("-f,--file", a->prompt_file, "read the prompt from a file")
      ->check(CLI::ExistingFile);
  app.add_option("-n,--n-predict", a->n_predict, "tokens to generate")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  app.add_option("-c,--ctx-size", a->n_ctx, "context size (prompt + generated tokens)")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_flag("--chat", a->chat, "wrap the prompt as a user message in the model's chat template");
  app.add_option("--system", a->system, "system message for --chat");
  app.add_flag("--ignore-eos", a->ignore_eos, "do not stop at end-of-generation tokens");
  app.add_flag("--no-parse-special", a->no_parse_special,
               "treat special-token text (e.g. <|im_start|>) in the prompt as plain text "
               "(not with --chat: the template's tokens are always parsed)");
  add_sampling_options(app, a->sampling, a->seed);
  app.add_option("-b,--prefill-chunk", a->prefill_chunk, "prompt tokens per forward call")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  add_kv_options(app, a->kv);
  app.add_option("--rss-every", a->rss_every,
                 "print the process RSS and KV bytes every N generated tokens (stderr)");
  app.add_option("--prompt-cache", a->prompt_cache,
                 "a session file: resumed when it exists (saved with this model, the same KV "
                 "options and -c; the prompt's common prefix with it is not prefilled again), "
                 "written back after generating. The cache then holds -c tokens (a --kv-budget "
                 "fraction is of -c)");
  app.add_flag("--quiet", a->quiet,
               "do not print the prompt or the generated text (timings and stats only)");
  return [a] { return run_generate(*a); };
}

}  // namespace qevict::cli
