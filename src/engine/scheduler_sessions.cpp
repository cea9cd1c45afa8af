// The scheduler's conversation reuse (engine/scheduler.h's file comment): which session a
// request resumes, restoring one from disk, making room in the pool by evicting idle sessions,
// and keeping a finished request's cache as a session.
#include <fmt/format.h>

#include <cstdio>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "core/atomic_file.h"
#include "engine/scheduler.h"
#include "engine/scheduler_seq.h"
#include "engine/session.h"
#include "kvcache/budget.h"
#include "kvcache/registry.h"

namespace qevict {

namespace {

void fill_bytes(SessionEntry* e) {
  e->bytes = e->cache->bytes_held();
  KvReport r;
  e->cache->report(&r);
  e->bytes_full = e->bytes_quant = e->bytes_sink = 0;
  for (const auto& l : r.layers) {
    e->bytes_full += l.bytes_full;
    e->bytes_quant += l.bytes_quant;
    e->bytes_sink += l.bytes_sink;
  }
}

}  // namespace

Expected<Scheduler::Resolved> Scheduler::resolve(const ServeRequest& r) const {
  Resolved out;
  out.kv = r.kv;
  const int64_t ctx = int64_t(r.prompt.size()) + r.max_tokens;
  out.n_ctx = ctx;
  if (!opts_.cache_prompt) return out;
  const PolicyInfo* row = find_policy(r.kv.policy);
  if (!row) return Status::error(fmt::format("unknown KV policy '{}'", r.kv.policy));
  // A cache of its own making (the quantizers) is made for the request's context: its
  // session is resumed only by a request that fits in it.
  if (row->make_cache || row->max_bytes || row->kind == CacheKind::kQuantized) return out;
  if (row->kind != CacheKind::kFull && r.kv.budget_fraction > 0.0) {
    const KvShape& shape = model_.kv_shape();
    auto b = compute_budget(row->kind, shape, ctx, r.kv);
    if (!b) return b.status();
    if (row->kind == CacheKind::kPerHead)
      QEVICT_RETURN_IF_ERROR(
          fit_head_budget(&*b, shape, ctx, r.kv, row->make_policy(r.kv)->needs()));
    out.kv.budget_fraction = 0.0;
    out.kv.budget_bytes = int64_t(b->total);
    if (out.kv.bits == 0 && row->kind == CacheKind::kWindowed) out.kv.bits = b->bits;
    out.floored = b->floored;
  }
  out.n_ctx = opts_.n_ctx;
  return out;
}

std::string Scheduler::session_path(const std::string& id) const {
  return (std::filesystem::path(opts_.session_dir) / session_file_name(id)).string();
}

std::optional<SessionMatch> Scheduler::find_session(Seq& s) {
  const std::string& id = s.req.session_id;
  if (!id.empty()) {
    s.id = id;
    s.named = true;
  }
  const MatchRules rules{opts_.min_reuse_tokens, opts_.min_reuse_fraction};
  const int64_t need = int64_t(s.req.prompt.size()) + s.req.max_tokens;
  // A named session this server does not hold: another one sharing the directory may have
  // written it (a failover behind a load balancer).
  if (s.named && !opts_.session_dir.empty() && !store_.find(id)) {
    const std::string path = session_path(id);
    std::error_code ec;
    if (std::filesystem::exists(path, ec)) restore(id, path, true);
  }
  auto m = store_.match(id, s.req.prompt, s.key, need, rules);
  if (m && m->on_disk) {
    const SessionEntry* e = store_.find(m->id);
    if (!restore(m->id, e->path, e->named)) return std::nullopt;
    m = store_.match(id, s.req.prompt, s.key, need, rules);  // exact now: the cache is here
    if (m && m->on_disk) return std::nullopt;
  }
  return m;
}

bool Scheduler::restore(const std::string& id, const std::string& path, bool named) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream ss;
  ss << in.rdbuf();
  bool restored = false;
  auto ses = in ? Session::deserialize(model_, ss.str(), pool_, &restored)
                : Expected<std::unique_ptr<Session>>(Status::error("cannot read " + path));
  if (!ses || !restored) {  // gone, damaged, another model's: forgotten (a miss)
    store_.erase(id);
    count_sessions();
    return false;
  }
  SessionEntry e;
  e.id = id;
  e.named = named;
  e.path = path;
  e.tokens = (*ses)->tokens();
  e.kv = (*ses)->options().kv;
  e.key = kv_params_key(e.kv);
  e.n_ctx = (*ses)->options().n_ctx;
  e.cache = (*ses)->release_cache();
  e.n_past = e.cache->n_past();
  fill_bytes(&e);
  e.last_used_unix = int64_t(std::time(nullptr));
  store_.put(std::move(e));
  // Its bytes count like any idle session's (the request may yet wait for room): older ones
  // make way, and when even that is not enough it goes back to disk (it is the newest, so
  // the last evicted).
  make_room(0, "", /*wait_for_running=*/false);
  const SessionEntry* back = store_.find(id);
  if (!back || !back->in_memory()) return false;
  std::lock_guard<std::mutex> lk(mu_);
  ++metrics_.sessions_restored;
  return true;
}

