// Conversation reuse in qevict serve (issue 50 item 2; engine/scheduler.h) on the real model,
// over a real socket: a second turn prefills only its new tokens (usage's cached_tokens, and
// /metrics' prompt tokens processed = prompt − cached) and, on FullKV with greedy decoding,
// answers exactly what a server without reuse answers; a tiered cache with its budget in bytes
// resumes too; idle sessions evicted from the pool go to --session-dir and come back exactly
// (the file's bytes re-serialized after a restore are the file); a conversation named by
// X-Session-Id is resumed by another server sharing the directory (a failover).
#include <gtest/gtest.h>

#include <filesystem>
#include <nlohmann/json.hpp>

#include "e2e/e2e_process.h"
#include "e2e/real_model_fixture.h"
#include "engine/scheduler.h"
#include "engine/session.h"
#include "tokenizer/tokenizer.h"

namespace qevict {
namespace {

using json = nlohmann::json;
namespace fs = std::filesystem;
using ServeSession = RealModelTest;

SchedulerOptions options(bool reuse, const std::string& dir = "", int max_sessions = 16,
                         size_t pool = size_t(256) << 20) {
  SchedulerOptions so;
  so.n_ctx = 2048;
  so.kv_pool_bytes = pool;
  so.max_batch = 2;
  so.cache_prompt = reuse;
  so.session_dir = dir;
  so.max_sessions = max_sessions;
  return so;
}

// The server of these tests: model id smol.gguf, the model's chat template.
class Running : public RunningServer {
 public:
  Running(Model& model, ThreadPool& pool, const Tokenizer& tok, const SchedulerOptions& so)
      : RunningServer(model, pool, tok, so,
                      model.gguf().get_string_or("tokenizer.chat_template", ""), "smol.gguf") {}
};

std::string long_text() {
  std::string s = "Here are my notes from the trip. ";
  const char* lines[] = {
      "On Monday we walked along the river to the old mill and had lunch by the water. ",
      "Tuesday was rainy, so we visited the museum of clocks and the small library. ",
      "On Wednesday the train to the mountains was late, but the view made up for it. ",
      "Thursday we hiked to the lake, counted eleven boats and saw a heron. ",
      "Friday we packed, bought bread for the journey and said goodbye to the hosts. "};
  for (int i = 0; i < 3; ++i)
    for (const char* l : lines) s += l;
  return s;
}

json turn_body(const json& messages, const json& extra = json::object()) {
  json b = {{"messages", messages}, {"max_tokens", 24}, {"temperature", 0}};
  for (auto it = extra.begin(); it != extra.end(); ++it) b[it.key()] = it.value();
  return b;
}

json first_messages() {
  return json::array({json{{"role", "system"}, {"content", "You are a helpful assistant."}},
                      json{{"role", "user"}, {"content", long_text() + "What day was rainy?"}}});
}

json second_messages(const std::string& answer) {
  json m = first_messages();
  m.push_back({{"role", "assistant"}, {"content", answer}});
  m.push_back({{"role", "user"}, {"content", "And where did we see a heron?"}});
  return m;
}

std::string content(const json& r) { return r["choices"][0]["message"]["content"]; }
int64_t cached(const json& r) { return r["usage"]["prompt_tokens_details"]["cached_tokens"]; }

// Turn 1 and turn 2 of the conversation on a server without reuse: the reference answers.
std::pair<std::string, std::string> reference(Model& m, ThreadPool& pool, const Tokenizer& tok) {
  Running off(m, pool, tok, options(false));
  const json r1 = off.chat(turn_body(first_messages()));
  const json r2 = off.chat(turn_body(second_messages(content(r1))));
  EXPECT_EQ(cached(r2), 0) << r2;
  return {content(r1), content(r2)};
}

TEST_F(ServeSession, SecondTurnPrefillsOnlyItsNewTokensAndAnswersAsWithoutReuse) {
  // Exact matmul paths: a token's logits then do not depend on its batch (what a resumed
  // prefill changes), so FullKV's greedy answers must be identical.
  const MatmulPaths exact(/*amx=*/false, /*q8=*/false);
  auto tok = Tokenizer::from_gguf(model_->gguf());
  ASSERT_TRUE(tok) << tok.error();
  const auto [ref1, ref2] = reference(*model_, pool_, *tok);

  Running on(*model_, pool_, *tok, options(true));
  const json r1 = on.chat(turn_body(first_messages()));
  ASSERT_TRUE(r1.contains("choices")) << r1;
  EXPECT_EQ(content(r1), ref1);
  EXPECT_EQ(cached(r1), 0);
  const int64_t p1 = r1["usage"]["prompt_tokens"];
  const double before = on.metric("prompt_tokens_total");
  const json r2 = on.chat(turn_body(second_messages(content(r1))));
  ASSERT_TRUE(r2.contains("choices")) << r2;
  const int64_t p2 = r2["usage"]["prompt_tokens"], c2 = cached(r2);
  EXPECT_GE(c2, p1) << "turn 1's prompt is a prefix of turn 2's";
  EXPECT_LT(c2, p2);
  EXPECT_EQ(on.metric("prompt_tokens_total") - before, double(p2 - c2));
  EXPECT_EQ(content(r2), ref2);
  EXPECT_EQ(on.metric("session_hits_total"), 1);
  EXPECT_EQ(on.metric("session_misses_total"), 1);
  EXPECT_EQ(on.metric("prompt_tokens_reused_total"), double(c2));
  EXPECT_GT(on.metric("session_bytes"), 0);

  // Turn 3, streamed: the usage chunk carries the cached tokens too.
  json m3 = second_messages(content(r1));
  m3.push_back({{"role", "assistant"}, {"content", content(r2)}});
  m3.push_back({{"role", "user"}, {"content", "Thanks."}});
  const json s3 =
      on.chat(turn_body(m3, {{"stream", true}, {"stream_options", {{"include_usage", true}}}}));
  const std::string sse = s3.value("sse", "");
  const size_t at = sse.find("\"prompt_tokens_details\":{\"cached_tokens\":");
  ASSERT_NE(at, std::string::npos) << sse;
  EXPECT_GE(std::stoll(sse.substr(at + 41)), p2) << sse;

  // GET /slots: the one conversation, idle, FullKV.
  const json sl = on.slots();
  ASSERT_EQ(sl.size(), 1u) << sl;
  EXPECT_EQ(sl[0]["state"], "idle");
  EXPECT_EQ(sl[0]["policy"], "full");
  EXPECT_GT(sl[0]["tokens"].get<int64_t>(), p2);
  EXPECT_GT(sl[0]["bytes_held"].get<int64_t>(), 0);
  EXPECT_LE(on.metrics().max_held_bytes, on.metrics().pool_bytes);
}

TEST_F(ServeSession, TieredCacheResumesWithABudgetInBytesOrAFraction) {
  auto tok = Tokenizer::from_gguf(model_->gguf());
  ASSERT_TRUE(tok) << tok.error();
  Running on(*model_, pool_, *tok, options(true));
  for (const json& kv : {json{{"kv_policy", "qevict"}, {"kv_budget_bytes", 150000}},
                         json{{"kv_policy", "qevict"}, {"kv_budget", 0.5}}}) {
    SCOPED_TRACE(kv.dump());
    const json r1 = on.chat(turn_body(first_messages(), kv));
    ASSERT_TRUE(r1.contains("choices")) << r1;
    const json r2 = on.chat(turn_body(second_messages(content(r1)), kv));
    ASSERT_TRUE(r2.contains("choices")) << r2;
    EXPECT_GT(r2["usage"]["completion_tokens"].get<int64_t>(), 0);
    // Both resume: a fraction budget keeps the conversation's first byte budget.
    EXPECT_GE(cached(r2), r1["usage"]["prompt_tokens"].get<int64_t>());
  }
  EXPECT_LE(on.metrics().max_held_bytes, on.metrics().pool_bytes);
}

TEST_F(ServeSession, EvictedSessionsGoToTheSessionDirAndComeBackExactly) {
  const MatmulPaths exact(/*amx=*/false, /*q8=*/false);
  auto tok = Tokenizer::from_gguf(model_->gguf());
  ASSERT_TRUE(tok) << tok.error();
  const auto [ref1, ref2] = reference(*model_, pool_, *tok);
  const fs::path dir = fresh_dir("qevict-serve-evict");
  // A pool of 20 MB: a FullKV request of ~560 tokens (23 KB a token on SmolLM2-135M) reserves
  // ~13 MB and its session holds ~12.5 MB, so the next conversation's admission must evict it.
  Running on(*model_, pool_, *tok, options(true, dir.string(), 16, size_t(20) << 20));
  const json a1 = on.chat(turn_body(first_messages()));
  ASSERT_TRUE(a1.contains("choices")) << a1;
  EXPECT_EQ(content(a1), ref1);
  EXPECT_EQ(on.metric("sessions_in_memory"), 1);
  json other = json::array({json{{"role", "user"}, {"content", long_text() + "Count the boats."}}});
  other[0]["content"] = "Something else entirely. " + other[0]["content"].get<std::string>();
  const json b1 = on.chat(turn_body(other));
  ASSERT_TRUE(b1.contains("choices")) << b1;
  EXPECT_EQ(cached(b1), 0);
  EXPECT_EQ(on.metric("sessions_on_disk"), 1);
  EXPECT_EQ(on.metric("sessions_written_total"), 1);
  std::vector<fs::path> files;
  for (const auto& f : fs::directory_iterator(dir)) files.push_back(f.path());
  ASSERT_EQ(files.size(), 1u);
  // The file restores exactly: deserialized and serialized again, the same bytes.
  const std::string bytes = slurp(files[0]);
  bool restored = false;
  auto ses = Session::deserialize(*model_, bytes, pool_, &restored);
  ASSERT_TRUE(ses) << ses.error();
  EXPECT_TRUE(restored);
  auto again = (*ses)->serialize();
  ASSERT_TRUE(again) << again.error();
  EXPECT_TRUE(*again == bytes);

  // Turn 2 of the first conversation: restored from the file (evicting the other one).
  const json a2 = on.chat(turn_body(second_messages(content(a1))));
  ASSERT_TRUE(a2.contains("choices")) << a2;
  EXPECT_GE(cached(a2), a1["usage"]["prompt_tokens"].get<int64_t>());
  EXPECT_EQ(content(a2), ref2);
  EXPECT_EQ(on.metric("sessions_restored_total"), 1);
  EXPECT_FALSE(fs::exists(files[0])) << "a resumed automatic session's file is removed";
  const SchedulerMetrics m = on.metrics();
  EXPECT_LE(m.max_held_bytes, m.pool_bytes);
  EXPECT_GT(m.max_held_bytes, m.pool_bytes / 2);
  fs::remove_all(dir);
}

TEST_F(ServeSession, ANamedConversationIsResumedByAnotherServerSharingTheDirectory) {
  const MatmulPaths exact(/*amx=*/false, /*q8=*/false);
  auto tok = Tokenizer::from_gguf(model_->gguf());
  ASSERT_TRUE(tok) << tok.error();
  const auto [ref1, ref2] = reference(*model_, pool_, *tok);
  const fs::path dir = fresh_dir("qevict-serve-failover");
  std::string answer1;
  {
    Running first(*model_, pool_, *tok, options(true, dir.string()));
    const json r1 = first.chat(turn_body(first_messages()), "conv-7");
    ASSERT_TRUE(r1.contains("choices")) << r1;
    answer1 = content(r1);
    EXPECT_EQ(answer1, ref1);
    // Written through before the answer came back.
    EXPECT_TRUE(fs::exists(dir / "conv-7.qvs"));
    const json sl = first.slots();
    ASSERT_EQ(sl.size(), 1u) << sl;
    EXPECT_EQ(sl[0]["id"], "conv-7");
    EXPECT_EQ(sl[0]["state"], "idle");
  }
  // The first server is gone; another one, sharing the directory, gets turn 2.
  Running second(*model_, pool_, *tok, options(true, dir.string()));
  json body = turn_body(second_messages(answer1));
  body["user"] = "conv-7";  // OpenAI's field names the conversation as the header does
  const json r2 = second.chat(body);
  ASSERT_TRUE(r2.contains("choices")) << r2;
  EXPECT_GT(cached(r2), 0);
  EXPECT_EQ(content(r2), ref2);
  EXPECT_EQ(second.metric("sessions_restored_total"), 1);
  // Another conversation's id does not resume it.
  const json r3 = second.chat(turn_body(second_messages(answer1)), "conv-8");
  EXPECT_EQ(cached(r3), 0);
  fs::remove_all(dir);
}

}  // namespace
}  // namespace qevict
