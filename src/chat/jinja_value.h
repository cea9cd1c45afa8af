// Values of the Jinja2 subset used by chat templates, with Python semantics where templates
// can observe them: truthiness, ==, ordering, str(), repr() and json.dumps(). Reference path;
// there is no optimized one (a template renders once per request).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "core/status.h"

namespace qevict::jinja {

class Value;
using ValueList = std::vector<Value>;

// An insertion-ordered string-keyed map, like a Python dict. A namespace() object is a dict
// whose attributes `set ns.x = ...` may assign.
struct ValueDict {
  std::vector<std::pair<std::string, Value>> items;
  bool is_namespace = false;

  const Value* find(std::string_view key) const;
  void set(const std::string& key, Value v);
};

class Value {
 public:
  enum class Kind { kUndefined, kNone, kBool, kInt, kFloat, kString, kList, kDict };

  // An undefined value; `name` (the variable or attribute that was missing) is only used in
  // error messages.
  Value() = default;
  static Value undefined(std::string name);
  static Value none();
  static Value boolean(bool b);
  static Value integer(int64_t i);
  static Value number(double f);
  static Value string(std::string s);
  static Value list(ValueList items);
  static Value tuple(ValueList items);  // a list that prints and compares as a Python tuple
  static Value dict(ValueDict d);

  Kind kind() const { return kind_; }
  bool is_undefined() const { return kind_ == Kind::kUndefined; }
  bool is_none() const { return kind_ == Kind::kNone; }
  bool is_string() const { return kind_ == Kind::kString; }
  bool is_list() const { return kind_ == Kind::kList; }  // lists and tuples
  bool is_tuple() const { return kind_ == Kind::kList && b_; }
  bool is_dict() const { return kind_ == Kind::kDict; }
  // bool, int and float: Python's numbers.Number (bool is an int subclass).
  bool is_number() const {
    return kind_ == Kind::kBool || kind_ == Kind::kInt || kind_ == Kind::kFloat;
  }
  bool is_integral() const { return kind_ == Kind::kBool || kind_ == Kind::kInt; }

  bool as_bool() const { return b_; }
  int64_t as_int() const { return kind_ == Kind::kBool ? (b_ ? 1 : 0) : i_; }  // bool or int
  double as_double() const;                                                    // any number
  const std::string& as_string() const { return *s_; }
  const ValueList& as_list() const { return *l_; }
  const ValueDict& as_dict() const { return *d_; }
  ValueDict& dict_mut() { return *d_; }  // reference semantics: copies share the dict
  const std::string& undefined_name() const { return *s_; }

  bool truthy() const;                 // Python bool()
  std::string str() const;             // Python str(); undefined prints as ""
  std::string repr() const;            // Python repr()
  std::string_view type_name() const;  // Python type name, for error messages ('str', 'int', ...)
  // json.dumps(x, ensure_ascii=False) with default separators (what Hugging Face's tojson
  // filter does). An error for undefined values.
  Expected<std::string> to_json() const;

 private:
  Kind kind_ = Kind::kUndefined;
  bool b_ = false;  // kBool: the value; kList: is a tuple
  int64_t i_ = 0;
  double f_ = 0.0;
  std::shared_ptr<const std::string> s_ = empty_string();
  std::shared_ptr<ValueList> l_;
  std::shared_ptr<ValueDict> d_;

  static const std::shared_ptr<const std::string>& empty_string();
};

// Python ==: numbers compare by value across bool/int/float, containers element-wise, other
// mixed kinds are unequal; undefined equals only undefined (as jinja2's Undefined).
bool values_equal(const Value& a, const Value& b);
// Python ordering, op one of "<", "<=", ">", ">=": numbers, strings (by code point) and
// lists (lexicographic). Other pairs are Python's TypeError, returned as an error status.
Expected<bool> value_compare(const Value& a, const Value& b, std::string_view op);

// Python float repr: shortest round-trip digits, "1e+16" style exponents, "3.0", "inf", "nan".
std::string python_float_repr(double f);

// Concatenates pieces by appending (GCC 12's -Wrestrict misfires on "literal" + std::string).
template <typename... Parts>
std::string cat(const Parts&... parts) {
  std::string s;
  (s.append(std::string_view(parts)), ...);
  return s;
}

// UTF-8 helpers: code-point count and a code-point-indexed split, as Python str indexing.
size_t utf8_length(std::string_view s);
std::vector<std::string> utf8_chars(std::string_view s);
// Byte length of the character that starts at s[i] (a lead byte and its continuation bytes).
size_t utf8_char_len(std::string_view s, size_t i);
// Byte offset of every character of s, then s.size(): character k is [off[k], off[k + 1]).
// 4 bytes per character where utf8_chars takes ~40 (strings are at most 64 MiB by default).
std::vector<uint32_t> utf8_offsets(std::string_view s);

}  // namespace qevict::jinja
