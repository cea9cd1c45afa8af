// End-to-end: sessions (engine/session.h) on the real model. A FullKV session extended turn by
// turn gives the logits of one prefill of the concatenation; a tiered session saved, loaded and
// continued is byte-identical and generates the same greedy tokens; rewinds and damaged files.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include "e2e/real_model_fixture.h"
#include "engine/prompt_drive.h"
#include "engine/session.h"
#include "engine/session_file.h"
#include "kvcache/factory.h"
#include "kvcache/full_cache.h"
#include "kvcache/options.h"

namespace qevict {
namespace {

class SessionModel : public RealModelTest {
 protected:
  std::vector<int32_t> slice(int64_t a, int64_t b) const {
    return std::vector<int32_t>(tokens_.begin() + a, tokens_.begin() + b);
  }
  std::unique_ptr<Session> make(const KvOptionList& kv, int64_t n_ctx = 2048) {
    auto p = make_kv_params(kv);
    EXPECT_TRUE(p.has_value()) << p.error();
    SessionOptions o;
    o.kv = *p;
    o.n_ctx = n_ctx;
    o.prefill_chunk = 128;
    auto s = Session::create(*model_, o);
    EXPECT_TRUE(s.has_value()) << s.error();
    return std::move(*s);
  }
  static float max_abs_diff(const std::vector<float>& a, const std::vector<float>& b) {
    float m = 0.0f;
    for (size_t i = 0; i < a.size(); ++i) m = std::max(m, std::fabs(a[i] - b[i]));
    return m;
  }
  SamplingParams greedy() const {
    SamplingParams s;
    s.temperature = 0.0f;
    return s;
  }
};

TEST_F(SessionModel, FullKvExtendEqualsOnePrefillOfTheConcatenation) {
  const MatmulPaths exact(/*amx=*/false, /*q8=*/false);
  auto s = make({{"policy", "full"}});
  std::vector<float> turn_logits;
  ASSERT_TRUE(s->append(slice(0, 300), pool_).is_ok());
  ASSERT_TRUE(s->append(slice(300, 420), pool_, &turn_logits).is_ok());
  EXPECT_EQ(s->cache().n_past(), 420);
  EXPECT_EQ(s->turns().size(), 2u);
  EXPECT_EQ(s->turns()[1].reused_tokens, 300);
  EXPECT_EQ(s->turns()[1].prompt_tokens, 120);

  FullKvCache one(model_->kv_shape(), 2048);
  std::vector<float> one_logits(size_t(model_->config().n_vocab));
  const auto all = slice(0, 420);
  ASSERT_TRUE(
      prefill_prompts(*model_, {{&one, all.data(), 420, one_logits.data()}}, 128, pool_, true)
          .is_ok());
  // The same function; the chunks' boundaries differ (300 + 120 against 128-token chunks), so
  // only the order of float sums does: f16 storage of the same K/V, f32 accumulation.
  EXPECT_LT(max_abs_diff(turn_logits, one_logits), 2e-2f);
  EXPECT_EQ(std::max_element(turn_logits.begin(), turn_logits.end()) - turn_logits.begin(),
            std::max_element(one_logits.begin(), one_logits.end()) - one_logits.begin());
}

TEST_F(SessionModel, FullKvRewindThenExtendGivesTheSameLogits) {
  const MatmulPaths exact(/*amx=*/false, /*q8=*/false);
  auto s = make({{"policy", "full"}});
  std::vector<float> a, b;
  ASSERT_TRUE(s->append(slice(0, 256), pool_).is_ok());
  ASSERT_TRUE(s->append(slice(256, 300), pool_, &a).is_ok());
  ASSERT_TRUE(s->can_rewind(200));
  ASSERT_TRUE(s->rewind(200).is_ok());
  EXPECT_EQ(s->cache().n_past(), 200);
  ASSERT_TRUE(s->append(slice(200, 300), pool_, &b).is_ok());
  EXPECT_LT(max_abs_diff(a, b), 2e-2f);
}

// With f16 key scales and zeros and with one-byte ones (--kv-key-meta 8).
TEST_F(SessionModel, TieredSaveLoadContinueIsIdentical) {
  for (const char* km : {"16", "8"}) {
    SCOPED_TRACE(km);
    auto s = make({{"policy", "qevict"}, {"budget", "0.2"}, {"key_meta", km}});
    Session::GenerateResult g;
    ASSERT_TRUE(s->append(slice(0, 700), pool_).is_ok());
    ASSERT_TRUE(s->generate(slice(700, 720), 12, greedy(), {}, pool_, nullptr, &g).is_ok());
    ASSERT_EQ(g.tokens.size(), 12u);
    KvReport rep;
    s->cache().report(&rep);
    int64_t evicted = 0, quant = 0;
    for (const auto& l : rep.layers) evicted += l.windows_evicted, quant += l.windows_quant;
    ASSERT_GT(quant, 0) << "the test needs a cache that compressed";
    Session::SaveMode mode;
    auto bytes = s->serialize(&mode);
    ASSERT_TRUE(bytes.has_value()) << bytes.error();
    EXPECT_EQ(mode, Session::SaveMode::kState);

    bool restored = false;
    auto t = Session::deserialize(*model_, *bytes, pool_, &restored);
    ASSERT_TRUE(t.has_value()) << t.error();
    EXPECT_TRUE(restored);
    EXPECT_EQ((*t)->tokens(), s->tokens());
    auto again = (*t)->serialize();
    ASSERT_TRUE(again.has_value());
    EXPECT_TRUE(*again == *bytes) << "save → load → save changed the bytes";

    // Both continue with the same turn: the same greedy tokens, the same state after.
    Session::GenerateResult g1, g2;
    ASSERT_TRUE(s->generate(slice(720, 760), 24, greedy(), {}, pool_, nullptr, &g1).is_ok());
    ASSERT_TRUE((*t)->generate(slice(720, 760), 24, greedy(), {}, pool_, nullptr, &g2).is_ok());
    EXPECT_EQ(g1.tokens, g2.tokens);
    auto b1 = s->serialize(), b2 = (*t)->serialize();
    ASSERT_TRUE(b1.has_value() && b2.has_value());
    EXPECT_TRUE(*b1 == *b2);
  }
}

// What a server reserves for a resumed conversation (max_cache_bytes with `resumed`): only the
// new turn over the budget, held until its end. Checked after every forward call of the new
// turn and after its end, for the routes that hold a prompt (end, staged), against the old
// reservation (the whole prompt) to show the saving.
TEST_F(SessionModel, ResumedTurnStaysWithinItsReservation) {
  const KvShape& shape = model_->kv_shape();
  const int64_t first = 800, reply = 10, turn = 250;  // the golden text has 1,100 tokens
  const int max_tokens = 8;
  const int64_t n_prompt = first + reply + turn;
  const int64_t budget = int64_t(0.2 * double(n_prompt + max_tokens) * double(shape.token_bytes()));
  for (const char* route : {"end", "staged"}) {
    SCOPED_TRACE(route);
    auto s = make(
        {{"policy", "qevict"}, {"budget_bytes", std::to_string(budget)}, {"prefill_route", route}});
    Session::GenerateResult g;
    const Status a = s->append(slice(0, first), pool_);
    ASSERT_TRUE(a.is_ok()) << a.message();
    const Status b = s->generate(slice(first, first + reply), 4, greedy(), {}, pool_, nullptr, &g);
    ASSERT_TRUE(b.is_ok()) << b.message();
    const KvCacheParams kv = s->options().kv;
    auto cache = s->release_cache();
    const int64_t resumed = cache->n_past();
    ASSERT_GT(resumed, first);
    auto bound = max_cache_bytes(shape, n_prompt, max_tokens, kv, 64, resumed);
    auto fresh = max_cache_bytes(shape, n_prompt, max_tokens, kv, 64);
    ASSERT_TRUE(bound.has_value() && fresh.has_value());
    // The new turn: the tokens the session had not fed, then the turn's own.
    const auto feed = slice(resumed, n_prompt);
    size_t most = cache->bytes_held();
    SequenceKvCache* c = cache.get();
    ASSERT_TRUE(prefill_prompts(*model_, {{c, feed.data(), int64_t(feed.size()), nullptr}}, 64,
                                pool_, true,
                                [&](int64_t, int64_t, int64_t) {
                                  most = std::max(most, c->bytes_held());
                                  return Status::ok();
                                })
                    .is_ok());
    most = std::max(most, c->bytes_held());
    std::printf(
        "%s: resumed at %lld, +%zu tokens: held at most %.2f MiB, reserved %.2f MiB "
        "(a fresh request's %.2f MiB)\n",
        route, (long long)resumed, feed.size(), most / 1048576.0, *bound / 1048576.0,
        *fresh / 1048576.0);
    EXPECT_LE(most, *bound);
    if (std::string(route) == "end") {
      EXPECT_LT(*bound, *fresh * 3 / 4);
    }
  }
  // FullKV reserves its pages whatever was resumed.
  auto f = make_kv_params({{"policy", "full"}});
  ASSERT_TRUE(f.has_value());
  EXPECT_EQ(*max_cache_bytes(shape, n_prompt, max_tokens, *f, 64, 1000),
            *max_cache_bytes(shape, n_prompt, max_tokens, *f, 64));
}

TEST_F(SessionModel, TieredRewindsOnlyWithinTheLocalRegion) {
  auto s = make({{"policy", "qevict"}, {"budget", "0.2"}});
  Session::GenerateResult g;
  ASSERT_TRUE(s->append(slice(0, 600), pool_).is_ok());
  ASSERT_TRUE(s->generate(slice(600, 610), 4, greedy(), {}, pool_, nullptr, &g).is_ok());
  const int64_t n = int64_t(s->tokens().size());
  EXPECT_TRUE(s->can_rewind(n - 3));  // newest tokens: local, full precision
  EXPECT_FALSE(s->can_rewind(100));   // routed long ago
  EXPECT_FALSE(s->rewind(100).is_ok());
  EXPECT_EQ(int64_t(s->tokens().size()), n);  // a failed rewind changes nothing
  ASSERT_TRUE(s->rewind(n - 3).is_ok());
  EXPECT_EQ(int64_t(s->tokens().size()), n - 3);
  Session::GenerateResult g2;
  ASSERT_TRUE(s->generate(slice(610, 620), 4, greedy(), {}, pool_, nullptr, &g2).is_ok());
  EXPECT_EQ(g2.tokens.size(), 4u);
}

TEST_F(SessionModel, DamagedOrForeignFilesGiveClearErrors) {
  auto s = make({{"policy", "qevict"}, {"budget", "0.2"}});
  ASSERT_TRUE(s->append(slice(0, 300), pool_).is_ok());
  auto bytes = s->serialize();
  ASSERT_TRUE(bytes.has_value());
  auto err = [&](const std::string& b) {
    auto t = Session::deserialize(*model_, b, pool_);
    EXPECT_FALSE(t.has_value());
    return t.has_value() ? std::string() : t.error();
  };
  std::string flipped = *bytes;
  flipped[flipped.size() / 2] ^= 0x40;
  EXPECT_NE(err(flipped).find("checksum"), std::string::npos);
  EXPECT_NE(err(bytes->substr(0, bytes->size() - 100)).find("truncated"), std::string::npos);
  EXPECT_NE(err("hello").find("magic"), std::string::npos);
  auto c = decode_session(*bytes);
  ASSERT_TRUE(c.has_value());
  c->model_fingerprint ^= 1;
  EXPECT_NE(err(encode_session(*c)).find("another model"), std::string::npos);
}

TEST_F(SessionModel, EveryPolicySavesAndRestoresOrReprefills) {
  // Policies that cannot write their state are saved as tokens and prefilled again on load.
  for (const char* pol : {"full", "qevict", "h2o", "snapkv", "streaming", "kivi"}) {
    SCOPED_TRACE(pol);
    KvOptionList kv{{"policy", pol}};
    if (std::string(pol) == "kivi")
      kv.push_back({"bits", "2"});
    else if (std::string(pol) != "full")
      kv.push_back({"budget", "0.3"});
    auto s = make(kv);
    ASSERT_TRUE(s->append(slice(0, 400), pool_).is_ok());
    auto bytes = s->serialize();
    ASSERT_TRUE(bytes.has_value()) << bytes.error();
    auto t = Session::deserialize(*model_, *bytes, pool_);
    ASSERT_TRUE(t.has_value()) << t.error();
    EXPECT_EQ((*t)->tokens(), s->tokens());
    EXPECT_EQ((*t)->cache().n_past(), 400);
    Session::GenerateResult g1, g2;
    ASSERT_TRUE(s->generate(slice(400, 420), 8, greedy(), {}, pool_, nullptr, &g1).is_ok());
    ASSERT_TRUE((*t)->generate(slice(400, 420), 8, greedy(), {}, pool_, nullptr, &g2).is_ok());
    EXPECT_EQ(g1.tokens, g2.tokens);
  }
}

}  // namespace
}  // namespace qevict
