// Evaluation protocols (see eval_protocol.h).
#include "eval/eval_protocol.h"

#include <fmt/format.h>

#include <algorithm>
#include <memory>
#include <set>
#include <sstream>

#include "eval/eval_runner.h"
#include "eval/ruler_qa.h"
#include "kvcache/full_cache.h"
#include "kvcache/report.h"
#include "kvcache/tiered_cache.h"

namespace qevict::eval {

const char* protocol_name(EvalProtocol p) {
  switch (p) {
    case EvalProtocol::kEnd:
      return "end";
    case EvalProtocol::kAfter:
      return "after";
    case EvalProtocol::kFirst:
      return "first";
    case EvalProtocol::kMulti:
      return "multi";
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
      p = EvalProtocol::kMulti;
    else
      return Status::error(
          fmt::format("unknown protocol '{}' (known: end, after, first, multi)", name));
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
  if (p == EvalProtocol::kMulti) return task == "niah_multikey_1" || task == "niah_multiquery";
  if (task == "cwe" || task == "fwe") return p == EvalProtocol::kAfter;
  return true;
}

int protocol_answers(EvalProtocol p) { return p == EvalProtocol::kMulti ? kMultiQuestions : 1; }

std::string protocol_label(EvalProtocol p, int answer) {
  if (p == EvalProtocol::kMulti) return fmt::format("multi.t{}", answer + 1);
  return protocol_name(p);
}

bool ProtocolPrompt::is_answered(size_t turn) const {
  return std::find(answered.begin(), answered.end(), turn) != answered.end();
}

int64_t ProtocolPrompt::n_tokens() const {
  int64_t n = 0;
  for (const auto& t : turns) n += int64_t(t.size());
  return n;
}

namespace {

// multi: the text, then question 1 (with its prefix) as after's two turns; question k > 1 is
// what the template adds after an assistant turn holding answer k - 1 (its end of turn, the
// next user turn, the generation prompt) and the question's prefix. That text is read from a
// rendering with a placeholder answer: it does not depend on the answer in the templates
// whose assistant turn is its content between fixed markers (ChatML, Llama 3, ...).
Expected<ProtocolPrompt> multi_prompt(const PromptFormatter& f, const RulerSample& s) {
  if (s.raw || int(s.questions.size()) < kMultiQuestions || s.question_at < 0)
    return Status::error(fmt::format("{}: protocol 'multi' needs a chat prompt with {} keys to ask",
                                     s.task, kMultiQuestions));
  ProtocolPrompt out;
  const std::string context = sample_context(s);
  const auto& qs = s.questions;
  auto texts = f.render_turns({context, qs[0].question}, qs[0].answer_prefix);
  if (!texts) return texts.status();
  out.texts = std::move(*texts);
  std::vector<ChatMessage> msgs{{"user", context}};
  for (int k = 1; k < kMultiQuestions; ++k) {
    const std::string answer = fmt::format("QEVICT_ANSWER_{}", k);
    msgs.push_back({"user", qs[size_t(k) - 1].question});
    msgs.push_back({"assistant", answer});
    std::vector<ChatMessage> with = msgs;
    with.push_back({"user", qs[size_t(k)].question});
    auto full = f.render_messages(with, true);
    if (!full) return full.status();
    const size_t at = full->rfind(answer);
    if (at == std::string::npos)
      return Status::error("chat template: an assistant turn's content is not rendered as given");
    out.texts.push_back(full->substr(at + answer.size()) + qs[size_t(k)].answer_prefix);
  }
  for (size_t i = 0; i < out.texts.size(); ++i) {
    auto ids = f.encode_text(out.texts[i], /*first=*/i == 0);
    if (!ids) return ids.status();
    out.turns.push_back(std::move(*ids));
    if (i > 0) {
      out.answered.push_back(i);
      out.expected.push_back(qs[i - 1].expected);
    }
  }
  out.carry = true;
  return out;
}

}  // namespace

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
    out.answered = {0};
    return out;
  }
  if (p == EvalProtocol::kMulti) return multi_prompt(f, s);
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
  out.answered = {out.turns.size() - 1};
  return out;
}

