// Python semantics of template values (see jinja_value.h).
#include "chat/jinja_value.h"

#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstdlib>

namespace qevict::jinja {

const Value* ValueDict::find(std::string_view key) const {
  for (const auto& [k, v] : items)
    if (k == key) return &v;
  return nullptr;
}

void ValueDict::set(const std::string& key, Value v) {
  for (auto& [k, old] : items) {
    if (k == key) {
      old = std::move(v);
      return;
    }
  }
  items.emplace_back(key, std::move(v));
}

const std::shared_ptr<const std::string>& Value::empty_string() {
  static const std::shared_ptr<const std::string> kEmpty = std::make_shared<const std::string>();
  return kEmpty;
}

Value Value::undefined(std::string name) {
  Value v;
  v.s_ = std::make_shared<const std::string>(std::move(name));
  return v;
}
Value Value::none() {
  Value v;
  v.kind_ = Kind::kNone;
  return v;
}
Value Value::boolean(bool b) {
  Value v;
  v.kind_ = Kind::kBool;
  v.b_ = b;
  return v;
}
Value Value::integer(int64_t i) {
  Value v;
  v.kind_ = Kind::kInt;
  v.i_ = i;
  return v;
}
Value Value::number(double f) {
  Value v;
  v.kind_ = Kind::kFloat;
  v.f_ = f;
  return v;
}
Value Value::string(std::string s) {
  Value v;
  v.kind_ = Kind::kString;
  v.s_ = std::make_shared<const std::string>(std::move(s));
  return v;
}
Value Value::list(ValueList items) {
  Value v;
  v.kind_ = Kind::kList;
  v.l_ = std::make_shared<ValueList>(std::move(items));
  return v;
}
Value Value::tuple(ValueList items) {
  Value v = list(std::move(items));
  v.b_ = true;
  return v;
}
Value Value::dict(ValueDict d) {
  Value v;
  v.kind_ = Kind::kDict;
  v.d_ = std::make_shared<ValueDict>(std::move(d));
  return v;
}

double Value::as_double() const {
  switch (kind_) {
    case Kind::kBool:
      return b_ ? 1.0 : 0.0;
    case Kind::kInt:
      return static_cast<double>(i_);
    case Kind::kFloat:
      return f_;
    default:
      return 0.0;
  }
}

bool Value::truthy() const {
  switch (kind_) {
    case Kind::kUndefined:
    case Kind::kNone:
      return false;
    case Kind::kBool:
      return b_;
    case Kind::kInt:
      return i_ != 0;
    case Kind::kFloat:
      return f_ != 0.0;
    case Kind::kString:
      return !s_->empty();
    case Kind::kList:
      return !l_->empty();
    case Kind::kDict:
      return d_->is_namespace || !d_->items.empty();  // a Namespace object is always true
  }
  return false;
}

std::string_view Value::type_name() const {
  switch (kind_) {
    case Kind::kUndefined:
      return "Undefined";
    case Kind::kNone:
      return "NoneType";
    case Kind::kBool:
      return "bool";
    case Kind::kInt:
      return "int";
    case Kind::kFloat:
      return "float";
    case Kind::kString:
      return "str";
    case Kind::kList:
      return "list";
    case Kind::kDict:
      return d_->is_namespace ? "Namespace" : "dict";
  }
  return "?";
}

std::string python_float_repr(double f) {
  if (std::isnan(f)) return "nan";
  if (std::isinf(f)) return f > 0 ? "inf" : "-inf";
  if (f == 0.0) return std::signbit(f) ? "-0.0" : "0.0";
  // Shortest round-trip digits, as Python's repr (David Gay's algorithm; to_chars is exact too).
  char buf[64];
  auto res = std::to_chars(buf, buf + sizeof(buf), f, std::chars_format::scientific);
  std::string sci(buf, res.ptr);
  std::string out;
  size_t p = 0;
  if (sci[0] == '-') {
    out = "-";
    p = 1;
  }
  const size_t e = sci.find('e');
  std::string digits;
  for (size_t i = p; i < e; ++i)
    if (sci[i] != '.') digits += sci[i];
  const int exp = std::atoi(sci.c_str() + e + 1);
  // Python's float_repr_style 'short': exponent form when exp < -4 or exp >= 16.
  if (exp < -4 || exp >= 16) {
    out += digits[0];
    if (digits.size() > 1) out += cat(".", std::string_view(digits).substr(1));
    char eb[16];
    std::snprintf(eb, sizeof(eb), "e%c%02d", exp < 0 ? '-' : '+', std::abs(exp));
    out += eb;
  } else if (exp >= 0) {
    const size_t int_digits = static_cast<size_t>(exp) + 1;
    if (digits.size() <= int_digits) {
      out += cat(digits, std::string(int_digits - digits.size(), '0'), ".0");
    } else {
      out += cat(std::string_view(digits).substr(0, int_digits), ".",
                 std::string_view(digits).substr(int_digits));
    }
  } else {
    out += cat("0.", std::string(static_cast<size_t>(-exp - 1), '0'), digits);
  }
  return out;
}

namespace {

std::string python_str_repr(const std::string& s) {
  const bool has_single = s.find('\'') != std::string::npos;
  const bool has_double = s.find('"') != std::string::npos;
  const char quote = has_single && !has_double ? '"' : '\'';
  std::string out(1, quote);
  for (unsigned char c : s) {
    if (c == quote || c == '\\') {
      out += '\\';
      out += static_cast<char>(c);
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '\r') {
      out += "\\r";
    } else if (c == '\t') {
      out += "\\t";
    } else if (c < 0x20 || c == 0x7f) {
      char b[8];
      std::snprintf(b, sizeof(b), "\\x%02x", c);
      out += b;
    } else {
      out += static_cast<char>(c);  // UTF-8 bytes pass through, as Python prints them
    }
  }
  out += quote;
  return out;
}

std::string json_string(const std::string& s) {
  std::string out = "\"";
  for (unsigned char c : s) {
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\r':
        out += "\\r";
        break;
      case '\t':
        out += "\\t";
        break;
      case '\b':
        out += "\\b";
        break;
      case '\f':
        out += "\\f";
        break;
      default:
        if (c < 0x20) {
          char b[8];
          std::snprintf(b, sizeof(b), "\\u%04x", c);
          out += b;
        } else {
          out += static_cast<char>(c);  // ensure_ascii=False: UTF-8 unchanged
        }
    }
  }
  out += '"';
  return out;
}

std::string dict_body(const ValueDict& d) {
  std::string out = "{";
  for (size_t i = 0; i < d.items.size(); ++i) {
    if (i) out += ", ";
    out += python_str_repr(d.items[i].first) + ": " + d.items[i].second.repr();
  }
  return out + "}";
}

}  // namespace

