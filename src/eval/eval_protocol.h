// Evaluation protocols (issue 51): where a task's question stands relative to the moment the
// cache compresses the prompt. `end` is RULER's prompt as built (the question last, the
// prompt compressed with it: every grid before issue 51). `after`: the instruction and text
// are one user turn, ended and compressed; the question and the answer prefix come as a
// second user turn, prefilled into the compressed cache, then decoded. `first`: one prompt,
// the question before the text and a neutral closing request, no key in the answer prefix.
// `multi`: the text one turn, then 4 questions (one key of the needles each), one per turn in
// the same cache, each answered (decoded) before the next is appended; every answer scored.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "core/status.h"
#include "engine/generator.h"
#include "eval/ruler_tasks.h"
#include "eval/turn_mass.h"
#include "kvcache/kv_cache.h"
#include "kvcache/report.h"
#include "tokenizer/tokenizer.h"

namespace qevict::eval {

class PromptFormatter;  // eval_runner.h

enum class EvalProtocol { kEnd, kAfter, kFirst, kMulti };

// Questions a `multi` sample asks, one per turn.
inline constexpr int kMultiQuestions = 4;

const char* protocol_name(EvalProtocol p);
// "end", "after", "first", "multi" (a comma list: every one, in the order given, each once).
Expected<std::vector<EvalProtocol>> parse_protocols(const std::string& list);

// Whether protocol p is run for `task`: `end` for every task; `after` and `first` for the
// RULER tasks with a separable question (niah ×8, vt, qa_1/qa_2; cwe and fwe under `after`
// only: their question asks about the whole list, which `first` would put before it);
// `multi` for the niah tasks with 4 keys of one value each (niah_multikey_1, niah_multiquery).
bool protocol_applies(EvalProtocol p, const std::string& task);
// Result lines (answered turns) a sample gives under p: kMultiQuestions for multi, else 1.
int protocol_answers(EvalProtocol p);
// The protocol's name in cell keys and summary rows for answered turn `answer` (0-based):
// "multi.t1".."multi.t4" for multi, else protocol_name(p).
std::string protocol_label(EvalProtocol p, int answer);

// The closing request of a `first` prompt and its answer prefix (no key in it).
inline constexpr const char* kFirstClosing = "Answer the question above.";
inline constexpr const char* kFirstPrefix = "Answer:";

// A sample's prompt under a protocol: the tokens of each turn, in order, and their text as the
// model reads it. The answered turns are decoded (max_new_tokens) and scored; the others are
// prefilled and ended (compressed as at a prompt's end).
struct ProtocolPrompt {
  std::vector<std::vector<int32_t>> turns;
  std::vector<std::string> texts;
  std::vector<size_t> answered;                    // indices into turns, ascending
  std::vector<std::vector<std::string>> expected;  // per answered turn; empty: the sample's
  // multi: a turn after an answer ends the answer with the template's end of turn. An answer
  // cut at max_new_tokens leaves its last token sampled but not in the cache: the next turn
  // feeds it first.
  bool carry = false;
  int64_t n_tokens() const;
  bool is_answered(size_t turn) const;
};

// `end`: PromptFormatter::encode of the sample, as every grid before protocols. Errors: the
// sample has no separable question (question_at < 0) under `after` or `first`.
Expected<ProtocolPrompt> protocol_prompt(const PromptFormatter& f, const RulerSample& s,
                                         EvalProtocol p);

// Per-turn diagnostics of a multi-turn protocol (issue 51 item 2), from the cache's report.
struct TurnSnapshot {
  int64_t n_past = 0, routing_events = 0;
  int64_t promotions = 0, demotions = 0, evictions = 0;  // so far, all layers
  size_t bytes_held = 0;
  // Tiers of the needles' token positions over every unit (layer, or layer and KV head),
  // indexed by Tier (local, F, Q, E); all 0 when there are no needles or no tier map.
  int64_t needle_tiers[4] = {0, 0, 0, 0};
};
struct TurnDiagnostics {
  TurnSnapshot before;  // when the question arrives (turn 1 ended and compressed)
  TurnSnapshot after;   // after the answer
  // The turn's attention by tier (turn_mass.h): FullKV's (the first FullKV cache of the
  // batch) over the text's positions (turn 1) split by this cache's tiers in `before`, later
  // positions as local; and a tiered cache's own. None without a FullKV cache in the batch
  // (a resumed cell whose FullKV line is done) or a tier map / a tiered cache.
  std::optional<TurnMass> fullkv_mass, own_mass;
};

// One answered turn of one request.
struct TurnAnswer {
  std::vector<int32_t> output;  // generated tokens (a stop token included)
  bool hit_stop = false;
  TurnDiagnostics diag;  // multi-turn protocols
};

// Token positions of the niah needles holding `values` (the sentences "... is: VALUE.") in the
// tokens `ids` of a turn starting at position 0; a value not found adds none.
std::vector<int64_t> needle_positions(const Tokenizer& tok, const std::vector<int32_t>& ids,
                                      const std::vector<std::string>& values);
TurnSnapshot turn_snapshot(const SequenceKvCache& c, const std::vector<int64_t>& needle_pos);
// The same from a report of c taken with ReportDetail::kTiers.
TurnSnapshot turn_snapshot(const SequenceKvCache& c, const KvReport& r,
                           const std::vector<int64_t>& needle_pos);
// {"before": ..., "after": ..., "promotions": after - before, and "fullkv_mass", "own_mass"
// (turn_mass_json) when known}.
nlohmann::json turn_diagnostics_json(const TurnDiagnostics& d);
// st += add (a later turn's generate() call).
void add_turn_stats(const GenerationStats& add, GenerationStats* st);

// Runs the turns of pp on the requests (each with its cache, sampling and stop tokens set;
// share_prefill_of set for the first turn, whose prefill the grid shares): the first turn as
// given, later turns each cache's own. answers[a][i]: answered turn a of request i, with its
// diagnostics (needle tiers from the first turn's tokens, attention mass by tier) when pp has
// more than one turn.
Status run_protocol_turns(Model& model, ThreadPool& pool, const Tokenizer& tok,
                          const ProtocolPrompt& pp, const RulerSample& s, int max_new_tokens,
                          std::vector<GenerationRequest>& reqs, const GenerateOptions& go,
                          GenerationStats* st, std::vector<std::vector<TurnAnswer>>* answers);

}  // namespace qevict::eval
