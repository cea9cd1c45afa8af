// Pre-tokenizer splits of hand-written strings, with the expected words worked out by hand
// from each family's regex (pretokenize.h), plus the mapping of tokenizer.ggml.pre names.
#include "tokenizer/pretokenize.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace qevict {
namespace {

using Words = std::vector<std::string>;

struct SplitCase {
  PreTokenizer type;
  std::string text;
  Words words;
};

const char* name_of(PreTokenizer t) {
  switch (t) {
    case PreTokenizer::kDefault:
      return "default";
    case PreTokenizer::kGpt2:
      return "gpt2";
    case PreTokenizer::kSmollm:
      return "smollm";
    case PreTokenizer::kLlama3:
      return "llama3";
    case PreTokenizer::kQwen2:
      return "qwen2";
  }
  return "?";
}

TEST(PreTokenize, HandWrittenSplits) {
  using P = PreTokenizer;
  const std::vector<SplitCase> cases = {
      {P::kGpt2, "Hello world", {"Hello", " world"}},
      {P::kGpt2, "I'm here", {"I", "'m", " here"}},
      {P::kGpt2, "I'M", {"I", "'", "M"}},  // contractions are case-sensitive here
      {P::kGpt2, "  two spaces", {" ", " two", " spaces"}},
      {P::kGpt2, "a  \n b", {"a", "  \n", " b"}},  // \s+(?!\S) leaves the last space
      {P::kGpt2, "x = 3.14;", {"x", " =", " 3", ".", "14", ";"}},
      {P::kGpt2, "end   ", {"end", "   "}},  // trailing whitespace stays whole
      {P::kGpt2, "\tif", {"\t", "if"}},      // only U+0020 joins the next word
      {P::kGpt2, " caf\u00e9 \u65e5\u672c\u8a9e", {" caf\u00e9", " \u65e5\u672c\u8a9e"}},
      {P::kGpt2, "a\U0001F600b", {"a", "\U0001F600", "b"}},
      {P::kGpt2, "", {}},
      {P::kSmollm, "abc 123", {"abc", " ", "1", "2", "3"}},
      {P::kSmollm, "x2y", {"x", "2", "y"}},
      {P::kSmollm, "\u0663\u0664!", {"\u0663", "\u0664", "!"}},  // Arabic-Indic digits are \p{N}
      {P::kSmollm, "v1.25 ", {"v", "1", ".", "2", "5", " "}},
      {P::kLlama3, "HE'S 12345 ok", {"HE", "'S", " ", "123", "45", " ok"}},
      {P::kLlama3, "a\n\n  b", {"a", "\n\n", " ", " b"}},
      {P::kLlama3, "!!!\n\nx", {"!!!\n\n", "x"}},
      {P::kLlama3, "\tif (x)", {"\tif", " (", "x", ")"}},
      {P::kLlama3, "line\r\n  next", {"line", "\r\n", " ", " next"}},
      {P::kLlama3, "a ", {"a", " "}},
      {P::kQwen2, "12345", {"1", "2", "3", "4", "5"}},
      {P::kQwen2, "We'LL see", {"We", "'LL", " see"}},
      {P::kDefault, "hello, world!! 12345", {"hello", ",", " world", "!!", " ", "123", "45"}},
      {P::kDefault, "a`b", {"a", "`", "b"}},  // '`' is not in the punctuation class
  };
  for (const SplitCase& c : cases) {
    EXPECT_EQ(pre_tokenize(c.text, c.type), c.words)
        << name_of(c.type) << " split of \"" << c.text << "\"";
  }
}

TEST(PreTokenize, PiecesCoverTheInput) {
  const std::string text = "Mixed: 12,345.678 caf\u00e9\t\tdon't  \r\n\U0001F44D\U0001F3FD end  ";
  for (PreTokenizer t : {PreTokenizer::kDefault, PreTokenizer::kGpt2, PreTokenizer::kSmollm,
                         PreTokenizer::kLlama3, PreTokenizer::kQwen2}) {
    std::string joined;
    for (const std::string& w : pre_tokenize(text, t)) {
      EXPECT_FALSE(w.empty()) << name_of(t);
      joined += w;
    }
    EXPECT_EQ(joined, text) << name_of(t);
  }
}

TEST(PreTokenize, NamesMapToFamilies) {
  ASSERT_TRUE(pre_tokenizer_from_name("smollm"));
  EXPECT_EQ(pre_tokenizer_from_name("smollm")->type, PreTokenizer::kSmollm);
  EXPECT_EQ(pre_tokenizer_from_name("gpt-2")->type, PreTokenizer::kGpt2);
  EXPECT_EQ(pre_tokenizer_from_name("default")->type, PreTokenizer::kDefault);
  EXPECT_EQ(pre_tokenizer_from_name("qwen2")->type, PreTokenizer::kQwen2);
  const auto llama3 = pre_tokenizer_from_name("llama-bpe");
  ASSERT_TRUE(llama3);
  EXPECT_EQ(llama3->type, PreTokenizer::kLlama3);
  EXPECT_TRUE(llama3->ignore_merges);
  EXPECT_TRUE(llama3->add_bos_default);
  EXPECT_FALSE(pre_tokenizer_from_name("no-such-pre"));
  EXPECT_FALSE(pre_tokenizer_from_name(""));
}

}  // namespace
}  // namespace qevict
