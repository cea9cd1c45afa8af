// Builtins of the Jinja2 subset (see jinja_builtins.h). String case mapping is ASCII-only
// (Python's is Unicode); everything else follows Python/jinja2 on the values chat templates see.
#include "chat/jinja_builtins.h"

#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <initializer_list>
#include <limits>

#include "chat/jinja_parser.h"

namespace qevict::jinja {

namespace {

bool is_py_space(char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v';
}

// Python str.strip/lstrip/rstrip: ASCII whitespace, or the characters of `chars`.
std::string py_strip(const std::string& s, const std::string* chars, bool left, bool right) {
  auto strip_char = [&](char c) {
    return chars ? chars->find(c) != std::string::npos : is_py_space(c);
  };
  size_t b = 0, e = s.size();
  if (left)
    while (b < e && strip_char(s[b])) ++b;
  if (right)
    while (e > b && strip_char(s[e - 1])) --e;
  return s.substr(b, e - b);
}

std::string ascii_upper(std::string s) {
  for (char& c : s)
    if (c >= 'a' && c <= 'z') c = static_cast<char>(c - 'a' + 'A');
  return s;
}
std::string ascii_lower(std::string s) {
  for (char& c : s)
    if (c >= 'A' && c <= 'Z') c = static_cast<char>(c - 'A' + 'a');
  return s;
}
std::string py_capitalize(const std::string& s) {
  std::string out = ascii_lower(s);
  if (!out.empty() && out[0] >= 'a' && out[0] <= 'z') out[0] = static_cast<char>(out[0] - 32);
  return out;
}
std::string py_title(const std::string& s) {
  std::string out = s;
  bool prev_cased = false;
  for (char& c : out) {
    const bool lower = c >= 'a' && c <= 'z', upper = c >= 'A' && c <= 'Z';
    if (lower && !prev_cased) c = static_cast<char>(c - 'a' + 'A');
    if (upper && prev_cased) c = static_cast<char>(c - 'A' + 'a');
    prev_cased = lower || upper;
  }
  return out;
}

// Stops early once the result passes max_size (the caller reports it).
std::string py_replace(const std::string& s, const std::string& from, const std::string& to,
                       int64_t count, uint64_t max_size) {
  std::string out;
  int64_t done = 0;
  if (from.empty()) {  // Python inserts `to` before every character and at the end
    // Walks the characters in place (a vector of them would take ~40x the string's bytes).
    for (size_t i = 0;;) {
      if (count < 0 || done < count) {
        out += to;
        ++done;
      }
      if (out.size() > max_size || i >= s.size()) break;
      const size_t n = utf8_char_len(s, i);
      out.append(s, i, n);
      i += n;
    }
    return out;
  }
  size_t pos = 0;
  for (;;) {
    const size_t q = (count >= 0 && done >= count) ? std::string::npos : s.find(from, pos);
    if (q == std::string::npos) break;
    out.append(s, pos, q - pos);
    out += to;
    if (out.size() > max_size) break;  // the caller reports it
    pos = q + from.size();
    ++done;
  }
  out.append(s, pos, std::string::npos);
  return out;
}

Expected<Value> replaced(std::string s, uint64_t max_size) {
  if (s.size() > max_size) return Status::error("replace result too large");
  return Value::string(std::move(s));
}

ValueList py_split(const std::string& s, const Value* sep, int64_t maxsplit) {
  ValueList out;
  auto full = [&]() { return maxsplit >= 0 && static_cast<int64_t>(out.size()) >= maxsplit; };
  if (!sep || sep->is_none()) {  // runs of whitespace; no empty strings
    size_t i = 0;
    for (;;) {
      while (i < s.size() && is_py_space(s[i])) ++i;
      if (i >= s.size()) break;
      if (full()) {
        size_t e = s.size();
        while (e > i && is_py_space(s[e - 1])) --e;
        out.push_back(Value::string(s.substr(i, e - i)));
        break;
      }
      size_t j = i;
      while (j < s.size() && !is_py_space(s[j])) ++j;
      out.push_back(Value::string(s.substr(i, j - i)));
      i = j;
    }
    return out;
  }
  const std::string& d = sep->as_string();
  size_t pos = 0;
  for (;;) {
    const size_t q = full() ? std::string::npos : s.find(d, pos);
    if (q == std::string::npos) break;
    out.push_back(Value::string(s.substr(pos, q - pos)));
    pos = q + d.size();
  }
  out.push_back(Value::string(s.substr(pos)));
  return out;
}

Status check_arity(std::string_view what, const CallArgs& a, size_t max_args,
                   std::initializer_list<std::string_view> kw_names) {
  if (a.pos.size() > max_args)
    return Status::error(cat(what, " takes at most ", std::to_string(max_args),
                             " positional argument(s), got ", std::to_string(a.pos.size())));
  for (const auto& [k, v] : a.kw) {
    bool known = false;
    for (std::string_view n : kw_names) known = known || k == n;
    if (!known) return Status::error(cat(what, " got an unexpected keyword argument '", k, "'"));
  }
  return Status::ok();
}

Expected<std::string> string_arg(std::string_view what, const Value* v, std::string_view arg) {
  if (!v || !v->is_string()) return Status::error(cat(what, ": ", arg, " must be a string"));
  return v->as_string();
}

const Value* attribute(const Value& item, const std::string& name) {
  return item.is_dict() ? item.as_dict().find(name) : nullptr;
}

// select/reject/selectattr/rejectattr: keep the items whose (attribute) passes the test.
Expected<Value> select_items(std::string_view f, const Value& v, const CallArgs& a) {
  const bool by_attr = f == "selectattr" || f == "rejectattr";
  const bool keep_if = f == "select" || f == "selectattr";
  if (!a.kw.empty()) return Status::error(cat(f, " takes positional arguments only"));
  size_t next = 0;
  std::string attr;
  if (by_attr) {
    if (a.pos.empty() || !a.pos[0].is_string())
      return Status::error(cat(f, " needs an attribute name"));
    attr = a.pos[0].as_string();
    next = 1;
  }
  std::string test;
  if (next < a.pos.size()) {
    if (!a.pos[next].is_string() || !is_supported_test(a.pos[next].as_string()))
      return Status::error(cat(f, ": unsupported test ", a.pos[next].repr()));
    test = a.pos[next].as_string();
  }
  CallArgs test_args;
  for (size_t i = next + 1; i < a.pos.size(); ++i) test_args.pos.push_back(a.pos[i]);
  if (!v.truthy()) return Value::list({});  // jinja2 checks `if seq:` before iterating
  auto items = iterate(v);
  if (!items) return items.status();
  ValueList out;
  for (const Value& item : *items) {
    Value subject = item;
    if (by_attr) {
      const Value* x = attribute(item, attr);
      subject = x ? *x : Value::undefined(attr);
    }
    bool pass = subject.truthy();
    if (!test.empty()) {
      auto r = apply_test(test, subject, test_args);
      if (!r) return r.status();
      pass = *r;
    }
    if (pass == keep_if) out.push_back(item);
  }
  return Value::list(std::move(out));
}

Expected<Value> to_number(std::string_view f, const Value& v, const CallArgs& a) {
  QEVICT_RETURN_IF_ERROR(check_arity(f, a, 1, {"default"}));
  if (v.is_undefined()) return Status::error(undefined_message(v));  // int(Undefined) raises
  const bool want_int = f == "int";
  const Value* dflt = a.get(0, "default");
  const Value fallback = dflt ? *dflt : want_int ? Value::integer(0) : Value::number(0.0);
  if (v.is_number()) {
    if (!want_int) return Value::number(v.as_double());
    if (v.is_integral()) return Value::integer(v.as_int());
    const double d = v.as_double();
    if (!(std::fabs(d) < 9.2e18)) return fallback;
    return Value::integer(static_cast<int64_t>(d));
  }
  if (!v.is_string()) return fallback;
  const std::string s = py_strip(v.as_string(), nullptr, true, true);
  if (s.empty()) return fallback;
  char* end = nullptr;
  if (want_int) {
    errno = 0;
    const long long i = std::strtoll(s.c_str(), &end, 10);
    if (end == s.c_str() + s.size() && errno == 0) return Value::integer(i);
  }
  const double d = std::strtod(s.c_str(), &end);
  if (end != s.c_str() + s.size()) return fallback;
  if (!want_int) return Value::number(d);
  if (!(std::fabs(d) < 9.2e18)) return fallback;
  return Value::integer(static_cast<int64_t>(d));
}

}  // namespace

const Value* CallArgs::get(size_t i, std::string_view name) const {
  if (i < pos.size()) return &pos[i];
  for (const auto& [k, v] : kw)
    if (k == name) return &v;
  return nullptr;
}

std::string undefined_message(const Value& v) {
  return v.undefined_name().empty() ? std::string("value is undefined")
                                    : cat("'", v.undefined_name(), "' is undefined");
}

Expected<ValueList> iterate(const Value& v, uint64_t max_chars) {
  switch (v.kind()) {
    case Value::Kind::kUndefined:
      return ValueList{};
    case Value::Kind::kList:
      return v.as_list();
    case Value::Kind::kString: {
      // Count first: a string's characters as values take ~60x its bytes.
      const std::string& str = v.as_string();
      uint64_t n = 0;
      for (size_t i = 0; i < str.size(); i += utf8_char_len(str, i)) ++n;
      if (n > max_chars)
        return Status::error(cat("string of ", std::to_string(n),
                                 " characters is too long to iterate (limit ",
                                 std::to_string(max_chars), ")"));
      ValueList out;
      for (std::string& c : utf8_chars(str)) out.push_back(Value::string(std::move(c)));
      return out;
    }
    case Value::Kind::kDict:
      if (!v.as_dict().is_namespace) {
        ValueList out;
        for (const auto& kv : v.as_dict().items) out.push_back(Value::string(kv.first));
        return out;
      }
      [[fallthrough]];
    default:
      return Status::error(cat("'", v.type_name(), "' object is not iterable"));
  }
}

Expected<Value> call_function(std::string_view name, const CallArgs& a,
                              const RenderLimits& limits) {
  if (name == "raise_exception") {
    QEVICT_RETURN_IF_ERROR(check_arity(name, a, 1, {}));
    return Status::error(cat("raise_exception: ", a.pos.empty() ? "" : a.pos[0].str()));
  }
  if (name == "namespace") {
    if (!a.pos.empty()) return Status::error("namespace() takes keyword arguments only");
    ValueDict d;
    d.is_namespace = true;
    for (const auto& [k, v] : a.kw) d.set(k, v);
    return Value::dict(std::move(d));
  }
  if (name == "range") {
    QEVICT_RETURN_IF_ERROR(check_arity(name, a, 3, {}));
    if (a.pos.empty()) return Status::error("range() takes 1 to 3 arguments");
    for (const Value& v : a.pos)
      if (!v.is_integral()) return Status::error("range() arguments must be integers");
    int64_t start = 0, stop = a.pos[0].as_int(), step = 1;
    if (a.pos.size() >= 2) {
      start = a.pos[0].as_int();
      stop = a.pos[1].as_int();
    }
    if (a.pos.size() == 3) step = a.pos[2].as_int();
    if (step == 0) return Status::error("range() step must not be zero");
    ValueList out;
    for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step) {
      if (out.size() >= limits.max_range) return Status::error("range() too large");
      out.push_back(Value::integer(i));
      if ((step > 0 && i > std::numeric_limits<int64_t>::max() - step) ||
          (step < 0 && i < std::numeric_limits<int64_t>::min() - step))
        break;
    }
    return Value::list(std::move(out));
  }
  return Status::error(cat("unsupported function '", name, "'"));
}

