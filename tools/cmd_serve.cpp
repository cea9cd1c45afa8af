// qevict serve: an OpenAI-compatible HTTP server (issue 12) over the continuous-batching
// scheduler (engine/scheduler.h). Endpoints: POST /v1/chat/completions and /v1/completions
// (streaming SSE or not), GET /v1/models, /health, /metrics (Prometheus text). One model per
// server: like llama-server, any `model` value in a request is served by it. Extra body
// fields `kv_policy` and `kv_budget` choose a request's cache (server defaults from the
// --kv-* flags); every cache draws from one pool of --kv-pool-bytes. Errors use OpenAI's
// shape {"error": {"message", "type", "param", "code"}}.
#include <fmt/format.h>
#include <httplib.h>

#include <atomic>
#include <csignal>
#include <cstdio>
#include <ctime>
#include <nlohmann/json.hpp>
#include <random>
#include <thread>
#include <variant>

#include "chat/chat_template.h"
#include "cli_common.h"
#include "commands.h"
#include "engine/scheduler.h"
#include "server/openai_request.h"

namespace qevict::cli {

namespace {

using json = nlohmann::json;

struct ServeArgs {
  ModelOptions model;
  KvOptions kv;
  std::string host = "127.0.0.1";
  int port = 8080;
  std::string api_key;
  int64_t n_ctx = 8192;
  std::string pool = "512M";
  int parallel = 8;
  int max_queue = 64;
  int prefill_chunk = 256;
  int64_t max_body = 1 << 20;
  int http_threads = 96;
};

std::atomic<bool> g_stop{false};
httplib::Server* g_server = nullptr;

void on_signal(int) {
  g_stop.store(true);
  if (g_server) g_server->stop();
}

// "512M", "2G", "1048576" → bytes; 0 on a malformed value.
size_t parse_bytes(const std::string& s) {
  if (s.empty()) return 0;
  size_t mult = 1, n = s.size();
  switch (s.back()) {
    case 'K':
    case 'k':
      mult = size_t(1) << 10;
      --n;
      break;
    case 'M':
    case 'm':
      mult = size_t(1) << 20;
      --n;
      break;
    case 'G':
    case 'g':
      mult = size_t(1) << 30;
      --n;
      break;
    default:
      break;
  }
  size_t v = 0;
  for (size_t i = 0; i < n; ++i) {
    if (s[i] < '0' || s[i] > '9') return 0;
    v = v * 10 + size_t(s[i] - '0');
  }
  return v * mult;
}

void send_error(httplib::Response& res, int status, const std::string& msg,
                const std::string& param = "") {
  const char* type = status == 401   ? "authentication_error"
                     : status == 429 ? "rate_limit_error"
                     : status >= 500 ? "server_error"
                                     : "invalid_request_error";
  json e = {{"error",
             {{"message", msg},
              {"type", type},
              {"param", param.empty() ? json(nullptr) : json(param)},
              {"code", json(nullptr)}}}};
  res.status = status;
  if (status == 429) res.set_header("Retry-After", "1");
  res.set_content(e.dump(), "application/json");
}

// What a request asks for, after validation.
struct Parsed {
  bool chat = false, stream = false, include_usage = false;
  std::vector<int32_t> prompt;
  ServeRequest req;
  std::vector<std::string> stop;  // stop strings
  std::string model_name;
};

class Server {
 public:
  Server(ServeArgs a, Loaded l, Scheduler& sched, std::string model_id)
      : a_(std::move(a)), l_(std::move(l)), sched_(sched), model_id_(std::move(model_id)) {
    const std::string tmpl = l_.model->gguf().get_string_or("tokenizer.chat_template", "");
    if (!tmpl.empty()) {
      auto ct = ChatTemplate::parse(tmpl);
      if (ct)
        tmpl_ = std::make_unique<ChatTemplate>(*ct);
      else
        template_error_ = ct.error();
    }
    for (int32_t id = 0; id < l_.tokenizer->n_vocab(); ++id)
      if (l_.tokenizer->is_eog(id)) eog_.push_back(id);
    created_ = int64_t(std::time(nullptr));
  }

