// Continuous batching (see scheduler.h).
#include "engine/scheduler.h"

#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <ctime>

#include "engine/prompt_drive.h"
#include "engine/scheduler_seq.h"
#include "kvcache/budget.h"
#include "kvcache/factory.h"
#include "kvcache/full_cache.h"
#include "kvcache/head_cache.h"
#include "kvcache/registry.h"

namespace qevict {

bool ServeStream::next(ServeEvent* e, std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lk(mu_);
  if (!cv_.wait_for(lk, timeout, [&] { return !q_.empty(); })) return false;
  *e = std::move(q_.front());
  q_.pop_front();
  return true;
}

void ServeStream::push(ServeEvent e) {
  {
    std::lock_guard<std::mutex> lk(mu_);
    q_.push_back(std::move(e));
  }
  cv_.notify_one();
}

Status SchedulerOptions::validate() const {
  if (n_ctx < 1) return Status::error("the context size must be positive");
  if (kv_pool_bytes == 0) return Status::error("--kv-pool-bytes must be positive");
  if (max_queue < 0) return Status::error("--max-queue must be >= 0");
  if (max_batch < 1) return Status::error("--parallel must be >= 1");
  if (prefill_chunk < 1) return Status::error("--prefill-chunk must be >= 1");
  if (prefill_overtake_limit < 0) return Status::error("the prefill overtake limit must be >= 0");
  if (max_sessions < 0) return Status::error("--max-sessions must be >= 0");
  return Status::ok();
}

Expected<size_t> reservation_bytes(const KvShape& shape, int64_t prompt_len, int max_tokens,
                                   const KvCacheParams& p, int prefill_chunk, int64_t resumed) {
  return max_cache_bytes(shape, prompt_len, max_tokens, p, prefill_chunk, resumed);
}

Scheduler::Scheduler(Model& model, ThreadPool& pool, const SchedulerOptions& opts)
    : model_(model), pool_(pool), opts_(opts) {
  metrics_.pool_bytes = opts.kv_pool_bytes;
}

Scheduler::~Scheduler() = default;

SubmitResult Scheduler::submit(ServeRequest r) {
  SubmitResult res;
  const int64_t n_ctx = int64_t(r.prompt.size()) + r.max_tokens;
  if (r.prompt.empty()) {
    res.status = 400;
    res.error = "the prompt has no tokens";
  } else if (r.max_tokens < 1) {
    res.status = 400;
    res.error = "max_tokens must be at least 1";
  } else if (n_ctx > opts_.n_ctx) {
    res.status = 400;
    res.error =
        fmt::format("the prompt ({} tokens) plus max_tokens ({}) exceeds the context of {} tokens",
                    r.prompt.size(), r.max_tokens, opts_.n_ctx);
  } else if (Status st = r.sampling.validate(); !st.is_ok()) {
    res.status = 400;
    res.error = st.message();
  }
  size_t need = 0;
  Resolved rv;
  if (res.status == 200) {
    auto rs = resolve(r);
    if (rs) rv = *rs;
    auto b = !rs ? Expected<size_t>(rs.status())
                 : reservation_bytes(model_.kv_shape(), int64_t(r.prompt.size()), r.max_tokens,
                                     rv.kv, opts_.prefill_chunk);
    if (!b) {
      res.status = 400;
      res.error = b.error();
    } else if (*b > opts_.kv_pool_bytes) {
      res.status = 400;
      res.error = fmt::format(
          "this request's KV cache may hold {} bytes, more than the whole pool ({} bytes): use "
          "a smaller kv_budget, a shorter prompt or fewer max_tokens",
          *b, opts_.kv_pool_bytes);
    } else {
      need = *b;
    }
  }
  std::lock_guard<std::mutex> lk(mu_);
  ++metrics_.requests;
  if (res.status != 200) return res;
  if (int64_t(waiting_.size()) >= opts_.max_queue) {
    ++metrics_.refused_queue_full;
    res.status = 429;
    res.error =
        fmt::format("the server is full ({} requests waiting); retry later", waiting_.size());
    return res;
  }
  auto s = std::make_unique<Seq>();
  s->out = std::make_shared<ServeStream>();
  s->out->prompt_tokens_ = int64_t(r.prompt.size());
  s->reserved = need;
  s->kv = rv.kv;
  s->cache_ctx = rv.n_ctx;
  s->floored = rv.floored;
  // A fraction budget matches a session of any byte budget (session_store.h, budget_free_key).
  if (opts_.cache_prompt)
    s->key = r.kv.budget_fraction > 0.0 ? budget_free_key(r.kv) : kv_params_key(rv.kv);
  s->sampler = std::make_unique<Sampler>(r.sampling);
  s->req = std::move(r);
  res.stream = s->out;
  waiting_.push_back(std::move(s));
  metrics_.waiting = int64_t(waiting_.size());
  wake_.notify_one();
  return res;
}

void Scheduler::wake() { wake_.notify_all(); }

SchedulerMetrics Scheduler::metrics() const {
  std::lock_guard<std::mutex> lk(mu_);
  return metrics_;
}

void Scheduler::admit() {
  // In arrival order. A request that does not fit waits; one behind it that fits may go first
  // (a follow-up of a few tokens need not wait behind a whole document's reservation: in the
  // 8-conversation run, follow-ups waited up to 133 s behind first turns queued for room), but
  // once a waiting request has been passed prefill_overtake_limit times nothing behind it is
  // admitted before it (0: first come, first served). Only this thread removes from waiting_,
  // and submit() only appends, so index i stays valid while the lock is released (restoring a
  // session reads a file).
  size_t i = 0;
  for (;;) {
    Seq* sp = nullptr;
    {
      std::lock_guard<std::mutex> lk(mu_);
      metrics_.waiting = int64_t(waiting_.size());
      if (i >= waiting_.size() || int(active_.size()) >= opts_.max_batch) return;
      sp = waiting_[i].get();
      if (sp->out->cancelled()) {
        ++metrics_.cancelled;
        waiting_.erase(waiting_.begin() + std::ptrdiff_t(i));
        continue;
      }
    }
    Seq& s = *sp;
    std::optional<SessionMatch> m;
    if (opts_.cache_prompt) m = find_session(s);
    // A resumed conversation holds only its new tokens beyond its budget while they are read
    // (usually far less than a fresh prompt; a resume the pool could never hold is a miss).
    const size_t need = m ? resumed_reservation(s, *m) : s.reserved;
    if (m && need > opts_.kv_pool_bytes) m.reset();
    if (!make_room(m ? need : s.reserved, m ? m->id : "")) {  // waits; sessions as they were
      if (s.overtaken >= opts_.prefill_overtake_limit) return;
      ++i;
      continue;
    }
    if (m && resume(s, *m)) {
      s.reserved = need;
    } else {
      // Not resumed after all (rare: a rewind the cache refused): the whole reservation.
      if (need < s.reserved && !make_room(s.reserved, "")) {
        if (s.overtaken >= opts_.prefill_overtake_limit) return;
        ++i;
        continue;
      }
      auto c = make_kv_cache(model_.kv_shape(), s.cache_ctx, s.kv);
      if (!c) {
        s.out->push({ServeEvent::Kind::kError, -1, "", c.error()});
        std::lock_guard<std::mutex> lk(mu_);
        ++metrics_.failed;
        waiting_.erase(waiting_.begin() + std::ptrdiff_t(i));
        continue;
      }
      s.cache = std::move(*c);
      KvReport r;
      s.cache->report(&r);
      if (r.budget.floored) s.floored = true;
      if (opts_.cache_prompt) {
        if (s.id.empty()) s.id = fmt::format("auto-{}-{}", int64_t(::getpid()), next_auto_++);
        std::lock_guard<std::mutex> lk(mu_);
        ++metrics_.session_misses;
      }
    }
    s.logits.resize(size_t(model_.config().n_vocab));
    reserved_ += s.reserved;
    std::lock_guard<std::mutex> lk(mu_);
    if (s.floored) ++metrics_.budget_floored;
    metrics_.reserved_bytes = reserved_;
    for (size_t j = 0; j < i; ++j) ++waiting_[j]->overtaken;  // the ones it passed
    active_.push_back(std::move(waiting_[i]));
    waiting_.erase(waiting_.begin() + std::ptrdiff_t(i));
  }
}

void Scheduler::account(const Seq& s) {
  KvReport r;
  s.cache->report(&r);
  const KvLayerReport t = r.total();  // a resumed cache's counters include earlier turns'
  metrics_.evictions += t.evictions - s.base.evictions;
  metrics_.promotions += t.promotions - s.base.promotions;
  metrics_.demotions += t.demotions - s.base.demotions;
}

void Scheduler::finish(Seq& s, const std::string& reason) {
  s.done = true;
  // The conversation is kept (and written through) before its end is reported: a client
  // that has its answer can resume it, here or on another server sharing session_dir.
  if (opts_.cache_prompt) {
    {
      std::lock_guard<std::mutex> lk(mu_);
      account(s);
    }
    keep_session(s);
  }
  s.out->push({ServeEvent::Kind::kDone, -1, reason, ""});
  // Counted now: the server cancels a stream once it has sent it whole, which must not
  // turn an answered request into a cancelled one.
  std::lock_guard<std::mutex> lk(mu_);
  ++metrics_.finished;
}

void Scheduler::fail(Seq& s, const std::string& error) {
  s.out->push({ServeEvent::Kind::kError, -1, "", error});
  s.done = true;
  s.failed = true;
  std::lock_guard<std::mutex> lk(mu_);
  ++metrics_.failed;
}

void Scheduler::sample(Seq& s) {
  const int32_t tok = s.sampler->sample(s.logits.data(), model_.config().n_vocab);
  ++s.generated;
  {
    std::lock_guard<std::mutex> lk(mu_);
    ++metrics_.generated_tokens;
  }
  s.out_tokens.push_back(tok);
  const auto& stops = s.req.stop_tokens;
  if (std::find(stops.begin(), stops.end(), tok) != stops.end()) return finish(s, "stop");
  s.out->push({ServeEvent::Kind::kToken, tok, "", ""});
  if (s.generated >= s.req.max_tokens || s.cache->n_past() >= s.cache->n_ctx())
    return finish(s, "length");
  s.next = tok;
}

int pick_prefill(const std::vector<PrefillWait>& waits, int64_t limit) {
  int best = -1;
  for (int i = 0; i < int(waits.size()); ++i) {
    if (waits[i].overtaken >= limit) return i;
    if (best < 0 || waits[i].left < waits[best].left) best = i;
  }
  return best;
}

// Shortest remaining prompt first, not first come, first served: under the latter, short
// follow-ups of resumed conversations (a few hundred tokens) waited ~120 s behind 4K-token
// first turns. The bound (64 by default) lets a long first turn yield to dozens of one-chunk
// follow-ups, yet delays it by at most 64 chunks of later prompts (16K tokens at the default
// chunk, four times a 4K prompt's own 16): a steady stream of short prompts cannot starve it.
Scheduler::Seq* Scheduler::choose_prefill() {
  std::vector<Seq*> seqs;
  std::vector<PrefillWait> waits;
  for (auto& s : active_)  // in admission order
    if (!s->decoding && !s->done) {
      seqs.push_back(s.get());
      waits.push_back({int64_t(s->req.prompt.size()) - s->fed, s->overtaken});
    }
  const int i = pick_prefill(waits, opts_.prefill_overtake_limit);
  if (i < 0) return nullptr;
  for (int j = 0; j < i; ++j) ++seqs[j]->overtaken;  // those admitted before the chosen one
  return seqs[size_t(i)];
}

bool Scheduler::step() {
  admit();
  // Drop what ended: finished, failed, cancelled (the client went away).
  for (auto& s : active_) {
    if (s->out->cancelled() && !s->done) {
      s->done = true;
      {
        std::lock_guard<std::mutex> lk(mu_);
        ++metrics_.cancelled;
      }
      // A client that left after the prompt's end: its conversation is still whole.
      if (opts_.cache_prompt && s->decoding && s->cache) {
        {
          std::lock_guard<std::mutex> lk(mu_);
          account(*s);
        }
        keep_session(*s);
      }
    }
  }
  {
    std::lock_guard<std::mutex> lk(mu_);
    for (auto& s : active_)
      if (s->done) {
        if (s->cache) account(*s);
        reserved_ -= s->reserved;
        s->reserved = 0;
      }
    metrics_.reserved_bytes = reserved_;
    active_.erase(
        std::remove_if(active_.begin(), active_.end(), [](const auto& s) { return s->done; }),
        active_.end());
    metrics_.active = int64_t(active_.size());
  }
  update_held();

  std::vector<BatchSegment> segs;
  std::vector<Seq*> decoding;
  Seq* prefill = choose_prefill();
  int64_t chunk = 0;
  for (auto& s : active_) {
    if (s->decoding) {
      segs.push_back({s->cache.get(), &s->next, 1, false, s->logits.data()});
      decoding.push_back(s.get());
    } else if (s.get() == prefill) {
      chunk = std::min<int64_t>(opts_.prefill_chunk, int64_t(s->req.prompt.size()) - s->fed);
      const bool last = s->fed + chunk == int64_t(s->req.prompt.size());
      segs.push_back({s->cache.get(), s->req.prompt.data() + s->fed, chunk, false,
                      last ? s->logits.data() : nullptr});
    }
  }
  if (segs.empty()) return false;
  const auto t0 = std::chrono::steady_clock::now();
  const Status st = model_.forward(segs, pool_);
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (!st.is_ok()) {
    // Nothing was committed: every sequence of the batch fails with the reason.
    for (Seq* s : decoding) fail(*s, st.message());
    if (prefill) fail(*prefill, st.message());
    return true;
  }
  for (Seq* s : decoding) sample(*s);
  if (prefill) {
    prefill->fed += chunk;
    {
      std::lock_guard<std::mutex> lk(mu_);
      metrics_.prompt_tokens += chunk;
    }
    if (prefill->fed == int64_t(prefill->req.prompt.size())) {
      // The prompt is in: a cache with --prefill-route end compresses now (SPEC §4).
      const Status ep = end_prompts({prefill->cache.get()}, pool_);
      if (!ep.is_ok()) {
        fail(*prefill, ep.message());
      } else {
        prefill->decoding = true;
        settle_reservation(*prefill);
        sample(*prefill);
      }
    }
  }
  update_held();
  std::lock_guard<std::mutex> lk(mu_);
  ++metrics_.steps;
  if (!decoding.empty()) {
    metrics_.decode_seconds += secs;
    metrics_.decode_tokens += int64_t(decoding.size());
  }
  return true;
}

// The prompt is routed: a cache that held it (in f16 with --prefill-route end, at low bits
// with staged) until its end now holds at most its budget and a chunk — the bound of a
// conversation resumed with nothing new (reservation_bytes with every prompt token resumed) —
// so the rest of its reservation goes back to the pool for the requests waiting. Without it a
// fresh request kept its whole prompt's f16 reservation to its end: at 20 % of 8K contexts
// with 3K-token prompts, 18 streams in a pool that holds 31 at their real bound.
void Scheduler::settle_reservation(Seq& s) {
  if (!s.kv.defers_prompt()) return;
  const int64_t n = int64_t(s.req.prompt.size());
  auto b = reservation_bytes(model_.kv_shape(), n, s.req.max_tokens, s.kv, opts_.prefill_chunk, n);
  if (!b || *b >= s.reserved) return;
  reserved_ -= s.reserved - *b;
  s.reserved = *b;
  std::lock_guard<std::mutex> lk(mu_);
  metrics_.reserved_bytes = reserved_;
}

void Scheduler::update_held() {
  size_t held = 0, full = 0, quant = 0, sink = 0;
  std::vector<SlotInfo> slots;
  const int64_t now = int64_t(std::time(nullptr));
  for (auto& s : active_) {
    if (!s->cache) continue;  // finished: its cache is a session now
    held += s->cache->bytes_held();
    KvReport r;
    s->cache->report(&r);
    for (const auto& l : r.layers) {
      full += l.bytes_full;
      quant += l.bytes_quant;
      sink += l.bytes_sink;
    }
    if (opts_.cache_prompt && !s->done)
      slots.push_back({s->id, s->fed + int64_t(s->out_tokens.size()), s->cache->n_past(),
                       s->kv.policy, s->cache->bytes_held(), "active", now});
  }
  for (const auto& [id, e] : store_.entries())
    slots.push_back({id, int64_t(e.tokens.size()), e.n_past, e.kv.policy, e.bytes,
                     e.in_memory() ? "idle" : "on disk", e.last_used_unix});
  std::lock_guard<std::mutex> lk(mu_);
  metrics_.held_bytes = held;
  metrics_.held_full = full;
  metrics_.held_quant = quant;
  metrics_.held_sink = sink;
  metrics_.max_held_bytes = std::max(metrics_.max_held_bytes, held + store_.bytes());
  slots_ = std::move(slots);
}

std::vector<SlotInfo> Scheduler::slots() const {
  std::lock_guard<std::mutex> lk(mu_);
  return slots_;
}

void Scheduler::run(const std::atomic<bool>& stop) {
  while (!stop.load()) {
    if (step()) continue;
    std::unique_lock<std::mutex> lk(mu_);
    wake_.wait_for(lk, std::chrono::milliseconds(50),
                   [&] { return stop.load() || !waiting_.empty(); });
  }
}

}  // namespace qevict
