// The toy caches of the session_file_fuzz target and of its seeds (make_seeds.cpp): both must
// build caches of the same shape, context and options, so that a seed's state loads.
#pragma once

#include <memory>
#include <vector>

#include "common/kv_shape.h"
#include "kvcache/factory.h"
#include "kvcache/full_cache.h"
#include "kvcache/options.h"
#include "kvcache/shape.h"

namespace qevict::fuzz {

inline constexpr int64_t kSessionCtx = 64;

inline KvShape session_shape() { return test::rope_shape(2, 4, 2, 16); }

// A tiered cache: windows of 4 tokens, half the context's bytes, a small sink and local region
// so that 64 tokens reach every tier.
inline KvOptionList session_tiered_options() {
  return {{"policy", "qevict"}, {"budget", "0.5"}, {"window", "4"},
          {"sink", "4"},        {"local", "8"},    {"route_every", "4"}};
}

inline std::unique_ptr<SequenceKvCache> make_session_tiered() {
  auto p = make_kv_params(session_tiered_options());
  if (!p) return nullptr;
  auto c = make_kv_cache(session_shape(), kSessionCtx, *p);
  return c ? std::move(*c) : nullptr;
}

inline std::unique_ptr<SequenceKvCache> make_session_full() {
  return std::make_unique<FullKvCache>(session_shape(), kSessionCtx);
}

}  // namespace qevict::fuzz
