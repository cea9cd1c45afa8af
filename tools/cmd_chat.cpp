// qevict chat: an interactive multi-turn conversation (issue 50 item 4) in one Session
// (engine/session.h): each user line joins the conversation, which is rendered with the model's
// chat template; only what the session does not hold yet is prefilled into its — compressed —
// cache, and the reply streams to stdout. Commands: /save FILE, /load FILE, /stats, /help,
// /exit. stdin is read line by line, so a script can pipe a conversation in; then (stdin not a
// terminal) the first error ends the chat with exit status 1.
//
// How a turn reaches the session: the whole conversation is rendered and tokenized; the part
// after the history's common prefix with it is the new turn. When the two diverge inside the
// history (a reply re-tokenizes differently, a template's end-of-turn text), the session
// rewinds to the common prefix if its cache can (only within its full-precision local region),
// else — and after /load, whose file holds tokens but not the messages — it keeps its history
// and appends the template's text for a new user message: what ends an assistant turn (the
// part the history does not end with) and the user turn itself, rendered around a placeholder
// conversation.
#include <fmt/format.h>
#include <unistd.h>

#include <cstdio>
#include <iostream>
#include <optional>

#include "chat/chat_template.h"
#include "cli_common.h"
#include "commands.h"
#include "engine/session.h"

namespace qevict::cli {

namespace {

struct ChatArgs {
  ModelOptions model;
  int64_t n_ctx = 4096;
  int n_predict = 512;
  std::string system;
  SamplingParams sampling;
  int64_t seed = -1;
  int prefill_chunk = 512;
  KvOptions kv;
};

class Chat {
 public:
  Chat(const ChatArgs& a, Loaded& l, ThreadPool& pool)
      : a_(a), model_(*l.model), tok_(*l.tokenizer), pool_(pool) {}

  Status init(const KvCacheParams& kv) {
    const std::string src = model_.gguf().get_string_or("tokenizer.chat_template", "");
    if (!src.empty()) {
      auto ct = ChatTemplate::parse(src);
      if (!ct) return Status::error("chat template: " + ct.error());
      tmpl_.emplace(std::move(*ct));
    }
    auto s = Session::create(model_, session_options(kv, a_.n_ctx, a_.prefill_chunk));
    if (!s) return s.status();
    s_ = std::move(*s);
    if (!a_.system.empty()) msgs_.push_back({"system", a_.system});
    sampling_ = a_.sampling;
    sampling_.seed = resolve_seed(a_.seed);
    stop_ = eog_tokens(tok_);
    return Status::ok();
  }

  // One input line: a command or a user message. *quit: /exit.
  Status line(const std::string& in, bool* quit) {
    if (in.empty()) return Status::ok();
    if (in[0] != '/') return user_turn(in);
    const size_t sp = in.find(' ');
    const std::string cmd = in.substr(0, sp);
    std::string arg = sp == std::string::npos ? "" : in.substr(sp + 1);
    while (!arg.empty() && arg.back() == ' ') arg.pop_back();
    if (cmd == "/exit" || cmd == "/quit") {
      *quit = true;
    } else if (cmd == "/save" || cmd == "/load") {
      if (arg.empty()) return Status::error(cmd + " needs a file name");
      return cmd == "/save" ? save(arg) : load(arg);
    } else if (cmd == "/stats") {
      stats();
    } else if (cmd == "/help") {
      std::fputs(kHelp, stdout);
    } else {
      return Status::error(fmt::format("unknown command '{}' (/help lists them)", cmd));
    }
    return Status::ok();
  }

  const Session& session() const { return *s_; }
  double decode_seconds() const { return decode_seconds_; }

  static constexpr const char* kHelp =
      "commands:\n"
      "  /save FILE   write the conversation (tokens and the cache's state) to FILE\n"
      "  /load FILE   continue the conversation saved in FILE (its KV options replace the flags)\n"
      "  /stats       tokens, bytes by tier, and each turn's prefilled and reused tokens and "
      "promotions\n"
      "  /exit        end (so does the end of the input)\n";

 private:
  Expected<std::string> render(const std::vector<ChatMessage>& m, bool add_generation) const {
    if (!tmpl_) return render_chatml(m, add_generation);
    auto r = tmpl_->render(m, add_generation, tok_.token_to_piece(tok_.bos(), true),
                           tok_.token_to_piece(tok_.eos(), true));
    if (!r) return Status::error("chat template: " + r.error());
    return std::move(*r);
  }

