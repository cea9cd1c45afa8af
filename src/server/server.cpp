// The OpenAI-compatible routes over the scheduler (see server.h).
#include "server/server.h"

#include <fmt/format.h>
#include <httplib.h>

#include <ctime>
#include <nlohmann/json.hpp>
#include <random>
#include <variant>

#include "server/errors.h"
#include "server/metrics.h"
#include "server/sse.h"
#include "server/stop_strings.h"

namespace qevict {

namespace {

using json = nlohmann::json;

void send_error(httplib::Response& res, int status, const std::string& msg,
                const std::string& param = "") {
  res.status = status;
  if (status == 429) res.set_header("Retry-After", "1");
  res.set_content(openai_error_body(status, msg, param), "application/json");
}

}  // namespace

// What a request asks for, after validation.
struct OpenAiServer::Parsed {
  bool stream = false;
  ServeRequest req;
  std::vector<std::string> stop;  // stop strings
  CompletionHeader header;        // id and created are set when the request is accepted
};

// One streamed response, shared by the calls of its content provider.
struct OpenAiServer::Streamed {
  CompletionHeader header;
  std::shared_ptr<ServeStream> stream;
  StopStringMatcher text;
  int64_t n_prompt = 0, n_out = 0, n_cached = 0;
  bool first = true, finished = false;
};

OpenAiServer::OpenAiServer(OpenAiServerOptions opts, const Tokenizer& tokenizer,
                           const std::string& chat_template, Scheduler& scheduler,
                           KvParamsForRequest kv, const std::atomic<bool>& stopping)
    : opts_(std::move(opts)),
      tok_(tokenizer),
      tmpl_(chat_template),
      sched_(scheduler),
      kv_(std::move(kv)),
      stopping_(stopping) {
  for (int32_t id = 0; id < tok_.n_vocab(); ++id)
    if (tok_.is_eog(id)) eog_.push_back(id);
  created_ = int64_t(std::time(nullptr));
}

void OpenAiServer::install(httplib::Server& svr) {
  svr.set_payload_max_length(size_t(opts_.max_body_bytes));
  svr.set_pre_routing_handler([this](const httplib::Request& req, httplib::Response& res) {
    if (opts_.api_key.empty() || req.path == "/health")
      return httplib::Server::HandlerResponse::Unhandled;
    if (req.get_header_value("Authorization") != "Bearer " + opts_.api_key) {
      send_error(res, 401, "invalid or missing API key (Authorization: Bearer KEY)");
      return httplib::Server::HandlerResponse::Handled;
    }
    return httplib::Server::HandlerResponse::Unhandled;
  });
  svr.Get("/health", [this](const httplib::Request&, httplib::Response& res) {
    res.set_content(tmpl_.health_body(), "application/json");
  });
  svr.Get("/v1/models", [this](const httplib::Request&, httplib::Response& res) {
    json m = {{"object", "list"},
              {"data",
               {{{"id", opts_.model_id},
                 {"object", "model"},
                 {"created", created_},
                 {"owned_by", "qevict"}}}}};
    res.set_content(m.dump(-1, ' ', false, json::error_handler_t::replace), "application/json");
  });
  svr.Get("/metrics", [this](const httplib::Request&, httplib::Response& res) {
    res.set_content(prometheus_metrics(sched_.metrics()), "text/plain; version=0.0.4");
  });
  svr.Get("/slots", [this](const httplib::Request&, httplib::Response& res) {
    json a = json::array();
    for (const SlotInfo& s : sched_.slots())
      a.push_back({{"id", s.id},
                   {"tokens", s.tokens},
                   {"n_past", s.n_past},
                   {"policy", s.policy},
                   {"bytes_held", s.bytes},
                   {"state", s.state},
                   {"last_used", s.last_used}});
    res.set_content(a.dump(-1, ' ', false, json::error_handler_t::replace), "application/json");
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

// Validates the body into p (server/openai_request.h does the JSON), renders and tokenizes the
// prompt; on error fills res and returns false.
bool OpenAiServer::parse(const httplib::Request& hreq, bool chat, Parsed* p,
                         httplib::Response& res) const {
  const std::string& body = hreq.body;
  auto parsed = parse_openai_request(
      body, chat ? OpenAiEndpoint::kChat : OpenAiEndpoint::kCompletions, opts_.n_ctx);
  if (auto* e = std::get_if<OpenAiRequestError>(&parsed))
    return send_error(res, 400, e->message, e->param), false;
  const OpenAiRequest& q = std::get<OpenAiRequest>(parsed);
  p->stream = q.stream;
  p->stop = q.stop;
  p->header.chat = chat;
  p->header.include_usage = q.include_usage;
  p->header.model = q.model.empty() ? opts_.model_id : q.model;
  SamplingParams& sp = p->req.sampling;
  sp.temperature = float(q.temperature);
  sp.top_p = float(q.top_p);
  sp.top_k = int(q.top_k);
  sp.min_p = float(q.min_p);
  sp.seed = q.seed >= 0 ? uint64_t(q.seed) : std::random_device{}();
  p->req.max_tokens = int(q.max_tokens);
  if (!q.ignore_eos) p->req.stop_tokens = eog_;
  auto kvp = kv_(q);
  if (!kvp) return send_error(res, 400, kvp.error(), "kv_policy"), false;
  p->req.kv = *kvp;
  // The conversation: X-Session-Id, else OpenAI's `user`.
  p->req.session_id = hreq.get_header_value("X-Session-Id");
  if (p->req.session_id.empty()) p->req.session_id = q.user;
  if (p->req.session_id.size() > 256)
    return send_error(res, 400, "the session id (X-Session-Id / user) is over 256 bytes", "user"),
           false;
  // The prompt.
  std::string text;
  if (chat) {
    auto r = tmpl_.render(q.messages, tok_.token_to_piece(tok_.bos(), true),
                          tok_.token_to_piece(tok_.eos(), true));
    if (!r) return send_error(res, 400, r.error(), "messages"), false;
    text = *r;
  } else {
    text = q.prompt;
  }
  p->req.prompt = tok_.encode(text, /*add_special=*/true, /*parse_special=*/chat);
  return true;
}

void OpenAiServer::complete(const httplib::Request& hreq, httplib::Response& res, bool chat) {
  Parsed p;
  if (!parse(hreq, chat, &p, res)) return;
  const int64_t n_prompt = int64_t(p.req.prompt.size());
  SubmitResult sub = sched_.submit(std::move(p.req));
  if (!sub.stream) return send_error(res, sub.status, sub.error);
  p.header.id = fmt::format("{}-{}", chat ? "chatcmpl" : "cmpl", next_id_++);
  p.header.created = int64_t(std::time(nullptr));
  if (p.stream)
    answer_streamed(p, sub.stream, n_prompt, res);
  else
    answer_whole(p, sub.stream, n_prompt, res);
}

void OpenAiServer::answer_whole(Parsed& p, const std::shared_ptr<ServeStream>& stream,
                                int64_t n_prompt, httplib::Response& res) {
  StopStringMatcher text(p.stop);
  std::string finish;
  int64_t n_out = 0, n_cached = 0;
  for (;;) {
    ServeEvent e;
    if (!stream->next(&e, std::chrono::milliseconds(1000))) {
      if (stopping_.load()) return stream->cancel(), send_error(res, 503, "server shutting down");
      continue;
    }
    if (e.kind == ServeEvent::Kind::kError) return send_error(res, 500, e.error);
    if (e.kind == ServeEvent::Kind::kDone) {
      finish = e.finish_reason;
      break;
    }
    ++n_out;
    if (text.add(tok_.token_to_piece(e.token))) {
      stream->cancel();
      finish = "stop";
      break;
    }
  }
  text.flush();
  n_cached = stream->cached_tokens();
  res.set_content(completion_body(p.header, text.text(), finish, n_prompt, n_out, n_cached),
                  "application/json");
}

// One SSE event per piece of text (a chat starts with the assistant role), then the finish
// reason, the usage if asked, and [DONE].
void OpenAiServer::answer_streamed(Parsed& p, const std::shared_ptr<ServeStream>& stream,
                                   int64_t n_prompt, httplib::Response& res) {
  auto st = std::make_shared<Streamed>(Streamed{p.header, stream, StopStringMatcher(p.stop)});
  st->n_prompt = n_prompt;
  const bool chat = p.header.chat;
  res.set_chunked_content_provider(
      "text/event-stream",
      [st, chat, this](size_t, httplib::DataSink& sink) {
        auto write = [&](const std::string& s) { return sink.write(s.data(), s.size()); };
        if (st->finished) return false;
        if (st->first && chat) {
          st->first = false;
          if (!write(sse_chunk(st->header, json{{"role", "assistant"}, {"content", ""}}, nullptr)))
            return st->stream->cancel(), false;
        }
        ServeEvent e;
        if (!st->stream->next(&e, std::chrono::milliseconds(200))) {
          if (stopping_.load() || !sink.is_writable()) return st->stream->cancel(), false;
          return true;  // nothing yet: httplib calls again
        }
        if (e.kind == ServeEvent::Kind::kError) {
          write(sse_error(e.error));
          st->finished = true;
          sink.done();
          return true;
        }
        std::string finish;
        if (e.kind == ServeEvent::Kind::kDone) {
          finish = e.finish_reason;
        } else {
          ++st->n_out;
          if (st->text.add(tok_.token_to_piece(e.token))) {
            st->stream->cancel();
            finish = "stop";
          }
        }
        if (!finish.empty()) st->text.flush();
        const std::string piece = st->text.take();
        if (!piece.empty()) {
          const json content = chat ? json{{"content", piece}} : json(piece);
          if (!write(sse_chunk(st->header, content, nullptr))) return st->stream->cancel(), false;
        }
        if (finish.empty()) return true;
        st->n_cached = st->stream->cached_tokens();
        if (!write(sse_chunk(st->header, chat ? json::object() : json(""), finish))) return false;
        if (st->header.include_usage &&
            !write(sse_usage(st->header, st->n_prompt, st->n_out, st->n_cached)))
          return false;
        write(sse_done());
        st->finished = true;
        sink.done();
        return true;
      },
      [stream](bool) { stream->cancel(); });  // the response ended, or the client left
}

}  // namespace qevict
