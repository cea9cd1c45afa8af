// libFuzzer target: the server's request parser (src/server/openai_request.*) on arbitrary
// bodies, for both endpoints. Any bytes must give a request or one 400 error, never an
// exception (nlohmann::json throws on a wrong-type read; the server would answer 500).
// Checks beyond ASan/UBSan: every accepted field is in its range; an accepted request written
// back as JSON parses to the same request; the error message and the rendered prompt can be put
// into a JSON response (valid UTF-8, dump() does not throw); a chat request renders through the
// ChatML fallback and a Jinja chat template (SmolLM2's, as the server would).
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <variant>

#include "chat/chat_template.h"
#include "server/openai_request.h"

namespace {

using json = nlohmann::json;
using qevict::OpenAiRequest;
using qevict::OpenAiRequestError;

constexpr int64_t kCtx = 8192;

[[noreturn]] void fail(const char* what, std::string_view body) {
  std::fprintf(stderr, "openai_request_fuzz: %s (body %zu bytes)\n", what, body.size());
  std::abort();
}

// The request as a body the parser accepts (what a client would send to get the same request).
json to_json(const OpenAiRequest& q) {
  json j = {{"max_tokens", q.max_tokens},
            {"temperature", q.temperature},
            {"top_p", q.top_p},
            {"min_p", q.min_p},
            {"top_k", q.top_k},
            {"seed", q.seed},
            {"stream", q.stream},
            {"ignore_eos", q.ignore_eos},
            {"stop", q.stop}};
  if (!q.model.empty()) j["model"] = q.model;
  if (q.include_usage) j["stream_options"] = {{"include_usage", true}};
  if (q.kv_policy) j["kv_policy"] = *q.kv_policy;
  if (q.kv_budget) j["kv_budget"] = *q.kv_budget;
  if (q.chat) {
    j["messages"] = json::array();
    for (const auto& m : q.messages)
      j["messages"].push_back({{"role", m.role}, {"content", m.content}});
  } else {
    j["prompt"] = q.prompt;
  }
  return j;
}

bool same(const OpenAiRequest& a, const OpenAiRequest& b) {
  if (a.messages.size() != b.messages.size()) return false;
  for (size_t i = 0; i < a.messages.size(); ++i)
    if (a.messages[i].role != b.messages[i].role || a.messages[i].content != b.messages[i].content)
      return false;
  return a.chat == b.chat && a.model == b.model && a.prompt == b.prompt &&
         a.max_tokens == b.max_tokens && a.temperature == b.temperature && a.top_p == b.top_p &&
         a.min_p == b.min_p && a.top_k == b.top_k && a.seed == b.seed && a.stream == b.stream &&
         a.include_usage == b.include_usage && a.ignore_eos == b.ignore_eos && a.stop == b.stop &&
         a.kv_policy == b.kv_policy && a.kv_budget == b.kv_budget;
}

// SmolLM2-Instruct's chat template (tests/golden/chat_golden.json), parsed once.
const qevict::ChatTemplate& smollm2_template() {
  static const qevict::ChatTemplate t = *qevict::ChatTemplate::parse(
      "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
      "{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging "
      "Face<|im_end|>\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\n' + "
      "message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}"
      "{{ '<|im_start|>assistant\n' }}{% endif %}");
  return t;
}

void check(std::string_view body, qevict::OpenAiEndpoint ep) {
  auto parsed = qevict::parse_openai_request(body, ep, kCtx);
  if (auto* e = std::get_if<OpenAiRequestError>(&parsed)) {
    if (e->message.empty()) fail("an error without a message", body);
    // The server sends it as {"error": {"message": ..., "param": ...}}: must not throw.
    (void)json({{"message", e->message}, {"param", e->param}}).dump();
    return;
  }
  const OpenAiRequest& q = std::get<OpenAiRequest>(parsed);
  if (q.chat != (ep == qevict::OpenAiEndpoint::kChat)) fail("wrong endpoint", body);
  if (q.max_tokens < 1 || q.max_tokens > kCtx) fail("max_tokens out of range", body);
  if (!(q.temperature >= 0 && q.temperature <= 2)) fail("temperature out of range", body);
  if (!(q.top_p >= 0 && q.top_p <= 1) || !(q.min_p >= 0 && q.min_p <= 1))
    fail("top_p/min_p out of range", body);
  if (q.top_k < 0 || q.top_k > (int64_t(1) << 20)) fail("top_k out of range", body);
  if (q.stop.size() > 4) fail("more than 4 stop strings", body);
  for (const auto& s : q.stop)
    if (s.empty()) fail("an empty stop string", body);
  if (q.kv_budget && !(*q.kv_budget > 0 && *q.kv_budget <= 1)) fail("kv_budget out of range", body);
  if (q.chat && q.messages.empty()) fail("a chat without messages", body);
  for (const auto& m : q.messages)
    if (m.role != "system" && m.role != "user" && m.role != "assistant") fail("bad role", body);
  // Round trip: the request written back as JSON parses to the same request.
  const std::string again = to_json(q).dump();
  auto parsed2 = qevict::parse_openai_request(again, ep, kCtx);
  if (!std::holds_alternative<OpenAiRequest>(parsed2) || !same(q, std::get<OpenAiRequest>(parsed2)))
    fail("the request written back as JSON parses differently", body);
  if (q.chat) {
    const std::string a = qevict::render_chatml(q.messages, true);
    auto b = smollm2_template().render(q.messages, true, "", "<|im_end|>");
    if (!b) fail("SmolLM2's template failed on valid messages", body);
    if (*b != a && q.messages.front().role == "system") fail("template and ChatML differ", body);
    (void)json(*b).dump();
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view body(reinterpret_cast<const char*>(data), size);
  check(body, qevict::OpenAiEndpoint::kChat);
  check(body, qevict::OpenAiEndpoint::kCompletions);
  return 0;
}