Expected<Value> call_method(const Value& obj, std::string_view m, const CallArgs& a,
                            const RenderLimits& limits) {
  const std::string what = cat(m, "()");
  if (obj.is_undefined()) return Status::error(undefined_message(obj));
  if (obj.is_string()) {
    const std::string& s = obj.as_string();
    if (m == "strip" || m == "lstrip" || m == "rstrip") {
      QEVICT_RETURN_IF_ERROR(check_arity(what, a, 1, {}));
      const Value* chars = a.get(0, "");
      if (chars && !chars->is_none() && !chars->is_string())
        return Status::error(cat(what, " argument must be a string or none"));
      const std::string* cs = chars && chars->is_string() ? &chars->as_string() : nullptr;
      return Value::string(py_strip(s, cs, m != "rstrip", m != "lstrip"));
    }
    if (m == "startswith" || m == "endswith") {
      QEVICT_RETURN_IF_ERROR(check_arity(what, a, 1, {}));
      const Value* x = a.get(0, "");
      if (!x) return Status::error(cat(what, " takes one argument"));
      const ValueList options = x->is_list() ? x->as_list() : ValueList{*x};  // str or tuple
      for (const Value& o : options) {
        if (!o.is_string()) return Status::error(cat(what, " argument must be a string"));
        const std::string& t = o.as_string();
        if (t.size() <= s.size() &&
            (m == "startswith" ? s.compare(0, t.size(), t) == 0
                               : s.compare(s.size() - t.size(), t.size(), t) == 0))
          return Value::boolean(true);
      }
      return Value::boolean(false);
    }
    if (m == "split") {
      QEVICT_RETURN_IF_ERROR(check_arity(what, a, 2, {"sep", "maxsplit"}));
      const Value* sep = a.get(0, "sep");
      const Value* maxsplit = a.get(1, "maxsplit");
      if (sep && !sep->is_none() && (!sep->is_string() || sep->as_string().empty()))
        return Status::error("split() separator must be a non-empty string or none");
      if (maxsplit && !maxsplit->is_integral())
        return Status::error("split() maxsplit must be an integer");
      return Value::list(py_split(s, sep, maxsplit ? maxsplit->as_int() : -1));
    }
    if (m == "upper" || m == "lower" || m == "capitalize" || m == "title") {
      QEVICT_RETURN_IF_ERROR(check_arity(what, a, 0, {}));
      return Value::string(m == "upper"   ? ascii_upper(s)
                           : m == "lower" ? ascii_lower(s)
                           : m == "title" ? py_title(s)
                                          : py_capitalize(s));
    }
    if (m == "replace") {
      QEVICT_RETURN_IF_ERROR(check_arity(what, a, 3, {}));
      auto from = string_arg(what, a.get(0, ""), "old");
      if (!from) return from.status();
      auto to = string_arg(what, a.get(1, ""), "new");
      if (!to) return to.status();
      const Value* count = a.get(2, "");
      if (count && !count->is_integral())
        return Status::error("replace() count must be an integer");
      return replaced(py_replace(s, *from, *to, count ? count->as_int() : -1, limits.max_output),
                      limits.max_output);
    }
  }
  if (obj.is_dict() && !obj.as_dict().is_namespace) {
    const ValueDict& d = obj.as_dict();
    if (m == "get") {
      QEVICT_RETURN_IF_ERROR(check_arity(what, a, 2, {}));
      const Value* key = a.get(0, "");
      if (!key) return Status::error("get() takes a key");
      const Value* v = key->is_string() ? d.find(key->as_string()) : nullptr;
      if (v) return *v;
      const Value* dflt = a.get(1, "");
      return dflt ? *dflt : Value::none();
    }
    if (m == "items" || m == "keys" || m == "values") {
      QEVICT_RETURN_IF_ERROR(check_arity(what, a, 0, {}));
      ValueList out;
      for (const auto& [k, v] : d.items) {
        if (m == "items") out.push_back(Value::tuple({Value::string(k), v}));
        if (m == "keys") out.push_back(Value::string(k));
        if (m == "values") out.push_back(v);
      }
      return Value::list(std::move(out));
    }
  }
  return Status::error(cat("'", obj.type_name(), "' object has no method '", m, "'"));
}

