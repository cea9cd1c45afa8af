// Evaluation protocols (see eval_protocol.h).
#include "eval/eval_protocol.h"

#include <fmt/format.h>

#include <algorithm>
#include <set>
#include <sstream>

#include "eval/eval_runner.h"
#include "eval/ruler_qa.h"
#include "kvcache/report.h"

namespace qevict::eval {

const char* protocol_name(EvalProtocol p) {
  switch (p) {
    case EvalProtocol::kEnd:
      return "end";
    case EvalProtocol::kAfter:
      return "after";
    case EvalProtocol::kFirst:
      return "first";
  }
  return "?";
}

Expected<std::vector<EvalProtocol>> parse_protocols(const std::string& list) {
  std::vector<EvalProtocol> out;
  std::set<std::string> seen;
  std::stringstream ss(list);
  for (std::string name; std::getline(ss, name, ',');) {
    EvalProtocol p;
    if (name == "end")
      p = EvalProtocol::kEnd;
    else if (name == "after")
      p = EvalProtocol::kAfter;
    else if (name == "first")
      p = EvalProtocol::kFirst;
    else if (name == "multi")
      return Status::error("protocol 'multi' is not built yet (issue 51): use end, after, first");
    else
      return Status::error(fmt::format("unknown protocol '{}' (known: end, after, first)", name));
    if (!seen.insert(name).second)
      return Status::error(fmt::format("protocol '{}' is listed twice", name));
    out.push_back(p);
  }
  if (out.empty()) return Status::error("no protocol given");
  return out;
}

bool protocol_applies(EvalProtocol p, const std::string& task) {
  if (p == EvalProtocol::kEnd) return true;
  if (!is_ruler_task(task)) return false;  // lcc, doc_qa, doc_sum, --dataset tasks
  if (task == "cwe" || task == "fwe") return p == EvalProtocol::kAfter;
  return true;
}

int64_t ProtocolPrompt::n_tokens() const {
  int64_t n = 0;
  for (const auto& t : turns) n += int64_t(t.size());
  return n;
}

Expected<ProtocolPrompt> protocol_prompt(const PromptFormatter& f, const RulerSample& s,
                                         EvalProtocol p) {
  ProtocolPrompt out;
  if (p == EvalProtocol::kEnd) {
    auto ids = f.encode(s.input, s.answer_prefix, s.raw);
    if (!ids) return ids.status();
    auto text = f.render(s.input, s.answer_prefix, s.raw);
    if (!text) return text.status();
    out.turns.push_back(std::move(*ids));
    out.texts.push_back(std::move(*text));
    return out;
  }
  if (s.question_at < 0)
    return Status::error(fmt::format("{}: the prompt has no separable question for protocol '{}'",
                                     s.task, protocol_name(p)));
  const std::string context = sample_context(s), question = sample_question(s);
  std::vector<std::string> users;
  std::string prefix = s.answer_prefix;
  if (p == EvalProtocol::kFirst) {
    users = {question + "\n\n" + context + "\n\n" + kFirstClosing};
    prefix = kFirstPrefix;
  } else {
    users = {context, question};
  }
  auto texts = f.render_turns(users, prefix, s.raw);
  if (!texts) return texts.status();
  out.texts = std::move(*texts);
  for (size_t i = 0; i < out.texts.size(); ++i) {
    auto ids = f.encode_text(out.texts[i], /*first=*/i == 0, s.raw);
    if (!ids) return ids.status();
    out.turns.push_back(std::move(*ids));
  }
  return out;
}

std::vector<int64_t> needle_positions(const Tokenizer& tok, const std::vector<int32_t>& ids,
                                      const RulerSample& s) {
  std::vector<int64_t> out;
  if (s.task.rfind("niah_", 0) != 0) return out;
  // The turn's text as its tokens spell it, and where each token starts in it.
  std::string text;
  std::vector<size_t> start(ids.size() + 1);
  for (size_t i = 0; i < ids.size(); ++i) {
    start[i] = text.size();
    text += tok.token_to_piece(ids[i], true);
  }
  start[ids.size()] = text.size();
  for (const std::string& value : s.expected) {
    // "One of the special magic {type} for {key} is: {value}." (ruler_tasks.cpp kNeedle).
    const std::string tail = " is: " + value + ".";
    const size_t e = text.find(tail);
    if (e == std::string::npos) continue;
    const size_t b = text.rfind("One of the special magic", e);
    const size_t lo = b == std::string::npos ? e : b, hi = e + tail.size();
    for (size_t i = 0; i < ids.size(); ++i)
      if (start[i + 1] > lo && start[i] < hi) out.push_back(int64_t(i));
  }
  return out;
}

TurnSnapshot turn_snapshot(const SequenceKvCache& c, const std::vector<int64_t>& needle_pos) {
  KvReport r;
  c.report(&r, needle_pos.empty() ? ReportDetail::kSummary : ReportDetail::kTiers);
  TurnSnapshot t;
  t.n_past = c.n_past();
  t.routing_events = r.routing_events;
  const KvLayerReport tot = r.total();
  t.promotions = tot.promotions;
  t.demotions = tot.demotions;
  t.evictions = tot.evictions;
  t.bytes_held = c.bytes_held();
  for (const auto& unit : r.position_tiers)
    for (int64_t p : needle_pos)
      if (p < int64_t(unit.size())) ++t.needle_tiers[int(unit[size_t(p)])];
  return t;
}

namespace {

nlohmann::json snapshot_json(const TurnSnapshot& t) {
  return {{"n_past", t.n_past},
          {"routing_events", t.routing_events},
          {"promotions", t.promotions},
          {"demotions", t.demotions},
          {"evictions", t.evictions},
          {"bytes_held", t.bytes_held},
          {"needle_tiers",
           {{"L", t.needle_tiers[0]},
            {"F", t.needle_tiers[1]},
            {"Q", t.needle_tiers[2]},
            {"E", t.needle_tiers[3]}}}};
}

}  // namespace

nlohmann::json turn_diagnostics_json(const TurnDiagnostics& d) {
  return {{"before", snapshot_json(d.before)},
          {"after", snapshot_json(d.after)},
          {"promotions", d.after.promotions - d.before.promotions}};
}

void add_turn_stats(const GenerationStats& add, GenerationStats* st) {
  st->n_prompt += add.n_prompt;
  st->n_prompt_shared += add.n_prompt_shared;
  st->n_decode_calls += add.n_decode_calls;
  st->n_generated += add.n_generated;
  st->prompt_seconds += add.prompt_seconds;
  st->prompt_model_seconds += add.prompt_model_seconds;
  st->prompt_replay_seconds += add.prompt_replay_seconds;
  st->prompt_end_seconds += add.prompt_end_seconds;
  st->decode_seconds += add.decode_seconds;
  st->peak_prompt_bytes = std::max(st->peak_prompt_bytes, add.peak_prompt_bytes);
}

}  // namespace qevict::eval
