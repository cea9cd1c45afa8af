// The functions, methods, filters and tests of the Jinja2 subset, on evaluated values.
// Python/jinja2 semantics; errors carry no position (the interpreter adds it).
#pragma once

#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "chat/jinja_value.h"
#include "chat/render_limits.h"
#include "core/status.h"

namespace qevict::jinja {

// Evaluated arguments of a call, filter or test (without the value being filtered/tested).
struct CallArgs {
  std::vector<Value> pos;
  std::vector<std::pair<std::string, Value>> kw;
  // Positional argument i, else the keyword argument `name`, else null.
  const Value* get(size_t i, std::string_view name) const;
};

// "'x' is undefined", jinja2's message for misusing an undefined value.
std::string undefined_message(const Value& v);

// Python iteration: list items, dict keys, string characters; undefined iterates as empty.
// A string of more than max_chars characters is an error (its characters would become a list
// of that many values: ~60 bytes each).
Expected<ValueList> iterate(const Value& v, uint64_t max_chars = RenderLimits{}.max_list);

// Global functions: raise_exception(msg) (always an error "raise_exception: msg"),
// namespace(k=v, ...), range([start,] stop[, step]).
Expected<Value> call_function(std::string_view name, const CallArgs& a, const RenderLimits& limits);
// str: strip lstrip rstrip startswith endswith split upper lower replace capitalize title;
// dict: get items keys values.
Expected<Value> call_method(const Value& obj, std::string_view name, const CallArgs& a,
                            const RenderLimits& limits);
// The filters named in jinja_parser.cpp's kFilters (select/reject/map return lists).
Expected<Value> apply_filter(std::string_view name, const Value& v, const CallArgs& a,
                             const RenderLimits& limits);
// (`limits`: range() length and the size of joined or replaced strings.)
// The tests named in jinja_parser.cpp's kTests.
Expected<bool> apply_test(std::string_view name, const Value& v, const CallArgs& a);

}  // namespace qevict::jinja
