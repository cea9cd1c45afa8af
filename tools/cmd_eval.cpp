// qevict eval: the RULER-style task suite (eval/ruler_tasks.h) over a grid of tasks × lengths
// × KV variants × budgets × samples, resumable, into --out DIR: results.jsonl (one line per
// finished cell), summary.csv and summary.md. Plot: tools/eval/plot_eval.py DIR/summary.csv.
// RULER's own data (qa_1/qa_2, the essay haystack) is read from --ruler-data, which
// tools/fetch_ruler_data.sh fills; --dataset runs prompt files in RULER's format.
#include <fmt/format.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <sstream>

#include "cli_common.h"
#include "commands.h"
#include "eval/eval_runner.h"
#include "eval/eval_summary.h"
#include "eval/longdoc_tasks.h"
#include "eval/ruler_dataset.h"
#include "eval/ruler_qa.h"
#include "eval/ruler_resources.h"
#include "kvcache/registry.h"

namespace qevict::cli {

namespace {

// Debian's jargon-text: the Jargon File 4.4.7, in the public domain. Its prose starts at
// Chapter 1 (before it: the table of contents).
constexpr const char* kDefaultHaystack = "/usr/share/doc/jargon-text/jargon.txt.gz";
constexpr const char* kDefaultHaystackStart = "Chapter 1. Hacker Slang";
constexpr const char* kDefaultWords = "/usr/share/dict/words";  // Debian's wamerican
// lcc's source files: the Python standard library of Debian 12 (libpython3.11-stdlib).
constexpr const char* kDefaultCodeDir = "/usr/lib/python3.11";

struct EvalArgs {
  ModelOptions model;
  std::string profile = "quick";
  std::string tasks, lengths, variants, budgets;
  int samples = 0;
  std::string out_dir;
  int64_t seed = 0;
  int prefill_chunk = 512;
  std::string haystack = "jargon", haystack_start = kDefaultHaystackStart;
  std::string ruler_data;  // empty: the cache's ruler-data (default_ruler_data)
  std::vector<std::string> datasets;
  std::string dataset_metric = "all";
  int dataset_tokens = 128;
  int64_t dataset_length = 0;
  std::string words = kDefaultWords;
  std::string code_dir = kDefaultCodeDir;
  bool summary_only = false;
  bool prompts_only = false;
  std::string protocols = "end";
  KvOptions kv;
};

// Where tools/fetch_ruler_data.sh puts RULER's data: $QEVICT_CACHE/ruler-data, else
// ${XDG_CACHE_HOME:-~/.cache}/qevict/ruler-data.
std::string default_ruler_data() {
  if (const char* c = std::getenv("QEVICT_CACHE"); c && *c) return std::string(c) + "/ruler-data";
  if (const char* x = std::getenv("XDG_CACHE_HOME"); x && *x)
    return std::string(x) + "/qevict/ruler-data";
  const char* home = std::getenv("HOME");
  return std::string(home ? home : ".") + "/.cache/qevict/ruler-data";
}

std::vector<std::string> split(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  for (std::string x; std::getline(ss, x, ',');)
    if (!x.empty()) out.push_back(x);
  return out;
}

// "4096", "4k" or "4K" (× 1024).
Expected<int64_t> parse_length(const std::string& s) {
  try {
    size_t used = 0;
    int64_t v = std::stoll(s, &used);
    if (used + 1 == s.size() && (s[used] == 'k' || s[used] == 'K')) return v * 1024;
    if (used == s.size()) return v;
  } catch (const std::exception&) {
  }
  return Status::error(fmt::format("length '{}' is not a number of tokens (e.g. 4096 or 4K)", s));
}

// The profile's grid; flags given explicitly replace its parts.
Status fill_grid(const EvalArgs& a, eval::EvalOptions* o) {
  std::string tasks, lengths, variants, budgets;
  int samples = 0;
  if (a.profile == "quick") {
    // CI: the pipeline end to end on the real model, not a score claim. One sample per task:
    // FullKV and qevict with the paper's prefill route share one 4K-token prefill (about 95
    // CPU-seconds on the 0.5B model), so the profile stays well under 5 minutes on 2 cores.
    tasks = "niah_single_1,vt";
    lengths = "4096";
    samples = 1;
    variants = "full,qevict:route=end";
    budgets = "0.2";
  } else if (a.profile == "full") {  // issue 11's grid
    std::vector<std::string> all;
    for (const auto& t : eval::ruler_task_names()) all.push_back(t);
    for (const auto& t : eval::longdoc_task_names()) all.push_back(t);
    tasks = fmt::format("{}", fmt::join(all, ","));
    lengths = "4096,8192,16384,32768";
    samples = 10;
    variants = "full,qevict,qevict:route=end,qevict:score=age,qevict:q=0";
    for (const auto& r : policy_registry())
      if (r.kind != CacheKind::kFull && r.name != "qevict") variants += "," + r.name;
    budgets = "0.5,0.2,0.1,0.05";
  } else {
    return Status::error(fmt::format("unknown profile '{}' (quick, full)", a.profile));
  }
  if (!a.tasks.empty()) tasks = a.tasks;
  if (!a.lengths.empty()) lengths = a.lengths;
  if (a.samples > 0) samples = a.samples;
  if (!a.variants.empty()) variants = a.variants;
  if (!a.budgets.empty()) budgets = a.budgets;
  o->tasks = split(tasks);
  o->lengths.clear();
  for (const auto& l : split(lengths)) {
    auto v = parse_length(l);
    if (!v) return v.status();
    o->lengths.push_back(*v);
  }
  o->n_samples = samples;
  o->variants = split(variants);
  o->budgets.clear();
  for (const auto& b : split(budgets)) {
    try {
      size_t used = 0;
      o->budgets.push_back(std::stod(b, &used));
      if (used != b.size()) throw std::invalid_argument(b);
    } catch (const std::exception&) {
      return Status::error(fmt::format("budget '{}' is not a number", b));
    }
  }
  return Status::ok();
}

std::string duration(double s) {
  if (s < 90) return fmt::format("{:.0f} s", s);
  if (s < 5400) return fmt::format("{:.1f} min", s / 60);
  return fmt::format("{:.1f} h", s / 3600);
}

// The haystacks, word list, code files, RULER's QA data and --dataset files the run needs.
// A qa task whose data is missing is left out with a message (tools/fetch_ruler_data.sh
// fetches it); --dataset replaces the profile's tasks unless --tasks is given too.
Status load_inputs(const EvalArgs& a, eval::EvalOptions* o, eval::RulerResources* res) {
  const std::string data_dir = a.ruler_data.empty() ? default_ruler_data() : a.ruler_data;
  if (!a.datasets.empty()) {
    if (a.tasks.empty()) o->tasks.clear();
    eval::DatasetOptions dopt;
    dopt.max_new_tokens = a.dataset_tokens;
    dopt.metric =
        a.dataset_metric == "part" ? eval::RulerMetric::kMatchPart : eval::RulerMetric::kMatchAll;
    dopt.length = a.dataset_length;
    for (const auto& path : a.datasets) {
      auto samples = eval::load_dataset(path, dopt);
      if (!samples) return samples.status();
      eval::EvalDataset d{path, {}};
      std::map<std::string, int> per_task;  // --samples N: a task's first N prompts
      for (auto& smp : *samples)
        if (a.samples <= 0 || per_task[smp.task]++ < a.samples) d.samples.push_back(std::move(smp));
      o->datasets.push_back(std::move(d));
    }
  }
  // The Jargon File (or a given text) is read in any case: doc_qa / doc_sum ask about it.
  const bool named = a.haystack == "jargon" || a.haystack == "essay";
  auto r =
      eval::load_ruler_resources(named ? kDefaultHaystack : a.haystack, a.haystack_start, a.words);
  if (!r) return r.status();
  *res = std::move(*r);
  if (a.haystack == "essay") {
    auto words = eval::load_essay_words(data_dir);
    if (!words) return words.status();
    res->doc_words = std::move(res->essay_words);
    res->essay_words = std::move(*words);
  }
  std::vector<std::string> kept;
  for (const auto& t : o->tasks) {
    if (eval::is_qa_task(t)) {
      auto set = eval::load_qa_set(data_dir, t);
      if (!set) {
        std::fprintf(stderr, "eval: skipping %s: %s\n", t.c_str(), set.error().c_str());
        continue;
      }
      (t == "qa_1" ? res->squad : res->hotpotqa) =
          std::make_shared<const eval::QaSet>(std::move(*set));
    }
    kept.push_back(t);
  }
  o->tasks = std::move(kept);
  if (std::find(o->tasks.begin(), o->tasks.end(), "lcc") != o->tasks.end()) {
    // Files long enough for the shortest length's context (lcc_sample checks each length).
    int64_t shortest = *std::min_element(o->lengths.begin(), o->lengths.end());
    auto files = eval::find_code_files(a.code_dir, int64_t(4.5 * double(shortest)) + 256);
    if (!files) return files.status();
    if (files->empty())
      return Status::error(
          fmt::format("lcc: no Python file under {} is long enough (--code-dir)", a.code_dir));
    res->code_files = std::move(*files);
  }
  return Status::ok();
}

int run_eval_cmd(EvalArgs a) {
  if (a.summary_only) {
    auto md = eval::write_eval_summary(a.out_dir);
    if (!md) return fail(md.error());
    std::printf("%s", md->c_str());
    return 0;
  }
  eval::EvalOptions o;
  Status s = fill_grid(a, &o);
  if (!s) return fail(s.message());
  auto base = kv_flags(a.kv, &o.given);
  if (!base) return fail(base.error());
  if (base->budget_fraction > 0 || base->budget_bytes > 0)
    return fail("eval takes its budgets from --budgets, not --kv-budget / --kv-budget-bytes");
  o.base = *base;
  o.prefill_chunk = a.prefill_chunk;
  o.seed = uint64_t(a.seed);
  o.out_dir = a.out_dir;
  o.prompts_only = a.prompts_only;
  auto protocols = eval::parse_protocols(a.protocols);
  if (!protocols) return fail(protocols.error());
  o.protocols = *protocols;
  o.haystack = eval::haystack_name(a.haystack);
  eval::RulerResources res;
  s = load_inputs(a, &o, &res);
  if (!s) return fail(s.message());
  s = o.validate();
  if (!s) return fail(s.message());
  auto variants = eval::expand_variants(o);  // flag errors before the model loads
  if (!variants) return fail(variants.error());
  auto path = resolve_model_path(a.model.model_path);
  if (!path) return fail(path.error());
  o.model_name = std::filesystem::path(*path).filename().string();
  auto loaded = load_model(a.model);
  if (!loaded) return fail(loaded.error());
  const int threads = resolve_threads(a.model.threads);
  for (const eval::EvalVariant& v : *variants)
    if (find_policy(v.params.policy)->needs_calibration &&
        !o.base.quant.kvquant_calib) {  // calibrates once
      KvCacheParams p = v.params;
      if (Status st = prepare_kv_params(*loaded, &p, threads); !st.is_ok())
        return fail(st.message());
      o.base.quant.kvquant_calib = p.quant.kvquant_calib;
    }
  ThreadPool pool(threads);
  std::fprintf(stderr,
               "eval: %zu task(s) x %zu length(s) x %d sample(s) x %zu variant column(s), model "
               "%s, %d threads, haystack %s (%zu words), out %s\n",
               o.tasks.size(), o.lengths.size(), o.n_samples, variants->size(),
               o.model_name.c_str(), threads, o.haystack.c_str(), res.essay_words.size(),
               o.out_dir.c_str());
  for (const auto& d : o.datasets)
    std::fprintf(stderr, "eval: %s: %zu prompt(s)\n", d.path.c_str(), d.samples.size());
  s = eval::run_eval(
      *loaded->model, *loaded->tokenizer, pool, res, o, [](const eval::EvalProgress& p) {
        if (p.run_done == 0) {
          std::fprintf(stderr, "eval: %lld of %lld cells already done, %lld to run\n",
                       (long long)p.skipped, (long long)p.total, (long long)(p.total - p.done));
          return;
        }
        std::fprintf(stderr, "eval: %lld/%lld cells (%.0f%%) | %s elapsed, ~%s left | %s\n",
                     (long long)p.done, (long long)p.total,
                     100.0 * double(p.done) / double(p.total), duration(p.elapsed).c_str(),
                     duration(p.eta).c_str(), p.last.c_str());
      });
  if (!s) return fail(s.message());
  if (o.prompts_only) {
    std::fprintf(stderr, "wrote %s/prompts.jsonl\n", o.out_dir.c_str());
    return 0;
  }
  auto md = eval::write_eval_summary(o.out_dir);
  if (!md) return fail(md.error());
  std::printf("%s", md->c_str());
  std::fprintf(stderr,
               "wrote %s/results.jsonl, summary.csv and summary.md\nplot: $(tools/eval/venv.sh) "
               "tools/eval/plot_eval.py %s/summary.csv\n",
               o.out_dir.c_str(), o.out_dir.c_str());
  return 0;
}

}  // namespace

Runner add_eval(CLI::App& app) {
  auto a = std::make_shared<EvalArgs>();
  add_model_options(app, a->model, MatmulMode::kF32);
  app.add_option("--profile", a->profile,
                 "quick: niah_single_1 + vt, 1 sample each at 4K, full and qevict:route=end at 0.2 "
                 "sharing one prefill (CI); full: "
                 "every task at 4K-32K, 10 samples, every policy at 0.5/0.2/0.1/0.05. The flags "
                 "below replace parts of it")
      ->capture_default_str()
      ->check(CLI::IsMember({"quick", "full"}));
  app.add_option(
      "--tasks", a->tasks,
      "comma-separated tasks. RULER's: niah_single_1/2/3, niah_multikey_1/2/3, "
      "niah_multivalue, niah_multiquery, vt, cwe, fwe, qa_1 (SQuAD), qa_2 (HotpotQA; "
      "both need --ruler-data). Long documents: lcc (the next line of a real Python file, "
      "edit similarity), doc_qa and doc_sum (a question about a term / a summary of a "
      "long Jargon File excerpt, scored as agreement with FullKV's answer (and doc_qa_ref: keyword "
      "recall of the headword's own entry): needs the "
      "variant full)");
  app.add_option("--lengths", a->lengths,
                 "comma-separated lengths in tokens (prompt in the chat template + generated), "
                 "e.g. 4K,8K");
  app.add_option("--samples", a->samples, "samples per task and length")
      ->check(CLI::PositiveNumber);
  app.add_option("--variants", a->variants,
                 "comma-separated KV policies (" + policy_names(", ") +
                     "), each optionally NAME:key=value[:...] with key score, q, window, "
                     "route_every, sink, local, bits (2, 4 or auto), route (chunk|end|staged), "
                     "prefill_window or pool (e.g. "
                     "qevict:score=age, qevict:q=0, qevict:route=end); variants that keep the "
                     "whole prompt until it ends (full, route=end) share one prefill");
  app.add_option("--budgets", a->budgets,
                 "comma-separated budgets, fractions of the full cache (FullKV runs once)");
  app.add_option("--out", a->out_dir, "output directory (results.jsonl, summary.csv/.md)")
      ->required();
  app.add_option("--seed", a->seed, "base seed of the samples")->capture_default_str();
  app.add_option("-b,--prefill-chunk", a->prefill_chunk, "prompt tokens per forward call")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--haystack", a->haystack,
                 "the essay haystack of niah: jargon (the Jargon File, Debian's jargon-text), "
                 "essay (RULER's own: Paul Graham's essays from --ruler-data) or a path to any "
                 "text (plain or .gz). Recorded on every result; a DIR holds one haystack's")
      ->capture_default_str();
  app.add_option("--haystack-start", a->haystack_start,
                 "jargon or a path: the prose starts at the first occurrence of this text "
                 "(empty: at the start)")
      ->capture_default_str();
  app.add_option("--ruler-data", a->ruler_data,
                 "RULER's data directory (squad.json, hotpotqa.json, PaulGrahamEssays.json), as "
                 "tools/fetch_ruler_data.sh prints it; default $QEVICT_CACHE/ruler-data or "
                 "~/.cache/qevict/ruler-data. qa_1/qa_2 are skipped when their file is missing");
  app.add_option("--dataset", a->datasets,
                 "a RULER-format JSONL file of prompts (input, outputs, optional answer_prefix, "
                 "length, index, tokens_to_generate, task) run through every variant; "
                 "repeatable. Replaces the profile's tasks unless --tasks is given; --samples N "
                 "keeps a task's first N prompts");
  app.add_option("--dataset-metric", a->dataset_metric,
                 "--dataset's metric: all (string_match_all, RULER's synthetic tasks) or part "
                 "(string_match_part, RULER's qa)")
      ->capture_default_str()
      ->check(CLI::IsMember({"all", "part"}));
  app.add_option("--dataset-tokens", a->dataset_tokens,
                 "tokens to generate for --dataset lines without tokens_to_generate")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--dataset-length", a->dataset_length,
                 "the length recorded for --dataset cells (default: the lines' largest length "
                 "rounded up to a multiple of 1024)")
      ->check(CLI::PositiveNumber);
  app.add_option("--code-dir", a->code_dir,
                 "Python sources for lcc (searched recursively, test directories left out)")
      ->capture_default_str();
  app.add_option("--words", a->words, "word list, one per line (keys, CWE's words)")
      ->capture_default_str();
  app.add_flag("--summary-only", a->summary_only,
               "only rewrite summary.csv/.md from --out's results.jsonl");
  app.add_option("--protocol", a->protocols,
                 "where the question stands, a comma list of: end (RULER's prompt, the question "
                 "last), after (the text one turn, ended and compressed; the question a second "
                 "turn), first (the question before the text, a neutral closing request), multi "
                 "(the text, then each of 4 keys asked alone, one per turn; niah_multikey_1 and "
                 "niah_multiquery); results of protocols other than end carry it in their cell "
                 "key")
      ->capture_default_str();
  app.add_flag("--prompts-only", a->prompts_only,
               "only build the prompts into --out's prompts.jsonl (no generation, no results)");
  add_kv_options(app, a->kv, KvFlagScope::kGrid);
  return [a] { return run_eval_cmd(*a); };
}

}  // namespace qevict::cli
