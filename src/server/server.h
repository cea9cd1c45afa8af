// qevict serve's HTTP API (issue 12), a library: an OpenAI-compatible server over the
// continuous-batching scheduler (engine/scheduler.h). Endpoints: POST /v1/chat/completions and
// /v1/completions (streaming SSE or not), GET /v1/models, /health, /metrics (Prometheus text),
// /slots (the conversations the scheduler holds: engine/scheduler.h's conversation reuse; a
// request names its conversation with the X-Session-Id header or OpenAI's `user` field, and
// its usage says the prompt tokens reused in prompt_tokens_details.cached_tokens).
// One model per server: like llama-server, any `model` value in a request is served by it.
// Extra body fields `kv_policy` and `kv_budget` choose a request's cache (the caller's
// KvParamsForRequest turns them into params). Errors use OpenAI's shape (server/errors.h).
// What stays with the caller (tools/cmd_serve.cpp): flags, loading the model, the scheduler
// thread, binding the socket and signals.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "core/status.h"
#include "engine/scheduler.h"
#include "kvcache/params.h"
#include "server/openai_request.h"
#include "server/server_template.h"
#include "tokenizer/tokenizer.h"

namespace httplib {
class Server;
class Request;
class Response;
}  // namespace httplib

namespace qevict {

struct OpenAiServerOptions {
  std::string model_id;  // GET /v1/models, and "model" of responses to requests naming none
  std::string api_key;   // non-empty: every endpoint but /health needs "Bearer KEY"
  int64_t n_ctx = 8192;  // bounds max_tokens
  int64_t max_body_bytes = 1 << 20;
};

// A request's KV-cache params: the server's defaults with the request's kv_policy and
// kv_budget applied, validated; an error is answered 400 on "kv_policy".
using KvParamsForRequest = std::function<Expected<KvCacheParams>(const OpenAiRequest&)>;

class OpenAiServer {
 public:
  // `chat_template`: the model's template text (empty: none; see server_template.h).
  // `stopping` turns true when the server shuts down: requests still waiting end (503, or
  // their stream closes). tokenizer, scheduler and stopping must outlive the server.
  OpenAiServer(OpenAiServerOptions opts, const Tokenizer& tokenizer,
               const std::string& chat_template, Scheduler& scheduler, KvParamsForRequest kv,
               const std::atomic<bool>& stopping);

  // Registers the routes, the API-key check and the error handlers on `svr`.
  void install(httplib::Server& svr);

  const ServerChatTemplate& chat_template() const { return tmpl_; }

 private:
  struct Parsed;
  struct Streamed;
  bool parse(const httplib::Request& hreq, bool chat, Parsed* p, httplib::Response& res) const;
  void complete(const httplib::Request& hreq, httplib::Response& res, bool chat);
  void answer_whole(Parsed& p, const std::shared_ptr<ServeStream>& stream, int64_t n_prompt,
                    httplib::Response& res);
  void answer_streamed(Parsed& p, const std::shared_ptr<ServeStream>& stream, int64_t n_prompt,
                       httplib::Response& res);

  OpenAiServerOptions opts_;
  const Tokenizer& tok_;
  ServerChatTemplate tmpl_;
  Scheduler& sched_;
  KvParamsForRequest kv_;
  const std::atomic<bool>& stopping_;
  std::vector<int32_t> eog_;  // end-of-generation tokens: stop tokens unless ignore_eos
  int64_t created_ = 0;       // Unix seconds: the model's "created" in /v1/models
  std::atomic<int64_t> next_id_{1};
};

}  // namespace qevict
