// The server's conversations between requests (issue 50 item 2, llama-server's --cache-prompt):
// a finished request's cache and history (prompt + generated tokens) stay here as an idle
// session; a later request whose prompt shares a long enough token prefix with one resumes it
// and prefills only its new tokens. This is the bookkeeping alone — which session a prompt
// resumes, how far it rewinds, which sessions are the least recently used, how many bytes the
// idle ones hold — so that it can be tested without a model. Writing sessions to disk and
// reading them back (Session::serialize / deserialize) is the scheduler's (engine/scheduler.h).
//
// A session is in memory (its cache here, `bytes` = the cache's bytes_held) or on disk only (a
// file `path`, cache null, its history kept here as the index prefix matching searches). The
// one a running request holds is in neither: the request took it (take()).
//
// Reuse: the prompt and the history share p tokens. The model needs at least one prompt token
// to run on, so the target is t = min(p, prompt − 1). The cache has consumed n_past tokens of
// the history (the last generated token is pending): if t >= n_past, all n_past are kept;
// otherwise the cache goes back to t when it can drop the tokens after t
// (SequenceKvCache::can_truncate: FullKV anywhere, a compressed cache only within its
// full-precision local region), else the session is a miss. A reuse below MatchRules'
// minimum (too few tokens, or too little of the session) is a miss too.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "kvcache/kv_cache.h"
#include "kvcache/params.h"

namespace qevict {

struct SessionEntry {
  std::string id;
  bool named = false;             // the client named it (X-Session-Id / user), else automatic
  std::vector<int32_t> tokens;    // the history
  int64_t n_past = 0, n_ctx = 0;  // the cache's
  KvCacheParams kv;               // what the cache was made with
  std::string key;                // kv_params_key(kv): a request must have the same to resume
  // budget_free_key(kv), set by SessionStore::put: what a request whose budget is a fraction
  // matches (the conversation keeps the byte budget its first turn got).
  std::string loose_key;
  std::unique_ptr<SequenceKvCache> cache;  // null: on disk only
  std::string path;                        // non-empty: a file holds exactly this state
  size_t bytes = 0, bytes_full = 0, bytes_quant = 0, bytes_sink = 0;  // in memory
  uint64_t tick = 0;                                                  // least recently used first
  int64_t last_used_unix = 0;
  bool in_memory() const { return cache != nullptr; }
};

struct MatchRules {
  int64_t min_tokens = 32;    // fewer reused tokens: a miss
  double min_fraction = 0.5;  // reusing less than this share of the session: a miss
};

struct SessionMatch {
  std::string id;
  int64_t reuse = 0;      // tokens of the cache kept (the request prefills the rest)
  bool truncate = false;  // the cache goes back to `reuse` first
  bool on_disk = false;   // restore it first (can_truncate is checked again then)
};

// What reusing a session with this history and cache gives for `prompt`: the tokens kept and
// whether the cache is truncated, or nullopt (a miss). A null cache (on disk) is taken to be
// able to truncate; the caller checks once it is restored.
std::optional<SessionMatch> plan_reuse(const std::vector<int32_t>& history, int64_t n_past,
                                       const SequenceKvCache* cache,
                                       const std::vector<int32_t>& prompt, const MatchRules& rules);

// A string equal for two params exactly when they make the same cache (every field a session
// file records).
std::string kv_params_key(const KvCacheParams& p);

// kv_params_key without the budget (fraction, bytes, tokens), marked apart from it: a request
// that gives its budget as a fraction of its context resumes a session of any byte budget with
// otherwise equal params — else every later, longer turn of a conversation would be a larger
// budget, hence a miss.
std::string budget_free_key(const KvCacheParams& p);

// A file name for a session id: the id itself when it is made of [A-Za-z0-9._-] (at most 100,
// not starting with '.'), else "h" + a 64-bit hash of it in hex; then ".qvs".
std::string session_file_name(const std::string& id);

class SessionStore {
 public:
  // Adds an idle session, most recently used; replaces one with the same id.
  void put(SessionEntry e);
  // The session `prompt` should resume: with an id, that session only; without, the one of
  // the longest reuse among the unnamed ones (in memory or on disk; a named conversation is
  // its client's, not to be continued by another) of the same key and a context of at least
  // n_ctx_needed tokens; nullopt: a miss.
  std::optional<SessionMatch> match(const std::string& id, const std::vector<int32_t>& prompt,
                                    const std::string& key, int64_t n_ctx_needed,
                                    const MatchRules& rules) const;
  SessionEntry* find(const std::string& id);
  const SessionEntry* find(const std::string& id) const;
  // Removes the session and gives it to the caller.
  SessionEntry take(const std::string& id);
  void erase(const std::string& id);
  // Ids of the sessions in memory, least recently used first, `except` left out.
  std::vector<std::string> lru_in_memory(const std::string& except = "") const;
  // Drops a session's cache (it stays as an on-disk entry: path must be set).
  void to_disk(const std::string& id);

  size_t bytes() const { return bytes_; }  // held by the sessions in memory
  int64_t in_memory() const { return in_memory_; }
  int64_t on_disk() const { return int64_t(entries_.size()) - in_memory_; }
  const std::map<std::string, SessionEntry>& entries() const { return entries_; }

 private:
  void forget(const SessionEntry& e);
  std::map<std::string, SessionEntry> entries_;
  size_t bytes_ = 0;
  int64_t in_memory_ = 0;
  uint64_t tick_ = 0;
};

}  // namespace qevict
