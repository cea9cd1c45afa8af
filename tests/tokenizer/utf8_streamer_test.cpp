// Utf8Streamer: complete UTF-8 prefixes out, incomplete multi-byte tails held back, every
// byte eventually delivered, for all ways of cutting a mixed string into two or three pushes.
#include <gtest/gtest.h>

#include <algorithm>

#include "tokenizer/tokenizer.h"

namespace qevict {
namespace {

TEST(Utf8Streamer, HoldsBackIncompleteSequences) {
  const std::string smile = "\xF0\x9F\x98\x80";  // U+1F600, 4 bytes
  Utf8Streamer s;
  EXPECT_EQ(s.push("a\xF0"), "a");
  EXPECT_EQ(s.push("\x9F\x98"), "");
  EXPECT_EQ(s.push("\x80z"), smile + "z");
  EXPECT_EQ(s.flush(), "");
  EXPECT_EQ(s.push("\xC3"), "");  // first byte of U+00E9
  EXPECT_EQ(s.push("\xA9"), "\xC3\xA9");
}

TEST(Utf8Streamer, PassesInvalidBytesThrough) {
  Utf8Streamer s;
  EXPECT_EQ(s.push("\x80\x80"), "\x80\x80");  // stray continuation bytes never complete
  EXPECT_EQ(s.push("x\xFF"), "x\xFF");        // 0xFF never starts a sequence
  EXPECT_EQ(s.push("\xE2\x82"), "");          // a truncated 3-byte sequence ...
  EXPECT_EQ(s.flush(), "\xE2\x82");           // ... is handed out by flush
  EXPECT_EQ(s.flush(), "");
}

TEST(Utf8Streamer, EverySplitDeliversWholeCharacters) {
  const std::string text = "a\xC3\xA9\xE2\x82\xAC\xF0\x9F\x98\x80z";  // a é € 😀 z
  // Character boundaries: output may only ever end at one of these.
  const std::vector<size_t> boundaries = {0, 1, 3, 6, 10, 11};
  auto at_boundary = [&](size_t n) {
    return std::find(boundaries.begin(), boundaries.end(), n) != boundaries.end();
  };
  for (size_t i = 0; i <= text.size(); ++i) {
    for (size_t j = i; j <= text.size(); ++j) {
      Utf8Streamer s;
      std::string out;
      for (const std::string& part : {text.substr(0, i), text.substr(i, j - i), text.substr(j)}) {
        out += s.push(part);
        ASSERT_TRUE(at_boundary(out.size())) << "split " << i << "," << j;
      }
      out += s.flush();
      EXPECT_EQ(out, text) << "split " << i << "," << j;
    }
  }
}

}  // namespace
}  // namespace qevict
