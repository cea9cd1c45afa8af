// Long-document tasks on real inputs (issue 11), beside the RULER-style ones (ruler_tasks.h) and
// built on the same RulerSample, seeds and length fitting:
//   lcc      the next line of a real Python source file from the machine (the standard library
//            of Debian's python3.11), after up to `length` tokens of the lines before it, in
//            the style of LongBench's LCC (Bai et al. 2023, arXiv 2308.14508: 64 new tokens;
//            score: edit similarity of the first code line of the output, and exact match on
//            the side). The prompt is the lines alone, as plain text (RulerSample::raw), for
//            the model to continue: LongBench's instruction ("Please complete the code given
//            below. {context}Next line of code:") made the 0.5B coder rewrite the file in a
//            markdown block, in a chat turn or without one (FullKV: exact match 0 of 10,
//            edit similarity 24, the same for every variant: no signal); the lines alone gave
//            FullKV 4 of 6 exact, similarity 91. The model may have seen these files in
//            training: the scores compare caches on the same model, not models.
//   doc_qa   a question about a term defined deep in a long excerpt of the haystack prose (the
//            Jargon File): what does the document say about ':term:'?
//   doc_sum  a two- or three-sentence summary of a long excerpt.
// doc_qa and doc_sum score the agreement of a variant's greedy output with FullKV's own
// (ROUGE-L F1 over words) — what compression costs, whatever the model's skill — so they need
// the variant `full` in the same run. doc_qa also has a reference (issue 53 item 7): the asked
// headword's own entry in the excerpt, scored by keyword recall (doc_qa_reference below), so
// FullKV gets a real score too.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "core/status.h"
#include "eval/ruler_tasks.h"

namespace qevict::eval {

// lcc, doc_qa, doc_sum.
const std::vector<std::string>& longdoc_task_names();
bool is_longdoc_task(const std::string& name);
// Tokens generated: lcc 64, doc_qa 48, doc_sum 96.
int longdoc_max_new_tokens(const std::string& task);
// The fewest units (lcc: context lines; doc_*: words) a sample may have.
int64_t longdoc_min_units(const std::string& task);

// Python source files under `dir` (recursively, sorted by path) that suit lcc: at least
// `min_bytes` long, with at least one `def` per 2,000 bytes (code, not data tables), outside
// test, idlelib and site/dist-packages directories. Errors when `dir` cannot be listed.
Expected<std::vector<std::string>> find_code_files(const std::string& dir, int64_t min_bytes);

// Sample `sample` of `task` with `units` units of context. lcc draws (from the seed alone, so
// that the length fitting sees one file and one target) a file whose target line lies at least
// 4.5 bytes per token of `length` into it, and a target line there that is code: not blank, a
// comment, a decorator alone, a string or inside a triple-quoted one; its context is the
// `units` lines before it (fewer at the file's start). doc_* draw an excerpt start in the
// prose; doc_qa asks about a ':term:' headword in the middle half of the excerpt (anywhere in
// it when the middle has none; the excerpt's middle word when it has none at all).
Expected<RulerSample> build_longdoc_sample(const std::string& task, int64_t length, int sample,
                                           uint64_t base_seed, int64_t units,
                                           const RulerResources& res);

// LongBench's code_sim_score, rewritten: the first line of the output (leading blank lines
// dropped) that holds no '`', '#' or '//', then 2·LCS / (|a| + |b|) over characters against
// the expected line (the indel ratio of fuzz.ratio), both stripped; in [0, 1].
double code_line_similarity(const std::string& output, const std::string& expected);
// The same first code line equals the expected line, both stripped.
bool code_line_exact(const std::string& output, const std::string& expected);
// ROUGE-L F1 over lowercase alphanumeric words; 1 when both are empty.
double rouge_l_f1(const std::string& a, const std::string& b);

// doc_qa's reference: what the excerpt itself says about the asked headword.
struct DocQaReference {
  // The entry's definition as the excerpt holds it: the words after the headword, its
  // pronunciation (/.../) and part of speech (n., vt., adj., ...), up to the next headword
  // (a word ':X...') or the excerpt's end.
  std::string entry;
  // The first sentence of each sense (numbered "1.", "2.", ...; an entry without numbers has
  // one), after bracketed notes ("[techspeak]"), extended sentence by sentence until it has 3
  // keywords (or the sense ends). Senses without a keyword are left out. Bracketed notes
  // before a sense with 3 keywords or more (an acronym's expansion) come before it, whole.
  std::vector<std::string> sentences;
  // Each sentence's distinct content words (content_words), less the headword's own.
  std::vector<std::vector<std::string>> keywords;
};

// The reference of the headword at words[at] of an excerpt split on whitespace (as
// prose_words splits the haystack); none when words[at] is no ':term:' headword or no sense
// of its entry has a keyword.
std::optional<DocQaReference> jargon_entry_reference(const std::vector<std::string>& words,
                                                     size_t at);
// The same from a doc_qa sample: the document of its prompt and the term it asks about
// (sample.source), at the term's first occurrence as a headword. None for other samples and
// when the term is no headword (an excerpt without one asks about its middle word).
std::optional<DocQaReference> doc_qa_reference(const RulerSample& sample);

// Lowercase alphanumeric words of two characters or more, a final 's' dropped (not from 'ss',
// nor from words of three letters), without English stopwords, the Jargon File's
// cross-reference words (see, also, compare, cf, esp, orig) and the words an answer frames
// itself with whatever it says (term, document, refers, means, ...); distinct, in order.
std::vector<std::string> content_words(const std::string& text);
// The share of `keywords` (content_words' form) among the output's content words; 0 when
// there are none. doc_qa's reference score. Chosen over ROUGE-L against the entry: entries
// run from ten to several hundred words and the answer is at most 48 tokens, so ROUGE-L F1
// or recall against the whole entry measures the entry's length more than the answer; against
// the first sentence it still credits function words and their order, which a paraphrase
// changes freely. Keyword recall asks whether the answer carries what the definition says.
double keyword_recall(const std::string& output, const std::vector<std::string>& keywords);
// doc_qa's reference score: the best keyword recall over the entry's senses — an answer that
// gives any one sense the document gives is right (the 0.5B coder's FullKV answer for
// ':zombie:' was sense 2, a cracked machine, not sense 1, a dead process).
double reference_recall(const std::string& output, const DocQaReference& ref);

}  // namespace qevict::eval
