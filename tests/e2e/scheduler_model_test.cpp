// The server's continuous-batching scheduler (engine/scheduler.h) on the real model: requests
// that join the batch at different steps, with different prompt lengths, lengths and KV
// policies, decode exactly the greedy tokens that generate() gives each of them alone (on
// the exact matmul path; see the test); a cancelled request leaves and gives its
// reservation back; the bytes every cache holds never exceed the pool, and the
// reservations always cover them.
#include <gtest/gtest.h>

#include <vector>

#include "e2e/real_model_fixture.h"
#include "engine/generator.h"
#include "engine/scheduler.h"
#include "kernels/matmul.h"
#include "kvcache/factory.h"
#include "kvcache/registry.h"

namespace qevict {
namespace {

using SchedulerModel = RealModelTest;

KvCacheParams params(const std::string& policy, double budget) {
  KvCacheParams p;
  p.policy = policy;
  p.budget_fraction = budget;
  EXPECT_TRUE(apply_policy_defaults(&p, KvParamsGiven{}).is_ok());
  return p;
}

// generate() alone: the reference.
std::vector<int32_t> alone(Model& m, ThreadPool& pool, const ServeRequest& r) {
  auto c = make_kv_cache(m.kv_shape(), int64_t(r.prompt.size()) + r.max_tokens, r.kv);
  EXPECT_TRUE(c.has_value()) << c.error();
  std::vector<GenerationRequest> reqs(1);
  reqs[0].cache = c->get();
  reqs[0].prompt = r.prompt;
  reqs[0].n_predict = r.max_tokens;
  reqs[0].sampling = r.sampling;
  GenerateOptions o;
  o.prefill_chunk = 96;
  EXPECT_TRUE(generate(m, pool, reqs, o, nullptr, nullptr).is_ok());
  return reqs[0].output;
}

// A greedy request for tokens [from, from + len) of the golden text (FullKV unless kv says).
ServeRequest slice(const std::vector<int32_t>& tokens, int64_t from, int64_t len, int max_tokens,
                   const KvCacheParams& kv = params("full", 0)) {
  ServeRequest r;
  r.prompt.assign(tokens.begin() + from, tokens.begin() + from + len);
  r.max_tokens = max_tokens;
  r.sampling.temperature = 0.0f;
  r.kv = kv;
  return r;
}

// Drains a stream after step `step`: sets *first to the step of its first token (once) and
// *done when it ended.
void note(ServeStream& st, int step, int* first, bool* done) {
  ServeEvent e;
  while (st.next(&e, std::chrono::milliseconds(0))) {
    ASSERT_NE(int(e.kind), int(ServeEvent::Kind::kError)) << e.error;
    if (e.kind == ServeEvent::Kind::kToken && *first < 0) *first = step;
    if (e.kind != ServeEvent::Kind::kToken) *done = true;
  }
}

// The prompt-order tests' server: 512-token contexts in 64 MiB, prompts read 16 tokens a
// step, a prompt overtaken `overtake_limit` times by later ones read first.
SchedulerOptions sixteen_token_chunks(
    int overtake_limit = SchedulerOptions{}.prefill_overtake_limit) {
  SchedulerOptions so;
  so.n_ctx = 512;
  so.kv_pool_bytes = size_t(64) << 20;
  so.prefill_chunk = 16;
  so.prefill_overtake_limit = overtake_limit;
  return so;
}

TEST_F(SchedulerModel, JoiningRequestsDecodeWhatEachDecodesAlone) {
  // Exact only on the exact matmul path: the AMX prefill path and the 8-bit decode path (on
  // by default where the CPU has them) round a token's products differently when 32 or more
  // tokens share its batch (the one takes calls of >= 32 tokens, the other those below).
  const MatmulPaths exact(/*amx=*/false, /*q8=*/false);
  SamplingParams greedy;
  greedy.temperature = 0.0f;
  struct Case {
    int64_t from, len;
    int max_tokens;
    KvCacheParams kv;
    int join_at_step;
  };
  const std::vector<Case> cases = {
      {0, 200, 12, params("full", 0), 0},
      {40, 330, 20, params("qevict", 0.5), 0},
      {7, 90, 6, params("h2o", 0.6), 3},
      // SnapKV's budget also holds its 32 observation queries per layer (73.7 KB on SmolLM2):
      // a short context needs a large fraction.
      {100, 300, 10, params("snapkv", 0.9), 9},
  };
  SchedulerOptions so;
  so.n_ctx = 1024;
  so.kv_pool_bytes = size_t(64) << 20;
  so.prefill_chunk = 96;
  Scheduler sched(*model_, pool_, so);
  std::vector<ServeRequest> reqs;
  std::vector<std::shared_ptr<ServeStream>> streams(cases.size());
  for (const Case& c : cases) {
    ServeRequest r;
    r.prompt.assign(tokens_.begin() + c.from, tokens_.begin() + c.from + c.len);
    r.max_tokens = c.max_tokens;
    r.sampling = greedy;
    r.kv = c.kv;
    reqs.push_back(r);
  }
  // A request that is cancelled after its first token.
  ServeRequest gone = reqs[0];
  gone.max_tokens = 50;
  std::shared_ptr<ServeStream> gone_stream;
  std::vector<std::vector<int32_t>> got(cases.size());
  std::vector<bool> done(cases.size(), false);
  for (int step = 0; step < 400; ++step) {
    for (size_t i = 0; i < cases.size(); ++i)
      if (!streams[i] && cases[i].join_at_step == step) {
        SubmitResult s = sched.submit(reqs[i]);
        ASSERT_NE(s.stream, nullptr) << s.error;
        streams[i] = s.stream;
      }
    if (step == 1) gone_stream = sched.submit(gone).stream;
    const bool ran = sched.step();
    const SchedulerMetrics m = sched.metrics();
    EXPECT_LE(m.held_bytes, so.kv_pool_bytes) << "step " << step;
    EXPECT_LE(m.held_bytes, m.reserved_bytes)
        << "step " << step << ": a cache outgrew its reservation";
    for (size_t i = 0; i < cases.size(); ++i) {
      ServeEvent e;
      while (streams[i] && streams[i]->next(&e, std::chrono::milliseconds(0))) {
        ASSERT_NE(int(e.kind), int(ServeEvent::Kind::kError)) << e.error;
        if (e.kind == ServeEvent::Kind::kToken) got[i].push_back(e.token);
        if (e.kind == ServeEvent::Kind::kDone) done[i] = true;
      }
    }
    ServeEvent e;
    if (gone_stream && gone_stream->next(&e, std::chrono::milliseconds(0))) gone_stream->cancel();
    if (!ran && step > 10) break;
  }
  for (size_t i = 0; i < cases.size(); ++i) {
    EXPECT_TRUE(done[i]) << "request " << i;
    EXPECT_EQ(got[i], alone(*model_, pool_, reqs[i]))
        << "request " << i << " (" << reqs[i].kv.policy << ")";
  }
  const SchedulerMetrics m = sched.metrics();
  EXPECT_EQ(m.cancelled, 1);
  EXPECT_EQ(m.finished, int64_t(cases.size()));
  EXPECT_EQ(m.reserved_bytes, 0u);
  EXPECT_EQ(m.active, 0);
}

// Conversation reuse under a short pool: a request short of room only because of an idle
// conversation waits while another request runs (that one gives its reservation back when it
// ends, keeping its own conversation compressed) instead of dropping the idle conversation.
// (With nothing running, the least recently used make way: ServeSession's eviction test.)
TEST_F(SchedulerModel, IdleConversationsAreNotDroppedWhileRunningRequestsWillGiveRoomBack) {
  SamplingParams greedy;
  greedy.temperature = 0.0f;
  auto request = [&](int64_t from, const std::string& id, int max_tokens) {
    ServeRequest r;
    r.prompt.assign(tokens_.begin() + from, tokens_.begin() + from + 300);
    r.max_tokens = max_tokens;
    r.sampling = greedy;
    r.kv = params("qevict", 0.2);
    r.session_id = id;
    return r;
  };
  SchedulerOptions so;
  so.n_ctx = 1024;
  so.prefill_chunk = 96;
  so.cache_prompt = true;
  auto drain = [](Scheduler& sched, const std::shared_ptr<ServeStream>& st) {
    for (int step = 0; step < 400; ++step) {
      sched.step();
      ServeEvent e;
      while (st->next(&e, std::chrono::milliseconds(0))) {
        EXPECT_NE(int(e.kind), int(ServeEvent::Kind::kError)) << e.error;
        if (e.kind == ServeEvent::Kind::kDone) return true;
      }
    }
    return false;
  };
  // A probe with room to spare: an idle conversation's bytes and a running request's
  // reservation (every request here has the same length and policy).
  size_t idle = 0, reserve = 0, settled = 0;
  {
    SchedulerOptions big = so;
    big.kv_pool_bytes = size_t(256) << 20;
    Scheduler probe(*model_, pool_, big);
    ASSERT_TRUE(drain(probe, probe.submit(request(0, "a", 4)).stream));
    idle = probe.metrics().session_bytes;
    auto st = probe.submit(request(300, "b", 4)).stream;
    probe.step();
    reserve = probe.metrics().reserved_bytes;
    ServeEvent e;
    for (int step = 0; step < 20 && !st->next(&e, std::chrono::milliseconds(0)); ++step)
      probe.step();
    settled = probe.metrics().reserved_bytes;  // b decoding: its prompt routed
  }
  ASSERT_GT(idle, 0u);
  ASSERT_GT(reserve, idle);
  ASSERT_LT(settled, reserve);
  ASSERT_GE(settled, idle + idle / 2);  // c fits beside the two idle conversations at the end
  // Room for a running request being read and one routed, not for them and the idle
  // conversation.
  so.kv_pool_bytes = reserve + settled + idle / 2;
  Scheduler sched(*model_, pool_, so);
  ASSERT_TRUE(drain(sched, sched.submit(request(0, "a", 4)).stream));
  ASSERT_EQ(sched.metrics().sessions_in_memory, 1);
  auto b = sched.submit(request(300, "b", 24)).stream;  // runs a while
  sched.step();
  ASSERT_EQ(sched.metrics().active, 1);
  auto c = sched.submit(request(600, "c", 4)).stream;
  bool b_done = false;
  for (int step = 0; step < 400 && !b_done; ++step) {
    sched.step();
    const SchedulerMetrics m = sched.metrics();
    ServeEvent e;
    while (b->next(&e, std::chrono::milliseconds(0)))
      if (e.kind == ServeEvent::Kind::kDone) b_done = true;
    if (b_done) break;
    EXPECT_EQ(m.sessions_dropped, 0) << "step " << step << ": an idle conversation dropped";
    EXPECT_EQ(m.waiting, 1) << "step " << step << ": c admitted beside b";
    EXPECT_EQ(m.sessions_in_memory, 1) << "step " << step;
  }
  ASSERT_TRUE(b_done);
  // b's reservation came back and b is kept compressed: c fits beside both conversations.
  ASSERT_TRUE(drain(sched, c));
  const SchedulerMetrics m = sched.metrics();
  EXPECT_EQ(m.sessions_dropped, 0);
  EXPECT_EQ(m.sessions_in_memory, 3);
  EXPECT_EQ(m.finished, 3);
  EXPECT_LE(m.session_bytes + m.reserved_bytes, so.kv_pool_bytes);
}

// A prompt routed at its end gives back what it no longer needs (Scheduler::settle_reservation):
// in a pool with room for one fresh 300-token prompt at 20 % and one routed, a second request
// is read while the first decodes; before, it waited for the first to finish (each kept its
// whole prompt's f16 reservation to its end).
TEST_F(SchedulerModel, ARoutedPromptGivesBackWhatItNoLongerNeeds) {
  auto request = [&](int64_t from, int max_tokens) {
    return slice(tokens_, from, 300, max_tokens, params("qevict", 0.2));
  };
  SchedulerOptions so;
  so.n_ctx = 1024;
  so.prefill_chunk = 96;
  const ServeRequest a = request(0, 40), b = request(300, 40);
  auto fresh = reservation_bytes(model_->kv_shape(), 300, 40, a.kv, so.prefill_chunk);
  auto routed = reservation_bytes(model_->kv_shape(), 300, 40, a.kv, so.prefill_chunk, 300);
  ASSERT_TRUE(fresh && routed);
  ASSERT_LT(*routed, *fresh);
  so.kv_pool_bytes = *fresh + *routed + (*routed / 10);  // not two fresh ones
  ASSERT_LT(so.kv_pool_bytes, 2 * *fresh);
  Scheduler sched(*model_, pool_, so);
  auto as = sched.submit(a).stream, bs = sched.submit(b).stream;
  ASSERT_TRUE(as && bs);
  int a_first = -1, b_first = -1;
  bool a_done = false, b_done = false;
  for (int step = 0; step < 200 && !(a_done && b_done); ++step) {
    ASSERT_TRUE(sched.step());
    note(*as, step, &a_first, &a_done);
    note(*bs, step, &b_first, &b_done);
    const SchedulerMetrics m = sched.metrics();
    EXPECT_LE(m.held_bytes, so.kv_pool_bytes) << "step " << step;
    EXPECT_LE(m.held_bytes, m.reserved_bytes) << "step " << step << ": a cache outgrew it";
  }
  ASSERT_TRUE(a_done && b_done);
  EXPECT_EQ(a_first, 3) << "a's 4 chunks";
  EXPECT_EQ(b_first, 7) << "b read while a decodes (a has 40 tokens to go)";
  sched.step();  // what ended gives its reservation back
  EXPECT_EQ(sched.metrics().reserved_bytes, 0u);
}

// Admission past a request that does not fit (Scheduler::admit): with a 300-token prompt being
// read, a second one waits for room, and a 32-token request behind it that fits is admitted
// and answered at once; with a bound of 0 (first come, first served) it waits behind the
// second until the first has finished.
TEST_F(SchedulerModel, ARequestThatFitsIsAdmittedPastOneThatDoesNot) {
  auto request = [&](int64_t from, int64_t len, int max_tokens) {
    return slice(tokens_, from, len, max_tokens, params("qevict", 0.2));
  };
  const ServeRequest a = request(0, 300, 30), b = request(300, 300, 4), c = request(600, 32, 4);
  auto fresh = reservation_bytes(model_->kv_shape(), 300, 30, a.kv, 96);
  auto small = reservation_bytes(model_->kv_shape(), 32, 4, c.kv, 96);
  ASSERT_TRUE(fresh && small);
  for (int limit : {64, 0}) {
    SchedulerOptions so = sixteen_token_chunks(limit);
    so.prefill_chunk = 96;
    so.n_ctx = 1024;
    so.kv_pool_bytes = *fresh + *small + *small / 10;  // a + c, never a + b
    Scheduler sched(*model_, pool_, so);
    auto as = sched.submit(a).stream;
    ASSERT_TRUE(sched.step());  // a's first chunk
    auto bs = sched.submit(b).stream, cs = sched.submit(c).stream;
    ASSERT_TRUE(as && bs && cs);
    int a_first = -1, b_first = -1, c_first = -1, a_end = -1;
    bool a_done = false, b_done = false, c_done = false;
    for (int step = 1; step < 200 && !(a_done && b_done && c_done); ++step) {
      sched.step();  // false for a step when one ended and the next is not yet admitted
      note(*as, step, &a_first, &a_done);
      note(*bs, step, &b_first, &b_done);
      note(*cs, step, &c_first, &c_done);
      if (a_done && a_end < 0) a_end = step;
      EXPECT_LE(sched.metrics().held_bytes, so.kv_pool_bytes) << "step " << step;
    }
    ASSERT_TRUE(a_done && b_done && c_done) << "limit " << limit;
    if (limit > 0) {
      EXPECT_EQ(c_first, 1) << "c admitted past b and read before a's last chunks";
    } else {
      EXPECT_GT(c_first, a_end) << "first come, first served: c waits behind b";
    }
    EXPECT_GT(b_first, a_first) << "limit " << limit;
  }
}

// Shortest remaining prompt first (Scheduler::choose_prefill): a one-chunk prompt admitted
// while a ten-chunk one is being read is read at the next step; under first come, first
// served it answered only after the long prompt's every chunk (step 10, the long one at 9).
TEST_F(SchedulerModel, AShortPromptIsReadBeforeALongOneAdmittedEarlier) {
  Scheduler sched(*model_, pool_, sixteen_token_chunks());
  auto long_st = sched.submit(slice(tokens_, 0, 160, 2)).stream;
  ASSERT_NE(long_st, nullptr);
  ASSERT_TRUE(sched.step());  // its first chunk
  auto short_st = sched.submit(slice(tokens_, 200, 16, 2)).stream;
  ASSERT_NE(short_st, nullptr);
  int first_long = -1, first_short = -1;
  bool long_done = false, short_done = false;
  for (int step = 1; step < 40 && !(long_done && short_done); ++step) {
    ASSERT_TRUE(sched.step());
    note(*long_st, step, &first_long, &long_done);
    note(*short_st, step, &first_short, &short_done);
  }
  EXPECT_TRUE(long_done && short_done);
  EXPECT_EQ(first_short, 1) << "the short prompt waited for the long one";
  EXPECT_EQ(first_long, 10) << "its 9 chunks left, one step later for the short prompt";
  EXPECT_EQ(sched.metrics().finished, 2);
}

// The starvation bound (SchedulerOptions::prefill_overtake_limit): a four-chunk prompt with a
// one-chunk prompt arriving before every step yields to the first 3 (the limit) and is then
// read to its end; with no bound it would wait as long as short prompts kept coming.
TEST_F(SchedulerModel, ALongPromptOvertakenLimitTimesIsReadFirst) {
  Scheduler sched(*model_, pool_, sixteen_token_chunks(3));
  auto long_st = sched.submit(slice(tokens_, 0, 64, 2)).stream;
  ASSERT_NE(long_st, nullptr);
  std::vector<std::shared_ptr<ServeStream>> shorts;
  int first_long = -1;
  bool long_done = false;
  for (int step = 0; step < 20 && !long_done; ++step) {
    shorts.push_back(sched.submit(slice(tokens_, 100 + 16 * step, 16, 1)).stream);
    ASSERT_NE(shorts.back(), nullptr);
    ASSERT_TRUE(sched.step());
    note(*long_st, step, &first_long, &long_done);
  }
  EXPECT_EQ(first_long, 3 + 4 - 1) << "3 short prompts first, then its 4 chunks";
  // Every short prompt that was read answered (those after step 2 waited for the long one).
  for (int step = 0; step < 20; ++step) sched.step();
  for (size_t i = 0; i < shorts.size(); ++i) {
    int first = -1;
    bool done = false;
    note(*shorts[i], 0, &first, &done);
    EXPECT_TRUE(done) << "short prompt " << i;
  }
}

// Only a prompt admitted later overtakes: two equal prompts are read one after the other in
// admission order even with a limit of 1 (the second is never counted as overtaken by the
// first, so the two do not take turns chunk by chunk).
TEST_F(SchedulerModel, WaitingForAnEarlierPromptIsNotBeingOvertaken) {
  Scheduler sched(*model_, pool_, sixteen_token_chunks(1));
  auto a = sched.submit(slice(tokens_, 0, 64, 1)).stream;
  auto b = sched.submit(slice(tokens_, 100, 64, 1)).stream;
  ASSERT_TRUE(a && b);
  int first_a = -1, first_b = -1;
  bool a_done = false, b_done = false;
  for (int step = 0; step < 20 && !(a_done && b_done); ++step) {
    ASSERT_TRUE(sched.step());
    note(*a, step, &first_a, &a_done);
    note(*b, step, &first_b, &b_done);
  }
  EXPECT_EQ(first_a, 3);
  EXPECT_EQ(first_b, 7);
}

}  // namespace
}  // namespace qevict
