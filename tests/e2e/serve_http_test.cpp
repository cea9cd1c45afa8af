// qevict serve's HTTP library (src/server/server.h) on the real model, over a real socket: a
// model whose chat template does not parse is reported in GET /health and served with ChatML
// (llama-server's fallback); the error bodies and the end of a stream are the exact bytes of
// server/errors.h and server/sse.h. (tools/serve/client_test.py drives the whole CLI with the
// official openai client.)
#include <gtest/gtest.h>
#include <httplib.h>

#include <nlohmann/json.hpp>

#include "e2e/e2e_process.h"
#include "e2e/real_model_fixture.h"
#include "kvcache/registry.h"
#include "server/errors.h"
#include "server/server.h"
#include "server/sse.h"
#include "tokenizer/tokenizer.h"

namespace qevict {
namespace {

using json = nlohmann::json;
using ServeHttp = RealModelTest;

// A 512-token context, a 64 MiB KV pool, two sequences at a time.
SchedulerOptions options() {
  SchedulerOptions so;
  so.n_ctx = 512;
  so.kv_pool_bytes = size_t(64) << 20;
  so.max_batch = 2;
  return so;
}

TEST_F(ServeHttp, TemplateThatFailsToParseIsReportedAndChatFallsBackToChatml) {
  auto tok = Tokenizer::from_gguf(model_->gguf());
  ASSERT_TRUE(tok) << tok.error();
  const std::string bad = "{% for m in messages %}{{ m.content }}";  // no endfor
  const auto err = ChatTemplate::parse(bad);
  ASSERT_FALSE(err);
  RunningServer run(*model_, pool_, *tok, options(), bad, "broken.gguf");
  ASSERT_GT(run.port(), 0);
  EXPECT_EQ(run.server().chat_template().startup_warning("broken.gguf"),
            "warning: the chat template of broken.gguf does not parse (" + err.error() +
                "); chat requests fall back to ChatML");
  httplib::Client cli("127.0.0.1", run.port());

  auto health = cli.Get("/health");
  ASSERT_TRUE(health);
  EXPECT_EQ(health->status, 200);
  EXPECT_EQ(
      health->body,
      json({{"status", "ok"}, {"chat_template", "chatml"}, {"chat_template_error", err.error()}})
          .dump());

  // The prompt is the ChatML rendering of the messages (its token count tells).
  const std::vector<ChatMessage> msgs = {{"user", "Hi there"}};
  const size_t chatml_tokens = tok->encode(render_chatml(msgs, true), true, true).size();
  auto r = cli.Post("/v1/chat/completions",
                    R"({"messages":[{"role":"user","content":"Hi there"}],"max_tokens":2,)"
                    R"("temperature":0})",
                    "application/json");
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200) << r->body;
  const json j = json::parse(r->body);
  EXPECT_EQ(j["usage"]["prompt_tokens"].get<size_t>(), chatml_tokens) << r->body;
  EXPECT_EQ(j["model"], "broken.gguf");
  EXPECT_EQ(j["object"], "chat.completion");
}

TEST_F(ServeHttp, ErrorBodiesAndTheEndOfAStream) {
  auto tok = Tokenizer::from_gguf(model_->gguf());
  ASSERT_TRUE(tok) << tok.error();
  RunningServer run(*model_, pool_, *tok, options(),
                    model_->gguf().get_string_or("tokenizer.chat_template", ""), "broken.gguf");
  httplib::Client cli("127.0.0.1", run.port());

  auto nf = cli.Get("/v1/nothing");
  ASSERT_TRUE(nf);
  EXPECT_EQ(nf->status, 404);
  EXPECT_EQ(nf->body, R"({"error":{"code":null,"message":"no such endpoint","param":null,)"
                      R"("type":"invalid_request_error"}})");
  auto bad = cli.Post("/v1/completions", R"({"prompt":"x","top_p":2})", "application/json");
  ASSERT_TRUE(bad);
  EXPECT_EQ(bad->status, 400);
  EXPECT_EQ(bad->body, openai_error_body(400, "'top_p' must be in [0, 1]", "top_p"));

  // A streamed completion of exactly 3 tokens: text chunks, the finish chunk, the usage chunk
  // and [DONE], in that order.
  auto s = cli.Post("/v1/completions",
                    R"({"prompt":"The capital of France is","max_tokens":3,"temperature":0,)"
                    R"("ignore_eos":true,"stream":true,"stream_options":{"include_usage":true}})",
                    "application/json");
  ASSERT_TRUE(s);
  ASSERT_EQ(s->status, 200) << s->body;
  const std::string done = sse_done();
  ASSERT_GE(s->body.size(), done.size());
  EXPECT_EQ(s->body.substr(s->body.size() - done.size()), done);
  const size_t usage = s->body.rfind("data: ", s->body.size() - done.size() - 1);
  const json u = json::parse(s->body.substr(usage + 6, s->body.size() - done.size() - usage - 8));
  EXPECT_EQ(u["choices"], json::array());
  EXPECT_EQ(u["usage"]["completion_tokens"], 3);
  EXPECT_NE(s->body.find(R"("finish_reason":"length")"), std::string::npos) << s->body;
}

// A one-line chat request with max_tokens 16 is answered for every budgeted policy at 20 % and
// 90 %: a budget fraction below the policy's fixed regions is floored, not refused with 400
// (issue 50 item 3), and /metrics counts the floored requests.
TEST_F(ServeHttp, ShortRequestsWithABudgetFractionAreAnsweredForEveryPolicy) {
  auto tok = Tokenizer::from_gguf(model_->gguf());
  ASSERT_TRUE(tok) << tok.error();
  RunningServer run(*model_, pool_, *tok, options(),
                    model_->gguf().get_string_or("tokenizer.chat_template", ""), "broken.gguf");
  httplib::Client cli("127.0.0.1", run.port());
  cli.set_read_timeout(120);
  int answered = 0;
  for (const auto& row : policy_registry()) {
    if (row.kind != CacheKind::kWindowed && row.kind != CacheKind::kPerHead) continue;
    for (const char* budget : {"0.2", "0.9"}) {
      SCOPED_TRACE(row.name + " @ " + budget);
      for (const char* content : {"Hi", "What is the capital of France? Answer in one word."}) {
        auto r = cli.Post(
            "/v1/chat/completions",
            json({{"messages", json::array({json{{"role", "user"}, {"content", content}}})},
                  {"max_tokens", 16},
                  {"temperature", 0},
                  {"kv_policy", row.name},
                  {"kv_budget", std::stod(budget)}})
                .dump(),
            "application/json");
        ASSERT_TRUE(r);
        EXPECT_EQ(r->status, 200) << r->body;
        answered += r->status == 200;
      }
    }
  }
  EXPECT_GT(answered, 0);
  // qevict's sink and local region alone are 37 tokens: its short requests are all floored.
  EXPECT_GE(run.metric("kv_budget_floored_total"), 4.0);
}

}  // namespace
}  // namespace qevict
