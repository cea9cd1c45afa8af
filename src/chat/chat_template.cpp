// ChatTemplate: the public face of the Jinja2-subset parser and interpreter.
#include "chat/chat_template.h"

#include "chat/jinja_ast.h"
#include "chat/jinja_interpreter.h"
#include "chat/jinja_parser.h"

namespace qevict {

struct ChatTemplate::Impl {
  std::string source;
  jinja::Body body;
};

namespace {
constexpr const char* kPrefix = "chat template: ";
}  // namespace

Expected<ChatTemplate> ChatTemplate::parse(std::string_view jinja_source) {
  auto body = jinja::parse_template(jinja_source);
  if (!body) return Status::error(kPrefix + body.error());
  auto impl = std::make_shared<Impl>();
  impl->source = std::string(jinja_source);
  impl->body = std::move(*body);
  return ChatTemplate(std::move(impl));
}

const std::string& ChatTemplate::source() const { return impl_->source; }

Expected<std::string> ChatTemplate::render(const std::vector<ChatMessage>& messages,
                                           bool add_generation_prompt, const std::string& bos_token,
                                           const std::string& eos_token,
                                           const RenderLimits& limits) const {
  using jinja::Value;
  jinja::ValueList msgs;
  msgs.reserve(messages.size());
  for (const ChatMessage& m : messages) {
    jinja::ValueDict d;
    d.items = {{"role", Value::string(m.role)}, {"content", Value::string(m.content)}};
    msgs.push_back(Value::dict(std::move(d)));
  }
  jinja::ValueDict globals;
  globals.items = {
      {"messages", Value::list(std::move(msgs))},
      {"add_generation_prompt", Value::boolean(add_generation_prompt)},
      {"bos_token", Value::string(bos_token)},
      {"eos_token", Value::string(eos_token)},
      {"tools", Value::none()},
      {"documents", Value::none()},
  };
  auto out = jinja::render_template(impl_->body, globals, limits);
  if (!out) return Status::error(kPrefix + out.error());
  return out;
}

std::string render_chatml(const std::vector<ChatMessage>& messages, bool add_generation_prompt) {
  std::string out;
  for (const ChatMessage& m : messages)
    out += "<|im_start|>" + m.role + "\n" + m.content + "<|im_end|>\n";
  if (add_generation_prompt) out += "<|im_start|>assistant\n";
  return out;
}

}  // namespace qevict
