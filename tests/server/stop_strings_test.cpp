// Stop strings across token boundaries (src/server/stop_strings.*): what a stream sends after
// each token (take()), where the text ends, and that nothing of a stop string is ever sent.
#include "server/stop_strings.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace qevict {
namespace {

// Feeds tokens one by one; returns what take() gave after each, then after the end
// (flush + take, as the server does when the generation ends without a stop string).
std::vector<std::string> stream(StopStringMatcher& m, const std::vector<std::string>& tokens) {
  std::vector<std::string> out;
  for (const auto& t : tokens) {
    const bool stop = m.add(t);
    if (stop) {
      out.push_back(m.take());
      return out;
    }
    out.push_back(m.take());
  }
  m.flush();
  out.push_back(m.take());
  return out;
}

using Pieces = std::vector<std::string>;

TEST(StopStrings, NoStopStringsSendsEveryPiece) {
  StopStringMatcher m({});
  EXPECT_EQ(stream(m, {"Hello", ",", " world"}), (Pieces{"Hello", ",", " world", ""}));
  EXPECT_EQ(m.text(), "Hello, world");
  EXPECT_FALSE(m.stopped());
}

TEST(StopStrings, StopSplitOverTwoTokens) {
  StopStringMatcher m({"END"});
  EXPECT_FALSE(m.add("abcE"));
  EXPECT_EQ(m.take(), "abc");  // "E" may begin "END"
  EXPECT_TRUE(m.add("ND more"));
  EXPECT_EQ(m.take(), "");
  EXPECT_EQ(m.text(), "abc");
  EXPECT_TRUE(m.stopped());
  EXPECT_TRUE(m.add("x"));  // stopped: nothing changes
  EXPECT_EQ(m.text(), "abc");
}

TEST(StopStrings, StopSplitOverThreeTokens) {
  StopStringMatcher m({"<|stop|>"});
  EXPECT_EQ(stream(m, {"Hi <|", "sto", "p|> bye"}), (Pieces{"Hi ", "", ""}));
  EXPECT_EQ(m.text(), "Hi ");
  EXPECT_TRUE(m.stopped());
}

TEST(StopStrings, PartialPrefixThenDivergenceReleasesTheHeldText) {
  StopStringMatcher m({"abc"});
  EXPECT_EQ(stream(m, {"xab", "d", "ab", "ab", "c"}), (Pieces{"x", "abd", "", "ab", ""}));
  EXPECT_EQ(m.text(), "xabdab");
}

TEST(StopStrings, HeldTailIsSentWhenTheGenerationEnds) {
  StopStringMatcher m({"\n\n"});
  EXPECT_EQ(stream(m, {"hi", "\n"}), (Pieces{"hi", "", "\n"}));
  EXPECT_EQ(m.text(), "hi\n");
  EXPECT_FALSE(m.stopped());
}

TEST(StopStrings, StopAtTheVeryStart) {
  StopStringMatcher one_token({"Q:"});
  EXPECT_EQ(stream(one_token, {"Q: hi"}), (Pieces{""}));
  EXPECT_EQ(one_token.text(), "");
  StopStringMatcher two_tokens({"Q:"});
  EXPECT_EQ(stream(two_tokens, {"Q", ":", "x"}), (Pieces{"", ""}));
  EXPECT_EQ(two_tokens.text(), "");
  EXPECT_TRUE(two_tokens.stopped());
}

TEST(StopStrings, MultipleStopStrings) {
  StopStringMatcher m({"###", "\nUser"});
  // "\n" may begin "\nUser", "#" may begin "###": the longer of the tails is held.
  EXPECT_EQ(stream(m, {"ok\n", "Us", "#", "##"}), (Pieces{"ok", "", "\nUs", ""}));
  EXPECT_EQ(m.text(), "ok\nUs");
  StopStringMatcher second({"###", "\nUser"});
  EXPECT_EQ(stream(second, {"ok\n", "User:"}), (Pieces{"ok", ""}));
  EXPECT_EQ(second.text(), "ok");
}

TEST(StopStrings, OneTokenCompletingTwoStopsCutsAtTheEarliest) {
  StopStringMatcher m({"b", "a"});
  EXPECT_TRUE(m.add("xab"));
  EXPECT_EQ(m.text(), "x");
  EXPECT_EQ(m.take(), "x");
}

TEST(StopStrings, Utf8CharacterSplitOverTokensIsSentWhole) {
  StopStringMatcher m({});
  // "é" is C3 A9: the first token ends inside it.
  EXPECT_EQ(stream(m, {"caf\xC3", "\xA9!"}), (Pieces{"caf", "\xC3\xA9!", ""}));
}

TEST(StopStrings, MultiByteStopStringSplitInsideItsCharacters) {
  StopStringMatcher m({"\xC3\xA9!"});  // "é!"
  EXPECT_EQ(stream(m, {"caf\xC3", "\xA9", "!"}), (Pieces{"caf", "", ""}));
  EXPECT_EQ(m.text(), "caf");
  // U+1F600 (F0 9F 98 80) in tokens of 1, 2 and 1 bytes.
  StopStringMatcher emoji({"\xF0\x9F\x98\x80"});
  EXPECT_EQ(stream(emoji, {"a\xF0", "\x9F\x98", "\x80z"}), (Pieces{"a", "", ""}));
  EXPECT_EQ(emoji.text(), "a");
}

TEST(StopStrings, MultiByteDivergenceSendsWholeCharacters) {
  const std::string e_acute = "\xC3\xA9", e_grave = "\xC3\xA8";  // é, è
  StopStringMatcher m({e_acute + "a"});
  EXPECT_EQ(stream(m, {"x" + e_acute, "b\xC3", "\xA8"}), (Pieces{"x", e_acute + "b", e_grave, ""}));
  EXPECT_EQ(m.text(), "x" + e_acute + "b" + e_grave);
}

TEST(StopStrings, IncompleteCharacterAtTheEndIsFlushed) {
  StopStringMatcher m({"zz"});
  EXPECT_EQ(stream(m, {"a\xE2\x82"}), (Pieces{"a", "\xE2\x82"}));  // an unfinished "€"
  EXPECT_EQ(m.text(), "a\xE2\x82");
}

}  // namespace
}  // namespace qevict
