// Where a cached position lives (SPEC §1): the sink/local region (never routed), the
// full-precision tier F, the recoverable low-bit tier Q, or evicted (E).
#pragma once

#include <cstdint>

namespace qevict {

enum class Tier : uint8_t { kLocal, kFull, kQuant, kEvicted };

inline char tier_char(Tier t) { return "LFQE"[static_cast<int>(t)]; }

}  // namespace qevict
