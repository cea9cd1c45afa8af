// Lexer and recursive-descent parser for the Jinja2 subset that chat templates use. The
// whitespace rules are those of Hugging Face's apply_chat_template environment (jinja2 with
// trim_blocks=True, lstrip_blocks=True, keep_trailing_newline=False), plus `-`/`+` markers.
// Unknown filters and tests are parse errors (as in jinja2), so most unsupported templates
// fail when they are loaded; unknown functions and methods fail when reached.
#pragma once

#include <string_view>

#include "chat/jinja_ast.h"
#include "core/status.h"

namespace qevict::jinja {

// Parses a whole template. Errors read "line L, col C: what is wrong".
Expected<Body> parse_template(std::string_view source);

// The supported names (jinja_builtins implements exactly these).
bool is_supported_filter(std::string_view name);
bool is_supported_test(std::string_view name);

}  // namespace qevict::jinja
