// RULER-format prompt files (see ruler_dataset.h).
#include "eval/ruler_dataset.h"

#include <fmt/format.h>

#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "eval/ruler_resources.h"

namespace qevict::eval {

namespace {

using json = nlohmann::json;

// An integer field, or `fallback` when absent (or null); an error when present but not a
// non-negative integer.
Expected<int64_t> int_field(const json& j, const char* key, int64_t fallback) {
  if (!j.contains(key) || j[key].is_null()) return fallback;
  const json& v = j[key];
  if (!v.is_number_integer() || v.get<int64_t>() < 0)
    return Status::error(fmt::format("\"{}\" is not a non-negative integer", key));
  return v.get<int64_t>();
}

Expected<RulerSample> parse_line(const std::string& line, const std::string& file_task,
                                 int64_t position, const DatasetOptions& opts) {
  const json j = json::parse(line, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return Status::error("not valid JSON");
  if (!j.is_object()) return Status::error("not a JSON object");
  RulerSample s;
  if (!j.contains("input") || !j["input"].is_string())
    return Status::error("no \"input\" string (the prompt)");
  s.input = j["input"].get<std::string>();
  if (!j.contains("outputs")) return Status::error("no \"outputs\" (the reference answers)");
  const json& out = j["outputs"];
  if (out.is_string()) {
    s.expected = {out.get<std::string>()};
  } else if (out.is_array()) {
    for (const auto& o : out) {
      if (!o.is_string()) return Status::error("\"outputs\" holds a value that is not a string");
      s.expected.push_back(o.get<std::string>());
    }
  } else {
    return Status::error("\"outputs\" is not a list of strings");
  }
  if (s.expected.empty()) return Status::error("\"outputs\" is empty");
  if (j.contains("answer_prefix")) {
    if (!j["answer_prefix"].is_string()) return Status::error("\"answer_prefix\" is not a string");
    std::string prefix = j["answer_prefix"].get<std::string>();
    // RULER's package appends the prefix to the input; here it opens the model's turn.
    const std::string bare = strip_whitespace(prefix);
    const std::string in = strip_whitespace(s.input);
    if (!bare.empty() && in.size() >= bare.size() &&
        in.compare(in.size() - bare.size(), bare.size(), bare) == 0)
      s.input = strip_whitespace(in.substr(0, in.size() - bare.size()));
    s.answer_prefix = !prefix.empty() && prefix[0] == ' ' ? prefix.substr(1) : prefix;
  }
  auto length = int_field(j, "length", 0);
  if (!length) return length.status();
  s.length = *length;
  const char* tok_key = j.contains("tokens_to_generate") ? "tokens_to_generate" : "max_new_tokens";
  auto max_new = int_field(j, tok_key, opts.max_new_tokens);
  if (!max_new) return max_new.status();
  if (*max_new <= 0) return Status::error(fmt::format("\"{}\" must be positive", tok_key));
  s.max_new_tokens = int(*max_new);
  int64_t index = position;
  const char* index_key = j.contains("index") ? "index" : "id";
  if (j.contains(index_key)) {
    const json& v = j[index_key];
    if (v.is_string()) {
      s.source = v.get<std::string>();
    } else {
      auto i = int_field(j, index_key, position);
      if (!i) return i.status();
      index = *i;
    }
  }
  if (index > INT32_MAX) return Status::error("the index is too large");
  s.sample = int(index);
  s.task = file_task;
  if (j.contains("task")) {
    if (!j["task"].is_string() || j["task"].get<std::string>().empty())
      return Status::error("\"task\" is not a non-empty string");
    s.task = j["task"].get<std::string>();
  }
  if (s.task.find('|') != std::string::npos)
    return Status::error(fmt::format("task name '{}' holds '|'", s.task));
  s.metric = opts.metric;
  return s;
}

}  // namespace

int64_t round_up_length(int64_t tokens) { return (tokens + 1023) / 1024 * 1024; }

std::string dataset_task_name(const std::string& path) {
  const std::filesystem::path p(path);
  std::string stem = p.filename().string();
  for (const char* ext : {".gz", ".jsonl", ".json"})
    if (stem.size() > std::string(ext).size() && stem.ends_with(ext))
      stem.resize(stem.size() - std::string(ext).size());
  if ((stem == "validation" || stem == "test") && p.has_parent_path() &&
      !p.parent_path().filename().empty())
    return p.parent_path().filename().string();
  return stem;
}

Expected<std::vector<RulerSample>> parse_dataset(const std::string& text, const std::string& path,
                                                 const DatasetOptions& opts) {
  const std::string file_task = dataset_task_name(path);
  std::vector<RulerSample> out;
  std::set<std::pair<std::string, int>> seen;
  std::istringstream in(text);
  int64_t line_no = 0;
  std::map<std::string, int64_t> max_length;  // per task, from the lines' "length"
  for (std::string line; std::getline(in, line);) {
    ++line_no;
    if (strip_whitespace(line).empty()) continue;
    auto s = parse_line(line, file_task, int64_t(out.size()), opts);
    if (!s) return Status::error(fmt::format("{}:{}: {}", path, line_no, s.error()));
    if (!seen.insert({s->task, s->sample}).second)
      return Status::error(
          fmt::format("{}:{}: task '{}' has index {} twice", path, line_no, s->task, s->sample));
    max_length[s->task] = std::max(max_length[s->task], s->length);
    out.push_back(std::move(*s));
  }
  if (out.empty()) return Status::error(fmt::format("{}: no prompt in the file", path));
  for (auto& s : out) {
    s.length = opts.length > 0 ? opts.length : round_up_length(max_length[s.task]);
    s.seed = 0;
  }
  return out;
}

Expected<std::vector<RulerSample>> load_dataset(const std::string& path,
                                                const DatasetOptions& opts) {
  auto text = read_text_file(path);
  if (!text) return text.status();
  return parse_dataset(*text, path, opts);
}

}  // namespace qevict::eval