bool Scheduler::make_room(size_t need, const std::string& except, bool wait_for_running) {
  const size_t pool = opts_.kv_pool_bytes;
  const SessionEntry* ex = except.empty() ? nullptr : store_.find(except);
  // The session a request resumes: its bytes become the request's (its reservation covers
  // them), so they do not count here.
  size_t others = store_.bytes() - (ex && ex->in_memory() ? ex->bytes : 0);
  if (reserved_ + need > pool) return false;
  // Short only of what idle conversations hold: while requests run, wait for them (each gives
  // its reservation back and keeps its conversation compressed) rather than drop idle ones
  // for room that is coming anyway; with nothing running, the least recently used make way.
  if (wait_for_running && reserved_ > 0 && reserved_ + need + others > pool) return false;
  for (const std::string& id : store_.lru_in_memory(except)) {
    if (reserved_ + need + others <= pool) break;
    others -= store_.find(id)->bytes;
    evict(id);
  }
  count_sessions();
  return true;
}

Status Scheduler::write_session(SessionEntry& e, const std::string& path) {
  SessionOptions o;
  o.kv = e.kv;
  o.n_ctx = e.n_ctx;
  o.prefill_chunk = opts_.prefill_chunk;
  auto ses = Session::adopt(model_, o, std::move(e.cache), e.tokens);
  auto bytes = ses->serialize();
  e.cache = ses->release_cache();
  if (!bytes) return bytes.status();
  QEVICT_RETURN_IF_ERROR(write_file_atomic(path, *bytes));
  std::lock_guard<std::mutex> lk(mu_);
  ++metrics_.sessions_written;
  return Status::ok();
}

void Scheduler::evict(const std::string& id) {
  SessionEntry* e = store_.find(id);
  if (!e || !e->in_memory()) return;
  bool on_disk = !e->path.empty();  // written through: the file is this state
  if (!on_disk && !opts_.session_dir.empty() && e->cache->can_save_state()) {
    const std::string path = session_path(id);
    if (write_session(*e, path).is_ok()) {
      e->path = path;
      on_disk = true;
    }
  }
  if (on_disk) {
    store_.to_disk(id);
  } else {
    store_.erase(id);
    std::lock_guard<std::mutex> lk(mu_);
    ++metrics_.sessions_dropped;
  }
}

void Scheduler::keep_session(Seq& s) {
  // The reservation goes back now; the session is held at its real bytes (no more).
  reserved_ -= s.reserved;
  s.reserved = 0;
  {
    std::lock_guard<std::mutex> lk(mu_);
    metrics_.reserved_bytes = reserved_;
  }
  if (!s.cache || s.failed) return;
  SessionEntry e;
  e.id = s.id;
  e.named = s.named;
  e.tokens = s.req.prompt;
  e.tokens.insert(e.tokens.end(), s.out_tokens.begin(), s.out_tokens.end());
  e.n_past = s.cache->n_past();
  e.n_ctx = s.cache->n_ctx();
  e.kv = s.kv;
  e.key = s.key;
  e.cache = std::move(s.cache);
  fill_bytes(&e);
  e.last_used_unix = int64_t(std::time(nullptr));
  if (e.named && !opts_.session_dir.empty() && e.cache->can_save_state()) {
    const std::string path = session_path(e.id);
    if (write_session(e, path).is_ok()) e.path = path;
  }
  const std::string id = e.id;
  store_.put(std::move(e));
  for (const std::string& old : store_.lru_in_memory()) {
    if (store_.in_memory() <= opts_.max_sessions) break;
    evict(old);
  }
  count_sessions();
  update_held();  // GET /slots lists it before its request's end is reported
}

size_t Scheduler::resumed_reservation(const Seq& s, const SessionMatch& m) const {
  const SessionEntry* e = store_.find(m.id);
  if (!e || m.reuse <= 0) return s.reserved;
  auto b = reservation_bytes(model_.kv_shape(), int64_t(s.req.prompt.size()), s.req.max_tokens,
                             e->kv, opts_.prefill_chunk, m.reuse);
  return b ? *b : s.reserved;
}

bool Scheduler::resume(Seq& s, const SessionMatch& m) {
  SessionEntry e = store_.take(m.id);
  count_sessions();
  if (!e.in_memory()) return false;
  if (m.truncate && !e.cache->truncate(m.reuse).is_ok()) return false;  // dropped: a miss
  // An evicted automatic session's file is stale once resumed (a named one is rewritten).
  if (!e.named && !e.path.empty()) std::remove(e.path.c_str());
  s.cache = std::move(e.cache);
  KvReport r;
  s.cache->report(&r);
  s.base = r.total();
  s.kv = e.kv;
  s.cache_ctx = e.n_ctx;
  s.id = e.id;
  s.named = e.named;
  s.fed = m.reuse;
  s.cached = m.reuse;
  s.out->cached_.store(m.reuse);
  std::lock_guard<std::mutex> lk(mu_);
  ++metrics_.session_hits;
  metrics_.reused_tokens += m.reuse;
  return true;
}

void Scheduler::count_sessions() {
  size_t full = 0, quant = 0, sink = 0;
  for (const auto& [id, e] : store_.entries()) {
    full += e.bytes_full;
    quant += e.bytes_quant;
    sink += e.bytes_sink;
  }
  std::lock_guard<std::mutex> lk(mu_);
  metrics_.sessions_in_memory = store_.in_memory();
  metrics_.sessions_on_disk = store_.on_disk();
  metrics_.session_bytes = store_.bytes();
  metrics_.session_full = full;
  metrics_.session_quant = quant;
  metrics_.session_sink = sink;
}

}  // namespace qevict
