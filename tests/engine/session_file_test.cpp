// Session files' versions (engine/session_file.h) without a model: version 2 carries the
// low-bit tier's key_meta, version 3 --kv-adapt; a version 1 file (the committed fuzz seeds were
// written by a version 1 build) still reads, as f16 key scales and zeros; a newer version is a
// clear error.
#include "engine/session_file.h"

#include <gtest/gtest.h>

#include <fstream>
#include <sstream>

namespace qevict {
namespace {

std::string read_all(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

uint32_t version_of(const std::string& b) {
  uint32_t v = 0;
  for (int i = 0; i < 4; ++i) v |= uint32_t(uint8_t(b[8 + i])) << (8 * i);
  return v;
}

SessionFileContents tiered(int key_meta) {
  SessionFileContents c;
  c.model_name = "toy";
  c.kv.policy = "qevict";
  c.kv.budget_fraction = 0.2;
  c.kv.bits = 4;
  c.kv.value_bits = 2;
  c.kv.key_meta = key_meta;
  c.n_ctx = 64;
  c.tokens = {1, 2, 3};
  return c;
}

TEST(SessionFile, KeyMetaRoundTripsInVersion2) {
  for (int km : {16, 8}) {
    const std::string b = encode_session(tiered(km));
    EXPECT_EQ(version_of(b), kSessionFileVersion);
    auto c = decode_session(b);
    ASSERT_TRUE(c.has_value()) << c.error();
    EXPECT_EQ(c->kv.key_meta, km);
    EXPECT_EQ(c->kv.bits, 4);
    EXPECT_EQ(c->tokens, (std::vector<int32_t>{1, 2, 3}));
  }
}

TEST(SessionFile, AdaptRoundTripsInVersion3) {
  for (double adapt : {0.0, 0.5}) {
    SessionFileContents t = tiered(16);
    t.kv.prefill_route = PrefillRoute::kEnd;  // what --kv-adapt needs
    t.kv.prefill_window = 32;
    t.kv.adapt = adapt;
    auto c = decode_session(encode_session(t));
    ASSERT_TRUE(c.has_value()) << c.error();
    EXPECT_DOUBLE_EQ(c->kv.adapt, adapt);
  }
}

TEST(SessionFile, AVersion1FileReadsAsF16KeyScales) {
  const std::string b =
      read_all(std::string(QEVICT_TEST_DATA_DIR) + "/fuzz/corpus/session_file_fuzz/tiered_40");
  ASSERT_GT(b.size(), 32u);
  ASSERT_EQ(version_of(b), 1u) << "the seed was rewritten: keep a version 1 file for this test";
  auto c = decode_session(b);
  ASSERT_TRUE(c.has_value()) << c.error();
  EXPECT_EQ(c->kv.key_meta, 16);
  EXPECT_EQ(c->kv.policy, "qevict");
  EXPECT_TRUE(c->has_state);
}

TEST(SessionFile, ANewerVersionIsAClearError) {
  std::string b = encode_session(tiered(8));
  b[8] = char(kSessionFileVersion + 1);
  auto c = decode_session(b);
  ASSERT_FALSE(c.has_value());
  EXPECT_NE(c.error().find("version"), std::string::npos) << c.error();
}

}  // namespace
}  // namespace qevict
