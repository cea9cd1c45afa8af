// The task-suite runner (see eval_runner.h).
#include "eval/eval_runner.h"

#include <fmt/format.h>
#include <zlib.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <sstream>

#include "core/atomic_file.h"
#include "engine/generator.h"
#include "eval/eval_summary.h"
#include "eval/longdoc_tasks.h"
#include "eval/ruler_dataset.h"
#include "eval/ruler_resources.h"
#include "kvcache/factory.h"
#include "kvcache/options.h"
#include "kvcache/registry.h"

namespace qevict::eval {

using json = nlohmann::json;

Status EvalOptions::validate() const {
  if (tasks.empty() && datasets.empty()) return Status::error("no tasks given");
  bool agreement = false;
  for (const auto& t : tasks) {
    if (!is_ruler_task(t) && !is_longdoc_task(t))
      return Status::error(fmt::format("unknown task '{}'", t));
    agreement |= t == "doc_qa" || t == "doc_sum";
  }
  for (const auto& d : datasets)
    for (const auto& s : d.samples)
      if (std::find(tasks.begin(), tasks.end(), s.task) != tasks.end())
        return Status::error(fmt::format(
            "{}: its task '{}' is also a built-in task of this run: run it into another --out",
            d.path, s.task));
  if (agreement && std::find(variants.begin(), variants.end(), "full") == variants.end())
    return Status::error(
        "doc_qa and doc_sum score agreement with FullKV's answer: add the variant 'full'");
  if (lengths.empty() && !tasks.empty()) return Status::error("no lengths given");
  for (int64_t l : lengths)
    if (l < 256) return Status::error(fmt::format("length {} is too short (at least 256)", l));
  if (n_samples <= 0) return Status::error("the number of samples must be positive");
  if (variants.empty()) return Status::error("no variants given");
  if (protocols.empty()) return Status::error("no protocol given");
  for (double b : budgets)
    if (!(b > 0.0)) return Status::error(fmt::format("budget {} must be positive", b));
  if (prefill_chunk <= 0) return Status::error("prefill chunk must be positive");
  if (out_dir.empty()) return Status::error("no output directory given");
  return Status::ok();
}

namespace {

// Applies "key=value" of a variant spec to p and marks it as given: the shared KV option
// parser (kvcache/options.h), less the options the grid sets itself.
Status apply_option(const std::string& kv, KvCacheParams* p, KvParamsGiven* g) {
  const size_t eq = kv.find('=');
  if (eq == std::string::npos) return Status::error(fmt::format("'{}' is not key=value", kv));
  const std::string k = kv.substr(0, eq), v = kv.substr(eq + 1);
  if (k == "policy" || k == "budget" || k == "budget_bytes" || k == "trace")
    return Status::error(
        fmt::format("'{}' is the grid's to set (the variant's name is its policy; --budgets)", k));
  return set_kv_option(p, g, k, v);
}

std::string budget_str(double b) { return fmt::format("{:g}", b); }

const char* metric_name(RulerMetric m) {
  switch (m) {
    case RulerMetric::kMatchAll:
      return "string_match_all";
    case RulerMetric::kMatchPart:
      return "string_match_part";
    case RulerMetric::kEditSim:
      return "edit_similarity";
    case RulerMetric::kAgreeFull:
      return "rouge_l_vs_fullkv";
  }
  return "?";
}

}  // namespace

Expected<std::vector<EvalVariant>> expand_variants(const EvalOptions& o) {
  std::vector<EvalVariant> out;
  std::set<std::string> seen;
  for (const auto& spec : o.variants) {
    std::vector<std::string> parts;
    std::stringstream ss(spec);
    for (std::string part; std::getline(ss, part, ':');) parts.push_back(part);
    if (parts.empty() || parts[0].empty())
      return Status::error(fmt::format("empty variant in '{}'", spec));
    const PolicyInfo* row = find_policy(parts[0]);
    if (!row)
      return Status::error(fmt::format("variant '{}': unknown policy '{}' (known: {})", spec,
                                       parts[0], policy_names(", ")));
    KvCacheParams p = o.base;
    KvParamsGiven g = o.given;
    p.policy = parts[0];
    p.budget_bytes = 0;
    p.trace_path.clear();
    for (size_t i = 1; i < parts.size(); ++i) {
      Status s = apply_option(parts[i], &p, &g);
      if (!s) return Status::error(fmt::format("variant '{}': {}", spec, s.message()));
    }
    Status s = apply_policy_defaults(&p, g);
    if (!s) return Status::error(fmt::format("variant '{}': {}", spec, s.message()));
    const bool budgeted = row->kind != CacheKind::kFull && row->kind != CacheKind::kQuantized;
    for (double b : budgeted ? o.budgets : std::vector<double>{0.0}) {
      EvalVariant v{spec, b, p};
      v.params.budget_fraction = b;
      s = v.params.validate();
      if (!s) return Status::error(fmt::format("variant '{}': {}", spec, s.message()));
      if (!seen.insert(spec + "@" + budget_str(b)).second)
        return Status::error(fmt::format("variant '{}' is listed twice", spec));
      out.push_back(std::move(v));
    }
  }
  return out;
}

std::string eval_cell_key(const std::string& task, int64_t length, const std::string& variant,
                          double budget, int sample, const std::string& protocol) {
  const std::string key =
      fmt::format("{}|{}|{}|{}|{}", task, length, variant, budget_str(budget), sample);
  return protocol == "end" ? key : key + "|" + protocol;
}

Expected<PromptFormatter> PromptFormatter::from_model(const Model& model, const Tokenizer& tok) {
  const std::string src = model.gguf().get_string_or("tokenizer.chat_template", "");
  if (src.empty()) return PromptFormatter(&tok, nullptr);
  auto ct = ChatTemplate::parse(src);
  if (!ct) return Status::error("chat template: " + ct.error());
  return PromptFormatter(&tok, std::make_shared<const ChatTemplate>(std::move(*ct)));
}

Expected<std::string> PromptFormatter::render(const std::string& input,
                                              const std::string& answer_prefix, bool raw) const {
  if (raw) return input + answer_prefix;
  const std::vector<ChatMessage> msgs{{"user", input}};
  if (!tmpl_) return render_chatml(msgs, true) + answer_prefix;
  auto r = tmpl_->render(msgs, true, tok_->token_to_piece(tok_->bos(), true),
                         tok_->token_to_piece(tok_->eos(), true));
  if (!r) return Status::error("chat template: " + r.error());
  return *r + answer_prefix;
}

Expected<std::vector<int32_t>> PromptFormatter::encode(const std::string& input,
                                                       const std::string& answer_prefix,
                                                       bool raw) const {
  auto text = render(input, answer_prefix, raw);
  if (!text) return text.status();
  // A raw prompt is the task's text only: special-token spellings in it stay text.
  return tok_->encode(*text, /*add_special=*/true, /*parse_special=*/!raw);
}

Expected<std::string> PromptFormatter::render_messages(const std::vector<ChatMessage>& msgs,
                                                       bool add_generation_prompt) const {
  if (!tmpl_) return render_chatml(msgs, add_generation_prompt);
  auto r = tmpl_->render(msgs, add_generation_prompt, tok_->token_to_piece(tok_->bos(), true),
                         tok_->token_to_piece(tok_->eos(), true));
  if (!r) return Status::error("chat template: " + r.error());
  return *r;
}

Expected<std::vector<std::string>> PromptFormatter::render_turns(
    const std::vector<std::string>& users, const std::string& answer_prefix, bool raw) const {
  std::vector<std::string> out;
  std::string before;  // the rendering of the turns so far
  std::vector<ChatMessage> msgs;
  for (size_t i = 0; i < users.size(); ++i) {
    const bool last = i + 1 == users.size();
    std::string text;
    if (raw) {
      text = (i ? before + "\n" : before) + users[i];
    } else {
      msgs.push_back({"user", users[i]});
      auto r = render_messages(msgs, last);
      if (!r) return r.status();
      text = std::move(*r);
    }
    if (last) text += answer_prefix;
    if (text.compare(0, before.size(), before) != 0)
      return Status::error(fmt::format(
          "chat template: the rendering of {} user turn(s) does not start with that of {}", i + 1,
          i));
    out.push_back(text.substr(before.size()));
    before = std::move(text);
  }
  return out;
}

Expected<std::vector<int32_t>> PromptFormatter::encode_text(const std::string& text, bool first,
                                                            bool raw) const {
  return tok_->encode(text, /*add_special=*/first, /*parse_special=*/!raw);
}

namespace {

// dst = gzip(src), written to a temporary file and renamed, so a killed run leaves the
// previous copy. Once per sample: a 4K grid's results.jsonl (2.2 MB) takes ~0.1 s.
Status gzip_copy(const std::string& src, const std::string& dst) {
  auto text = read_text_file(src);
  if (!text) return text.status();
  const std::string tmp = dst + ".tmp";
  gzFile f = gzopen(tmp.c_str(), "wb9");
  if (!f) return Status::error(fmt::format("{}: cannot open for writing", tmp));
  const bool ok = text->empty() || gzwrite(f, text->data(), unsigned(text->size())) > 0;
  if (gzclose(f) != Z_OK || !ok) {
    std::filesystem::remove(tmp);
    return Status::error(fmt::format("{}: write failed", tmp));
  }
  std::error_code ec;
  std::filesystem::rename(tmp, dst, ec);
  if (ec) return Status::error(fmt::format("{}: cannot rename: {}", dst, ec.message()));
  return Status::ok();
}

}  // namespace

Status run_eval(Model& model, const Tokenizer& tok, ThreadPool& pool, const RulerResources& res,
                const EvalOptions& opts, const std::function<void(const EvalProgress&)>& progress) {
  QEVICT_RETURN_IF_ERROR(opts.validate());
  auto variants = expand_variants(opts);
  if (!variants) return variants.status();
  auto fmt_or = PromptFormatter::from_model(model, tok);
  if (!fmt_or) return fmt_or.status();
  const PromptFormatter& formatter = *fmt_or;

  std::error_code ec;
  std::filesystem::create_directories(opts.out_dir, ec);
  if (ec) return Status::error(fmt::format("{}: cannot create: {}", opts.out_dir, ec.message()));
  const std::string path = opts.out_dir + "/results.jsonl";
  // results.jsonl.gz is the copy to commit (a grid's cells outgrow the 2 MiB limit for
  // tracked files; the plain file is ignored by git): a fresh clone has only it, and the
  // run resumes from it.
  const std::string gz_path = path + ".gz";
  if (!opts.prompts_only && !std::filesystem::exists(path) && std::filesystem::exists(gz_path)) {
    auto text = read_text_file(gz_path);  // gunzips
    if (!text) return text.status();
    QEVICT_RETURN_IF_ERROR(write_file_atomic(path, *text));
  }
  const std::set<std::string> builtin_tasks(opts.tasks.begin(), opts.tasks.end());
  std::set<std::string> file_tasks;
  for (const auto& d : opts.datasets)
    for (const auto& s : d.samples) file_tasks.insert(s.task);
  int64_t n_bad = 0;
  auto old = read_eval_results(path, &n_bad);
  if (!old) return old.status();
  std::set<std::string> done;
  // FullKV's outputs, which the agreement tasks score against: "task|length|sample" -> output.
  std::map<std::string, std::string> full_output;
  auto sample_key = [](const std::string& task, int64_t length, int sample) {
    return fmt::format("{}|{}|{}", task, length, sample);
  };
  for (const auto& j : *old) {
    if (j.value("variant", "") == "full" && j.value("protocol", "end") == "end")
      full_output[sample_key(j.value("task", ""), j.value("length", int64_t(0)),
                             j.value("sample", 0))] = j.value("output", "");
    const std::string m = j.value("model", "");
    if (!opts.model_name.empty() && m != opts.model_name)
      return Status::error(
          fmt::format("{} holds results of model '{}', not '{}': give another --out", path, m,
                      opts.model_name));
    const std::string h = j.value("haystack", "jargon");
    if (h != opts.haystack)
      return Status::error(
          fmt::format("{} holds results with the haystack '{}', not '{}': give another --out", path,
                      h, opts.haystack));
    // A task of a --dataset file and a built-in task of the same name never share cells.
    const std::string task = j.value("task", "");
    const bool from_file = j.contains("dataset");
    if (from_file ? builtin_tasks.count(task) > 0 : file_tasks.count(task) > 0)
      return Status::error(fmt::format(
          "{} holds {} results of task '{}', which this run takes from {}: give another --out",
          path, from_file ? "--dataset" : "built-in", task,
          from_file ? "the generator" : "a --dataset file"));
    done.insert(eval_cell_key(task, j.value("length", int64_t(0)), j.value("variant", ""),
                              j.value("budget", 0.0), j.value("sample", 0),
                              result_protocol_label(j)));
  }
  if (opts.prompts_only) done.clear();  // prompts of every cell, run or not
  // A run killed while writing leaves a partial last line: start the next on a fresh line.
  bool needs_newline = false;
  {
    std::ifstream in(path, std::ios::binary | std::ios::ate);
    if (in && in.tellg() > 0) {
      in.seekg(-1, std::ios::end);
      needs_newline = in.get() != '\n';
    }
  }
  // results.jsonl is appended a line at a time (resumable); --prompts-only writes prompts.jsonl
  // whole at the end through an AtomicFile, so a killed run leaves the previous file or none.
  std::ofstream out;
  std::string prompts;
  if (!opts.prompts_only) {
    out.open(path, std::ios::app);
    if (!out) return Status::error(fmt::format("{}: cannot open for writing", path));
    if (needs_newline) out << "\n";
  }

  const PromptTokenCounter count = [&](const RulerSample& s) -> Expected<int64_t> {
    auto ids = formatter.encode(s.input, s.answer_prefix, s.raw);
    if (!ids) return ids.status();
    return int64_t(ids->size());
  };
  // The grid's samples: every (length, task, sample) of the generator, then the files' prompts
  // (given: the prompt itself).
  struct Work {
    std::string task;
    int64_t length;
    int sample;
    const RulerSample* given = nullptr;
    const std::string* dataset = nullptr;  // the file's path
  };
  std::vector<Work> work;
  for (int64_t l : opts.lengths)
    for (const auto& t : opts.tasks)
      for (int s = 0; s < opts.n_samples; ++s) work.push_back({t, l, s});
  std::vector<EvalDataset> datasets = opts.datasets;
  for (auto& d : datasets) {
    // A task whose lines give no length: its prompts' longest (tokens + generated), rounded.
    std::map<std::string, int64_t> longest;
    for (const auto& s : d.samples) {
      if (s.length > 0) continue;
      auto t = count(s);
      if (!t) return Status::error(fmt::format("{}: {}", d.path, t.error()));
      longest[s.task] = std::max(longest[s.task], *t + s.max_new_tokens);
    }
    for (auto& s : d.samples)
      if (s.length == 0) s.length = round_up_length(longest[s.task]);
    for (const auto& s : d.samples) work.push_back({s.task, s.length, s.sample, &s, &d.path});
  }

  // The protocols each sample runs under (eval_protocol.h): `end` for every task, the others
  // for the tasks with a separable question.
  auto protocols_of = [&](const Work& w) {
    std::vector<EvalProtocol> ps;
    for (EvalProtocol p : opts.protocols)
      if (p == EvalProtocol::kEnd || (!w.given && protocol_applies(p, w.task))) ps.push_back(p);
    return ps;
  };
  EvalProgress pr;
  for (const Work& w : work)
    for (EvalProtocol p : protocols_of(w))
      for (const auto& v : *variants)
        for (int a = 0; a < protocol_answers(p); ++a) {
          ++pr.total;
          const std::string key =
              eval_cell_key(w.task, w.length, v.spec, v.budget, w.sample, protocol_label(p, a));
          pr.skipped += done.count(key) ? 1 : 0;
        }
  pr.done = pr.skipped;
  using clock = std::chrono::steady_clock;
  const auto t0 = clock::now();
  if (progress) progress(pr);

  std::vector<int32_t> stop_tokens;
  for (int32_t id = 0; id < tok.n_vocab(); ++id)
    if (tok.is_eog(id)) stop_tokens.push_back(id);

  for (const Work& w : work) {
    const std::string& task = w.task;
    const int64_t length = w.length;
    const int si = w.sample;
    std::optional<RulerSample> built;  // the sample, built once for all its protocols
    for (EvalProtocol proto : protocols_of(w)) {
      const std::string pname = protocol_name(proto);
      const bool end = proto == EvalProtocol::kEnd;
      const int n_answers = protocol_answers(proto);
      auto cell_done = [&](const EvalVariant& v, int answer) {
        return done.count(eval_cell_key(task, length, v.spec, v.budget, si,
                                        protocol_label(proto, answer))) > 0;
      };
      std::vector<const EvalVariant*> pending;
      for (const auto& v : *variants)
        for (int a = 0; a < n_answers; ++a)
          if (!cell_done(v, a)) {
            pending.push_back(&v);
            break;
          }
      if (pending.empty()) continue;
      if (!built) {
        auto made = w.given ? Expected<RulerSample>(*w.given)
                            : make_ruler_sample(task, length, si, opts.seed, res, count);
        if (!made) return made.status();
        built = std::move(*made);
      }
      RulerSample* sample = &*built;
      // doc_qa's reference (longdoc_tasks.h): the headword's own entry; none for prompts of a
      // --dataset file and excerpts without a headword.
      const std::optional<DocQaReference> ref = w.given ? std::nullopt : doc_qa_reference(*sample);
      auto pp = protocol_prompt(formatter, *sample, proto);
      if (!pp) return pp.status();
      const int64_t n_prompt = pp->n_tokens();
      auto turn_tokens = [&] {
        json t = json::array();
        for (const auto& turn : pp->turns) t.push_back(turn.size());
        return t;
      };
      if (opts.prompts_only) {
        json j{{"task", task},
               {"length", length},
               {"sample", si},
               {"seed", sample->seed},
               {"prompt_tokens", n_prompt},
               {"haystack_units", sample->haystack_units},
               {"max_new_tokens", sample->max_new_tokens},
               {"expected", sample->expected},
               {"metric", metric_name(sample->metric)},
               {"source", sample->source},
               {"haystack", opts.haystack},
               {"chat_template", !sample->raw},
               {"input", sample->input},
               {"answer_prefix", sample->answer_prefix},
               {"prompt", pp->texts.back()}};
        if (ref) {
          j["reference"] = ref->sentences;
          j["reference_keywords"] = ref->keywords;
          j["reference_entry"] = ref->entry;
        }
        if (!end) {
          j["protocol"] = pname;
          j["turns"] = pp->texts;  // each turn's text; "prompt" is the last
          j["turn_tokens"] = turn_tokens();
          if (!pp->expected.empty()) j["turn_expected"] = pp->expected;
        }
        prompts += j.dump(-1, ' ', false, json::error_handler_t::replace);
        prompts += '\n';
        pr.run_done += int64_t(pending.size()) * n_answers;
        pr.done += int64_t(pending.size()) * n_answers;
        pr.elapsed = std::chrono::duration<double>(clock::now() - t0).count();
        pr.eta = pr.elapsed / double(pr.run_done) * double(pr.total - pr.done);
        pr.last = fmt::format("{} {} #{}{}: prompt of {} tokens", task, length, si,
                              end ? "" : " " + pname, n_prompt);
        if (progress) progress(pr);
        continue;
      }
      // Room for every turn and every answer (multi: one per question, and a carried token).
      const int64_t n_ctx = n_prompt + int64_t(pp->answered.size()) * (sample->max_new_tokens + 1) -
                            (pp->answered.size() == 1 ? 1 : 0);
      std::vector<std::unique_ptr<SequenceKvCache>> caches;
      std::vector<GenerationRequest> reqs;
      for (const EvalVariant* v : pending) {
        auto c = make_kv_cache(model.kv_shape(), n_ctx, v->params);
        if (!c)
          return Status::error(
              fmt::format("{} at {}: {}", v->spec, budget_str(v->budget), c.error()));
        caches.push_back(std::move(*c));
        GenerationRequest r;
        r.cache = caches.back().get();
        r.prompt = pp->turns[0];
        r.sampling.temperature = 0.0f;  // greedy, as RULER
        r.stop_tokens = stop_tokens;
        reqs.push_back(std::move(r));
      }
      // One prefill per sample: every cache that keeps the whole prompt until end_prompt()
      // (FullKV, --prefill-route end) replays the first such cache's prefill instead of
      // running the model again (engine/prefill_share.h). Later turns are each cache's own.
      int source = -1;
      for (size_t i = 0; i < reqs.size(); ++i) {
        if (!caches[i]->prefill_keeps_everything()) continue;
        if (source < 0)
          source = int(i);
        else
          reqs[i].share_prefill_of = source;
      }
      std::vector<bool> shared(reqs.size());
      for (size_t i = 0; i < reqs.size(); ++i) shared[i] = reqs[i].share_prefill_of >= 0;
      GenerateOptions go;
      go.prefill_chunk = opts.prefill_chunk;
      GenerationStats st;
      std::vector<std::vector<TurnAnswer>> answers;
      QEVICT_RETURN_IF_ERROR(run_protocol_turns(model, pool, tok, *pp, *sample,
                                                sample->max_new_tokens, reqs, go, &st, &answers));

      std::string last = fmt::format("{} {} #{}{}:", task, length, si, end ? "" : " " + pname);
      // texts[a][i]: answered turn a of request i.
      std::vector<std::vector<std::string>> texts(answers.size());
      for (size_t a = 0; a < answers.size(); ++a)
        for (size_t i = 0; i < reqs.size(); ++i) {
          std::vector<int32_t> ids = answers[a][i].output;
          if (answers[a][i].hit_stop && !ids.empty()) ids.pop_back();
          texts[a].push_back(tok.decode(ids));
          if (end && pending[i]->spec == "full")
            full_output[sample_key(task, length, si)] = texts[a].back();
        }
      if (sample->metric == RulerMetric::kAgreeFull) {
        const auto it = full_output.find(sample_key(task, length, si));
        if (it == full_output.end())
          return Status::error(
              fmt::format("{} {} #{}: no FullKV output to score against", task, length, si));
        sample->expected = {it->second};
      }
      int64_t n_lines = 0;
      for (size_t a = 0; a < answers.size(); ++a) {
        const std::vector<std::string>& expected =
            a < pp->expected.size() ? pp->expected[a] : sample->expected;
        for (size_t i = 0; i < reqs.size(); ++i) {
          const EvalVariant& v = *pending[i];
          if (cell_done(v, int(a))) continue;  // multi: this turn's line is in the file
          const TurnAnswer& ans = answers[a][i];
          const std::string& text = texts[a][i];
          const double score = score_ruler(sample->metric, text, expected);
          json j;
          j["task"] = task;
          j["length"] = length;
          j["variant"] = v.spec;
          j["budget"] = v.budget;
          j["sample"] = si;
          j["seed"] = sample->seed;
          j["model"] = opts.model_name;
          j["haystack"] = opts.haystack;
          if (w.dataset) j["dataset"] = *w.dataset;
          j["prompt_tokens"] = n_prompt;
          j["haystack_units"] = sample->haystack_units;
          j["max_new_tokens"] = sample->max_new_tokens;
          j["n_generated"] = ans.output.size();
          j["hit_stop"] = ans.hit_stop;
          j["output"] = text;
          j["expected"] = expected;  // doc_qa, doc_sum: FullKV's output
          j["score"] = score;
          j["metric"] = metric_name(sample->metric);
          const double score_ref = ref ? reference_recall(text, *ref) : 0.0;
          if (ref) {  // beside the agreement: the answer against the entry (keyword recall)
            j["score_ref"] = score_ref;
            j["reference"] = ref->sentences;
            j["reference_keywords"] = ref->keywords;
          }
          if (sample->metric == RulerMetric::kEditSim)
            j["exact_match"] = code_line_exact(text, expected.at(0));
          if (!sample->source.empty()) j["source"] = sample->source;
          // Times are the batch's: all pending variants of this sample ran together.
          j["batch"] = reqs.size();
          j["prefill_seconds"] = st.prompt_seconds;
          j["prefill_parts"] = {{"model", st.prompt_model_seconds},
                                {"replay", st.prompt_replay_seconds},
                                {"end_prompt", st.prompt_end_seconds}};
          j["prefill_shared"] = bool(shared[i]);    // replayed, not recomputed
          j["prefill_model_tokens"] = st.n_prompt;  // the batch's, by the model
          j["decode_seconds"] = st.decode_seconds;
          j["bytes_held"] = caches[i]->bytes_held();
          j["kv"] = caches[i]->describe();
          {  // where the prompt's observation window looked, and --kv-adapt's choice
            KvReport rep;
            caches[i]->report(&rep, ReportDetail::kSummary);
            if (!rep.prompt_focus.empty()) {
              json f = json::array();
              for (const PromptFocus& x : rep.prompt_focus)
                f.push_back({std::round(x.history * 1e4) / 1e4, std::round(x.top1 * 1e4) / 1e4,
                             std::round(x.top4 * 1e4) / 1e4, std::round(x.top16 * 1e4) / 1e4,
                             std::round(x.far4 * 1e4) / 1e4, std::round(x.kl * 1e4) / 1e4});
              j["prompt_focus"] = f;  // [layer][history, top1, top4, top16, far4, kl]
              j["focus"] = focus_score(rep.prompt_focus);
            }
            if (!rep.adapted.empty()) j["adapted"] = rep.adapted;
          }
          if (!end) {
            j["protocol"] = pname;
            j["turn_tokens"] = turn_tokens();
            if (answers.size() > 1) j["turn"] = a + 1;  // multi: the question's index
            if (pp->turns.size() > 1) j["diagnostics"] = turn_diagnostics_json(ans.diag);
          }
          out << j.dump(-1, ' ', false, json::error_handler_t::replace) << "\n";
          const std::string label = protocol_label(proto, int(a));
          done.insert(eval_cell_key(task, length, v.spec, v.budget, si, label));
          ++n_lines;
          last += fmt::format(" {}", v.spec);
          if (v.budget > 0) last += fmt::format("@{}", budget_str(v.budget));
          if (answers.size() > 1) last += fmt::format("/t{}", a + 1);
          last += fmt::format("={:.2f}", score);
          if (ref) last += fmt::format("/ref {:.2f}", score_ref);
        }
      }
      out.flush();
      if (!out) return Status::error(fmt::format("{}: write failed", path));
      QEVICT_RETURN_IF_ERROR(gzip_copy(path, gz_path));
      pr.run_done += n_lines;
      pr.done += n_lines;
      pr.elapsed = std::chrono::duration<double>(clock::now() - t0).count();
      pr.eta = pr.elapsed / double(pr.run_done) * double(pr.total - pr.done);
      pr.last = last;
      if (progress) progress(pr);
    }
  }
  if (opts.prompts_only) return write_file_atomic(opts.out_dir + "/prompts.jsonl", prompts);
  return Status::ok();
}

}  // namespace qevict::eval