Expected<Value> apply_filter(std::string_view f, const Value& v, const CallArgs& a,
                             const RenderLimits& limits) {
  const std::string what = cat("filter '", f, "'");
  if (f == "default" || f == "d") {
    QEVICT_RETURN_IF_ERROR(check_arity(what, a, 2, {"default_value", "boolean"}));
    const Value* dflt = a.get(0, "default_value");
    const Value* boolean = a.get(1, "boolean");
    const bool use_default = v.is_undefined() || (boolean && boolean->truthy() && !v.truthy());
    if (!use_default) return v;
    return dflt ? *dflt : Value::string("");
  }
  if (f == "length" || f == "count") {
    QEVICT_RETURN_IF_ERROR(check_arity(what, a, 0, {}));
    if (v.is_undefined()) return Value::integer(0);
    if (v.is_string()) return Value::integer(static_cast<int64_t>(utf8_length(v.as_string())));
    if (v.is_list()) return Value::integer(static_cast<int64_t>(v.as_list().size()));
    if (v.is_dict() && !v.as_dict().is_namespace)
      return Value::integer(static_cast<int64_t>(v.as_dict().items.size()));
    return Status::error(cat("object of type '", v.type_name(), "' has no len()"));
  }
  if (f == "tojson") {
    QEVICT_RETURN_IF_ERROR(check_arity(what, a, 0, {}));
    auto j = v.to_json();
    if (!j) return j.status();
    return Value::string(std::move(*j));
  }
  if (f == "first" || f == "last" || f == "list") {
    QEVICT_RETURN_IF_ERROR(check_arity(what, a, 0, {}));
    auto items = iterate(v, limits.max_list);
    if (!items) return items.status();
    if (f == "list") return Value::list(std::move(*items));
    if (items->empty()) return Value::undefined(std::string(f));
    return f == "first" ? items->front() : items->back();
  }
  if (f == "join") {
    QEVICT_RETURN_IF_ERROR(check_arity(what, a, 1, {"d"}));
    const Value* sep = a.get(0, "d");
    auto items = iterate(v, limits.max_list);
    if (!items) return items.status();
    std::string out;
    for (size_t i = 0; i < items->size(); ++i) {
      if (i && sep) out += sep->str();
      out += (*items)[i].str();
      if (out.size() > limits.max_output) return Status::error("join result too large");
    }
    return Value::string(std::move(out));
  }
  if (f == "items") {
    QEVICT_RETURN_IF_ERROR(check_arity(what, a, 0, {}));
    if (v.is_undefined()) return Value::list({});
    if (!v.is_dict() || v.as_dict().is_namespace)
      return Status::error(cat("filter 'items' needs a mapping, got '", v.type_name(), "'"));
    return call_method(v, "items", a, limits);
  }
  if (f == "select" || f == "reject" || f == "selectattr" || f == "rejectattr")
    return select_items(f, v, a);
  if (f == "map") {
    if (!v.truthy()) return Value::list({});  // jinja2 checks `if value:` before iterating
    auto items = iterate(v, limits.max_list);
    if (!items) return items.status();
    ValueList out;
    if (const Value* attr = a.get(99, "attribute")) {  // map(attribute='x'[, default=...])
      QEVICT_RETURN_IF_ERROR(check_arity(what, a, 0, {"attribute", "default"}));
      if (!attr->is_string()) return Status::error("map: attribute must be a string");
      const Value* dflt = a.get(99, "default");
      for (const Value& item : *items) {
        const Value* x = attribute(item, attr->as_string());
        out.push_back(x ? *x : dflt ? *dflt : Value::undefined(attr->as_string()));
      }
      return Value::list(std::move(out));
    }
    if (a.pos.empty() || !a.pos[0].is_string() || !is_supported_filter(a.pos[0].as_string()))
      return Status::error("map: needs attribute='...' or the name of a supported filter");
    CallArgs rest;
    rest.pos.assign(a.pos.begin() + 1, a.pos.end());
    rest.kw = a.kw;
    for (const Value& item : *items) {
      auto r = apply_filter(a.pos[0].as_string(), item, rest, limits);
      if (!r) return r.status();
      out.push_back(std::move(*r));
    }
    return Value::list(std::move(out));
  }
  if (f == "abs") {
    QEVICT_RETURN_IF_ERROR(check_arity(what, a, 0, {}));
    if (v.is_integral() && v.as_int() != std::numeric_limits<int64_t>::min())
      return Value::integer(v.as_int() < 0 ? -v.as_int() : v.as_int());
    if (v.is_number()) return Value::number(std::fabs(v.as_double()));
    return Status::error(cat("bad operand type for abs(): '", v.type_name(), "'"));
  }
  if (f == "int" || f == "float") return to_number(f, v, a);
  // String filters: the value as a string (undefined is "").
  const std::string s = v.str();
  if (f == "trim") {
    QEVICT_RETURN_IF_ERROR(check_arity(what, a, 1, {"chars"}));
    const Value* chars = a.get(0, "chars");
    const std::string* cs = chars && chars->is_string() ? &chars->as_string() : nullptr;
    return Value::string(py_strip(s, cs, true, true));
  }
  if (f == "replace") {
    QEVICT_RETURN_IF_ERROR(check_arity(what, a, 3, {"count"}));
    auto from = string_arg(what, a.get(0, ""), "old");
    if (!from) return from.status();
    auto to = string_arg(what, a.get(1, ""), "new");
    if (!to) return to.status();
    const Value* count = a.get(2, "count");
    if (count && !count->is_integral() && !count->is_none())
      return Status::error("filter 'replace': count must be an integer");
    return replaced(py_replace(s, *from, *to, count && count->is_integral() ? count->as_int() : -1,
                               limits.max_output),
                    limits.max_output);
  }
  QEVICT_RETURN_IF_ERROR(check_arity(what, a, 0, {}));
  if (f == "upper") return Value::string(ascii_upper(s));
  if (f == "lower") return Value::string(ascii_lower(s));
  if (f == "capitalize") return Value::string(py_capitalize(s));
  if (f == "string") return Value::string(s);
  return Status::error(cat("unsupported filter '", f, "'"));
}

