// Long-document tasks (see longdoc_tasks.h).
#include "eval/longdoc_tasks.h"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>

namespace qevict::eval {

namespace {

// Uniform in [0, n) from a 64-bit generator, by rejection (the same on every platform).
uint64_t below(std::mt19937_64& g, uint64_t n) {
  const uint64_t limit = ~uint64_t(0) - (~uint64_t(0) % n);
  for (;;) {
    const uint64_t x = g();
    if (x < limit) return x % n;
  }
}

std::vector<std::string> split_lines(const std::string& text) {
  std::vector<std::string> lines;
  std::string line;
  std::istringstream in(text);
  while (std::getline(in, line)) lines.push_back(line);
  return lines;
}

// A line worth predicting: code, not blank, a comment, a lone decorator, a string or a
// closing bracket alone.
bool is_code_target(const std::string& line) {
  const std::string s = strip_whitespace(line);
  if (s.size() < 4) return false;
  const char c = s[0];
  if (c == '#' || c == '@' || c == '"' || c == '\'' || c == ')' || c == ']' || c == '}')
    return false;
  return std::any_of(s.begin(), s.end(), [](unsigned char ch) { return std::isalpha(ch); });
}

Expected<std::string> read_all(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return Status::error(fmt::format("{}: cannot open", path));
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// The first line of a model's output that reads as code (LongBench's rule).
std::string first_code_line(const std::string& output) {
  const size_t b = output.find_first_not_of('\n');
  if (b == std::string::npos) return std::string();
  std::istringstream in(output.substr(b));
  std::string line, first;
  bool have_first = false;
  while (std::getline(in, line)) {
    if (!have_first) first = line, have_first = true;
    if (line.find('`') == std::string::npos && line.find('#') == std::string::npos &&
        line.find("//") == std::string::npos)
      return line;
  }
  return first;  // every line has one of them: LongBench keeps the output's first line
}

template <class T>
int64_t lcs(const std::vector<T>& a, const std::vector<T>& b) {
  std::vector<int64_t> prev(b.size() + 1, 0), cur(b.size() + 1, 0);
  for (size_t i = 1; i <= a.size(); ++i) {
    for (size_t j = 1; j <= b.size(); ++j)
      cur[j] = a[i - 1] == b[j - 1] ? prev[j - 1] + 1 : std::max(prev[j], cur[j - 1]);
    std::swap(prev, cur);
  }
  return prev[b.size()];
}

std::vector<std::string> lower_words(const std::string& s) {
  std::vector<std::string> out;
  std::string w;
  for (unsigned char ch : s) {
    if (std::isalnum(ch)) {
      w.push_back(char(std::tolower(ch)));
    } else if (!w.empty()) {
      out.push_back(std::move(w));
      w.clear();
    }
  }
  if (!w.empty()) out.push_back(std::move(w));
  return out;
}

// A Jargon File headword written as one word, ":term:" (prose_words keeps the colons).
bool is_headword(const std::string& w) {
  if (w.size() < 4 || w.front() != ':' || w.back() != ':') return false;
  return std::all_of(w.begin() + 1, w.end() - 1, [](unsigned char ch) {
    return std::isalnum(ch) || ch == '-' || ch == '\'' || ch == '.';
  });
}

Expected<RulerSample> lcc_sample(int64_t length, int64_t units, std::mt19937_64& rng,
                                 const RulerResources& res) {
  if (res.code_files.empty())
    return Status::error("lcc: no source files (--code-dir; Debian's libpython3.11-stdlib)");
  // The file and the target depend on the seed alone: the length fitting varies only the
  // number of context lines.
  const int64_t min_offset = int64_t(4.5 * double(length));
  std::vector<size_t> order(res.code_files.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  for (size_t i = order.size(); i > 1; --i) std::swap(order[i - 1], order[below(rng, i)]);
  for (size_t f : order) {
    auto text = read_all(res.code_files[f]);
    if (!text) return text.status();
    if (int64_t(text->size()) < min_offset + 256) continue;
    const std::vector<std::string> lines = split_lines(*text);
    std::vector<size_t> targets;
    int64_t offset = 0;
    bool in_string = false;  // inside a triple-quoted string (docstrings, usage texts)
    for (size_t i = 0; i < lines.size(); ++i) {
      if (offset >= min_offset && !in_string && is_code_target(lines[i])) targets.push_back(i);
      offset += int64_t(lines[i].size()) + 1;
      int64_t quotes = 0;
      for (const char* q : {"\"\"\"", "'''"})
        for (size_t at = lines[i].find(q); at != std::string::npos; at = lines[i].find(q, at + 3))
          ++quotes;
      if (quotes % 2 == 1) in_string = !in_string;
    }
    if (targets.empty()) continue;
    const size_t t = targets[below(rng, targets.size())];
    const size_t first = t > size_t(units) ? t - size_t(units) : 0;
    std::string context;
    for (size_t i = first; i < t; ++i) context += lines[i] + "\n";
    RulerSample s;
    s.input = context;
    s.raw = true;  // the model continues the file (longdoc_tasks.h: why not an instruction)
    s.expected = {strip_whitespace(lines[t])};
    s.haystack_units = int64_t(t - first);
    s.source = fmt::format("{}:{}", res.code_files[f], t + 1);
    return s;
  }
  return Status::error(
      fmt::format("lcc: no source file is long enough for {} tokens of context (at least {} bytes)",
                  length, min_offset));
}

RulerSample doc_sample(const std::string& task, int64_t units, std::mt19937_64& rng,
                       const RulerResources& res) {
  const std::vector<std::string>& w = res.doc_words.empty() ? res.essay_words : res.doc_words;
  const size_t start = size_t(below(rng, w.size()));
  const uint64_t pick = rng();  // which headword of the middle half (doc_qa)
  std::string doc;
  std::vector<std::string> heads;
  for (int64_t i = 0; i < units; ++i) {
    const std::string& word = w[(start + size_t(i)) % w.size()];
    if (i > 0) doc += ' ';
    doc += word;
    if (i >= units / 4 && i < units - units / 4 && is_headword(word)) heads.push_back(word);
  }
  if (heads.empty())  // none in the middle half: any in the excerpt
    for (int64_t i = 0; i < units; ++i)
      if (is_headword(w[(start + size_t(i)) % w.size()]))
        heads.push_back(w[(start + size_t(i)) % w.size()]);
  RulerSample s;
  if (task == "doc_qa") {
    const std::string term =
        heads.empty() ? w[(start + size_t(units / 2)) % w.size()] : heads[pick % heads.size()];
    s.input = "Read the document below and answer the question after it.\n\n" + doc +
              "\n\nQuestion: What does the document say about the term '" + term +
              "'? Answer in one or two sentences.";
    s.answer_prefix = "Answer:";
    s.source = term;
  } else {
    s.input = "Read the document below.\n\n" + doc +
              "\n\nSummarize the document above in two or three sentences.";
    s.answer_prefix = "Summary:";
  }
  s.haystack_units = units;
  return s;
}

}  // namespace

const std::vector<std::string>& longdoc_task_names() {
  static const std::vector<std::string> names = {"lcc", "doc_qa", "doc_sum"};
  return names;
}

bool is_longdoc_task(const std::string& name) {
  const auto& n = longdoc_task_names();
  return std::find(n.begin(), n.end(), name) != n.end();
}

int longdoc_max_new_tokens(const std::string& task) {
  if (task == "lcc") return 64;
  if (task == "doc_qa") return 48;
  return 96;
}

int64_t longdoc_min_units(const std::string& task) { return task == "lcc" ? 8 : 64; }

Expected<std::vector<std::string>> find_code_files(const std::string& dir, int64_t min_bytes) {
  namespace fs = std::filesystem;
  std::error_code ec;
  fs::recursive_directory_iterator it(dir, fs::directory_options::skip_permission_denied, ec);
  if (ec) return Status::error(fmt::format("{}: cannot list: {}", dir, ec.message()));
  std::vector<std::string> out;
  for (auto end = fs::recursive_directory_iterator(); it != end; it.increment(ec)) {
    if (ec) return Status::error(fmt::format("{}: cannot list: {}", dir, ec.message()));
    const std::string name = it->path().filename().string();
    if (it->is_directory(ec)) {
      if (name == "test" || name == "tests" || name == "idlelib" || name == "site-packages" ||
          name == "dist-packages" || name == "__pycache__")
        it.disable_recursion_pending();
      continue;
    }
    if (it->path().extension() != ".py" || !it->is_regular_file(ec)) continue;
    if (int64_t(it->file_size(ec)) < min_bytes || ec) continue;
    auto text = read_all(it->path().string());
    if (!text) continue;
    int64_t defs = 0;
    for (const std::string& line : split_lines(*text))
      defs += strip_whitespace(line).rfind("def ", 0) == 0;
    if (defs * 2000 >= int64_t(text->size())) out.push_back(it->path().string());
  }
  std::sort(out.begin(), out.end());
  return out;
}

Expected<RulerSample> build_longdoc_sample(const std::string& task, int64_t length, int sample,
                                           uint64_t base_seed, int64_t units,
                                           const RulerResources& res) {
  if (!is_longdoc_task(task)) return Status::error(fmt::format("unknown task '{}'", task));
  if (units < longdoc_min_units(task))
    return Status::error(fmt::format("{}: {} units, fewer than the {} the task needs", task, units,
                                     longdoc_min_units(task)));
  if (task != "lcc" && res.essay_words.empty() && res.doc_words.empty())
    return Status::error("no haystack prose given");
  const uint64_t seed = ruler_seed(task, length, sample, base_seed);
  std::mt19937_64 rng(seed);
  RulerSample s;
  if (task == "lcc") {
    auto l = lcc_sample(length, units, rng, res);
    if (!l) return l.status();
    s = std::move(*l);
    s.metric = RulerMetric::kEditSim;
  } else {
    s = doc_sample(task, units, rng, res);
    s.metric = RulerMetric::kAgreeFull;
  }
  s.task = task;
  s.length = length;
  s.sample = sample;
  s.seed = seed;
  s.max_new_tokens = longdoc_max_new_tokens(task);
  return s;
}

double code_line_similarity(const std::string& output, const std::string& expected) {
  const std::string a = strip_whitespace(first_code_line(output)), b = strip_whitespace(expected);
  if (a.empty() && b.empty()) return 1.0;
  const std::vector<char> va(a.begin(), a.end()), vb(b.begin(), b.end());
  return 2.0 * double(lcs(va, vb)) / double(a.size() + b.size());
}

bool code_line_exact(const std::string& output, const std::string& expected) {
  return strip_whitespace(first_code_line(output)) == strip_whitespace(expected);
}

double rouge_l_f1(const std::string& a, const std::string& b) {
  const std::vector<std::string> wa = lower_words(a), wb = lower_words(b);
  if (wa.empty() && wb.empty()) return 1.0;
  if (wa.empty() || wb.empty()) return 0.0;
  const double l = double(lcs(wa, wb));
  if (l == 0.0) return 0.0;
  const double p = l / double(wa.size()), r = l / double(wb.size());
  return 2.0 * p * r / (p + r);
}

}  // namespace qevict::eval
