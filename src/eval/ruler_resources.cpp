// Reading haystack prose and word lists (see ruler_resources.h).
#include "eval/ruler_resources.h"

#include <fmt/format.h>
#include <zlib.h>

#include <algorithm>
#include <cctype>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <sstream>

namespace qevict::eval {

Expected<std::string> read_text_file(const std::string& path) {
  // gzread passes plain files through unchanged, so one path reads both kinds.
  gzFile f = gzopen(path.c_str(), "rb");
  if (!f) return Status::error(fmt::format("{}: cannot open", path));
  std::string out;
  char buf[1 << 16];
  for (;;) {
    const int n = gzread(f, buf, sizeof buf);
    if (n < 0) {
      int code = 0;
      std::string msg = gzerror(f, &code);
      gzclose(f);
      return Status::error(fmt::format("{}: read error: {}", path, msg));
    }
    if (n == 0) break;
    out.append(buf, size_t(n));
  }
  gzclose(f);
  return out;
}

std::vector<std::string> prose_words(const std::string& text, const std::string& start) {
  // No-break spaces (U+00A0, UTF-8 c2 a0) count as spaces: the Jargon File writes
  // "Chapter\u00a01.\u00a0Hacker Slang".
  // (Copied byte by byte: std::string::replace here draws a GCC 12 -Wrestrict false positive.)
  std::string t;
  t.reserve(text.size());
  for (size_t i = 0; i < text.size(); ++i) {
    if (text[i] == '\xc2' && i + 1 < text.size() && text[i + 1] == '\xa0') {
      t += ' ';
      ++i;
    } else {
      t += text[i];
    }
  }
  size_t from = start.empty() ? std::string::npos : t.find(start);
  if (from == std::string::npos) from = 0;
  std::istringstream in(t.substr(from));
  std::vector<std::string> words;
  std::string w;
  while (in >> w) {
    const bool has_alnum = std::any_of(w.begin(), w.end(), [](char c) {
      return std::isalnum(static_cast<unsigned char>(c)) != 0;
    });
    if (has_alnum) words.push_back(w);
  }
  return words;
}

std::vector<std::string> plain_words(const std::string& text) {
  std::istringstream in(text);
  std::vector<std::string> out;
  std::string line;
  while (std::getline(in, line)) {
    if (line.size() < 3 || line.size() > 10) continue;
    if (std::all_of(line.begin(), line.end(), [](char c) { return c >= 'a' && c <= 'z'; }))
      out.push_back(line);
  }
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  return out;
}

std::vector<std::string> whitespace_words(const std::string& text) {
  std::vector<std::string> words;
  std::string w;
  for (char c : text) {
    // Python's \s on str: ASCII whitespace and \x1c-\x1f; Unicode spaces (U+00A0, U+2009 ...)
    // too, which this byte-wise split keeps inside words (RULER's essays have few).
    const auto u = static_cast<unsigned char>(c);
    if (std::isspace(u) || (u >= 0x1c && u <= 0x1f)) {
      if (!w.empty()) words.push_back(std::move(w));
      w.clear();
    } else {
      w += c;
    }
  }
  if (!w.empty()) words.push_back(std::move(w));
  return words;
}

Expected<std::vector<std::string>> load_essay_words(const std::string& ruler_data_dir) {
  const std::string path = ruler_data_dir + "/PaulGrahamEssays.json";
  auto text = read_text_file(path);
  if (!text)
    return Status::error(text.error() +
                         " (RULER's essay haystack: fetch it with tools/fetch_ruler_data.sh)");
  const auto j = nlohmann::json::parse(*text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object() || !j.contains("text") || !j["text"].is_string())
    return Status::error(fmt::format("{}: not an object with a \"text\" string", path));
  std::vector<std::string> words = whitespace_words(j["text"].get<std::string>());
  if (words.size() < 1000)
    return Status::error(fmt::format("{}: only {} words of prose", path, words.size()));
  return words;
}

std::string haystack_name(const std::string& arg) {
  if (arg == "jargon" || arg == "essay") return arg;
  return "file:" + std::filesystem::path(arg).filename().string();
}

Expected<RulerResources> load_ruler_resources(const std::string& haystack_path,
                                              const std::string& haystack_start,
                                              const std::string& words_path) {
  RulerResources r;
  auto hay = read_text_file(haystack_path);
  if (!hay)
    return Status::error(hay.error() +
                         " (the default haystack is Debian's jargon-text; tools/setup.sh "
                         "installs it)");
  r.essay_words = prose_words(*hay, haystack_start);
  if (r.essay_words.size() < 1000)
    return Status::error(fmt::format("{}: only {} words of prose; a haystack needs more",
                                     haystack_path, r.essay_words.size()));
  auto words = read_text_file(words_path);
  if (!words)
    return Status::error(words.error() +
                         " (the default word list is Debian's wamerican; tools/setup.sh installs "
                         "it)");
  r.words = plain_words(*words);
  if (r.words.size() < 1000)
    return Status::error(fmt::format("{}: only {} plain lowercase words; a word list needs more",
                                     words_path, r.words.size()));
  return r;
}

}  // namespace qevict::eval
