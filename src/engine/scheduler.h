// Continuous batching for the server (issue 12): requests join and leave the decode batch at
// any step, prompt chunks interleave with decode steps, and every sequence's KV cache draws
// its bytes from one pool. One thread calls step() (or run()); any thread submits requests
// and reads their events from a ServeStream.
//
// The pool: a request is admitted only when its reservation fits in what the pool has left;
// otherwise it waits in a bounded queue (submit() refuses, HTTP 429, when that is full). A
// reservation is the most the request's cache can hold (reservation_bytes): a FullKV cache
// its whole context in 16 bits; a quantizer (kivi, zipcache: no budget, every token in f16
// until its rule runs) the same plus its one-layer scratch; a budgeted cache its budget plus
// one prefill chunk, or the whole prompt when it keeps every prompt token until the prompt
// ends (--prefill-route end) — for a resumed conversation only the new turn's tokens over
// its budget (its earlier turns are already routed); each plus a stated per-cache constant.
// Once a deferred prompt is routed, its reservation shrinks to the budget plus a chunk. A
// finished, failed or cancelled request gives its reservation back at the next step. So long and
// short conversations, FullKV, quantized and budgeted, share one pool by what each can really hold,
// and the bytes held never exceed the pool.
//
// Conversation reuse (SchedulerOptions::cache_prompt, issue 50 item 2, as llama-server's
// --cache-prompt): a finished request's cache and history stay as an idle session
// (engine/session_store.h); a request whose prompt shares a long enough prefix with one resumes
// it, rewinding when the cache can, and prefills only its new tokens (in chunks, then the
// prompt's end, as Session::append). Idle sessions are held in the pool at their real bytes:
// reservations of the admitted requests + bytes of the idle sessions <= the pool. An admission
// short of room only because of idle sessions waits while requests run (they give room back
// and keep their conversations); with none running it writes idle sessions to session_dir (or
// drops them), least recently used first; a request for a session on disk restores it exactly
// (Session::deserialize). A session named by the client (ServeRequest::session_id) is also written
// through to session_dir/<id>.qvs at the end of each turn, before the request's end is reported, so
// that another server sharing the directory can resume it. Only a policy whose cache can write its
// state (FullKV, the tiered cache) is written; other sessions are dropped instead.
// With reuse on, a cache is made for the server's whole context (n_ctx) so that a conversation
// can grow, and a budget given as a fraction is first made bytes, of the request's own context
// (prompt + max_tokens): the budget a request gets does not change. A session is resumed only
// by a request whose params (with the budget so made bytes) equal its own: a fraction budget
// of a longer conversation is a larger budget, hence a miss; give budgets in bytes to reuse
// compressed conversations.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "core/status.h"
#include "core/thread_pool.h"
#include "engine/sampling.h"
#include "engine/session_store.h"
#include "kvcache/kv_cache.h"
#include "kvcache/params.h"
#include "model/model.h"

namespace qevict {

struct ServeRequest {
  std::vector<int32_t> prompt;  // non-empty
  int max_tokens = 16;          // generate at most this many tokens
  SamplingParams sampling;
  std::vector<int32_t> stop_tokens;  // end of generation (not emitted)
  KvCacheParams kv;                  // validated, the policy's defaults applied
  std::string session_id;            // the conversation (empty: matched by prefix alone)
};

struct ServeEvent {
  enum class Kind { kToken, kDone, kError };
  Kind kind = Kind::kToken;
  int32_t token = -1;         // kToken
  std::string finish_reason;  // kDone: "stop" | "length"
  std::string error;          // kError
};

// One request's events, produced by the scheduler thread and read by its client's thread.
class ServeStream {
 public:
  // Waits up to `timeout` for the next event; false when none came.
  bool next(ServeEvent* e, std::chrono::milliseconds timeout);
  // The client is gone: the scheduler drops the sequence and frees its bytes at its next step.
  void cancel() { cancelled_.store(true); }
  bool cancelled() const { return cancelled_.load(); }
  int64_t prompt_tokens() const { return prompt_tokens_; }
  // Prompt tokens reused from a session (not prefilled); set when the request is admitted,
  // before its first event.
  int64_t cached_tokens() const { return cached_.load(); }