  void install(httplib::Server& svr) {
    svr.set_payload_max_length(size_t(a_.max_body));
    svr.set_pre_routing_handler([this](const httplib::Request& req, httplib::Response& res) {
      if (a_.api_key.empty() || req.path == "/health")
        return httplib::Server::HandlerResponse::Unhandled;
      if (req.get_header_value("Authorization") != "Bearer " + a_.api_key) {
        send_error(res, 401, "invalid or missing API key (Authorization: Bearer KEY)");
        return httplib::Server::HandlerResponse::Handled;
      }
      return httplib::Server::HandlerResponse::Unhandled;
    });
    svr.Get("/health", [](const httplib::Request&, httplib::Response& res) {
      res.set_content(R"({"status":"ok"})", "application/json");
    });
    svr.Get("/v1/models", [this](const httplib::Request&, httplib::Response& res) {
      json m = {{"object", "list"},
                {"data",
                 {{{"id", model_id_},
                   {"object", "model"},
                   {"created", created_},
                   {"owned_by", "qevict"}}}}};
      res.set_content(m.dump(), "application/json");
    });
    svr.Get("/metrics", [this](const httplib::Request&, httplib::Response& res) {
      res.set_content(metrics_text(), "text/plain; version=0.0.4");
    });
    svr.Post("/v1/chat/completions", [this](const httplib::Request& req, httplib::Response& res) {
      complete(req, res, true);
    });
    svr.Post("/v1/completions", [this](const httplib::Request& req, httplib::Response& res) {
      complete(req, res, false);
    });
    svr.set_error_handler([](const httplib::Request&, httplib::Response& res) {
      if (!res.body.empty()) return;
      if (res.status == 404)
        send_error(res, 404, "no such endpoint");
      else if (res.status == 413)
        send_error(res, 413, "request body too large");
      else
        send_error(res, res.status, fmt::format("HTTP error {}", res.status));
    });
    svr.set_exception_handler(
        [](const httplib::Request&, httplib::Response& res, std::exception_ptr ep) {
          std::string what = "internal error";
          try {
            if (ep) std::rethrow_exception(ep);
          } catch (const std::exception& e) {
            what = e.what();
          } catch (...) {
          }
          send_error(res, 500, what);
        });
  }

 private:
  // Validates the body into p (server/openai_request.h does the JSON), renders and tokenizes
  // the prompt; on error fills res and returns false.
  bool parse(const httplib::Request& hreq, bool chat, Parsed* p, httplib::Response& res) {
    auto parsed = parse_openai_request(
        hreq.body, chat ? OpenAiEndpoint::kChat : OpenAiEndpoint::kCompletions, a_.n_ctx);
    if (auto* e = std::get_if<OpenAiRequestError>(&parsed))
      return send_error(res, 400, e->message, e->param), false;
    const OpenAiRequest& q = std::get<OpenAiRequest>(parsed);
    p->chat = chat;
    p->stream = q.stream;
    p->include_usage = q.include_usage;
    p->stop = q.stop;
    p->model_name = q.model.empty() ? model_id_ : q.model;
    SamplingParams& sp = p->req.sampling;
    sp.temperature = float(q.temperature);
    sp.top_p = float(q.top_p);
    sp.top_k = int(q.top_k);
    sp.min_p = float(q.min_p);
    sp.seed = q.seed >= 0 ? uint64_t(q.seed) : std::random_device{}();
    p->req.max_tokens = int(q.max_tokens);
    if (!q.ignore_eos) p->req.stop_tokens = eog_;
    // The KV cache: the server's flags, then the request's kv_policy / kv_budget.
    KvOptions kv = a_.kv;
    if (q.kv_policy) kv.list.emplace_back("policy", *q.kv_policy);
    if (q.kv_budget) {
      kv.list.emplace_back("budget", fmt::format("{}", *q.kv_budget));
      kv.list.emplace_back("budget_bytes", "0");
    }
    auto kvp = kv_params(kv);
    if (!kvp) return send_error(res, 400, kvp.error(), "kv_policy"), false;
    if (!attach_known_calibration(l_, &*kvp))
      return send_error(res, 400,
                        "kv_policy kvquant needs its calibration, which runs the model: start the "
                        "server with --kv-policy kvquant (and the same --kv-bits / --kv-q)",
                        "kv_policy"),
             false;
    p->req.kv = *kvp;
    // The prompt.
    std::string text;
    if (chat) {
      if (tmpl_) {
        auto r =
            tmpl_->render(q.messages, true, l_.tokenizer->token_to_piece(l_.tokenizer->bos(), true),
                          l_.tokenizer->token_to_piece(l_.tokenizer->eos(), true));
        if (!r) return send_error(res, 400, r.error(), "messages"), false;
        text = *r;
      } else {
        text = render_chatml(q.messages, true);
      }
    } else {
      text = q.prompt;
    }
    p->req.prompt = l_.tokenizer->encode(text, /*add_special=*/true, /*parse_special=*/chat);
    return true;
  }

