// Evaluation protocols (issue 51): where a task's question stands relative to the moment the
// cache compresses the prompt. `end` is RULER's prompt as built (the question last, the
// prompt compressed with it: every grid before issue 51). `after`: the instruction and text
// are one user turn, ended and compressed; the question and the answer prefix come as a
// second user turn, prefilled into the compressed cache, then decoded. `first`: one prompt,
// the question before the text and a neutral closing request, no key in the answer prefix.
// `multi` (several questions, one per turn) is not built yet.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/status.h"
#include "engine/generator.h"
#include "eval/ruler_tasks.h"
#include "kvcache/kv_cache.h"
#include "tokenizer/tokenizer.h"

namespace qevict::eval {

class PromptFormatter;  // eval_runner.h

enum class EvalProtocol { kEnd, kAfter, kFirst };

const char* protocol_name(EvalProtocol p);
// "end", "after", "first" (a comma list: every one, in the order given, each once).
Expected<std::vector<EvalProtocol>> parse_protocols(const std::string& list);

// Whether protocol p is run for `task`: `end` for every task; `after` and `first` for the
// RULER tasks with a separable question (niah ×8, vt, qa_1/qa_2; cwe and fwe under `after`
// only: their question asks about the whole list, which `first` would put before it).
bool protocol_applies(EvalProtocol p, const std::string& task);

// The closing request of a `first` prompt and its answer prefix (no key in it).
inline constexpr const char* kFirstClosing = "Answer the question above.";
inline constexpr const char* kFirstPrefix = "Answer:";

// A sample's prompt under a protocol: the tokens of each turn, in order (the last one is
// decoded; the others are prefilled and ended), and their text as the model reads it.
struct ProtocolPrompt {
  std::vector<std::vector<int32_t>> turns;
  std::vector<std::string> texts;
  int64_t n_tokens() const;
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
};

// Token positions of a niah sample's needles (the sentences holding its expected values) in
// the tokens `ids` of a turn starting at position 0; empty for other tasks.
std::vector<int64_t> needle_positions(const Tokenizer& tok, const std::vector<int32_t>& ids,
                                      const RulerSample& s);
TurnSnapshot turn_snapshot(const SequenceKvCache& c, const std::vector<int64_t>& needle_pos);
// {"before": ..., "after": ..., "promotions": after - before}.
nlohmann::json turn_diagnostics_json(const TurnDiagnostics& d);
// st += add (a later turn's generate() call).
void add_turn_stats(const GenerationStats& add, GenerationStats* st);

}  // namespace qevict::eval
