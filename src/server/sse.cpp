// OpenAI completion bodies and their SSE framing (see sse.h).
#include "server/sse.h"

namespace qevict {

namespace {

using json = nlohmann::json;

std::string dump(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

json header_json(const CompletionHeader& h, const char* object) {
  return {{"id", h.id}, {"object", object}, {"created", h.created}, {"model", h.model}};
}

}  // namespace

json openai_usage(int64_t prompt_tokens, int64_t completion_tokens, int64_t cached_tokens) {
  json u = {{"prompt_tokens", prompt_tokens},
            {"completion_tokens", completion_tokens},
            {"total_tokens", prompt_tokens + completion_tokens}};
  if (cached_tokens >= 0) u["prompt_tokens_details"] = {{"cached_tokens", cached_tokens}};
  return u;
}

std::string sse_event(const json& data) { return "data: " + dump(data) + "\n\n"; }

std::string sse_done() { return "data: [DONE]\n\n"; }

std::string sse_chunk(const CompletionHeader& h, const json& content, const json& finish) {
  json choice = {{"index", 0}, {"finish_reason", finish}};
  if (h.chat) {
    choice["delta"] = content;
  } else {
    choice["text"] = content;
    choice["logprobs"] = nullptr;
  }
  json c = header_json(h, h.chat ? "chat.completion.chunk" : "text_completion");
  c["choices"] = json::array({choice});
  if (h.include_usage) c["usage"] = nullptr;
  return sse_event(c);
}

std::string sse_usage(const CompletionHeader& h, int64_t prompt_tokens, int64_t completion_tokens,
                      int64_t cached_tokens) {
  json u = header_json(h, h.chat ? "chat.completion.chunk" : "text_completion");
  u["choices"] = json::array();
  u["usage"] = openai_usage(prompt_tokens, completion_tokens, cached_tokens);
  return sse_event(u);
}

std::string sse_error(const std::string& message) {
  return sse_event({{"error", {{"message", message}, {"type", "server_error"}}}});
}

std::string completion_body(const CompletionHeader& h, const std::string& text,
                            const std::string& finish, int64_t prompt_tokens,
                            int64_t completion_tokens, int64_t cached_tokens) {
  json choice = {{"index", 0}, {"finish_reason", finish}};
  if (h.chat) {
    choice["message"] = {{"role", "assistant"}, {"content", text}};
  } else {
    choice["text"] = text;
    choice["logprobs"] = nullptr;
  }
  json out = header_json(h, h.chat ? "chat.completion" : "text_completion");
  out["choices"] = json::array({choice});
  out["usage"] = openai_usage(prompt_tokens, completion_tokens, cached_tokens);
  return dump(out);
}

}  // namespace qevict