  json usage(int64_t prompt, int64_t completion) const {
    return {{"prompt_tokens", prompt},
            {"completion_tokens", completion},
            {"total_tokens", prompt + completion}};
  }

  void complete(const httplib::Request& hreq, httplib::Response& res, bool chat) {
    Parsed p;
    if (!parse(hreq, chat, &p, res)) return;
    const int64_t n_prompt = int64_t(p.req.prompt.size());
    SubmitResult sub = sched_.submit(std::move(p.req));
    if (!sub.stream) return send_error(res, sub.status, sub.error);
    const std::string id = fmt::format("{}-{}", chat ? "chatcmpl" : "cmpl", next_id_++);
    const int64_t created = int64_t(std::time(nullptr));
    auto stream = sub.stream;
    auto text_state = std::make_shared<TextState>(p.stop);
    if (!p.stream) {
      std::string finish;
      int64_t n_out = 0;
      for (;;) {
        ServeEvent e;
        if (!stream->next(&e, std::chrono::milliseconds(1000))) {
          if (g_stop.load()) return stream->cancel(), send_error(res, 503, "server shutting down");
          continue;
        }
        if (e.kind == ServeEvent::Kind::kError) return send_error(res, 500, e.error);
        if (e.kind == ServeEvent::Kind::kDone) {
          finish = e.finish_reason;
          break;
        }
        ++n_out;
        if (text_state->add(l_.tokenizer->token_to_piece(e.token))) {
          stream->cancel();
          finish = "stop";
          break;
        }
      }
      text_state->flush();
      json choice = {{"index", 0}, {"finish_reason", finish}};
      if (chat) {
        choice["message"] = {{"role", "assistant"}, {"content", text_state->text}};
      } else {
        choice["text"] = text_state->text;
        choice["logprobs"] = nullptr;
      }
      json out = {{"id", id},
                  {"object", chat ? "chat.completion" : "text_completion"},
                  {"created", created},
                  {"model", p.model_name},
                  {"choices", json::array({choice})},
                  {"usage", usage(n_prompt, n_out)}};
      res.set_content(out.dump(), "application/json");
      return;
    }
    // Streaming: one SSE event per piece of text, then the finish reason, then [DONE].
    const bool include_usage = p.include_usage;
    const std::string model_name = p.model_name;
    auto n_out = std::make_shared<int64_t>(0);
    auto first = std::make_shared<bool>(true);
    auto finished = std::make_shared<bool>(false);
    res.set_chunked_content_provider(
        "text/event-stream",
        [=, this](size_t, httplib::DataSink& sink) {
          auto chunk = [&](const json& delta_or_text, const json& finish) {
            json choice = {{"index", 0}, {"finish_reason", finish}};
            if (chat)
              choice["delta"] = delta_or_text;
            else
              choice["text"] = delta_or_text, choice["logprobs"] = nullptr;
            json c = {{"id", id},
                      {"object", chat ? "chat.completion.chunk" : "text_completion"},
                      {"created", created},
                      {"model", model_name},
                      {"choices", json::array({choice})}};
            if (include_usage) c["usage"] = nullptr;
            const std::string s = "data: " + c.dump() + "\n\n";
            return sink.write(s.data(), s.size());
          };
          if (*finished) return false;
          if (*first && chat) {
            *first = false;
            if (!chunk(json{{"role", "assistant"}, {"content", ""}}, nullptr))
              return stream->cancel(), false;
          }
          ServeEvent e;
          if (!stream->next(&e, std::chrono::milliseconds(200))) {
            if (g_stop.load() || !sink.is_writable()) return stream->cancel(), false;
            return true;  // nothing yet: httplib calls again
          }
          std::string finish;
          if (e.kind == ServeEvent::Kind::kError) {
            const json err = {{"error", {{"message", e.error}, {"type", "server_error"}}}};
            const std::string s = "data: " + err.dump() + "\n\n";
            sink.write(s.data(), s.size());
            *finished = true;
            sink.done();
            return true;
          }
          if (e.kind == ServeEvent::Kind::kDone) {
            finish = e.finish_reason;
          } else {
            ++*n_out;
            if (text_state->add(l_.tokenizer->token_to_piece(e.token))) {
              stream->cancel();
              finish = "stop";
            }
          }
          if (!finish.empty()) text_state->flush();
          const std::string piece = text_state->take();
          if (!piece.empty()) {
            const json d = chat ? json{{"content", piece}} : json(piece);
            if (!chunk(d, nullptr)) return stream->cancel(), false;
          }
          if (finish.empty()) return true;
          if (!chunk(chat ? json::object() : json(""), finish)) return false;
          if (include_usage) {
            json u = {{"id", id},
                      {"object", chat ? "chat.completion.chunk" : "text_completion"},
                      {"created", created},
                      {"model", model_name},
                      {"choices", json::array()},
                      {"usage", usage(n_prompt, *n_out)}};
            const std::string s = "data: " + u.dump() + "\n\n";
            if (!sink.write(s.data(), s.size())) return false;
          }
          const std::string done = "data: [DONE]\n\n";
          sink.write(done.data(), done.size());
          *finished = true;
          sink.done();
          return true;
        },
        [stream](bool) { stream->cancel(); });  // the response ended, or the client left
  }

