// RULER-style synthetic long-context tasks (Hsieh et al., "RULER: What's the Real Context Size
// of Your Long-Context Language Models?", arXiv 2404.06654; task definitions from NVIDIA/RULER
// scripts/data/synthetic/{niah,variable_tracking,common_words_extraction,
// freq_words_extraction}.py, constants.py and synthetic.yaml). Generated offline and
// deterministically: every (task, length, sample) has its own fixed seed, and a sample is fitted
// to its length in tokens of the model that will read it (via a caller-supplied counter).
// qa_1/qa_2 (SQuAD, HotpotQA among distractor documents) are in ruler_qa.h; their data is read
// at run time from RULER's own package (tools/fetch_ruler_data.sh).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "core/status.h"

namespace qevict::eval {

// How a sample's output is scored against its expected strings (RULER's eval/synthetic
// metrics): kMatchAll = share of the expected strings found in the output (string_match_all),
// kMatchPart = 1 if any is found (string_match_part). Case-insensitive substring matches.
// The long-document tasks (longdoc_tasks.h): kEditSim = edit similarity of the output's first
// code line to expected[0]; kAgreeFull = ROUGE-L F1 of the output against expected[0], which
// the runner sets to FullKV's output for the same sample.
enum class RulerMetric { kMatchAll, kMatchPart, kEditSim, kAgreeFull };

struct QaSet;  // ruler_qa.h

// The material a haystack is made of. All of it is read at run time (eval/ruler_resources.h).
struct RulerResources {
  std::vector<std::string> essay_words;  // real prose split on whitespace, in reading order
  std::vector<std::string> words;        // distinct lowercase words: keys, CWE's word lists
  std::vector<std::string> code_files;   // source files for lcc (find_code_files), by path
  // The prose of doc_qa / doc_sum (the Jargon File, whose ':term:' headwords doc_qa asks
  // about) when the niah haystack (essay_words) is another text; empty: essay_words.
  std::vector<std::string> doc_words;
  std::shared_ptr<const QaSet> squad;     // qa_1 (ruler_qa.h); null: not loaded
  std::shared_ptr<const QaSet> hotpotqa;  // qa_2
};

// One of a sample's independent questions (the `multi` protocol, eval_protocol.h): one key of
// a niah task's needles asked alone, in RULER's singular wording, and the key's values.
struct RulerQuestion {
  std::string question;       // "What is the special magic number for KEY mentioned ...?"
  std::string answer_prefix;  // "The special magic number for KEY mentioned ... is"
  std::vector<std::string> expected;
};

// One generated prompt. The model sees `input` as the user turn of its chat template and
// `answer_prefix` as the start of its own turn (RULER's answer prefix, without its leading
// space), then continues it greedily for at most max_new_tokens.
struct RulerSample {
  std::string task;
  int64_t length = 0;  // target: prompt tokens + max_new_tokens <= length
  int sample = 0;      // index within (task, length)
  uint64_t seed = 0;   // ruler_seed(task, length, sample, base)
  std::string input;
  std::string answer_prefix;
  std::vector<std::string> expected;
  int max_new_tokens = 0;
  RulerMetric metric = RulerMetric::kMatchAll;
  int64_t haystack_units = 0;  // words, noise lines, distractor needles or list entries used
  int64_t prompt_tokens = 0;   // as counted by the PromptTokenCounter
  std::string source;          // lcc: file:line of the target; doc_qa: the term asked about
  // The prompt as plain text, without the chat template (lcc: the file's lines for the model
  // to continue; longdoc_tasks.h says why).
  bool raw = false;
  // Where the question starts in `input` (byte offset; the instruction and text before it,
  // whitespace between them), -1 when the prompt has no separable question (the long-document
  // tasks, --dataset prompts). The evaluation protocols that move the question (after, first:
  // eval_protocol.h) read the parts through sample_context() and sample_question().
  int64_t question_at = -1;
  // niah tasks with 4 keys of one value each (niah_multikey_1, niah_multiquery): every key's
  // question, in the order the keys were drawn; empty for the others. Not part of `input`.
  std::vector<RulerQuestion> questions;
};

// The prompt without its question (the instruction and the text, trailing whitespace
// stripped) and the question alone; both empty when question_at < 0. context + separator +
// question is `input`, byte for byte.
std::string sample_context(const RulerSample& s);
std::string sample_question(const RulerSample& s);

// Counts the tokens the model will read for a sample's prompt (input, answer_prefix): the chat
// template included unless the sample is raw.
using PromptTokenCounter = std::function<Expected<int64_t>(const RulerSample& s)>;

// The RULER tasks built here, in RULER's order: niah_single_1/2/3, niah_multikey_1/2/3,
// niah_multivalue, niah_multiquery, vt, cwe, fwe, qa_1, qa_2.
const std::vector<std::string>& ruler_task_names();
bool is_ruler_task(const std::string& name);
// Tokens RULER lets the model generate for this task (niah 128, vt 30, cwe 120, fwe 50, qa 32).
int ruler_max_new_tokens(const std::string& task);

// The fixed seed of one sample: FNV-1a of "task/length/sample" mixed with `base` (--seed).
uint64_t ruler_seed(const std::string& task, int64_t length, int sample, uint64_t base);

// Builds sample `sample` of `task` (RULER's or a long-document task, longdoc_tasks.h) at
// `length` tokens: the largest haystack whose prompt, as
// counted by `count`, plus the task's max_new_tokens fits in `length` (binary search, as
// RULER's generators do). Errors: unknown task, empty resources, a length too short for the
// template, or a counter error.
Expected<RulerSample> make_ruler_sample(const std::string& task, int64_t length, int sample,
                                        uint64_t base_seed, const RulerResources& res,
                                        const PromptTokenCounter& count);

// The same sample with a given haystack size (no fitting): the building block of
// make_ruler_sample, exposed for tests. prompt_tokens is left 0.
Expected<RulerSample> build_ruler_sample(const std::string& task, int64_t length, int sample,
                                         uint64_t base_seed, int64_t haystack_units,
                                         const RulerResources& res);

// s without leading and trailing whitespace (Python's str.strip()).
std::string strip_whitespace(const std::string& s);
// RULER's postprocess_pred: strip, control characters to '\n', strip again.
std::string postprocess_prediction(const std::string& output);
// string_match_all / string_match_part on one output, in [0, 1]; 0 when expected is empty.
double score_match_all(const std::string& output, const std::vector<std::string>& expected);
double score_match_part(const std::string& output, const std::vector<std::string>& expected);
// The task's metric on the postprocessed output.
double score_ruler(RulerMetric metric, const std::string& output,
                   const std::vector<std::string>& expected);

}  // namespace qevict::eval
