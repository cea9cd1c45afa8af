// The task-suite runner behind `qevict eval`: for every (length, task, sample) it builds the
// RULER-style prompt (eval/ruler_tasks.h) in the model's chat template, then prefills and
// greedily decodes it once per pending (variant, budget) — all of them in one batch
// (engine/generator.h), and every variant that keeps the whole prompt until it ends (FullKV,
// route=end) sharing one prefill (engine/prefill_share.h) — scores each output and appends one JSON
// line per (sample, variant, budget) to DIR/results.jsonl, flushed when the batch is done. A rerun
// reads that file and skips the cells it holds, so a killed sweep loses at most the batch in
// flight. Under every --protocol (eval_protocol.h) but `end` the prompt is split into turns:
// the first shares its prefill as above, later ones are each cache's own, prefilled into the
// compressed cache; a line per answered turn, keyed by the protocol.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "chat/chat_template.h"
#include "core/status.h"
#include "core/thread_pool.h"
#include "eval/eval_protocol.h"
#include "eval/ruler_tasks.h"
#include "kvcache/params.h"
#include "model/model.h"
#include "tokenizer/tokenizer.h"

namespace qevict::eval {

// One column of the grid: a policy (with options) at one budget.
struct EvalVariant {
  std::string spec;      // as given: "full", "qevict", "qevict:score=age", "qevict:q=0", ...
  double budget = 0.0;   // fraction of the full cache for prompt + max_new tokens; 0 for FullKV
  KvCacheParams params;  // complete, validated, except budget_fraction (set per sample)
};

// Prompts of a RULER-format file (`--dataset`, ruler_dataset.h), run like a built-in task's.
struct EvalDataset {
  std::string path;                  // recorded on every result line as "dataset"
  std::vector<RulerSample> samples;  // length 0: set from the prompts' tokens (round_up_length)
};

struct EvalOptions {
  std::vector<std::string> tasks;  // may be empty when datasets are given
  std::vector<int64_t> lengths;    // tokens: prompt (chat template included) + max_new_tokens
  int n_samples = 2;               // samples 0 .. n_samples-1 of every (task, length)
  // Registry policy names, optionally with options: "NAME[:key=value]..." where key is one of
  // score, q, window, route_every, sink, local, bits, route (chunk|end), prefill_window, pool
  // (e.g. "qevict:score=age", "qevict:q=0", "qevict:route=end").
  std::vector<std::string> variants = {"full", "qevict"};
  // Where the question stands (eval_protocol.h); `end` alone is every grid before issue 51.
  std::vector<EvalProtocol> protocols = {EvalProtocol::kEnd};
  std::vector<double> budgets = {0.2};  // every budgeted variant runs at each; FullKV once
  KvCacheParams base;                   // shared --kv-* options
  KvParamsGiven given;                  // which of them the user set
  int prefill_chunk = 512;
  uint64_t seed = 0;  // base of every sample's seed (ruler_seed)
  std::string out_dir;
  std::string model_name;  // recorded on every line; a rerun into the same DIR must match
  // The essay haystack's name (ruler_resources.h haystack_name), recorded on every line as
  // "haystack"; a rerun into the same DIR must match (lines without it: "jargon", the only
  // haystack before it was recorded).
  std::string haystack = "jargon";
  std::vector<EvalDataset> datasets;  // --dataset files, after the built-in tasks
  // Only build the prompts (DIR/prompts.jsonl: the rendered prompt, its tokens, the expected
  // answers): to read what the model would see, or time generation, without running it.
  bool prompts_only = false;
  Status validate() const;
};

// Every (variant spec, budget) column: FullKV (no budget) once, the others at every budget.
Expected<std::vector<EvalVariant>> expand_variants(const EvalOptions& o);

// The key of one result: "task|length|variant|budget|sample", and "|protocol" after it for
// every protocol but `end` (so the files of grids before protocols resume unchanged).
std::string eval_cell_key(const std::string& task, int64_t length, const std::string& variant,
                          double budget, int sample, const std::string& protocol = "end");

// Prompts as the model reads them: the user turn of the GGUF's chat template (ChatML when the
// file has none) with the generation prompt, then the task's answer prefix; `raw` (RulerSample::
// raw, lcc): the input and prefix as plain text, no template, special tokens not parsed.
class PromptFormatter {
 public:
  static Expected<PromptFormatter> from_model(const Model& model, const Tokenizer& tok);
  Expected<std::string> render(const std::string& input, const std::string& answer_prefix,
                               bool raw = false) const;
  Expected<std::vector<int32_t>> encode(const std::string& input, const std::string& answer_prefix,
                                        bool raw = false) const;
  // A conversation of user turns, as the text each turn appends: turn i is what the template
  // renders for users[0..i] beyond its rendering of users[0..i-1] (no generation prompt until
  // the last turn, which ends with it and the answer prefix). Raw: the turns' text joined by
  // "\n", the prefix after the last. Error: a template whose rendering of the first turns is
  // not a prefix of its rendering of more.
  // The template's rendering of msgs (ChatML when the file has none).
  Expected<std::string> render_messages(const std::vector<ChatMessage>& msgs,
                                        bool add_generation_prompt) const;
  Expected<std::vector<std::string>> render_turns(const std::vector<std::string>& users,
                                                  const std::string& answer_prefix,
                                                  bool raw = false) const;
  // Tokens of one turn's text (render_turns): the first with the tokenizer's special
  // prefix (as encode), the later ones without.
  Expected<std::vector<int32_t>> encode_text(const std::string& text, bool first,
                                             bool raw = false) const;

 private:
  PromptFormatter(const Tokenizer* tok, std::shared_ptr<const ChatTemplate> tmpl)
      : tok_(tok), tmpl_(std::move(tmpl)) {}
  const Tokenizer* tok_;
  std::shared_ptr<const ChatTemplate> tmpl_;  // null: ChatML
};

struct EvalProgress {
  int64_t done = 0;      // cells finished, this run and before
  int64_t total = 0;     // cells of the grid
  int64_t skipped = 0;   // found already done in results.jsonl
  int64_t run_done = 0;  // finished by this run
  double elapsed = 0.0;  // seconds since this run started
  double eta = 0.0;      // seconds left, from this run's rate
  std::string last;      // what just finished, one line
};

// Runs every cell of the grid not yet in DIR/results.jsonl. progress is called once at the
// start and after every sample batch.
Status run_eval(Model& model, const Tokenizer& tok, ThreadPool& pool, const RulerResources& res,
                const EvalOptions& opts, const std::function<void(const EvalProgress&)>& progress);

}  // namespace qevict::eval
