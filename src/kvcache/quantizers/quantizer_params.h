// Checks the quantizer caches share before they are made (make_kivi_cache, make_zipcache_cache):
// they keep their parameters in f16, as their references do, and --kv-trace DIR dumps the
// prompt's quantization when the prompt ends, so it needs --prefill-route end.
#pragma once

#include <fmt/format.h>

#include "core/status.h"
#include "kvcache/params.h"

namespace qevict {

inline Status check_quantizer_params(const KvCacheParams& p, const char* name, const char* f16_what,
                                     const char* dump_what) {
  if (p.dtype != HalfType::kF16)
    return Status::error(fmt::format("{} keeps its {} in f16, as the reference", name, f16_what));
  if (!p.trace_path.empty() && !p.defers_prompt())
    return Status::error(
        fmt::format("--kv-trace DIR with {} dumps {} at its end: it needs --prefill-route end",
                    name, dump_what));
  return Status::ok();
}

}  // namespace qevict
