// Bounds on the work of one chat-template render, so that a hostile template in a model file
// ends in an error instead of hanging or exhausting memory. The defaults are far above what
// real chat templates need; the fuzz target (tests/fuzz/chat_template_fuzz.cpp) lowers them to
// keep one input well under a second in its sanitizer build.
#pragma once

#include <cstdint>

namespace qevict {

struct RenderLimits {
  uint64_t max_output = uint64_t{64} << 20;     // bytes rendered, and bytes of any one string
  uint64_t max_list = uint64_t{1} << 18;        // elements of list + list, list * n
  uint64_t max_range = uint64_t{1} << 16;       // elements range() may produce
  uint64_t max_iterations = uint64_t{1} << 20;  // loop iterations of one render
  // Every evaluated value is charged its size (string bytes, 64 per list or dict element),
  // reads of variables included, since methods, filters and operators scan their operands.
  // Without it 2^20 iterations of `'a' * 60000000` or `s.replace(...)` on a large string run
  // for hours within the other bounds (found by the fuzz target).
  uint64_t max_work = uint64_t{1} << 28;
};

}  // namespace qevict
