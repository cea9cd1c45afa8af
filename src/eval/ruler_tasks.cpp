// RULER-style task generation and scoring (see ruler_tasks.h). Templates, needle formats,
// task parameters and metrics follow NVIDIA/RULER: scripts/data/synthetic/constants.py
// (templates, answer prefixes, tokens to generate), scripts/data/synthetic/niah.py (needles,
// haystacks, the 40-point depth grid, the singular rewrite), variable_tracking.py,
// common_words_extraction.py, freq_words_extraction.py, scripts/synthetic.yaml (per-task
// parameters) and scripts/eval/synthetic/constants.py (string_match_all / _part); qa_1/qa_2 in
// ruler_qa.cpp. Deviations, all because of what this machine has: the essay haystack is the
// text given at run time (qevict eval --haystack: RULER's own Paul Graham essays, or the Jargon
// File); key words and CWE's words are drawn from a plain word list (no
// part-of-speech lists, so keys are word-word pairs rather than adjective-noun); VT's in-context
// example has a fixed 20 noise lines instead of being fitted to 500 tokens; the queried keys are
// drawn before the haystack, so a sample's answers do not depend on the haystack size.
#include "eval/ruler_tasks.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <set>

#include "eval/longdoc_tasks.h"
#include "eval/ruler_qa.h"
#include "eval/ruler_rng.h"

