// libFuzzer target: the chat-template engine (src/chat: Jinja2-subset lexer, parser and
// interpreter) on arbitrary templates and messages. A hostile template must give an error, not
// a crash, a hang or unbounded memory (the engine bounds loops, lists, output and total work,
// RenderLimits; libFuzzer's -timeout and -rss_limit_mb catch what it misses).
// Input: the template, then optionally "\0role\0content\0role\0content..." as the messages; with
// no NUL byte a fixed four-message conversation is used. add_generation_prompt is the parity of
// the input size.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>
#include <vector>

#include "chat/chat_template.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view in(reinterpret_cast<const char*>(data), size);
  const size_t nul = in.find('\0');
  const std::string_view source = in.substr(0, nul);
  std::vector<qevict::ChatMessage> messages;
  if (nul == std::string_view::npos) {
    messages = {{"system", "Be brief."},
                {"user", "Hi {{ x }} {% if %}\n\t\xc3\xa9 \xe4\xb8\x96"},
                {"assistant", "Hello! How can I help?"},
                {"user", "Tell me a joke."}};
  } else {
    std::string_view rest = in.substr(nul + 1);
    while (!rest.empty() && messages.size() < 64) {
      const size_t a = rest.find('\0');
      const std::string_view role = rest.substr(0, a);
      std::string_view content;
      if (a == std::string_view::npos) {
        rest = {};
      } else {
        rest = rest.substr(a + 1);
        const size_t b = rest.find('\0');
        content = rest.substr(0, b);
        rest = b == std::string_view::npos ? std::string_view{} : rest.substr(b + 1);
      }
      messages.push_back({std::string(role), std::string(content)});
    }
  }
  auto t = qevict::ChatTemplate::parse(source);
  if (!t) {
    if (t.error().rfind("chat template: ", 0) != 0) {
      std::fprintf(stderr, "chat_template_fuzz: parse error without the prefix: %s\n",
                   t.error().c_str());
      std::abort();
    }
    return 0;
  }
  // The engine's bounds scaled down 64x: the sanitizer build runs string operations ~50x slower
  // than Release, and one input must stay far under libFuzzer's 1 s timeout. The code paths
  // (and the checks at each bound) are the same as with the defaults.
  qevict::RenderLimits limits;
  limits.max_output >>= 6;
  limits.max_list >>= 6;
  limits.max_range >>= 6;
  limits.max_iterations >>= 6;
  limits.max_work >>= 6;
  auto out = t->render(messages, size % 2 == 1, "<s>", "</s>", limits);
  if (!out && out.error().rfind("chat template: ", 0) != 0) {
    std::fprintf(stderr, "chat_template_fuzz: render error without the prefix: %s\n",
                 out.error().c_str());
    std::abort();
  }
  return 0;
}
