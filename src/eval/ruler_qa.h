// RULER's qa_1 (SQuAD) and qa_2 (HotpotQA), built as NVIDIA/RULER builds them
// (scripts/data/synthetic/qa.py and constants.py, read in PyPI nvidia-long-context-eval 26.3,
// long_context_eval/data/synthetic/): the question's gold paragraph(s) among distractor
// paragraphs, each written "Document {i}:\n{text}" and joined by blank lines, in RULER's QA
// template, answer prefix " Answer:", 32 tokens to generate, scored by string_match_part.
//   Documents: SQuAD's distinct paragraph contexts, HotpotQA's distinct "title\nsentences"
//   paragraphs, both sorted (RULER's read_squad / read_hotpotqa). Questions: SQuAD's answerable
//   ones (is_impossible false; every answer text is a reference); every HotpotQA question.
//   Gold: SQuAD, the question's paragraph; HotpotQA, all ten paragraphs of its distractor-
//   setting context (two supporting, eight distractors), as RULER takes them.
//   Distractors: SQuAD first takes the other paragraphs of the same article, then (as HotpotQA)
//   random paragraphs of the rest; the documents are shuffled.
// Deviations: RULER asks question i for sample i and shuffles with one fixed seed; here the
// question and the shuffle are drawn from the sample's seed (so another --seed gives other
// questions: a test split), and the distractors are drawn in an order that does not depend on
// how many are taken, so the length fitting (documents as the haystack unit, by binary search
// rather than RULER's steps of 10) only adds or removes documents at the end of that order.
// The data is read at run time (tools/fetch_ruler_data.sh); nothing of it is committed.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/status.h"
#include "eval/ruler_tasks.h"

namespace qevict::eval {

struct QaItem {
  std::string query;
  std::vector<std::string> outputs;  // reference answers
  std::vector<int32_t> gold;         // indices into QaSet::docs
  std::vector<int32_t> more;         // preferred distractors (SQuAD: the same article's)
};

struct QaSet {
  std::vector<std::string> docs;  // distinct, sorted
  std::vector<QaItem> items;
};

// The two datasets' JSON as RULER's package ships them. Errors name what is malformed.
Expected<QaSet> parse_squad_json(const std::string& text);
Expected<QaSet> parse_hotpotqa_json(const std::string& text);
// Reads squad.json (qa_1) or hotpotqa.json (qa_2) from `dir` (tools/fetch_ruler_data.sh's
// directory); the error says how to fetch it.
Expected<QaSet> load_qa_set(const std::string& dir, const std::string& task);

bool is_qa_task(const std::string& task);  // qa_1, qa_2
// The data file a qa task reads: "squad.json" or "hotpotqa.json".
const char* qa_data_file(const std::string& task);

// A qa sample with `n_docs` documents (at least the gold ones, at most all): the building block
// behind build_ruler_sample for qa_1/qa_2. Fills input, answer_prefix (RULER's, leading space
// kept), expected, source (the question) and haystack_units.
Expected<RulerSample> build_qa_sample(const QaSet& set, uint64_t seed, int64_t n_docs);

}  // namespace qevict::eval