namespace qevict::eval {

namespace {

// --- Templates: RULER's constants.py (strings a template needs, kept as written there). ---
constexpr const char* kNiahTemplate =
    "Some special magic {type_needle_v} are hidden within the following text. Make sure to "
    "memorize it. I will quiz you about the {type_needle_v} afterwards.\n{context}\nWhat are all "
    "the special magic {type_needle_v} for {query} mentioned in the provided text?";
constexpr const char* kNiahPrefix =
    " The special magic {type_needle_v} for {query} mentioned in the provided text are";
constexpr const char* kNeedle = "One of the special magic {type_needle_v} for {key} is: {value}.";
constexpr const char* kNoise =
    "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again.";
constexpr const char* kVtTemplate =
    "Memorize and track the chain(s) of variable assignment hidden in the following "
    "text.\n\n{context}\nQuestion: Find all variables that are assigned the value {query} in the "
    "text above.";
// "assgined" (sic): RULER's prompt, kept so that prompts match.
constexpr const char* kVtPrefix =
    " Answer: According to the chain(s) of variable assignment in the text above, {num_v} "
    "variables are assgined the value {query}, they are: ";
constexpr const char* kCweTemplate =
    "Below is a numbered list of words. In these words, some appear more often than others. "
    "Memorize the ones that appear most often.\n{context}\nQuestion: What are the 10 most common "
    "words in the above list?";
constexpr const char* kCwePrefix =
    " Answer: The top 10 words that appear most often in the list are:";
constexpr const char* kFweTemplate =
    "Read the following coded text and track the frequency of each coded word. Find the three "
    "most frequently appeared coded words. {context}\nQuestion: Do not provide any explanation. "
    "Please ignore the dots '....'. What are the three most frequently appeared words in the "
    "above coded text?";
constexpr const char* kFwePrefix =
    " Answer: According to the coded text above, the three most frequently appeared words are:";

// --- Task parameters: RULER's synthetic.yaml. ---
enum class Haystack { kNoise, kEssay, kNeedle };
enum class Kind { kWords, kNumbers, kUuids };
struct NiahConfig {
  const char* name;
  Haystack haystack;
  Kind key, value;
  int n_keys, n_values, n_queries;
};
constexpr NiahConfig kNiah[] = {
    {"niah_single_1", Haystack::kNoise, Kind::kWords, Kind::kNumbers, 1, 1, 1},
    {"niah_single_2", Haystack::kEssay, Kind::kWords, Kind::kNumbers, 1, 1, 1},
    {"niah_single_3", Haystack::kEssay, Kind::kWords, Kind::kUuids, 1, 1, 1},
    {"niah_multikey_1", Haystack::kEssay, Kind::kWords, Kind::kNumbers, 4, 1, 1},
    {"niah_multikey_2", Haystack::kNeedle, Kind::kWords, Kind::kNumbers, 1, 1, 1},
    {"niah_multikey_3", Haystack::kNeedle, Kind::kUuids, Kind::kUuids, 1, 1, 1},
    {"niah_multivalue", Haystack::kEssay, Kind::kWords, Kind::kNumbers, 1, 4, 1},
    {"niah_multiquery", Haystack::kEssay, Kind::kWords, Kind::kNumbers, 1, 1, 4},
};
constexpr int kVtHops = 4;       // one chain of 5 variables
constexpr int kVtIclNoise = 20;  // noise lines of the in-context example
constexpr int kCweCommon = 10, kCweFreqCommon = 30, kCweFreqRare = 3;
constexpr int kFweWordLen = 6;
constexpr double kFweAlpha = 2.0;  // zeta(2) = pi^2 / 6 below

const NiahConfig* find_niah(const std::string& task) {
  for (const auto& c : kNiah)
    if (task == c.name) return &c;
  return nullptr;
}

std::string replace_all(std::string s, const std::string& from, const std::string& to) {
  for (size_t p = s.find(from); p != std::string::npos; p = s.find(from, p + to.size()))
    s.replace(p, from.size(), to);
  return s;
}

std::string join(const std::vector<std::string>& v, const std::string& sep) {
  std::string out;
  for (size_t i = 0; i < v.size(); ++i) {
    if (i) out += sep;
    out += v[i];
  }
  return out;
}

std::string numbered(const std::vector<std::string>& v) {  // "1. a 2. b ..."
  std::string out;
  for (size_t i = 0; i < v.size(); ++i) out += fmt::format("{}{}. {}", i ? " " : "", i + 1, v[i]);
  return out;
}

std::string strip_leading_space(const std::string& s) {
  return !s.empty() && s[0] == ' ' ? s.substr(1) : s;
}

std::string random_uuid(Rng& rng) {  // uuid4: 122 random bits, version 4, RFC 4122 variant
  uint32_t w[4];
  for (auto& x : w) x = rng.bits32();
  w[1] = (w[1] & 0xffff0fffu) | 0x00004000u;
  w[2] = (w[2] & 0x3fffffffu) | 0x80000000u;
  return fmt::format("{:08x}-{:04x}-{:04x}-{:04x}-{:04x}{:08x}", w[0], w[1] >> 16, w[1] & 0xffff,
                     w[2] >> 16, w[2] & 0xffff, w[3]);
}

std::string random_of(Kind kind, Rng& rng, const RulerResources& res) {
  switch (kind) {
    case Kind::kNumbers:
      return std::to_string(rng.between(1000000, 9999999));  // 7 digits
    case Kind::kUuids:
      return random_uuid(rng);
    case Kind::kWords: {
      const std::string& a = res.words[rng.below(res.words.size())];
      const std::string& b = res.words[rng.below(res.words.size())];
      return a + "-" + b;
    }
  }
  return {};
}

const char* kind_name(Kind kind) {  // RULER's type_needle_v
  switch (kind) {
    case Kind::kNumbers:
      return "numbers";
    case Kind::kUuids:
      return "uuids";
    case Kind::kWords:
      return "words";
  }
  return "";
}

// Sentences of a whitespace-joined word list: a sentence ends at a word ending in . ? or !
// (closing quotes or brackets after it allowed). A plain stand-in for NLTK's sent_tokenize.
std::vector<std::string> sentences_of(const std::vector<std::string>& words) {
  std::vector<std::string> out;
  std::string cur;
  for (const auto& w : words) {
    if (!cur.empty()) cur += ' ';
    cur += w;
    size_t e = w.size();
    for (size_t prev = 0; prev != e;) {  // closing quotes and brackets after the stop
      prev = e;
      while (e > 0 && std::string_view("\"')]").find(w[e - 1]) != std::string_view::npos) --e;
      // UTF-8 right quotes U+2019 / U+201D: e2 80 99 / e2 80 9d.
      if (e >= 3 && uint8_t(w[e - 3]) == 0xe2 && uint8_t(w[e - 2]) == 0x80 &&
          (uint8_t(w[e - 1]) == 0x99 || uint8_t(w[e - 1]) == 0x9d))
        e -= 3;
    }
    if (e > 0 && (w[e - 1] == '.' || w[e - 1] == '?' || w[e - 1] == '!')) {
      out.push_back(std::move(cur));
      cur.clear();
    }
  }
  if (!cur.empty()) out.push_back(std::move(cur));
  return out;
}

// RULER's depth grid: np.round(np.linspace(0, 100, 40)) (round half to even, as numpy).
std::vector<int> depth_grid() {
  std::vector<int> d(40);
  for (int i = 0; i < 40; ++i) d[size_t(i)] = int(std::nearbyint(100.0 * i / 39.0));
  return d;
}

// Inserts `items` into `lines` at random positions, keeping their order (RULER inserts needles
// at sorted sampled positions of the haystack lines).
void insert_in_order(std::vector<std::string>& lines, const std::vector<std::string>& items,
                     Rng& rng) {
  std::vector<int64_t> pos = rng.sample(int64_t(lines.size()), int64_t(items.size()));
  std::sort(pos.begin(), pos.end());
  for (size_t j = 0; j < items.size(); ++j)
    lines.insert(lines.begin() + pos[j] + int64_t(j), items[j]);
}

// Essay haystack: the first n words of the prose (repeated when shorter), needles between
// sentences at depths drawn from the 40-point grid.
std::string essay_context(const RulerResources& res, int64_t n,
                          const std::vector<std::string>& needles, Rng& rng) {
  std::vector<std::string> words(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i)
    words[size_t(i)] = res.essay_words[size_t(i) % res.essay_words.size()];
  const std::vector<std::string> sents = sentences_of(words);
  const std::vector<int> depths = depth_grid();
  std::vector<int64_t> pick = rng.sample(int64_t(depths.size()), int64_t(needles.size()));
  std::vector<int64_t> pos;
  for (int64_t p : pick) pos.push_back(int64_t(sents.size()) * depths[size_t(p)] / 100);
  std::sort(pos.begin(), pos.end());
  pos.insert(pos.begin(), 0);
  pos.push_back(int64_t(sents.size()));
  std::vector<std::string> parts;
  for (size_t i = 1; i < pos.size(); ++i) {
    std::vector<std::string> chunk(sents.begin() + pos[i - 1], sents.begin() + pos[i]);
    if (!chunk.empty()) parts.push_back(join(chunk, " "));
    if (i - 1 < needles.size()) parts.push_back(needles[i - 1]);
  }
  return join(parts, " ");
}

RulerSample niah_sample(const NiahConfig& c, int64_t n, Rng& rng, const RulerResources& res) {
  const bool singular = c.n_queries * c.n_values == 1;
  const std::string type_v = kind_name(c.value);
  const int n_keys = std::max(c.n_keys, c.n_queries);
  std::vector<std::string> keys;
  std::vector<std::vector<std::string>> values;
  std::vector<std::string> needles;
  for (int i = 0; i < n_keys; ++i) {
    keys.push_back(random_of(c.key, rng, res));
    values.emplace_back();
    for (int j = 0; j < c.n_values; ++j) {
      values.back().push_back(random_of(c.value, rng, res));
      needles.push_back(fmt::format(fmt::runtime(kNeedle), fmt::arg("type_needle_v", type_v),
                                    fmt::arg("key", keys.back()),
                                    fmt::arg("value", values.back().back())));
    }
  }
  rng.shuffle(needles);
  RulerSample s;
  std::vector<std::string> queries;
  for (int64_t q : rng.sample(n_keys, c.n_queries)) {
    queries.push_back(keys[size_t(q)]);
    for (const auto& v : values[size_t(q)]) s.expected.push_back(v);
  }
  std::string context;
  if (c.haystack == Haystack::kEssay) {
    context = essay_context(res, n, needles, rng);
  } else {
    std::vector<std::string> lines;
    for (int64_t i = 0; i < n; ++i)
      lines.push_back(c.haystack == Haystack::kNoise
                          ? std::string(kNoise)
                          : fmt::format(fmt::runtime(kNeedle), fmt::arg("type_needle_v", type_v),
                                        fmt::arg("key", random_of(c.key, rng, res)),
                                        fmt::arg("value", random_of(c.value, rng, res))));
    // RULER inserts at sorted positions in reverse, each needle before haystack line p.
    std::vector<int64_t> pos = rng.sample(n, int64_t(needles.size()));
    std::sort(pos.rbegin(), pos.rend());
    for (size_t j = 0; j < needles.size(); ++j) lines.insert(lines.begin() + pos[j], needles[j]);
    context = join(lines, "\n");
  }
  const std::string query =
      queries.size() > 1
          ? join(std::vector<std::string>(queries.begin(), queries.end() - 1), ", ") + ", and " +
                queries.back()
          : queries[0];
  std::string tpl = kNiahTemplate, prefix = kNiahPrefix, tv = type_v;
  if (singular) {  // niah.py: one answer reads "A special magic number is hidden ..."
    for (std::string* t : {&tpl, &prefix}) {
      *t = replace_all(*t, "Some", "A");
      *t = replace_all(*t, "are all", "is");
      *t = replace_all(*t, "are", "is");
      *t = replace_all(*t, "answers", "answer");
    }
    tv.pop_back();
  }
  s.input = fmt::format(fmt::runtime(tpl), fmt::arg("type_needle_v", tv),
                        fmt::arg("context", context), fmt::arg("query", query));
  s.answer_prefix =
      fmt::format(fmt::runtime(prefix), fmt::arg("type_needle_v", tv), fmt::arg("query", query));
  // Every key asked alone (the multi protocol): the singular rewrite's question and prefix.
  if (n_keys >= 4 && c.n_values == 1) {
    const std::string one = std::string(type_v).substr(0, type_v.size() - 1);  // "number"
    for (int i = 0; i < n_keys; ++i) {
      const std::string& key = keys[size_t(i)];
      s.questions.push_back(
          {fmt::format("What is the special magic {} for {} mentioned in the provided text?", one,
                       key),
           fmt::format("The special magic {} for {} mentioned in the provided text is", one, key),
           values[size_t(i)]});
    }
  }
  return s;
}

// One variable chain: n_hops + 1 distinct upper-case names of `len` letters, the first assigned
// a 5-digit value, each next one assigned the previous (variable_tracking.py generate_chains).
struct Chain {
  std::vector<std::string> vars, lines;
  std::string value;
};
Chain make_chain(int len, Rng& rng) {
  Chain c;
  std::set<std::string> seen;
  while (int(c.vars.size()) < kVtHops + 1) {
    std::string v;
    for (int i = 0; i < len; ++i) v += char('A' + rng.below(26));
    if (seen.insert(v).second) c.vars.push_back(v);
  }
  c.value = std::to_string(rng.between(10000, 99998));  // np.random.randint(10000, 99999)
  c.lines.push_back(fmt::format("VAR {} = {}", c.vars[0], c.value));
  for (int j = 0; j < kVtHops; ++j)
    c.lines.push_back(fmt::format("VAR {} = VAR {}", c.vars[size_t(j) + 1], c.vars[size_t(j)]));
  return c;
}

std::string vt_text(const Chain& c, int64_t n_noise, Rng& rng) {
  std::vector<std::string> lines(size_t(n_noise), kNoise);
  insert_in_order(lines, c.lines, rng);
  return fmt::format(fmt::runtime(kVtTemplate), fmt::arg("context", join(lines, "\n")),
                     fmt::arg("query", c.value));
}

std::string vt_prefix(const Chain& c) {
  return fmt::format(fmt::runtime(kVtPrefix), fmt::arg("num_v", kVtHops + 1),
                     fmt::arg("query", c.value));
}

RulerSample vt_sample(int64_t n, Rng& rng) {
  // RULER prepends one solved example with 3-letter names (is_icl) to the user turn.
  const Chain icl = make_chain(3, rng);
  const Chain main = make_chain(5, rng);
  RulerSample s;
  const std::string example = vt_text(icl, kVtIclNoise, rng) + vt_prefix(icl) + join(icl.vars, " ");
  s.input = example + "\n" + vt_text(main, n, rng);
  s.answer_prefix = vt_prefix(main);
  s.expected = main.vars;
  return s;
}

// CWE's word list: n distinct words, the first kCweCommon repeated `common` times, the others
// `rare` times, shuffled and numbered (common_words_extraction.py get_example).
std::string cwe_list(const RulerResources& res, int64_t n, int common, int rare, Rng& rng,
                     std::vector<std::string>* answer) {
  std::vector<std::string> list;
  const std::vector<int64_t> pick = rng.sample(int64_t(res.words.size()), n);
  answer->clear();
  for (size_t i = 0; i < pick.size(); ++i) {
    const std::string& w = res.words[size_t(pick[i])];
    const bool is_common = int(i) < kCweCommon;
    if (is_common) answer->push_back(w);
    for (int r = 0; r < (is_common ? common : rare); ++r) list.push_back(w);
  }
  rng.shuffle(list);
  return numbered(list);
}

RulerSample cwe_sample(int64_t n, Rng& rng, const RulerResources& res) {
  // One solved example of 40 words (10 common x10, 30 rare x3) for lengths >= 4096, as RULER.
  std::vector<std::string> ex_answer, answer;
  const std::string ex = cwe_list(res, 40, 10, 3, rng, &ex_answer);
  const std::string ctx = cwe_list(res, n, kCweFreqCommon, kCweFreqRare, rng, &answer);
  RulerSample s;
  s.input = fmt::format(fmt::runtime(kCweTemplate), fmt::arg("context", ex)) + kCwePrefix + " " +
            numbered(ex_answer) + "\n" +
            fmt::format(fmt::runtime(kCweTemplate), fmt::arg("context", ctx));
  s.answer_prefix = kCwePrefix;
  s.expected = answer;
  return s;
}

RulerSample fwe_sample(int64_t n, int64_t length, Rng& rng) {
  // freq_words_extraction.py: a vocabulary of length/50 random 6-letter words, sorted then
  // shuffled; word of rank k appears int(n * k^-alpha / zeta(alpha)) times; rank 1 is "..."
  // (noise the prompt says to ignore), ranks 2-4 are the answer.
  const size_t vocab_size = size_t(std::max<int64_t>(length / 50, 8));
  std::set<std::string> set;
  while (set.size() < vocab_size) {
    std::string w;
    for (int i = 0; i < kFweWordLen; ++i) w += char('a' + rng.below(26));
    set.insert(w);
  }
  std::vector<std::string> vocab(set.begin(), set.end());
  rng.shuffle(vocab);
  vocab[0] = "...";
  const double zeta2 = M_PI * M_PI / 6.0;
  std::vector<std::string> text;
  for (size_t k = 0; k < vocab.size(); ++k) {
    const auto count = int64_t(double(n) * std::pow(double(k + 1), -kFweAlpha) / zeta2);
    for (int64_t r = 0; r < count; ++r) text.push_back(vocab[k]);
  }
  rng.shuffle(text);
  RulerSample s;
  s.input = fmt::format(fmt::runtime(kFweTemplate), fmt::arg("context", join(text, " ")));
  s.answer_prefix = kFwePrefix;
  s.expected = {vocab[1], vocab[2], vocab[3]};
  return s;
}

// Smallest haystack a task can be built with.
int64_t min_units(const std::string& task) {
  if (const NiahConfig* c = find_niah(task))
    return c->haystack == Haystack::kEssay ? 8 : std::max(c->n_keys, c->n_queries) * c->n_values;
  if (task == "cwe") return kCweCommon + 1;
  if (task == "fwe") return 64;
  if (is_qa_task(task)) return 1;  // build_qa_sample takes at least the gold documents
  return kVtHops + 1;              // vt
}

// Where the question of a RULER task's prompt starts: after the last "\n" before its marker
// (the templates end with the question; the text before it never holds the marker after
// its own last occurrence). -1 when the marker is missing.
int64_t find_question(const std::string& task, const std::string& input) {
  const char* marker = "\nQuestion: ";  // vt, cwe, fwe
  if (find_niah(task)) marker = "\nWhat ";
  if (is_qa_task(task)) marker = "\n\nAnswer the question";
  const size_t p = input.rfind(marker);
  if (p == std::string::npos) return -1;
  return int64_t(input.find_first_not_of('\n', p));
}

std::string ascii_lower(std::string s) {
  for (char& ch : s)
    if (ch >= 'A' && ch <= 'Z') ch = char(ch - 'A' + 'a');
  return s;
}

}  // namespace

const std::vector<std::string>& ruler_task_names() {
  static const std::vector<std::string> names = {"niah_single_1",
                                                 "niah_single_2",
                                                 "niah_single_3",
                                                 "niah_multikey_1",
                                                 "niah_multikey_2",
                                                 "niah_multikey_3",
                                                 "niah_multivalue",
                                                 "niah_multiquery",
                                                 "vt",
                                                 "cwe",
                                                 "fwe",
                                                 "qa_1",
                                                 "qa_2"};
  return names;
}

bool is_ruler_task(const std::string& name) {
  const auto& n = ruler_task_names();
  return std::find(n.begin(), n.end(), name) != n.end();
}

int ruler_max_new_tokens(const std::string& task) {
  if (task == "vt") return 30;
  if (task == "cwe") return 120;
  if (task == "fwe") return 50;
  if (is_qa_task(task)) return 32;
  return 128;  // niah
}

uint64_t ruler_seed(const std::string& task, int64_t length, int sample, uint64_t base) {
  const std::string key = fmt::format("{}/{}/{}", task, length, sample);
  uint64_t h = 1469598103934665603ull;  // FNV-1a 64
  for (unsigned char ch : key) {
    h ^= ch;
    h *= 1099511628211ull;
  }
  return h ^ (base * 0x9e3779b97f4a7c15ull);
}

Expected<RulerSample> build_ruler_sample(const std::string& task, int64_t length, int sample,
                                         uint64_t base_seed, int64_t haystack_units,
                                         const RulerResources& res) {
  if (!is_ruler_task(task))
    return Status::error(
        fmt::format("unknown RULER task '{}' (known: {})", task, join(ruler_task_names(), ", ")));
  const bool qa = is_qa_task(task);
  const QaSet* qa_set = task == "qa_1" ? res.squad.get() : res.hotpotqa.get();
  if (qa && !qa_set)
    return Status::error(
        fmt::format("{}: {} is not loaded (tools/fetch_ruler_data.sh)", task, qa_data_file(task)));
  if (!qa && res.words.size() < 64) return Status::error("the word list has fewer than 64 words");
  const NiahConfig* niah = find_niah(task);
  if (niah && niah->haystack == Haystack::kEssay && res.essay_words.empty())
    return Status::error("no haystack prose given");
  if (haystack_units < min_units(task))
    return Status::error(fmt::format("{}: haystack of {} units, fewer than the {} the task needs",
                                     task, haystack_units, min_units(task)));
  if (task == "cwe" && haystack_units > int64_t(res.words.size()))
    return Status::error(
        fmt::format("cwe: {} words asked, the word list has {}", haystack_units, res.words.size()));
  const uint64_t seed = ruler_seed(task, length, sample, base_seed);
  Rng rng(seed);
  RulerSample s;
  if (qa) {
    auto q = build_qa_sample(*qa_set, seed, haystack_units);
    if (!q) return q.status();
    s = std::move(*q);
  } else if (niah) {
    s = niah_sample(*niah, haystack_units, rng, res);
  } else if (task == "vt")
    s = vt_sample(haystack_units, rng);
  else if (task == "cwe")
    s = cwe_sample(haystack_units, rng, res);
  else
    s = fwe_sample(haystack_units, length, rng);
  if (!qa) s.haystack_units = haystack_units;  // qa: the documents used (clamped to the set)
  s.task = task;
  s.length = length;
  s.sample = sample;
  s.seed = seed;
  // After the assistant turn opens a leading space would start an unusual token; RULER's
  // prefix was written to follow "...text?" directly.
  s.answer_prefix = strip_leading_space(s.answer_prefix);
  s.max_new_tokens = ruler_max_new_tokens(task);
  s.metric = qa ? RulerMetric::kMatchPart : RulerMetric::kMatchAll;
  s.question_at = find_question(task, s.input);
  return s;
}

std::string sample_context(const RulerSample& s) {
  if (s.question_at < 0) return std::string();
  const std::string c = s.input.substr(0, size_t(s.question_at));
  const size_t e = c.find_last_not_of(" \t\n\r\f\v");
  return e == std::string::npos ? std::string() : c.substr(0, e + 1);
}

std::string sample_question(const RulerSample& s) {
  return s.question_at < 0 ? std::string() : s.input.substr(size_t(s.question_at));
}

Expected<RulerSample> make_ruler_sample(const std::string& task, int64_t length, int sample,
                                        uint64_t base_seed, const RulerResources& res,
                                        const PromptTokenCounter& count) {
  const bool longdoc = is_longdoc_task(task);
  const int max_new = longdoc ? longdoc_max_new_tokens(task) : ruler_max_new_tokens(task);
  // Tokens of the prompt with n haystack units, or an error.
  auto tokens = [&](int64_t n, RulerSample* out) -> Expected<int64_t> {
    auto s = longdoc ? build_longdoc_sample(task, length, sample, base_seed, n, res)
                     : build_ruler_sample(task, length, sample, base_seed, n, res);
    if (!s) return s.status();
    auto t = count(*s);
    if (!t) return t.status();
    s->prompt_tokens = *t;
    if (out) *out = std::move(*s);
    return *t;
  };
  int64_t lo = longdoc ? longdoc_min_units(task) : min_units(task);
  RulerSample best;
  auto t_lo = tokens(lo, &best);
  if (!t_lo) return t_lo.status();
  if (*t_lo + max_new > length)
    return Status::error(fmt::format(
        "{}: the smallest prompt has {} tokens; with {} to generate it does not fit in {}", task,
        *t_lo, max_new, length));
  // Upper bound from the tokens per unit of a probe, with 3x slack as RULER's search.
  const int64_t probe = std::max<int64_t>(lo * 4, 64);
  auto t_probe = tokens(probe, nullptr);
  if (!t_probe) return t_probe.status();
  const double per = std::max(1e-3, double(*t_probe - *t_lo) / double(probe - lo));
  int64_t hi = std::max<int64_t>(probe, int64_t(3.0 * double(length) / per));
  if (task == "cwe") hi = std::min<int64_t>(hi, int64_t(res.words.size()));
  if (is_qa_task(task)) {
    const QaSet* set = task == "qa_1" ? res.squad.get() : res.hotpotqa.get();
    if (set) hi = std::min<int64_t>(hi, int64_t(set->docs.size()));
  }
  while (lo < hi) {  // largest n that fits; tokens grow with n
    const int64_t mid = lo + (hi - lo + 1) / 2;
    RulerSample cand;
    auto t = tokens(mid, &cand);
    if (!t) return t.status();
    if (*t + max_new <= length) {
      lo = mid;
      best = std::move(cand);
    } else {
      hi = mid - 1;
    }
  }
  return best;
}

std::string strip_whitespace(const std::string& s) {
  const char* ws = " \t\n\r\f\v";
  const size_t b = s.find_first_not_of(ws);
  if (b == std::string::npos) return std::string();
  return s.substr(b, s.find_last_not_of(ws) - b + 1);
}

std::string postprocess_prediction(const std::string& output) {
  std::string s = strip_whitespace(output);
  for (char& ch : s)
    if (uint8_t(ch) < 0x20) ch = '\n';
  return strip_whitespace(s);
}

double score_match_all(const std::string& output, const std::vector<std::string>& expected) {
  if (expected.empty()) return 0.0;
  const std::string out = ascii_lower(output);
  int found = 0;
  for (const auto& e : expected) found += out.find(ascii_lower(e)) != std::string::npos;
  return double(found) / double(expected.size());
}

double score_match_part(const std::string& output, const std::vector<std::string>& expected) {
  const std::string out = ascii_lower(output);
  for (const auto& e : expected)
    if (out.find(ascii_lower(e)) != std::string::npos) return 1.0;
  return 0.0;
}

double score_ruler(RulerMetric metric, const std::string& output,
                   const std::vector<std::string>& expected) {
  if (metric == RulerMetric::kEditSim)  // the raw output: its lines and indentation count
    return expected.empty() ? 0.0 : code_line_similarity(output, expected[0]);
  const std::string p = postprocess_prediction(output);
  if (metric == RulerMetric::kAgreeFull)
    return expected.empty() ? 0.0 : rouge_l_f1(p, postprocess_prediction(expected[0]));
  return metric == RulerMetric::kMatchAll ? score_match_all(p, expected)
                                          : score_match_part(p, expected);
}

}  // namespace qevict::eval