  // The text that extends a conversation ending with an assistant's reply by a user message,
  // as the template renders it around a placeholder conversation (see the file comment).
  Expected<std::string> user_suffix(const std::string& text) const {
    static const std::string kMark = "\x1fqevict-reply\x1f";
    std::vector<ChatMessage> d;
    if (!a_.system.empty()) d.push_back({"system", a_.system});
    d.push_back({"user", "hi"});
    d.push_back({"assistant", kMark});
    auto p = render(d, false);
    if (!p) return p.status();
    d.push_back({"user", text});
    auto q = render(d, true);
    if (!q) return q.status();
    const size_t at = p->rfind(kMark);
    if (at == std::string::npos || q->compare(0, p->size(), *p) != 0)
      return Status::error(
          "the chat template does not extend a conversation by appending to it; this "
          "conversation cannot be continued");
    const std::string end = p->substr(at + kMark.size());  // what ends an assistant turn
    // The history's last tokens as text, special tokens included.
    std::string tail;
    const auto& h = s_->tokens();
    for (size_t i = h.size() > 16 ? h.size() - 16 : 0; i < h.size(); ++i)
      tail += tok_.token_to_piece(h[i], true);
    size_t k = std::min(end.size(), tail.size());
    while (k > 0 && tail.compare(tail.size() - k, k, end, 0, k) != 0) --k;
    if (h.empty()) k = end.size();  // nothing to end
    return end.substr(k) + q->substr(p->size());
  }

  Status user_turn(const std::string& text) {
    std::vector<int32_t> turn;
    const std::vector<int32_t>& hist = s_->tokens();
    std::vector<ChatMessage> next = msgs_;
    next.push_back({"user", text});
    bool done = false;
    if (known_) {
      auto r = render(next, true);
      if (!r) return r.status();
      const std::vector<int32_t> full = tok_.encode(*r, true, true);
      const int64_t c = common_prefix(hist, full);
      if (c == int64_t(hist.size()) || s_->can_rewind(c)) {
        if (c < int64_t(hist.size())) {
          std::fprintf(stderr, "[rewound %lld tokens to the conversation's common prefix]\n",
                       (long long)(hist.size() - c));
          QEVICT_RETURN_IF_ERROR(s_->rewind(c));
        }
        turn.assign(full.begin() + c, full.end());
        done = true;
      }
    }
    if (!done) {
      auto suffix = user_suffix(text);
      if (!suffix) return suffix.status();
      turn = tok_.encode(*suffix, hist.empty(), true);
    }
    const int64_t room =
        s_->cache().n_ctx() + 1 - int64_t(s_->tokens().size()) - int64_t(turn.size());
    const int n = int(std::min<int64_t>(a_.n_predict, room));
    if (n < 1)
      return Status::error(fmt::format(
          "the context is full ({} tokens held, {} new, -c {}); /save and start again with a "
          "larger -c",
          s_->tokens().size(), turn.size(), s_->cache().n_ctx()));
    TokenText out(tok_);
    Session::GenerateResult g;
    const Status st = s_->generate(
        turn, n, sampling_, stop_, pool_,
        [&](int32_t id) {
          out.put(id);
          return true;
        },
        &g);
    out.end();
    if (!st) return st;
    std::vector<int32_t> reply = g.tokens;
    if (g.hit_stop && !reply.empty()) reply.pop_back();
    next.push_back({"assistant", tok_.decode(reply)});
    msgs_ = std::move(next);
    const TurnStats& t = s_->turns().back();
    decode_seconds_ += t.decode_seconds;
    std::fprintf(stderr,
                 "[turn %zu: prefilled %lld, reused %lld, generated %lld (%.1f tok/s), "
                 "promotions %lld, kv %.2f MiB]\n",
                 s_->turns().size(), (long long)t.prompt_tokens, (long long)t.reused_tokens,
                 (long long)t.generated, t.generated / std::max(t.decode_seconds, 1e-9),
                 (long long)t.promotions, t.bytes_held / 1048576.0);
    return Status::ok();
  }

  Status save(const std::string& path) {
    Session::SaveMode mode;
    QEVICT_RETURN_IF_ERROR(s_->save(path, &mode));
    std::fprintf(stderr, "[saved %zu tokens to %s (%s)]\n", s_->tokens().size(), path.c_str(),
                 mode == Session::SaveMode::kState ? "the cache's state"
                                                   : "tokens only: re-prefilled on load");
    return Status::ok();
  }

