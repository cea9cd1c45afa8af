// A conversation held in memory (SPEC §11, issue 50): one sequence's KV cache and the tokens it
// has seen, extended turn after turn. A turn's tokens are prefilled in chunks into the cache's
// current — compressed — state and the turn's prompt is then ended (end_prompt: a cache with
// --prefill-route end routes there, its observation window the turn's last queries), so
// earlier turns are never prefilled again. Windows in the low-bit tier stay recoverable: when
// a turn's queries attend to them, the turn's routing promotes them; each turn's promotions,
// demotions and evictions are reported.
//
// History and cache: tokens() is everything the conversation holds; the cache has consumed
// tokens()[0, cache().n_past()). After generate(), the last generated token is in tokens()
// but not yet in the cache (the model has not run on it); the next append() feeds it first.
//
// Rewind: a conversation resumed by a request that diverges inside its last turn (a
// re-tokenized reply, a template's end-of-turn tokens) goes back to a common prefix. FullKV
// truncates; a compressed cache can drop tokens only while they are all still in its
// full-precision local region (SequenceKvCache::truncate); beyond that rewind() fails and the
// caller starts a new session.
//
// Saving: save() writes the whole state — the history and every tier's bytes — to a session
// file (engine/session_file.h); load() restores it exactly (bytes identical, the same next
// tokens). A policy whose cache cannot write its state saves the history alone and is
// re-prefilled on load (SaveMode says which happened).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/status.h"
#include "core/thread_pool.h"
#include "engine/generator.h"
#include "engine/sampling.h"
#include "kvcache/kv_cache.h"
#include "kvcache/params.h"
#include "model/model.h"

namespace qevict {

struct SessionOptions {
  KvCacheParams kv;         // validated, the policy's defaults applied (make_kv_params)
  int64_t n_ctx = 0;        // the longest conversation (0: the model's trained context)
  int prefill_chunk = 512;  // turn tokens per forward call
};

// What one turn did to the cache (deltas over the turn: its prefill, end and decode).
struct TurnStats {
  int64_t prompt_tokens = 0;  // tokens prefilled this turn (the pending one included)
  int64_t reused_tokens = 0;  // tokens already in the cache when the turn began
  int64_t generated = 0;
  double prompt_seconds = 0.0, decode_seconds = 0.0;
  int64_t promotions = 0, demotions = 0, evictions = 0;  // every layer, during the turn
  size_t bytes_held = 0;                                 // after the turn
};

class Session {
 public:
  static Expected<std::unique_ptr<Session>> create(Model& model, const SessionOptions& opts);
  // A session over a cache made elsewhere (the server's scheduler) that has consumed
  // tokens[0, cache->n_past()); opts must be what the cache was made with (kv, n_ctx =
  // cache->n_ctx()), as serialize() writes them for deserialize() to remake it.
  static std::unique_ptr<Session> adopt(Model& model, const SessionOptions& opts,
                                        std::unique_ptr<SequenceKvCache> cache,
                                        std::vector<int32_t> tokens);
  // Gives the cache back to the caller; the session is unusable afterwards.
  std::unique_ptr<SequenceKvCache> release_cache();

  const std::vector<int32_t>& tokens() const { return tokens_; }
  SequenceKvCache& cache() { return *cache_; }
  const SequenceKvCache& cache() const { return *cache_; }
  const SessionOptions& options() const { return opts_; }
  Model& model() { return model_; }
  // The turns so far (append / generate calls), oldest first.
  const std::vector<TurnStats>& turns() const { return turns_; }

  // Adds a turn's tokens to the conversation without generating: prefilled into the cache
  // (after the pending token, if any) and the turn ended. `last_logits`, when given, receives
  // f32 [n_vocab] of the last position. Errors leave the session as it was unless the model
  // failed mid-turn (then the session is unusable: is_broken()).
  Status append(const std::vector<int32_t>& turn, ThreadPool& pool,
                std::vector<float>* last_logits = nullptr);

  // Adds `turn` (may be empty when a token is pending) and generates up to n_predict tokens
  // from it, calling on_token for each (return false to stop). The generated tokens join the
  // history. Returns the generated tokens in *out.
  struct GenerateResult {
    std::vector<int32_t> tokens;
    bool hit_stop = false;
  };
  Status generate(const std::vector<int32_t>& turn, int n_predict, const SamplingParams& sampling,
                  const std::vector<int32_t>& stop_tokens, ThreadPool& pool,
                  const std::function<bool(int32_t)>& on_token, GenerateResult* out);

  // Goes back to the first n tokens of the history (n <= tokens().size()). Errors, changing
  // nothing, when the cache cannot drop the tokens after n (see the file comment).
  Status rewind(int64_t n);
  // Whether rewind(n) would succeed.
  bool can_rewind(int64_t n) const;

  // The session can no longer be used (a forward call failed inside a turn).
  bool is_broken() const { return broken_; }

  enum class SaveMode { kState, kTokensOnly };
  // Writes the session atomically (temporary file + rename); mode says whether the cache's
  // state went in (kState) or only the history (the policy cannot write its state).
  Status save(const std::string& path, SaveMode* mode = nullptr) const;
  // The same bytes, in memory (the server's idle sessions).
  Expected<std::string> serialize(SaveMode* mode = nullptr) const;
  // Reads a session file written for this model: checks its header, size, checksum and model
  // fingerprint (clear errors), rebuilds the cache with the file's options and restores its
  // state, or, for a tokens-only file, re-prefills the history. `restored` tells which.
  static Expected<std::unique_ptr<Session>> load(Model& model, const std::string& path,
                                                 ThreadPool& pool, bool* restored = nullptr);
  static Expected<std::unique_ptr<Session>> deserialize(Model& model, const std::string& bytes,
                                                        ThreadPool& pool, bool* restored = nullptr);

 private:
  Session(Model& model, const SessionOptions& opts, std::unique_ptr<SequenceKvCache> cache);
  void counters(int64_t* promotions, int64_t* demotions, int64_t* evictions) const;

  Model& model_;
  SessionOptions opts_;
  std::unique_ptr<SequenceKvCache> cache_;
  std::vector<int32_t> tokens_;
  std::vector<TurnStats> turns_;
  bool broken_ = false;
};

// The longest common prefix of two token sequences.
int64_t common_prefix(const std::vector<int32_t>& a, const std::vector<int32_t>& b);

}  // namespace qevict