  // Generated text: UTF-8 completed across tokens, stop strings cut, and what is safe to send
  // (held back while it could still be the start of a stop string).
  struct TextState {
    explicit TextState(std::vector<std::string> s) : stop(std::move(s)) {}
    std::vector<std::string> stop;
    Utf8Streamer utf8;
    std::string text;  // everything final so far
    size_t sent = 0;
    bool stopped = false;
    // Adds a token's bytes; true when a stop string was hit (text ends before it).
    bool add(const std::string& bytes) {
      if (stopped) return true;
      text += utf8.push(bytes);
      for (const auto& s : stop) {
        const size_t at = text.find(s, sent > s.size() ? sent - s.size() : 0);
        if (at != std::string::npos) {
          text.resize(at);
          stopped = true;
          return true;
        }
      }
      return false;
    }
    void flush() {
      if (!stopped) text += utf8.flush();
    }
    // The text not sent yet, minus a tail that may begin a stop string.
    std::string take() {
      size_t hold = 0;
      if (!stopped)
        for (const auto& s : stop)
          for (size_t k = std::min(s.size() - 1, text.size() - sent); k > hold; --k)
            if (text.compare(text.size() - k, k, s, 0, k) == 0) {
              hold = k;
              break;
            }
      const size_t end = text.size() - hold;
      std::string out = end > sent ? text.substr(sent, end - sent) : std::string();
      sent = std::max(sent, end);
      return out;
    }
  };

  std::string metrics_text() const {
    const SchedulerMetrics m = sched_.metrics();
    std::string s;
    auto add = [&](const char* name, const char* type, const char* help, double v) {
      s += fmt::format("# HELP qevict_{} {}\n# TYPE qevict_{} {}\nqevict_{} {}\n", name, help, name,
                       type, name, v);
    };
    add("requests_total", "counter", "requests received", double(m.requests));
    add("requests_refused_total", "counter", "requests refused with 429 (queue full)",
        double(m.refused_queue_full));
    add("requests_finished_total", "counter", "requests answered", double(m.finished));
    add("requests_cancelled_total", "counter", "requests whose client left", double(m.cancelled));
    add("requests_failed_total", "counter", "requests that failed", double(m.failed));
    add("prompt_tokens_total", "counter", "prompt tokens processed", double(m.prompt_tokens));
    add("generated_tokens_total", "counter", "tokens generated", double(m.generated_tokens));
    add("queue_depth", "gauge", "requests waiting for room in the KV pool", double(m.waiting));
    add("active_sequences", "gauge", "sequences in the batch", double(m.active));
    add("kv_pool_bytes", "gauge", "the KV byte pool", double(m.pool_bytes));
    add("kv_reserved_bytes", "gauge", "bytes reserved by admitted requests",
        double(m.reserved_bytes));
    add("kv_held_bytes", "gauge", "bytes every cache holds (real allocations)",
        double(m.held_bytes));
    add("kv_held_max_bytes", "gauge", "the most held after any step", double(m.max_held_bytes));
    s += "# HELP qevict_kv_tier_bytes bytes in use by tier\n# TYPE qevict_kv_tier_bytes gauge\n";
    s += fmt::format("qevict_kv_tier_bytes{{tier=\"full\"}} {}\n", m.held_full);
    s += fmt::format("qevict_kv_tier_bytes{{tier=\"quant\"}} {}\n", m.held_quant);
    s += fmt::format("qevict_kv_tier_bytes{{tier=\"sink\"}} {}\n", m.held_sink);
    add("evictions_total", "counter", "windows/tokens evicted (finished sequences)",
        double(m.evictions));
    add("promotions_total", "counter", "windows promoted Q to F (finished sequences)",
        double(m.promotions));
    add("steps_total", "counter", "scheduler steps (forward calls)", double(m.steps));
    add("decode_tokens_per_second", "gauge", "tokens per second of decoding steps",
        m.decode_seconds > 0 ? double(m.decode_tokens) / m.decode_seconds : 0.0);
    return s;
  }

