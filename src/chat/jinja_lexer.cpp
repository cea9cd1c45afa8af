// Jinja2-subset lexer (see jinja_lexer.h); rules follow jinja2/lexer.py.
#include "chat/jinja_lexer.h"

#include <algorithm>
#include <cstdlib>
#include <limits>

namespace qevict::jinja {

namespace {

bool is_space(char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v';
}
bool is_ident_start(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_'; }
bool is_digit(char c) { return c >= '0' && c <= '9'; }
bool is_ident(char c) { return is_ident_start(c) || is_digit(c); }

void append_utf8(std::string* out, uint32_t cp) {
  if (cp < 0x80) {
    *out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    *out += static_cast<char>(0xc0 | (cp >> 6));
    *out += static_cast<char>(0x80 | (cp & 0x3f));
  } else if (cp < 0x10000) {
    *out += static_cast<char>(0xe0 | (cp >> 12));
    *out += static_cast<char>(0x80 | ((cp >> 6) & 0x3f));
    *out += static_cast<char>(0x80 | (cp & 0x3f));
  } else {
    *out += static_cast<char>(0xf0 | (cp >> 18));
    *out += static_cast<char>(0x80 | ((cp >> 12) & 0x3f));
    *out += static_cast<char>(0x80 | ((cp >> 6) & 0x3f));
    *out += static_cast<char>(0x80 | (cp & 0x3f));
  }
}

// Splits the source into text, {{ }} and {% %} segments, applying the whitespace rules, and
// tokenizes the inside of each tag.
class Lexer {
 public:
  explicit Lexer(std::string_view src) {
    // jinja2 normalizes newlines and (keep_trailing_newline=False) drops one trailing "\n".
    src_.reserve(src.size());
    for (size_t i = 0; i < src.size(); ++i) {
      if (src[i] == '\r') {
        src_ += '\n';
        if (i + 1 < src.size() && src[i + 1] == '\n') ++i;
      } else {
        src_ += src[i];
      }
    }
    if (!src_.empty() && src_.back() == '\n') src_.pop_back();
    line_starts_.push_back(0);
    for (size_t i = 0; i < src_.size(); ++i)
      if (src_[i] == '\n') line_starts_.push_back(i + 1);
  }

  Status run(std::vector<Segment>* out) {
    size_t p = 0;
    bool line_starting = true;  // jinja2: the previous match ended with a newline
    while (p < src_.size()) {
      size_t q = find_tag(p);
      std::string text = src_.substr(p, q - p);
      if (q == src_.size()) {
        emit_text(out, std::move(text), p);
        break;
      }
      const char kind = src_[q + 1];  // '{', '%' or '#'
      const char mod = q + 2 < src_.size() ? src_[q + 2] : '\0';
      // Whitespace before the tag.
      if (mod == '-') {
        text.erase(text.find_last_not_of(" \t\n\r\f\v") + 1);
      } else if (mod != '+' && kind != '{') {  // lstrip_blocks
        const size_t nl = text.rfind('\n');
        const size_t l_pos = nl == std::string::npos ? 0 : nl + 1;
        if ((l_pos > 0 || line_starting) && l_pos < text.size() &&
            text.find_first_not_of(" \t\r\f\v", l_pos) == std::string::npos)
          text.erase(l_pos);
      }
      emit_text(out, std::move(text), p);
      const Pos tag_pos = pos_of(q);
      size_t body = q + 2 + ((mod == '-' || mod == '+') ? 1 : 0);
      bool strip_after = false;
      bool trim_newline = false;
      size_t end = 0;
      if (kind == '#') {
        const size_t c = src_.find("#}", body);
        if (c == std::string::npos) return Status::error(error_at(tag_pos, "unclosed comment"));
        const char before = c > body ? src_[c - 1] : '\0';
        strip_after = before == '-';
        trim_newline = before != '+';
        end = c + 2;
      } else {
        Segment seg;
        seg.type = kind == '{' ? Segment::Type::kOutput : Segment::Type::kStmt;
        seg.pos = tag_pos;
        QEVICT_RETURN_IF_ERROR(
            lex_tag(kind == '%', body, tag_pos, &seg.tokens, &end, &strip_after, &trim_newline));
        out->push_back(std::move(seg));
      }
      // Whitespace after the tag.
      p = end;
      if (strip_after) {
        while (p < src_.size() && is_space(src_[p])) ++p;
      } else if (trim_newline && p < src_.size() && src_[p] == '\n') {  // trim_blocks
        ++p;
      }
      line_starting = p > end && src_[p - 1] == '\n';
    }
    return Status::ok();
  }

 private:
  size_t find_tag(size_t from) const {
    for (size_t i = from; i + 1 < src_.size(); ++i)
      if (src_[i] == '{' && (src_[i + 1] == '{' || src_[i + 1] == '%' || src_[i + 1] == '#'))
        return i;
    return src_.size();
  }

  Pos pos_of(size_t offset) const {
    auto it = std::upper_bound(line_starts_.begin(), line_starts_.end(), offset);
    const size_t line = static_cast<size_t>(it - line_starts_.begin());
    return Pos{static_cast<int>(line), static_cast<int>(offset - line_starts_[line - 1] + 1)};
  }

  void emit_text(std::vector<Segment>* out, std::string text, size_t at) const {
    if (text.empty()) return;
    Segment seg;
    seg.type = Segment::Type::kText;
    seg.text = std::move(text);
    seg.pos = pos_of(at);
    out->push_back(std::move(seg));
  }

  bool at(size_t p, std::string_view s) const { return src_.compare(p, s.size(), s) == 0; }

  // Tokens of one tag from `p` up to its closing "}}" or "%}" (with optional -/+), which is
  // only recognized outside brackets, as in jinja2.
  Status lex_tag(bool is_stmt, size_t p, Pos tag_pos, std::vector<Token>* toks, size_t* end,
                 bool* strip_after, bool* trim_newline) {
    int depth = 0;
    const std::string_view close = is_stmt ? "%}" : "}}";
    for (;;) {
      while (p < src_.size() && is_space(src_[p])) ++p;
      if (p >= src_.size())
        return Status::error(
            error_at(tag_pos, std::string("unclosed tag (missing '") + std::string(close) + "')"));
      const Pos pos = pos_of(p);
      if (depth == 0) {
        size_t n = 0;
        if (src_[p] == '-' && at(p + 1, close)) {
          *strip_after = true;
          n = 3;
        } else if (is_stmt && src_[p] == '+' && at(p + 1, close)) {
          n = 3;
        } else if (at(p, close)) {
          *trim_newline = is_stmt;
          n = 2;
        }
        if (n) {
          toks->push_back(Token{Token::Type::kEnd, std::string(close), 0, 0.0, pos});
          *end = p + n;
          return Status::ok();
        }
      }
      const char c = src_[p];
      Token t{Token::Type::kOp, "", 0, 0.0, pos};
      if (is_ident_start(c)) {
        size_t q = p;
        while (q < src_.size() && is_ident(src_[q])) ++q;
        t.type = Token::Type::kName;
        t.text = src_.substr(p, q - p);
        p = q;
      } else if (is_digit(c)) {
        QEVICT_RETURN_IF_ERROR(lex_number(&p, &t));
      } else if (c == '\'' || c == '"') {
        QEVICT_RETURN_IF_ERROR(lex_string(&p, &t));
      } else {
        static constexpr std::string_view kOps[] = {
            "**", "//", "==", "!=", "<=", ">=", "+", "-", "*", "/", "%", "~", "<",
            ">",  "=",  "(",  ")",  "[",  "]",  "{", "}", ",", ".", ":", "|"};
        std::string_view op;
        for (std::string_view o : kOps) {
          if (at(p, o)) {
            op = o;
            break;
          }
        }
        if (op.empty())
          return Status::error(error_at(pos, std::string("unexpected character '") + c + "'"));
        if (op == "(" || op == "[" || op == "{") ++depth;
        if (op == ")" || op == "]" || op == "}") {
          if (depth == 0)
            return Status::error(error_at(pos, "unbalanced '" + std::string(op) + "'"));
          --depth;
        }
        t.text = std::string(op);
        p += op.size();
      }
      toks->push_back(std::move(t));
    }
  }

  Status lex_number(size_t* pp, Token* t) {
    size_t p = *pp;
    const size_t start = p;
    while (p < src_.size() && is_digit(src_[p])) ++p;
    bool is_float = false;
    if (p + 1 < src_.size() && src_[p] == '.' && is_digit(src_[p + 1])) {
      is_float = true;
      ++p;
      while (p < src_.size() && is_digit(src_[p])) ++p;
    }
    if (p < src_.size() && (src_[p] == 'e' || src_[p] == 'E')) {
      size_t q = p + 1;
      if (q < src_.size() && (src_[q] == '+' || src_[q] == '-')) ++q;
      if (q < src_.size() && is_digit(src_[q])) {
        is_float = true;
        p = q;
        while (p < src_.size() && is_digit(src_[p])) ++p;
      }
    }
    const std::string lit = src_.substr(start, p - start);
    if (is_float) {
      t->type = Token::Type::kFloat;
      t->f = std::strtod(lit.c_str(), nullptr);
    } else {
      t->type = Token::Type::kInt;
      int64_t v = 0;
      for (char c : lit) {
        if (v > (std::numeric_limits<int64_t>::max() - (c - '0')) / 10)
          return Status::error(error_at(t->pos, "integer literal " + lit + " is too large"));
        v = v * 10 + (c - '0');
      }
      t->i = v;
    }
    t->text = lit;
    *pp = p;
    return Status::ok();
  }

  // A Python-style string literal with backslash escapes.
  Status lex_string(size_t* pp, Token* t) {
    size_t p = *pp;
    const char quote = src_[p++];
    std::string out;
    for (;;) {
      if (p >= src_.size()) return Status::error(error_at(t->pos, "unterminated string literal"));
      const char c = src_[p];
      if (c == quote) {
        ++p;
        break;
      }
      if (c != '\\' || p + 1 >= src_.size()) {
        out += c;
        ++p;
        continue;
      }
      const char e = src_[p + 1];
      p += 2;
      static constexpr std::string_view kFrom = "ntrbfva0\\'\"";
      static constexpr std::string_view kTo = std::string_view("\n\t\r\b\f\v\a\0\\'\"", 11);
      if (const size_t k = kFrom.find(e); k != std::string_view::npos) {
        out += kTo[k];
        continue;
      }
      switch (e) {
        case '\n':
          break;  // line continuation
        case 'x':
        case 'u':
        case 'U': {
          const size_t n = e == 'x' ? 2 : e == 'u' ? 4 : 8;
          uint32_t cp = 0;
          for (size_t k = 0; k < n; ++k, ++p) {
            const char h = p < src_.size() ? src_[p] : '\0';
            int d = is_digit(h)              ? h - '0'
                    : (h >= 'a' && h <= 'f') ? h - 'a' + 10
                    : (h >= 'A' && h <= 'F') ? h - 'A' + 10
                                             : -1;
            if (d < 0)
              return Status::error(
                  error_at(t->pos, std::string("invalid \\") + e + " escape in string literal"));
            cp = cp * 16 + static_cast<uint32_t>(d);
          }
          if (cp > 0x10ffff)
            return Status::error(error_at(t->pos, "escape \\U beyond U+10FFFF in string literal"));
          append_utf8(&out, cp);
          break;
        }
        default:  // Python keeps unknown escapes as written
          out += '\\';
          out += e;
      }
    }
    t->type = Token::Type::kString;
    t->text = std::move(out);
    *pp = p;
    return Status::ok();
  }

  std::string src_;
  std::vector<size_t> line_starts_;
};

}  // namespace

Status lex_template(std::string_view source, std::vector<Segment>* out) {
  Lexer lexer(source);
  return lexer.run(out);
}

}  // namespace qevict::jinja
