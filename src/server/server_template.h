// The chat template a server renders requests with: the model's (GGUF
// tokenizer.chat_template), or ChatML when the model ships none or its template does not
// parse. Like llama-server, a template that fails to parse is not fatal: the server warns at
// start-up (startup_warning()) and reports it in GET /health (health_body()), then serves chat
// requests with ChatML.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "chat/chat_template.h"
#include "core/status.h"

namespace qevict {

class ServerChatTemplate {
 public:
  // `source`: the model's template text, empty when it has none.
  explicit ServerChatTemplate(const std::string& source);

  // The prompt text of a conversation, with the generation prompt. Errors come from the
  // model's template (ChatML never fails).
  Expected<std::string> render(const std::vector<ChatMessage>& messages,
                               const std::string& bos_token, const std::string& eos_token) const;

  // "model" (the model's template) or "chatml" (none, or it did not parse).
  const char* kind() const { return tmpl_ ? "model" : "chatml"; }
  // Why the model's template did not parse; empty when it did or there was none.
  const std::string& parse_error() const { return parse_error_; }
  // The start-up warning naming the model, the parse error and the fallback; empty when the
  // template parsed or there was none.
  std::string startup_warning(const std::string& model_id) const;
  // The body of GET /health: {"chat_template": kind(), "status": "ok"}, plus
  // "chat_template_error" when the model's template did not parse.
  std::string health_body() const;

 private:
  std::optional<ChatTemplate> tmpl_;
  std::string parse_error_;
};

}  // namespace qevict