 private:
  friend class Scheduler;
  void push(ServeEvent e);
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<ServeEvent> q_;
  std::atomic<bool> cancelled_{false};
  int64_t prompt_tokens_ = 0;
  std::atomic<int64_t> cached_{0};
};

struct SchedulerOptions {
  int64_t n_ctx = 8192;      // per sequence: prompt + max_tokens at most
  size_t kv_pool_bytes = 0;  // every cache together (> 0)
  int max_queue = 64;        // waiting requests; beyond, submit() refuses
  int max_batch = 32;        // sequences admitted at once
  int prefill_chunk = 256;   // prompt tokens per step (one prompt per step)
  // The starvation bound of the prefill order (pick_prefill): how many steps' chunks may go to
  // prompts admitted after a waiting prompt before it goes first; and of admission: how many
  // later requests may be admitted past one that does not fit before nothing more is.
  // 0 is first come, first served.
  int prefill_overtake_limit = 64;
  // Conversation reuse (see the file comment).
  bool cache_prompt = false;
  std::string session_dir;          // idle sessions evicted from memory, and named ones, go here
  int max_sessions = 16;            // idle sessions in memory at most
  int64_t min_reuse_tokens = 32;    // a shorter reuse is a miss
  double min_reuse_fraction = 0.5;  // so is reusing less than this share of the session
  Status validate() const;
};

struct SchedulerMetrics {
  int64_t requests = 0, refused_queue_full = 0, finished = 0, cancelled = 0, failed = 0;
  // Admitted requests whose budget fraction was below the policy's fixed regions (a short
  // context): their cache got the smallest valid budget instead (KvBudget::floored).
  int64_t budget_floored = 0;
  int64_t prompt_tokens = 0, generated_tokens = 0, steps = 0;
  int64_t waiting = 0, active = 0;
  size_t pool_bytes = 0, reserved_bytes = 0;
  size_t held_bytes = 0, held_full = 0, held_quant = 0, held_sink = 0;  // after the last step
  size_t max_held_bytes = 0;                             // the most held after any step
  int64_t evictions = 0, promotions = 0, demotions = 0;  // of finished and active sequences
  double decode_seconds = 0.0;                           // wall time of steps that decoded
  int64_t decode_tokens = 0;                             // tokens those steps generated
  // Conversation reuse.
  int64_t sessions_in_memory = 0, sessions_on_disk = 0;
  int64_t session_hits = 0, session_misses = 0, reused_tokens = 0;
  int64_t sessions_written = 0, sessions_dropped = 0, sessions_restored = 0;
  size_t session_bytes = 0, session_full = 0, session_quant = 0, session_sink = 0;
};

// One conversation, as GET /slots lists it.
struct SlotInfo {
  std::string id;
  int64_t tokens = 0, n_past = 0;
  std::string policy;
  size_t bytes = 0;
  std::string state;      // "active" | "idle" | "on disk"
  int64_t last_used = 0;  // Unix seconds
};

// What submit() says: a stream, or the HTTP status and message of a refusal.
struct SubmitResult {
  std::shared_ptr<ServeStream> stream;
  int status = 200;  // 400: can never be served; 429: queue full
  std::string error;
};

// The most bytes a cache for `prompt_len` + `max_tokens` tokens with params p can hold (see
// the file comment), `resumed` of the prompt's tokens already in it; errors when the params
// cannot make a cache.
Expected<size_t> reservation_bytes(const KvShape& shape, int64_t prompt_len, int max_tokens,
                                   const KvCacheParams& p, int prefill_chunk, int64_t resumed = 0);

// One prompt still being read, as pick_prefill sees it.
struct PrefillWait {
  int64_t left = 0;       // prompt tokens not yet given to the model
  int64_t overtaken = 0;  // steps whose chunk went to a prompt admitted after this one
};

// Which prompt gets this step's chunk, `waits` in admission order: shortest remaining prompt
// first (the earlier admitted on a tie), so that a short follow-up is not read after long
// first turns; but a prompt overtaken `limit` times goes first (the earliest admitted such),
// so no prompt waits more than `limit` steps for prompts admitted after it. -1 when empty.
int pick_prefill(const std::vector<PrefillWait>& waits, int64_t limit);

class Scheduler {
 public:
  Scheduler(Model& model, ThreadPool& pool, const SchedulerOptions& opts);
  ~Scheduler();

  // Thread-safe. Queues the request, or refuses it (see SubmitResult).
  SubmitResult submit(ServeRequest r);
  // Scheduler thread only. Admits waiting requests that fit the pool, drops cancelled ones,
  // then runs one forward call over every decoding sequence's next token and at most one
  // prompt chunk (of the prompt pick_prefill chooses). False when there was nothing to run.
  bool step();
  // Calls step() until `stop`; sleeps while idle until a request arrives.
  void run(const std::atomic<bool>& stop);
  void wake();
  SchedulerMetrics metrics() const;
  // Every conversation (the running requests and the stored sessions), after the last step.
  std::vector<SlotInfo> slots() const;

 private:
  struct Seq;
  void admit();
  void finish(Seq& s, const std::string& reason);
  void fail(Seq& s, const std::string& error);
  void sample(Seq& s);
  void account(const Seq& s);
  void update_held();     // metrics_.held_* from the active caches, and the slots
  Seq* choose_prefill();  // this step's prompt (pick_prefill), or null
  // Conversation reuse (scheduler_sessions.cpp).
  struct Resolved {
    KvCacheParams kv;
    int64_t n_ctx = 0;
    bool floored = false;
  };
  Expected<Resolved> resolve(const ServeRequest& r) const;
  std::optional<SessionMatch> find_session(Seq& s);
  bool restore(const std::string& id, const std::string& path, bool named);
  // Room for `need` more reserved bytes: false (wait) when running requests hold it, or, with
  // wait_for_running, when idle sessions do while any request runs; else evicts idle sessions
  // (least recently used first, never `except`) until it fits.
  bool make_room(size_t need, const std::string& except, bool wait_for_running = true);
  void evict(const std::string& id);
  void keep_session(Seq& s);
  Status write_session(SessionEntry& e, const std::string& path);
  std::string session_path(const std::string& id) const;
  bool resume(Seq& s, const SessionMatch& m);
  // What s reserves when it resumes m's session (its budget + the new tokens; see
  // max_cache_bytes).
  size_t resumed_reservation(const Seq& s, const SessionMatch& m) const;
  // Once s's prompt is routed, shrinks its reservation to the routed bound (scheduler.cpp).
  void settle_reservation(Seq& s);
  void count_sessions();

  Model& model_;
  ThreadPool& pool_;
  SchedulerOptions opts_;
  mutable std::mutex mu_;  // waiting_, metrics_
  std::condition_variable wake_;
  std::deque<std::unique_ptr<Seq>> waiting_;
  std::vector<std::unique_ptr<Seq>> active_;  // scheduler thread only
  SessionStore store_;                        // scheduler thread only
  size_t reserved_ = 0;                       // scheduler thread's copy of reserved_bytes
  int64_t next_auto_ = 1;
  SchedulerMetrics metrics_;
  std::vector<SlotInfo> slots_;  // mu_
};

}  // namespace qevict
