// The server's chat template and its ChatML fallback (see server_template.h).
#include "server/server_template.h"

#include <fmt/format.h>

#include <nlohmann/json.hpp>

namespace qevict {

ServerChatTemplate::ServerChatTemplate(const std::string& source) {
  if (source.empty()) return;
  auto ct = ChatTemplate::parse(source);
  if (ct)
    tmpl_ = std::move(*ct);
  else
    parse_error_ = ct.error();
}

Expected<std::string> ServerChatTemplate::render(const std::vector<ChatMessage>& messages,
                                                 const std::string& bos_token,
                                                 const std::string& eos_token) const {
  if (!tmpl_) return render_chatml(messages, true);
  return tmpl_->render(messages, true, bos_token, eos_token);
}

std::string ServerChatTemplate::startup_warning(const std::string& model_id) const {
  if (parse_error_.empty()) return "";
  return fmt::format(
      "warning: the chat template of {} does not parse ({}); chat requests fall back to ChatML",
      model_id, parse_error_);
}

std::string ServerChatTemplate::health_body() const {
  using json = nlohmann::json;
  json h = {{"status", "ok"}, {"chat_template", kind()}};
  if (!parse_error_.empty()) h["chat_template_error"] = parse_error_;
  return h.dump(-1, ' ', false, json::error_handler_t::replace);
}

}  // namespace qevict
