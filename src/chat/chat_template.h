// Chat templates: renders the Jinja2 template that a GGUF file ships in
// `tokenizer.chat_template` (ChatML/SmolLM2, Llama-3, Qwen2.5, Mistral [INST], Zephyr, Gemma,
// ...) with the variables Hugging Face's apply_chat_template passes, and a ChatML fallback
// for files without one. The interpreter is a small Jinja2 subset (src/chat/jinja_*):
// unsupported syntax, tags, filters and tests are rejected by parse() with the line and column;
// an unsupported function or method is an error when a render reaches it (as in jinja2).
// Known differences from jinja2: str case mapping is ASCII-only, `%` string formatting and
// macros are unsupported, select/reject/map return lists (not generators), and one render is
// bounded by RenderLimits (render_limits.h: 2^20 loop iterations, 64 MiB of output or of one
// string, 2^18-element lists, 256 MiB of evaluated values in all).
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "chat/render_limits.h"
#include "core/status.h"

namespace qevict {

struct ChatMessage {
  std::string role;  // "system", "user", "assistant", ...
  std::string content;
};

class ChatTemplate {
 public:
  // Parses a template. Errors read "chat template: line L, col C: what is wrong".
  static Expected<ChatTemplate> parse(std::string_view jinja_source);

  // Renders the conversation. The template sees `messages` (a list of {role, content}),
  // `add_generation_prompt`, `bos_token`, `eos_token`, and `tools`/`documents` set to none,
  // exactly as transformers' apply_chat_template without tools. Errors (including the
  // template's own raise_exception("...")) read "chat template: line L, col C: ...".
  // `limits` bound the work of the render (the defaults suit any real template).
  Expected<std::string> render(const std::vector<ChatMessage>& messages, bool add_generation_prompt,
                               const std::string& bos_token, const std::string& eos_token,
                               const RenderLimits& limits = {}) const;

  const std::string& source() const;

 private:
  struct Impl;
  explicit ChatTemplate(std::shared_ptr<const Impl> impl) : impl_(std::move(impl)) {}
  std::shared_ptr<const Impl> impl_;  // immutable after parse: copies share it
};

// ChatML ("<|im_start|>role\ncontent<|im_end|>\n" per message, then "<|im_start|>assistant\n"
// when add_generation_prompt): the fallback for files that ship no template.
std::string render_chatml(const std::vector<ChatMessage>& messages, bool add_generation_prompt);

}  // namespace qevict
