// Idle conversations of the server (see session_store.h).
#include "engine/session_store.h"

#include <fmt/format.h>

#include <algorithm>

#include "engine/session.h"
#include "engine/session_file.h"

namespace qevict {

std::optional<SessionMatch> plan_reuse(const std::vector<int32_t>& history, int64_t n_past,
                                       const SequenceKvCache* cache,
                                       const std::vector<int32_t>& prompt,
                                       const MatchRules& rules) {
  if (prompt.empty()) return std::nullopt;
  const int64_t p = common_prefix(history, prompt);
  const int64_t t = std::min<int64_t>(p, int64_t(prompt.size()) - 1);
  SessionMatch m;
  if (t >= n_past) {
    m.reuse = n_past;
  } else {
    if (cache && !cache->can_truncate(t)) return std::nullopt;
    m.reuse = t;
    m.truncate = true;
  }
  if (m.reuse < std::max<int64_t>(rules.min_tokens, 1)) return std::nullopt;
  if (double(m.reuse) < rules.min_fraction * double(history.size())) return std::nullopt;
  return m;
}

std::string kv_params_key(const KvCacheParams& p) {
  SessionFileContents c;
  c.kv = p;
  return encode_session(c);
}

std::string budget_free_key(const KvCacheParams& p) {
  KvCacheParams q = p;
  q.budget_fraction = 0.0;
  q.budget_bytes = 0;
  q.budget_tokens = 0;
  return "~" + kv_params_key(q);
}

std::string session_file_name(const std::string& id) {
  bool safe = !id.empty() && id.size() <= 100 && id[0] != '.';
  for (char ch : id)
    safe = safe && ((ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') ||
                    (ch >= '0' && ch <= '9') || ch == '.' || ch == '_' || ch == '-');
  if (safe) return id + ".qvs";
  return fmt::format("h{:016x}.qvs", fnv1a64(id.data(), id.size()));
}

void SessionStore::forget(const SessionEntry& e) {
  if (e.in_memory()) {
    bytes_ -= e.bytes;
    --in_memory_;
  }
}

void SessionStore::put(SessionEntry e) {
  erase(e.id);
  e.loose_key = budget_free_key(e.kv);
  e.tick = ++tick_;
  if (e.in_memory()) {
    bytes_ += e.bytes;
    ++in_memory_;
  }
  std::string id = e.id;
  entries_.emplace(std::move(id), std::move(e));
}

std::optional<SessionMatch> SessionStore::match(const std::string& id,
                                                const std::vector<int32_t>& prompt,
                                                const std::string& key, int64_t n_ctx_needed,
                                                const MatchRules& rules) const {
  std::optional<SessionMatch> best;
  uint64_t best_tick = 0;
  for (const auto& [eid, e] : entries_) {
    // A named conversation is its client's: resumed (and rewritten) only under its id.
    if (id.empty() ? e.named : eid != id) continue;
    if ((e.key != key && e.loose_key != key) || e.n_ctx < n_ctx_needed) continue;
    auto m = plan_reuse(e.tokens, e.n_past, e.cache.get(), prompt, rules);
    if (!m) continue;
    if (best && (m->reuse < best->reuse || (m->reuse == best->reuse && e.tick < best_tick)))
      continue;
    m->id = eid;
    m->on_disk = !e.in_memory();
    best = m;
    best_tick = e.tick;
  }
  return best;
}

SessionEntry* SessionStore::find(const std::string& id) {
  auto it = entries_.find(id);
  return it == entries_.end() ? nullptr : &it->second;
}

const SessionEntry* SessionStore::find(const std::string& id) const {
  auto it = entries_.find(id);
  return it == entries_.end() ? nullptr : &it->second;
}

SessionEntry SessionStore::take(const std::string& id) {
  auto it = entries_.find(id);
  if (it == entries_.end()) return {};
  forget(it->second);
  SessionEntry e = std::move(it->second);
  entries_.erase(it);
  return e;
}

void SessionStore::erase(const std::string& id) {
  auto it = entries_.find(id);
  if (it == entries_.end()) return;
  forget(it->second);
  entries_.erase(it);
}

std::vector<std::string> SessionStore::lru_in_memory(const std::string& except) const {
  std::vector<std::pair<uint64_t, std::string>> v;
  for (const auto& [id, e] : entries_)
    if (e.in_memory() && id != except) v.emplace_back(e.tick, id);
  std::sort(v.begin(), v.end());
  std::vector<std::string> out;
  for (auto& [tick, id] : v) out.push_back(id);
  return out;
}

void SessionStore::to_disk(const std::string& id) {
  SessionEntry* e = find(id);
  if (!e || !e->in_memory()) return;
  forget(*e);
  e->cache.reset();
  e->bytes = e->bytes_full = e->bytes_quant = e->bytes_sink = 0;
}

}  // namespace qevict
