// The request parser of qevict serve (src/server/openai_request.*): what it accepts, its
// defaults, and the one error (message + field) each kind of bad body gives.
#include "server/openai_request.h"

#include <gtest/gtest.h>

#include <string>

namespace qevict {
namespace {

constexpr int64_t kCtx = 8192;

OpenAiRequest ok(const std::string& body, OpenAiEndpoint ep) {
  auto r = parse_openai_request(body, ep, kCtx);
  if (auto* e = std::get_if<OpenAiRequestError>(&r)) {
    ADD_FAILURE() << body << " -> " << e->message;
    return {};
  }
  return std::get<OpenAiRequest>(r);
}

OpenAiRequestError err(const std::string& body, OpenAiEndpoint ep) {
  auto r = parse_openai_request(body, ep, kCtx);
  if (!std::holds_alternative<OpenAiRequestError>(r)) {
    ADD_FAILURE() << body << " was accepted";
    return {};
  }
  return std::get<OpenAiRequestError>(r);
}

constexpr auto kChat = OpenAiEndpoint::kChat;
constexpr auto kCompl = OpenAiEndpoint::kCompletions;

TEST(OpenAiRequest, ChatWithEveryField) {
  const OpenAiRequest q = ok(
      R"({"model":"x","messages":[{"role":"developer","content":"Be brief."},
          {"role":"user","content":[{"type":"text","text":"Hi "},{"type":"text","text":"there"}]}],
          "max_completion_tokens":32,"temperature":0.5,"top_p":0.9,"top_k":40,"min_p":0.05,
          "seed":7,"stream":true,"stream_options":{"include_usage":true},"stop":["a","bc"],
          "kv_policy":"qevict","kv_budget":0.25,"ignore_eos":true,"n":1,"user":"u",
          "frequency_penalty":0,"presence_penalty":0.0})",
      kChat);
  EXPECT_TRUE(q.chat);
  EXPECT_EQ(q.model, "x");
  ASSERT_EQ(q.messages.size(), 2u);
  EXPECT_EQ(q.messages[0].role, "system");  // developer is OpenAI's newer name for system
  EXPECT_EQ(q.messages[1].content, "Hi there");
  EXPECT_EQ(q.max_tokens, 32);
  EXPECT_EQ(q.temperature, 0.5);
  EXPECT_EQ(q.top_k, 40);
  EXPECT_EQ(q.seed, 7);
  EXPECT_TRUE(q.stream && q.include_usage && q.ignore_eos);
  EXPECT_EQ(q.stop, (std::vector<std::string>{"a", "bc"}));
  EXPECT_EQ(q.kv_policy.value_or(""), "qevict");
  EXPECT_EQ(q.kv_budget.value_or(0), 0.25);
  EXPECT_EQ(q.user, "u");  // names the conversation (the server's session reuse)
}

TEST(OpenAiRequest, DefaultsAndNulls) {
  const OpenAiRequest c = ok(R"({"prompt":"hello","stop":null,"seed":null,"stream":null})", kCompl);
  EXPECT_FALSE(c.chat);
  EXPECT_EQ(c.prompt, "hello");
  EXPECT_EQ(c.max_tokens, 16);
  EXPECT_EQ(c.seed, -1);
  EXPECT_FALSE(c.stream);
  EXPECT_TRUE(c.stop.empty());
  EXPECT_FALSE(c.kv_policy || c.kv_budget);
  EXPECT_EQ(ok(R"({"messages":[{"role":"user","content":"x"}]})", kChat).max_tokens, 256);
  EXPECT_EQ(ok(R"({"prompt":"x","stop":"\n"})", kCompl).stop, std::vector<std::string>{"\n"});
}