std::vector<int64_t> needle_positions(const Tokenizer& tok, const std::vector<int32_t>& ids,
                                      const std::vector<std::string>& values) {
  std::vector<int64_t> out;
  if (values.empty()) return out;
  // The turn's text as its tokens spell it, and where each token starts in it.
  std::string text;
  std::vector<size_t> start(ids.size() + 1);
  for (size_t i = 0; i < ids.size(); ++i) {
    start[i] = text.size();
    text += tok.token_to_piece(ids[i], true);
  }
  start[ids.size()] = text.size();
  for (const std::string& value : values) {
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
  return turn_snapshot(c, r, needle_pos);
}

TurnSnapshot turn_snapshot(const SequenceKvCache& c, const KvReport& r,
                           const std::vector<int64_t>& needle_pos) {
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
  nlohmann::json j{{"before", snapshot_json(d.before)},
                   {"after", snapshot_json(d.after)},
                   {"promotions", d.after.promotions - d.before.promotions}};
  if (d.fullkv_mass) j["fullkv_mass"] = turn_mass_json(*d.fullkv_mass);
  if (d.own_mass) j["own_mass"] = turn_mass_json(*d.own_mass);
  return j;
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

namespace {

// The attention observers of one answered turn (turn_mass.h), set on the caches for the turn
// and taken off when it ends (or fails).
struct TurnObservers {
  std::unique_ptr<FullKvTurnMass> fullkv;
  std::vector<std::unique_ptr<OwnTurnMass>> own;  // [request]
  FullKvCache* full = nullptr;
  std::vector<TieredKvCache*> tiered;
  TurnObservers() = default;
  TurnObservers(const TurnObservers&) = delete;
  TurnObservers& operator=(const TurnObservers&) = delete;
  ~TurnObservers() { detach(); }
  void detach() {
    if (full) full->set_attention_observer(nullptr);
    for (TieredKvCache* c : tiered) c->set_tier_mass_observer(nullptr);
    full = nullptr;
    tiered.clear();
  }
};

// Snapshots every request's cache when the question arrives (r.prompt set) into `answers`,
// and sets the observers of the turn's attention by tier on the caches. FullKV's mass is
// split over the text's positions (turn 1, n_text tokens: the only positions every cache
// shares; later ones — earlier questions, answers and the turn itself — count as local).
void begin_answered_turn(const KvShape& shape, std::vector<GenerationRequest>& reqs,
                         const std::vector<int64_t>& needles, int64_t n_text,
                         std::vector<TurnAnswer>& answers, TurnObservers* obs) {
  FullKvCache* full = nullptr;
  int64_t full_prompt_end = 0;
  for (GenerationRequest& r : reqs)
    if ((full = dynamic_cast<FullKvCache*>(r.cache))) {
      full_prompt_end = r.cache->n_past() + int64_t(r.prompt.size());
      break;
    }
  std::vector<std::vector<std::vector<Tier>>> tiers;  // [request][unit], the text's positions
  obs->own.resize(reqs.size());
  for (size_t i = 0; i < reqs.size(); ++i) {
    SequenceKvCache& c = *reqs[i].cache;
    KvReport rep;
    c.report(&rep, ReportDetail::kTiers);
    answers[i].diag.before = turn_snapshot(c, rep, needles);
    if (full) {
      for (auto& unit : rep.position_tiers)
        if (int64_t(unit.size()) > n_text) unit.resize(size_t(n_text));
      tiers.push_back(std::move(rep.position_tiers));
    }
    if (auto* tc = dynamic_cast<TieredKvCache*>(&c)) {
      obs->own[i] = std::make_unique<OwnTurnMass>(c.n_past() + int64_t(reqs[i].prompt.size()));
      tc->set_tier_mass_observer(obs->own[i].get());
      obs->tiered.push_back(tc);
    }
  }
  if (full) {
    obs->fullkv = std::make_unique<FullKvTurnMass>(shape.n_layers, shape.n_kv_heads,
                                                   full_prompt_end, std::move(tiers));
    full->set_attention_observer(obs->fullkv.get());
    obs->full = full;
  }
}

}  // namespace

Status run_protocol_turns(Model& model, ThreadPool& pool, const Tokenizer& tok,
                          const ProtocolPrompt& pp, const RulerSample& s, int max_new_tokens,
                          std::vector<GenerationRequest>& reqs, const GenerateOptions& go,
                          GenerationStats* st, std::vector<std::vector<TurnAnswer>>* answers) {
  const size_t n_turns = pp.turns.size();
  answers->assign(pp.answered.size(), std::vector<TurnAnswer>(reqs.size()));
  const bool niah = s.task.rfind("niah_", 0) == 0;
  size_t a = 0;  // the next answered turn
  for (size_t t = 0; t < n_turns; ++t) {
    const bool answered = pp.is_answered(t);
    const bool diag = answered && n_turns > 1;
    const std::vector<std::string>& values =
        a < pp.expected.size() && !pp.expected[a].empty() ? pp.expected[a] : s.expected;
    const std::vector<int64_t> needles =
        diag && niah ? needle_positions(tok, pp.turns[0], values) : std::vector<int64_t>();
    for (size_t i = 0; i < reqs.size(); ++i) {
      GenerationRequest& r = reqs[i];
      if (t > 0) {
        r.prompt.clear();
        // The previous answer's last token, sampled but never fed (cut at max_new_tokens).
        if (pp.carry && pp.is_answered(t - 1) && !r.hit_stop && !r.output.empty())
          r.prompt.push_back(r.output.back());
        r.prompt.insert(r.prompt.end(), pp.turns[t].begin(), pp.turns[t].end());
        r.share_prefill_of = -1;
      }
      r.n_predict = answered ? max_new_tokens : 0;
    }
    TurnObservers obs;
    if (diag)
      begin_answered_turn(model.kv_shape(), reqs, needles, int64_t(pp.turns[0].size()),
                          (*answers)[a], &obs);
    GenerationStats turn_st;
    QEVICT_RETURN_IF_ERROR(generate(model, pool, reqs, go, nullptr, t == 0 ? st : &turn_st));
    if (t > 0) add_turn_stats(turn_st, st);
    obs.detach();  // before the snapshots: FullKV's bytes held without the observer's buffers
    if (!answered) continue;
    for (size_t i = 0; i < reqs.size(); ++i) {
      TurnAnswer& ans = (*answers)[a][i];
      ans.output = reqs[i].output;
      ans.hit_stop = reqs[i].hit_stop;
      if (!diag) continue;
      ans.diag.after = turn_snapshot(*reqs[i].cache, needles);
      if (obs.fullkv) ans.diag.fullkv_mass = obs.fullkv->result(i);
      if (obs.own[i]) ans.diag.own_mass = obs.own[i]->result();
    }
    ++a;
  }
  return Status::ok();
}

}  // namespace qevict::eval