  Status load(const std::string& path) {
    bool restored = false;
    auto s = load_session(model_, path, pool_, /*same_as=*/nullptr, &restored);
    if (!s) return s.status();
    s_ = std::move(*s);
    // The file holds tokens, not messages: new messages are appended after them.
    msgs_.clear();
    known_ = false;
    std::fprintf(stderr, "[loaded %zu tokens from %s: kv %s, context %lld, %s]\n",
                 s_->tokens().size(), path.c_str(), s_->cache().describe().c_str(),
                 (long long)s_->cache().n_ctx(),
                 restored ? "cache state restored" : "history re-prefilled");
    return Status::ok();
  }

  void stats() const {
    KvReport r;
    s_->cache().report(&r);
    const KvLayerReport t = r.total();
    std::printf("tokens: %zu in the conversation, %lld in the cache, context %lld\n",
                s_->tokens().size(), (long long)s_->cache().n_past(),
                (long long)s_->cache().n_ctx());
    std::printf("kv: %s\n", s_->cache().describe().c_str());
    std::printf("bytes: held %zu (sink %zu, full %zu, low-bit %zu), peak %zu\n", r.bytes_held,
                t.bytes_sink, t.bytes_full, t.bytes_quant, r.peak_bytes_held);
    std::printf("moves: promotions %lld, demotions %lld, evictions %lld\n", (long long)t.promotions,
                (long long)t.demotions, (long long)t.evictions);
    int i = 0;
    for (const TurnStats& ts : s_->turns())
      std::printf(
          "turn %d: prefilled %lld, reused %lld, generated %lld, promotions %lld, demotions "
          "%lld, evictions %lld, bytes held %zu\n",
          ++i, (long long)ts.prompt_tokens, (long long)ts.reused_tokens, (long long)ts.generated,
          (long long)ts.promotions, (long long)ts.demotions, (long long)ts.evictions,
          ts.bytes_held);
    std::fflush(stdout);
  }

  const ChatArgs& a_;
  Model& model_;
  Tokenizer& tok_;
  ThreadPool& pool_;
  std::optional<ChatTemplate> tmpl_;
  std::unique_ptr<Session> s_;
  std::vector<ChatMessage> msgs_;
  bool known_ = true;  // msgs_ render to the session's history
  SamplingParams sampling_;
  std::vector<int32_t> stop_;
  double decode_seconds_ = 0.0;
};

int run_chat(const ChatArgs& a) {
  auto kvp = kv_params(a.kv);
  if (!kvp) return fail(kvp.error());
  if (Status s = a.sampling.validate(); !s) return fail(s.message());
  auto loaded = load_model(a.model);
  if (!loaded) return fail(loaded.error());
  const int threads = resolve_threads(a.model.threads);
  if (Status st = prepare_kv_params(*loaded, &*kvp, threads); !st.is_ok())
    return fail(st.message());
  ThreadPool pool(threads);
  Chat chat(a, *loaded, pool);
  if (Status st = chat.init(*kvp); !st) return fail(st.message());
  const bool tty = isatty(STDIN_FILENO) != 0;
  std::fprintf(stderr, "chat: %s, kv %s, context %lld; /help for commands\n",
               loaded->model->config().name.c_str(), chat.session().cache().describe().c_str(),
               (long long)a.n_ctx);
  std::string in;
  bool quit = false;
  while (!quit) {
    if (tty) {
      std::fputs("> ", stdout);
      std::fflush(stdout);
    }
    if (!std::getline(std::cin, in)) break;
    if (!in.empty() && in.back() == '\r') in.pop_back();
    const Status st = chat.line(in, &quit);
    if (!st) {
      std::fprintf(stderr, "error: %s\n", st.message().c_str());
      if (!tty || chat.session().is_broken()) return 1;
    }
  }
  if (a.kv.stats) print_kv_stats(chat.session().cache(), chat.decode_seconds());
  return 0;
}

}  // namespace

Runner add_chat(CLI::App& app) {
  auto a = std::make_shared<ChatArgs>();
  add_model_options(app, a->model);
  app.add_option("-c,--ctx-size", a->n_ctx,
                 "context size: the longest conversation (a --kv-budget fraction is of it)")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("-n,--n-predict", a->n_predict, "most tokens per reply")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--system", a->system, "system message");
  add_sampling_options(app, a->sampling, a->seed);
  app.add_option("-b,--prefill-chunk", a->prefill_chunk, "prompt tokens per forward call")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  add_kv_options(app, a->kv);
  return [a] { return run_chat(*a); };
}

}  // namespace qevict::cli
