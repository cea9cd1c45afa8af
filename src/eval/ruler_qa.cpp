// RULER's QA tasks (see ruler_qa.h).
#include "eval/ruler_qa.h"

#include <fmt/format.h>

#include <algorithm>
#include <map>
#include <nlohmann/json.hpp>
#include <set>

#include "eval/ruler_resources.h"
#include "eval/ruler_rng.h"

namespace qevict::eval {

namespace {

using json = nlohmann::json;

// RULER's constants.py, task 'qa'.
constexpr const char* kQaTemplate =
    "Answer the question based on the given documents. Only give me the answer and do not "
    "output any other words.\n\nThe following are given documents.\n\n{context}\n\nAnswer the "
    "question based on the given documents. Only give me the answer and do not output any other "
    "words.\n\nQuestion: {query}";
constexpr const char* kQaPrefix = " Answer:";
constexpr const char* kDocument = "Document {i}:\n{document}";

// Sorted distinct documents and each one's index (RULER: sorted(set(docs))).
std::map<std::string, int32_t> index_docs(const std::vector<std::string>& all, QaSet* set) {
  std::set<std::string> distinct(all.begin(), all.end());
  set->docs.assign(distinct.begin(), distinct.end());
  std::map<std::string, int32_t> at;
  for (size_t i = 0; i < set->docs.size(); ++i) at[set->docs[i]] = int32_t(i);
  return at;
}

Expected<json> parse_json(const std::string& text, const char* what) {
  json j = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return Status::error(fmt::format("{}: not valid JSON", what));
  return j;
}

}  // namespace

Expected<QaSet> parse_squad_json(const std::string& text) {
  auto j = parse_json(text, "squad.json");
  if (!j) return j.status();
  try {
    const json& data = j->at("data");
    std::vector<std::string> all;
    for (const auto& d : data)
      for (const auto& p : d.at("paragraphs")) all.push_back(p.at("context").get<std::string>());
    QaSet set;
    const auto at = index_docs(all, &set);
    for (const auto& d : data) {
      std::vector<int32_t> article;
      for (const auto& p : d.at("paragraphs")) article.push_back(at.at(p.at("context")));
      for (const auto& p : d.at("paragraphs")) {
        const int32_t gold = at.at(p.at("context"));
        for (const auto& q : p.at("qas")) {
          if (q.value("is_impossible", false)) continue;
          QaItem item;
          item.query = q.at("question").get<std::string>();
          for (const auto& a : q.at("answers")) item.outputs.push_back(a.at("text"));
          if (item.outputs.empty()) continue;
          item.gold = {gold};
          for (int32_t i : article)
            if (i != gold) item.more.push_back(i);
          set.items.push_back(std::move(item));
        }
      }
    }
    if (set.items.empty()) return Status::error("squad.json: no answerable question");
    return set;
  } catch (const json::exception& e) {
    return Status::error(fmt::format("squad.json: not SQuAD 2.0's layout: {}", e.what()));
  }
}

Expected<QaSet> parse_hotpotqa_json(const std::string& text) {
  auto j = parse_json(text, "hotpotqa.json");
  if (!j) return j.status();
  try {
    if (!j->is_array()) return Status::error("hotpotqa.json: not a list of questions");
    // A paragraph is its title, a newline, and its sentences joined as they are (RULER).
    auto doc = [](const json& c) {
      std::string s = c.at(0).get<std::string>() + "\n";
      for (const auto& sent : c.at(1)) s += sent.get<std::string>();
      return s;
    };
    std::vector<std::string> all;
    for (const auto& d : *j)
      for (const auto& c : d.at("context")) all.push_back(doc(c));
    QaSet set;
    const auto at = index_docs(all, &set);
    for (const auto& d : *j) {
      QaItem item;
      item.query = d.at("question").get<std::string>();
      item.outputs = {d.at("answer").get<std::string>()};
      for (const auto& c : d.at("context")) item.gold.push_back(at.at(doc(c)));
      set.items.push_back(std::move(item));
    }
    if (set.items.empty()) return Status::error("hotpotqa.json: no question");
    return set;
  } catch (const json::exception& e) {
    return Status::error(fmt::format("hotpotqa.json: not HotpotQA's layout: {}", e.what()));
  }
}

bool is_qa_task(const std::string& task) { return task == "qa_1" || task == "qa_2"; }

const char* qa_data_file(const std::string& task) {
  return task == "qa_2" ? "hotpotqa.json" : "squad.json";
}

Expected<QaSet> load_qa_set(const std::string& dir, const std::string& task) {
  const std::string path = dir + "/" + qa_data_file(task);
  auto text = read_text_file(path);
  if (!text)
    return Status::error(fmt::format("{}: {} (fetch RULER's data with tools/fetch_ruler_data.sh)",
                                     task, text.error()));
  auto set = task == "qa_2" ? parse_hotpotqa_json(*text) : parse_squad_json(*text);
  if (!set) return Status::error(fmt::format("{}: {}: {}", task, path, set.error()));
  return set;
}

Expected<RulerSample> build_qa_sample(const QaSet& set, uint64_t seed, int64_t n_docs) {
  if (set.items.empty() || set.docs.empty()) return Status::error("qa: no questions loaded");
  Rng rng(seed);
  const QaItem& item = set.items[rng.below(set.items.size())];
  const int64_t n_all = int64_t(set.docs.size());
  n_docs = std::clamp<int64_t>(n_docs, int64_t(item.gold.size()), n_all);
  // Distractors in a fixed order for this sample: the same article's paragraphs (shuffled),
  // then the others in the order of a partial Fisher-Yates draw, whose first draws do not
  // depend on how many are taken.
  std::vector<int32_t> docs = item.gold;
  std::vector<int32_t> more = item.more;
  rng.shuffle(more);
  std::set<int32_t> used(docs.begin(), docs.end());
  for (int32_t m : more) {
    if (int64_t(docs.size()) >= n_docs) break;
    if (used.insert(m).second) docs.push_back(m);
  }
  if (int64_t(docs.size()) < n_docs) {
    const int64_t k = std::min(n_all, n_docs + int64_t(used.size()));
    for (int64_t d : rng.sample(n_all, k)) {
      if (int64_t(docs.size()) >= n_docs) break;
      if (used.insert(int32_t(d)).second) docs.push_back(int32_t(d));
    }
  }
  // Every document drawn: shuffle with a generator of its own, so the order depends only on the
  // seed and the number of documents.
  Rng order(seed ^ 0x5bd1e995u);
  order.shuffle(docs);
  std::string context;
  for (size_t i = 0; i < docs.size(); ++i) {
    if (i) context += "\n\n";
    context += fmt::format(fmt::runtime(kDocument), fmt::arg("i", i + 1),
                           fmt::arg("document", set.docs[size_t(docs[i])]));
  }
  RulerSample s;
  s.input = fmt::format(fmt::runtime(kQaTemplate), fmt::arg("context", context),
                        fmt::arg("query", item.query));
  s.answer_prefix = kQaPrefix;
  s.expected = item.outputs;
  s.source = item.query;
  s.haystack_units = int64_t(docs.size());
  return s;
}

}  // namespace qevict::eval