std::string Value::str() const {
  switch (kind_) {
    case Kind::kUndefined:
      return "";
    case Kind::kString:
      return *s_;
    default:
      return repr();
  }
}

std::string Value::repr() const {
  switch (kind_) {
    case Kind::kUndefined:
      return "Undefined";
    case Kind::kNone:
      return "None";
    case Kind::kBool:
      return b_ ? "True" : "False";
    case Kind::kInt:
      return std::to_string(i_);
    case Kind::kFloat:
      return python_float_repr(f_);
    case Kind::kString:
      return python_str_repr(*s_);
    case Kind::kList: {
      std::string out = b_ ? "(" : "[";
      for (size_t i = 0; i < l_->size(); ++i) {
        if (i) out += ", ";
        out += (*l_)[i].repr();
      }
      if (b_ && l_->size() == 1) out += ",";
      out += b_ ? ")" : "]";
      return out;
    }
    case Kind::kDict:
      return d_->is_namespace ? "<Namespace " + dict_body(*d_) + ">" : dict_body(*d_);
  }
  return "";
}

Expected<std::string> Value::to_json() const {
  switch (kind_) {
    case Kind::kUndefined:
      return Status::error("tojson: value is undefined" +
                           (s_->empty() ? std::string() : " ('" + *s_ + "')"));
    case Kind::kNone:
      return std::string("null");
    case Kind::kBool:
      return std::string(b_ ? "true" : "false");
    case Kind::kInt:
      return std::to_string(i_);
    case Kind::kFloat:
      if (std::isnan(f_)) return std::string("NaN");
      if (std::isinf(f_)) return std::string(f_ > 0 ? "Infinity" : "-Infinity");
      return python_float_repr(f_);
    case Kind::kString:
      return json_string(*s_);
    case Kind::kList: {
      std::string out = "[";
      for (size_t i = 0; i < l_->size(); ++i) {
        if (i) out += ", ";
        auto e = (*l_)[i].to_json();
        if (!e) return e;
        out += *e;
      }
      return out + "]";
    }
    case Kind::kDict: {
      if (d_->is_namespace) return Status::error("tojson: a namespace is not JSON serializable");
      std::string out = "{";
      for (size_t i = 0; i < d_->items.size(); ++i) {
        if (i) out += ", ";
        auto e = d_->items[i].second.to_json();
        if (!e) return e;
        out += json_string(d_->items[i].first) + ": " + *e;
      }
      return out + "}";
    }
  }
  return Status::error("tojson: unknown value");
}