  ServeArgs a_;
  Loaded l_;
  Scheduler& sched_;
  std::string model_id_;
  std::unique_ptr<ChatTemplate> tmpl_;
  std::string template_error_;
  std::vector<int32_t> eog_;
  int64_t created_ = 0;
  std::atomic<int64_t> next_id_{1};
};

int run_serve(const ServeArgs& a) {
  SchedulerOptions so;
  so.n_ctx = a.n_ctx;
  so.kv_pool_bytes = parse_bytes(a.pool);
  so.max_queue = a.max_queue;
  so.max_batch = a.parallel;
  so.prefill_chunk = a.prefill_chunk;
  if (so.kv_pool_bytes == 0)
    return fail(
        fmt::format("--kv-pool-bytes: '{}' is not a size (e.g. 1073741824, 512M, 2G)", a.pool));
  if (Status st = so.validate(); !st.is_ok()) return fail(st.message());
  if (a.port < 0 || a.port > 65535) return fail("--port must be in [0, 65535]");
  auto kvp = kv_params(a.kv);
  if (!kvp) return fail(kvp.error());
  auto path = resolve_model_path(a.model.model_path);
  if (!path) return fail(path.error());
  auto loaded = load_model(a.model);
  if (!loaded) return fail(loaded.error());
  std::string model_id = *path;
  if (const size_t slash = model_id.find_last_of('/'); slash != std::string::npos)
    model_id = model_id.substr(slash + 1);
  // kvquant's calibration runs the model: at startup, before the scheduler does.
  if (Status st = prepare_kv_params(*loaded, &*kvp, a.model.threads); !st.is_ok())
    return fail(st.message());
  ThreadPool pool(resolve_threads(a.model.threads));
  Scheduler sched(*loaded->model, pool, so);
  Server server(a, std::move(*loaded), sched, model_id);
  httplib::Server svr;
  const int http_threads = a.http_threads;
  svr.new_task_queue = [http_threads] { return new httplib::ThreadPool(size_t(http_threads)); };
  server.install(svr);
  g_server = &svr;
  std::signal(SIGINT, on_signal);
  std::signal(SIGTERM, on_signal);
  std::signal(SIGPIPE, SIG_IGN);
  int port = a.port;
  if (port == 0) {
    port = svr.bind_to_any_port(a.host);
    if (port < 0) return fail(fmt::format("cannot bind {}", a.host));
  } else if (!svr.bind_to_port(a.host, port)) {
    return fail(fmt::format("cannot bind {}:{} (in use, or not allowed)", a.host, port));
  }
  std::thread worker([&] { sched.run(g_stop); });
  std::fprintf(stderr, "qevict serve: %s on http://%s:%d (KV pool %zu bytes, policy %s)\n",
               model_id.c_str(), a.host.c_str(), port, so.kv_pool_bytes, kvp->policy.c_str());
  std::fflush(stderr);
  svr.listen_after_bind();
  g_stop.store(true);
  sched.wake();
  worker.join();
  return 0;
}

}  // namespace

Runner add_serve(CLI::App& app) {
  auto a = std::make_shared<ServeArgs>();
  add_model_options(app, a->model);
  add_kv_options(app, a->kv);
  app.add_option("--host", a->host, "address to bind (default: loopback only)")
      ->capture_default_str();
  app.add_option("--port", a->port, "port (0: any free port, printed on stderr)")
      ->capture_default_str();
  app.add_option("--api-key", a->api_key, "require Authorization: Bearer KEY");
  app.add_option("-c,--ctx-size", a->n_ctx, "tokens per sequence (prompt + max_tokens)")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--kv-pool-bytes", a->pool,
                 "bytes all KV caches may hold together (e.g. 536870912, 512M, 2G)")
      ->capture_default_str();
  app.add_option("--parallel", a->parallel, "sequences decoding at once")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--max-queue", a->max_queue, "requests waiting for room; more get 429")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  app.add_option("--prefill-chunk", a->prefill_chunk, "prompt tokens per scheduler step")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--max-body-bytes", a->max_body, "largest request body")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--http-threads", a->http_threads, "connections served at once")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  return [a] { return run_serve(*a); };
}

}  // namespace qevict::cli
