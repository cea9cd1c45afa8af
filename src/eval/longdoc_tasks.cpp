// Long-document tasks (see longdoc_tasks.h).
#include "eval/longdoc_tasks.h"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <set>
#include <sstream>

namespace qevict::eval {

namespace {

// doc_qa's prompt around its document (doc_qa_reference finds the document between them).
constexpr const char* kQaIntro = "Read the document below and answer the question after it.\n\n";
constexpr const char* kQaQuestion = "\n\nQuestion: What does the document say about the term '";

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
    s.input = kQaIntro + doc + kQaQuestion + term + "'? Answer in one or two sentences.";
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

namespace {

// English function words, the Jargon
// File's cross-reference words, and the words an answer to "What does the document say about
// the term 'X'?" frames itself with whatever it says.
const std::set<std::string>& stopwords() {
  static const std::set<std::string> words = {
      // function words
      "a", "about", "above", "after", "again", "against", "all", "am", "an", "and", "any", "are",
      "as", "at", "be", "because", "been", "before", "being", "below", "between", "both", "but",
      "by", "can", "could", "did", "do", "does", "doing", "down", "during", "each", "either", "etc",
      "even", "ever", "every", "few", "for", "from", "further", "had", "has", "have", "having",
      "he", "her", "here", "hers", "herself", "him", "himself", "his", "how", "however", "if", "in",
      "into", "is", "it", "its", "itself", "just", "least", "less", "like", "many", "may", "me",
      "might", "more", "most", "much", "must", "my", "myself", "neither", "no", "nor", "not", "now",
      "of", "off", "often", "on", "once", "one", "only", "or", "other", "our", "ours", "ourselves",
      "out", "over", "own", "per", "rather", "same", "she", "should", "so", "some", "such", "than",
      "that", "the", "their", "theirs", "them", "themselves", "then", "there", "these", "they",
      "this", "those", "though", "through", "thus", "to", "too", "under", "until", "up", "upon",
      "us", "very", "via", "was", "we", "were", "what", "when", "where", "whether", "which",
      "while", "who", "whom", "whose", "why", "will", "with", "within", "without", "would", "yet",
      "you", "your", "yours", "also", "usually", "sometimes", "cannot", "something", "anything",
      // contractions split at the apostrophe ("hasn't": "hasn", "t")
      "aren", "couldn", "didn", "doesn", "don", "hadn", "hasn", "isn", "ll", "re", "shouldn", "ve",
      "wasn", "weren", "won", "wouldn",
      // the Jargon File's cross-references and abbreviations
      "see", "compare", "cf", "esp", "orig", "eg", "ie", "sense", "acronym", "abbrev",
      "abbreviation",
      // an answer's frame
      "term", "document", "say", "says", "said", "refer", "refers", "referred", "referring", "mean",
      "means", "meaning", "describe", "describes", "described", "defined", "definition", "called",
      "word", "used", "especially"};
  return words;
}

// content_words' form of one lowercase alphanumeric word ("" when dropped): a stopword
// before or after the plural rule is dropped ("this", "themselves").
std::string normal_word(std::string w) {
  if (stopwords().count(w)) return std::string();
  if (w.size() > 3 && w.back() == 's' && w[w.size() - 2] != 's') w.pop_back();
  if (w.size() < 2 || stopwords().count(w)) return std::string();
  return w;
}

// The first word of a headword: ':' then a letter or digit. In the Jargon File's glossary no
// other word starts so (one ":q", vi's quit command, in 41,630 lines), and headwords run
// to ten words: the closing ':' must come within twelve.
bool starts_headword(const std::vector<std::string>& words, size_t k) {
  const std::string& w = words[k];
  if (w.size() < 2 || w[0] != ':' || !std::isalnum(static_cast<unsigned char>(w[1]))) return false;
  for (size_t j = k; j < words.size() && j < k + 12; ++j) {
    if (j > k && words[j][0] == ':') return false;
    if (words[j].size() > (j == k ? 2u : 0u) && words[j].back() == ':') return true;
  }
  return false;
}

// A part-of-speech label of an entry's head line: "n.", "vt.,vi.", "adj.", ",", "pl.n." ...
bool is_pos_label(const std::string& w) {
  static const std::set<std::string> pos = {
      "n",   "v",      "vt",    "vi",  "adj",   "adv",  "pref", "suff", "interj", "pl",
      "imp", "abbrev", "quant", "obs", "infix", "excl", "prep", "conj", "pron"};
  std::string part;
  for (size_t i = 0; i <= w.size(); ++i) {
    if (i == w.size() || w[i] == '.' || w[i] == ',') {
      if (!part.empty() && !pos.count(part)) return false;
      part.clear();
    } else {
      part.push_back(w[i]);
    }
  }
  return true;  // only labels and separators (a lone "," too)
}

// "1." to "999." (stoul of it cannot overflow).
bool is_sense_number(const std::string& w) {
  return w.size() >= 2 && w.size() <= 4 && w.back() == '.' &&
         std::all_of(w.begin(), w.end() - 1, [](unsigned char c) { return std::isdigit(c); });
}

// The word ends a sentence: '.', '?' or '!' before closing quotes and brackets, and is no
// abbreviation (one letter, dotted inside as "e.g.", or one of a short list).
bool ends_sentence(const std::string& word) {
  std::string w = word;
  for (;;) {
    if (!w.empty() && std::strchr(")]}\"'", w.back())) {
      w.pop_back();
    } else if (w.size() >= 3 && w.compare(w.size() - 3, 3, "\xe2\x80\x9d") == 0) {  // ”
      w.resize(w.size() - 3);
    } else if (w.size() >= 3 && w.compare(w.size() - 3, 3, "\xe2\x80\x99") == 0) {  // ’
      w.resize(w.size() - 3);
    } else {
      break;
    }
  }
  if (w.empty()) return false;
  if (w.back() == '?' || w.back() == '!') return true;
  if (w.back() != '.') return false;
  w.pop_back();
  const size_t b = w.find_first_not_of("([{\"'");
  w = b == std::string::npos ? std::string() : w.substr(b);
  if (w.size() <= 1 || w.find('.') != std::string::npos) return false;
  static const std::set<std::string> abbrev = {"esp", "orig", "cf",  "vs",   "approx", "etc",
                                               "mr",  "mrs",  "dr",  "st",   "prob",   "poss",
                                               "fig", "no",   "vol", "incl", "abbrev", "obs"};
  for (char& c : w) c = char(std::tolower(static_cast<unsigned char>(c)));
  return !abbrev.count(w);
}

std::string join_words(const std::vector<std::string>& words, size_t from, size_t to) {
  std::string s;
  for (size_t i = from; i < to; ++i) s += (i > from ? " " : "") + words[i];
  return s;
}

}  // namespace

std::vector<std::string> content_words(const std::string& text) {
  std::vector<std::string> out;
  std::set<std::string> seen;
  for (std::string& w : lower_words(text)) {
    std::string n = normal_word(std::move(w));
    if (!n.empty() && seen.insert(n).second) out.push_back(std::move(n));
  }
  return out;
}

double keyword_recall(const std::string& output, const std::vector<std::string>& keywords) {
  if (keywords.empty()) return 0.0;
  const std::vector<std::string> got = content_words(output);
  const std::set<std::string> have(got.begin(), got.end());
  int64_t found = 0;
  for (const auto& k : keywords) found += have.count(k) ? 1 : 0;
  return double(found) / double(keywords.size());
}

std::optional<DocQaReference> jargon_entry_reference(const std::vector<std::string>& words,
                                                     size_t at) {
  if (at >= words.size() || !is_headword(words[at])) return std::nullopt;
  const size_t n = words.size();
  size_t i = at + 1;
  // Pronunciation: "/boh'gon/," or several words "/boh'gon fil'tr/,".
  if (i < n && words[i][0] == '/') {
    size_t j = i;
    if (words[i].find('/', 1) == std::string::npos)
      for (j = i + 1; j < n && j < i + 8 && words[j].find('/') == std::string::npos;) ++j;
    if (j < n && j < i + 8) i = j + 1;
  }
  while (i < n && is_pos_label(words[i])) ++i;
  size_t end = i;
  while (end < n && !starts_headword(words, end)) ++end;
  DocQaReference r;
  r.entry = join_words(words, i, end);
  // Where the senses start: "1.", "2.", ... in turn, each at the body's start or after a
  // sentence or a bracketed note ends ("see sense 2." is no sense). None: one sense, the body.
  std::vector<size_t> starts;
  for (size_t k = i; k < end; ++k)
    if (is_sense_number(words[k]) && std::stoul(words[k]) == starts.size() + 1 &&
        (k == i || ends_sentence(words[k - 1]) || words[k - 1].back() == ']'))
      starts.push_back(k);
  if (starts.empty()) starts.push_back(i);
  const std::set<std::string> own = [&] {
    const auto t = content_words(words[at]);
    return std::set<std::string>(t.begin(), t.end());
  }();
  for (size_t si = 0; si < starts.size(); ++si) {
    const size_t stop = si + 1 < starts.size() ? starts[si + 1] : end;
    // Bracketed notes (etymology, usage) and the sense number before the definition proper;
    // the notes before "1." belong to the whole entry.
    // A note of 3 keywords or more is a candidate of its own: an acronym's expansion
    // ("[acronym, 'Automated Retroactive Minimal Moderation']") answers the question too.
    size_t b = si == 0 ? i : starts[si];
    for (;;) {
      if (b < stop && is_sense_number(words[b])) {
        ++b;
      } else if (b < stop && words[b][0] == '[') {
        const size_t from = b;
        int depth = 0;
        do {
          for (char c : words[b]) depth += c == '[' ? 1 : c == ']' ? -1 : 0;
          ++b;
        } while (b < stop && depth > 0);
        std::vector<std::string> keys;
        for (std::string& k : content_words(join_words(words, from, b)))
          if (!own.count(k)) keys.push_back(std::move(k));
        if (keys.size() >= 3) {
          r.sentences.push_back(join_words(words, from, b));
          r.keywords.push_back(std::move(keys));
        }
      } else {
        break;
      }
    }
    size_t e = b;
    std::vector<std::string> keys;
    while (e < stop && keys.size() < 3) {
      while (e < stop && !ends_sentence(words[e])) ++e;
      if (e < stop) ++e;  // the sentence's last word
      keys.clear();
      for (std::string& k : content_words(join_words(words, b, e)))
        if (!own.count(k)) keys.push_back(std::move(k));
    }
    if (keys.empty()) continue;
    r.sentences.push_back(join_words(words, b, e));
    r.keywords.push_back(std::move(keys));
  }
  if (r.sentences.empty()) return std::nullopt;
  return r;
}

double reference_recall(const std::string& output, const DocQaReference& ref) {
  double best = 0.0;
  for (const auto& k : ref.keywords) best = std::max(best, keyword_recall(output, k));
  return best;
}

std::optional<DocQaReference> doc_qa_reference(const RulerSample& sample) {
  if (sample.task != "doc_qa" || sample.input.rfind(kQaIntro, 0) != 0) return std::nullopt;
  const size_t q = sample.input.rfind(kQaQuestion);
  const size_t from = std::string(kQaIntro).size();
  if (q == std::string::npos || q < from) return std::nullopt;
  std::istringstream in(sample.input.substr(from, q - from));
  std::vector<std::string> words;
  for (std::string w; in >> w;) words.push_back(std::move(w));
  for (size_t i = 0; i < words.size(); ++i)
    if (words[i] == sample.source) return jargon_entry_reference(words, i);
  return std::nullopt;
}

}  // namespace qevict::eval