Expected<bool> apply_test(std::string_view t, const Value& v, const CallArgs& a) {
  const bool one_arg = t == "divisibleby" || t == "eq" || t == "equalto" || t == "ne" || t == "in";
  const size_t n_args = one_arg ? 1 : 0;
  if (a.pos.size() != n_args || !a.kw.empty())
    return Status::error(
        cat("test '", t, "' takes ", std::to_string(n_args), " argument", one_arg ? "" : "s"));
  const bool mapping = v.is_dict() && !v.as_dict().is_namespace;
  if (t == "defined") return !v.is_undefined();
  if (t == "undefined") return v.is_undefined();
  if (t == "none") return v.is_none();
  if (t == "string") return v.is_string();
  if (t == "number") return v.is_number();
  if (t == "integer") return v.kind() == Value::Kind::kInt;  // jinja2 excludes bools
  if (t == "float") return v.kind() == Value::Kind::kFloat;
  if (t == "boolean") return v.kind() == Value::Kind::kBool;
  if (t == "mapping") return mapping;
  if (t == "sequence") return v.is_string() || v.is_list() || mapping || v.is_undefined();
  if (t == "iterable") return v.is_string() || v.is_list() || mapping || v.is_undefined();
  if (t == "true") return v.kind() == Value::Kind::kBool && v.as_bool();
  if (t == "false") return v.kind() == Value::Kind::kBool && !v.as_bool();
  if (t == "eq" || t == "equalto") return values_equal(v, a.pos[0]);
  if (t == "ne") return !values_equal(v, a.pos[0]);
  if (t == "in") {
    const Value& c = a.pos[0];
    if (c.is_string())
      return v.is_string() && c.as_string().find(v.as_string()) != std::string::npos;
    if (c.is_dict()) return v.is_string() && c.as_dict().find(v.as_string()) != nullptr;
    if (c.is_list()) {
      for (const Value& x : c.as_list())
        if (values_equal(x, v)) return true;
      return false;
    }
    return Status::error(cat("test 'in' needs a container, got '", c.type_name(), "'"));
  }
  // jinja2: even is `value % 2 == 0`, odd is `value % 2 == 1`, divisibleby is
  // `value % num == 0`, with Python's floored modulo (so 0.5 is neither even nor odd).
  if (t == "even" || t == "odd" || t == "divisibleby") {
    const Value n = t == "divisibleby" ? a.pos[0] : Value::integer(2);
    if (!v.is_number() || !n.is_number())
      return Status::error(cat("test '", t, "' needs numbers, got '", v.type_name(), "'"));
    if (n.as_double() == 0.0) return Status::error("integer division or modulo by zero");
    double m;
    if (v.is_integral() && n.is_integral()) {
      const int64_t x = v.as_int(), y = n.as_int();
      int64_t r = y == -1 ? 0 : x % y;
      if (r != 0 && ((r < 0) != (y < 0))) r += y;
      m = static_cast<double>(r);
    } else {
      m = std::fmod(v.as_double(), n.as_double());
      if (m != 0.0 && ((m < 0) != (n.as_double() < 0))) m += n.as_double();
    }
    return t == "odd" ? m == 1.0 : m == 0.0;
  }
  return Status::error(cat("unsupported test '", t, "'"));
}

}  // namespace qevict::jinja