bool values_equal(const Value& a, const Value& b) {
  using K = Value::Kind;
  if (a.is_number() && b.is_number()) {
    if (a.is_integral() && b.is_integral()) return a.as_int() == b.as_int();
    return a.as_double() == b.as_double();
  }
  if (a.kind() != b.kind()) return false;
  switch (a.kind()) {
    case K::kUndefined:
    case K::kNone:
      return true;
    case K::kString:
      return a.as_string() == b.as_string();
    case K::kList: {
      if (a.is_tuple() != b.is_tuple()) return false;  // (1,) != [1] in Python
      const ValueList& x = a.as_list();
      const ValueList& y = b.as_list();
      if (x.size() != y.size()) return false;
      for (size_t i = 0; i < x.size(); ++i)
        if (!values_equal(x[i], y[i])) return false;
      return true;
    }
    case K::kDict: {
      const ValueDict& x = a.as_dict();
      const ValueDict& y = b.as_dict();
      if (x.is_namespace || y.is_namespace) return &x == &y;  // objects compare by identity
      if (x.items.size() != y.items.size()) return false;
      for (const auto& [k, v] : x.items) {
        const Value* w = y.find(k);
        if (!w || !values_equal(v, *w)) return false;
      }
      return true;
    }
    default:
      return false;
  }
}

Expected<bool> value_compare(const Value& a, const Value& b, std::string_view op) {
  auto apply = [op](auto x, auto y) {
    if (op == "<") return x < y;
    if (op == "<=") return x <= y;
    if (op == ">") return x > y;
    return x >= y;
  };
  if (a.is_number() && b.is_number()) {
    if (a.is_integral() && b.is_integral()) return apply(a.as_int(), b.as_int());
    return apply(a.as_double(), b.as_double());
  }
  if (a.is_string() && b.is_string()) return apply(a.as_string(), b.as_string());
  if (a.is_list() && b.is_list()) {
    // Lexicographic: the first unequal pair decides, else the lengths.
    const ValueList& x = a.as_list();
    const ValueList& y = b.as_list();
    for (size_t i = 0; i < x.size() && i < y.size(); ++i)
      if (!values_equal(x[i], y[i])) return value_compare(x[i], y[i], op);
    return apply(x.size(), y.size());
  }
  return Status::error(cat("'", op, "' not supported between instances of '", a.type_name(),
                           "' and '", b.type_name(), "'"));
}

size_t utf8_length(std::string_view s) {
  size_t n = 0;
  for (unsigned char c : s) n += (c & 0xc0) != 0x80;
  return n;
}

std::vector<std::string> utf8_chars(std::string_view s) {
  std::vector<std::string> out;
  for (size_t i = 0; i < s.size();) {
    size_t j = i + 1;
    while (j < s.size() && (static_cast<unsigned char>(s[j]) & 0xc0) == 0x80) ++j;
    out.emplace_back(s.substr(i, j - i));
    i = j;
  }
  return out;
}

size_t utf8_char_len(std::string_view s, size_t i) {
  size_t j = i + 1;
  while (j < s.size() && (static_cast<unsigned char>(s[j]) & 0xc0) == 0x80) ++j;
  return j - i;
}

std::vector<uint32_t> utf8_offsets(std::string_view s) {
  std::vector<uint32_t> off;
  for (size_t i = 0; i < s.size(); i += utf8_char_len(s, i))
    off.push_back(static_cast<uint32_t>(i));
  off.push_back(static_cast<uint32_t>(s.size()));
  return off;
}

}  // namespace qevict::jinja
