// make_kv_cache: the one place a sequence cache is built — from the policy's registry row
// (kvcache/registry.h), the budget (kvcache/budget.h) and the options.
#pragma once

#include <memory>

#include "core/status.h"
#include "kvcache/kv_cache.h"
#include "kvcache/params.h"

namespace qevict {

// Builds the cache for one sequence of at most n_ctx tokens; errors for invalid options, a
// budget that cannot hold the policy's fixed regions, or an unwritable --kv-trace file.
Expected<std::unique_ptr<SequenceKvCache>> make_kv_cache(const KvShape& shape, int64_t n_ctx,
                                                         const KvCacheParams& params);

// The most bytes the cache of params.policy can hold for a sequence of prompt_len +
// max_tokens tokens prefilled in chunks of prefill_chunk: its row's max_bytes, or the bound of
// its kind (kind_max_bytes, registry.h). What a server reserves before admitting a request.
// `resumed` > 0: the cache already holds that many of the prompt's tokens (a conversation's
// earlier turns, compressed), so a routed kind holds only the rest in full precision until
// the turn's end (rows with their own max_bytes ignore it: their bound covers every token).
Expected<size_t> max_cache_bytes(const KvShape& shape, int64_t prompt_len, int max_tokens,
                                 const KvCacheParams& params, int prefill_chunk,
                                 int64_t resumed = 0);

}  // namespace qevict
