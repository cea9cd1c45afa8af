// Lexer of the Jinja2 subset: splits a template into text, {{ expression }} and
// {% statement %} segments, applies the whitespace rules of Hugging Face's chat-template
// environment (jinja2 with trim_blocks=True, lstrip_blocks=True, keep_trailing_newline=False,
// plus the -/+ markers) and tokenizes the inside of each tag.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "chat/jinja_ast.h"
#include "core/status.h"

namespace qevict::jinja {

struct Token {
  enum class Type { kName, kString, kInt, kFloat, kOp, kEnd };
  Type type;
  std::string text;  // name, operator, or the decoded string literal
  int64_t i = 0;
  double f = 0.0;
  Pos pos;
};

struct Segment {
  enum class Type { kText, kOutput, kStmt };
  Type type;
  std::string text;
  std::vector<Token> tokens;  // ends with a kEnd token
  Pos pos;
};

// Errors read "line L, col C: what is wrong".
Status lex_template(std::string_view source, std::vector<Segment>* out);

}  // namespace qevict::jinja
