// Tests that loop over option names as text ("chunk", "end", ...) turn them into the typed
// options here; the CLI, eval, Python and the server parse them with set_kv_option.
#pragma once

#include <string>

#include "kvcache/params.h"

namespace qevict::test {

inline PrefillRoute route_of(const std::string& s) {
  if (s == "staged") return PrefillRoute::kStaged;
  return s == "end" ? PrefillRoute::kEnd : PrefillRoute::kChunk;
}
inline ScoreMode score_of(const std::string& s) {
  return s == "age" ? ScoreMode::kAge : ScoreMode::kSum;
}
inline PoolSide side_of(const std::string& s) {
  return s == "after" ? PoolSide::kAfter : PoolSide::kBoth;
}

}  // namespace qevict::test