TEST(OpenAiRequest, EachBadBodyGivesOneErrorNamingTheField) {
  struct Case {
    const char* body;
    OpenAiEndpoint ep;
    const char* param;
    const char* says;
  };
  const Case cases[] = {
      {"{", kChat, "", "not valid JSON"},
      {"[1]", kChat, "", "must be a JSON object"},
      {"\"x\"", kCompl, "", "must be a JSON object"},
      {R"({"prompt":"x","bogus":1})", kCompl, "bogus", "unknown field 'bogus'"},
      {R"({"prompt":"x","echo":false,"messages":[]})", kCompl, "messages", "unknown field"},
      {R"({"messages":[{"role":"user","content":"x"}],"echo":false})", kChat, "echo", "unknown"},
      {R"({"prompt":"x","model":3})", kCompl, "model", "must be a string"},
      {R"({"prompt":"x","max_tokens":0})", kCompl, "max_tokens", "must be in [1, 8192]"},
      {R"({"prompt":"x","max_tokens":8193})", kCompl, "max_tokens", "must be in [1, 8192]"},
      {R"({"prompt":"x","max_tokens":2.5})", kCompl, "max_tokens", "must be an integer"},
      {R"({"prompt":"x","seed":18446744073709551615})", kCompl, "seed", "must be in"},
      {R"({"prompt":"x","n":2})", kCompl, "n", "must be in [1, 1]"},
      {R"({"prompt":"x","temperature":"hot"})", kCompl, "temperature", "must be a number"},
      {R"({"prompt":"x","top_p":1.5})", kCompl, "top_p", "must be in [0, 1]"},
      {R"({"prompt":"x","presence_penalty":0.5})", kCompl, "presence_penalty", "must be in"},
      {R"({"prompt":"x","echo":true})", kCompl, "echo", "not supported"},
      {R"({"prompt":"x","ignore_eos":1})", kCompl, "ignore_eos", "must be a boolean"},
      {R"({"prompt":"x","stream":"yes"})", kCompl, "stream", "must be a boolean"},
      {R"({"prompt":"x","stream_options":[]})", kCompl, "stream_options", "must be an object"},
      {R"({"prompt":"x","stream_options":{"include_usage":1}})", kCompl, "stream_options",
       "'include_usage' must be a boolean"},
      {R"({"prompt":"x","stop":["a","b","c","d","e"]})", kCompl, "stop", "up to 4 strings"},
      {R"({"prompt":"x","stop":[1]})", kCompl, "stop", "up to 4 strings"},
      {R"({"prompt":"x","stop":""})", kCompl, "stop", "must not be empty"},
      {R"({"prompt":"x","kv_policy":1})", kCompl, "kv_policy", "must be a string"},
      {R"({"prompt":"x","user":1})", kCompl, "user", "must be a string"},
      {R"({"prompt":"x","kv_budget":0})", kCompl, "kv_budget", "(0, 1]"},
      {R"({"prompt":"x","kv_budget":null})", kCompl, "kv_budget", "(0, 1]"},
      {R"({"prompt":"x","kv_q":[0.5]})", kCompl, "kv_q", "a string, a number or a boolean"},
      {R"({"prompt":"x","kv_trace":"/tmp/t"})", kCompl, "kv_trace", ""},
      {R"({"prompt":["x"]})", kCompl, "prompt", "must be a string"},
      {R"({})", kCompl, "prompt", "must be a string"},
      {R"({})", kChat, "messages", "non-empty array"},
      {R"({"messages":[]})", kChat, "messages", "non-empty array"},
      {R"({"messages":[1]})", kChat, "messages", "string 'role'"},
      {R"({"messages":[{"role":"tool","content":"x"}]})", kChat, "messages", "unknown role 'tool'"},
      {R"({"messages":[{"role":"user"}]})", kChat, "messages", "string 'content'"},
      {R"({"messages":[{"role":"user","content":[{"type":1,"text":"x"}]}]})", kChat, "messages",
       "content parts"},
      {R"({"messages":[{"role":"user","content":[{"type":"image_url"}]}]})", kChat, "messages",
       "content parts"},
  };
  for (const Case& c : cases) {
    const OpenAiRequestError e = err(c.body, c.ep);
    EXPECT_EQ(e.param, c.param) << c.body;
    EXPECT_NE(e.message.find(c.says), std::string::npos) << c.body << " -> " << e.message;
  }
}

// Every kv_<key> field beyond kv_policy and kv_budget is kept as text (JSON objects have no
// order: by key) for the shared KV option parser (kvcache/options.h) the CLI's flags go through.
TEST(OpenAiRequest, KvOptionFieldsKeptAsText) {
  const OpenAiRequest q = ok(R"({"prompt":"x","kv_policy":"qevict","kv_q":0.5,)"
                             R"("kv_prefill_route":"chunk","kv_strict_ledger":true,"kv_sink":4})",
                             OpenAiEndpoint::kCompletions);
  EXPECT_EQ(q.kv_policy.value_or(""), "qevict");
  const std::vector<std::pair<std::string, std::string>> want{
      {"prefill_route", "chunk"}, {"q", "0.5"}, {"sink", "4"}, {"strict_ledger", "1"}};
  EXPECT_EQ(q.kv_options, want);
}

}  // namespace
}  // namespace qevict
