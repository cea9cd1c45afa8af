// Tokenizer behaviour on tiny hand-built vocabularies (in-memory GGUF): merge order, special
// tokens, BOS/EOS, pieces, and the errors for unsupported or malformed tokenizer metadata.
#include <gtest/gtest.h>

#include <algorithm>

#include "common/gguf_builder.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/unicode.h"

namespace qevict {
namespace {

using test::GgufBuilder;

// A vocabulary over the letters a-c, space, '<', '>', '|' and 'x' (as byte-level symbols), a
// few merged tokens, and special tokens at the end.
struct ToyVocab {
  std::vector<std::string> tokens;
  std::vector<int32_t> types;
  std::vector<std::string> merges;
  std::string model = "gpt2";
  std::string pre = "gpt-2";

  ToyVocab() {
    for (char c : std::string("abc <>|x")) {
      tokens.push_back(unicode::byte_symbol(static_cast<uint8_t>(c)));  // ' ' is "Ġ"
      types.push_back(1);
    }
    for (const char* t : {"ab", "bc", "Ġa"}) {
      tokens.push_back(t);
      types.push_back(1);
    }
    add_special("<|x|>", 3);  // control
    add_special("<u>", 4);    // user-defined
    add_special("<|endoftext|>", 3);
  }
  void add_special(const std::string& text, int32_t type) {
    tokens.push_back(text);
    types.push_back(type);
  }
  int32_t id(const std::string& text) const {
    return static_cast<int32_t>(std::find(tokens.begin(), tokens.end(), text) - tokens.begin());
  }
  GgufBuilder builder() const {
    GgufBuilder b;
    b.add_string("tokenizer.ggml.model", model)
        .add_string("tokenizer.ggml.pre", pre)
        .add_string_array("tokenizer.ggml.tokens", tokens)
        .add_array("tokenizer.ggml.token_type", GgufValueType::kInt32, types)
        .add_string_array("tokenizer.ggml.merges", merges);
    return b;
  }
};

Expected<Tokenizer> load(const GgufBuilder& b) {
  auto m = test::open_memory_gguf(b.build().bytes);
  if (!m) return m.status();
  return Tokenizer::from_gguf(*(*m)->file);
}

Tokenizer load_ok(const GgufBuilder& b) {
  auto t = load(b);
  EXPECT_TRUE(t.has_value()) << t.error();
  return std::move(t.value());
}

TEST(TokenizerVocab, MergesApplyLowestRankFirst) {
  ToyVocab v;
  v.merges = {"b c", "a b"};  // "bc" outranks "ab"
  EXPECT_EQ(load_ok(v.builder()).encode("abc", false, false),
            (std::vector<int32_t>{v.id("a"), v.id("bc")}));
  v.merges = {"a b", "b c"};
  EXPECT_EQ(load_ok(v.builder()).encode("abc", false, false),
            (std::vector<int32_t>{v.id("ab"), v.id("c")}));
}

TEST(TokenizerVocab, SpaceJoinsTheNextWord) {
  ToyVocab v;
  v.merges = {"Ġ a", "a b"};
  const Tokenizer t = load_ok(v.builder());
  // Words "ab", " ab": the second starts with Ġa (rank 0) before a b can apply.
  EXPECT_EQ(t.encode("ab ab", false, false),
            (std::vector<int32_t>{v.id("ab"), v.id("Ġa"), v.id("b")}));
  EXPECT_EQ(t.decode(t.encode("ab ab", false, false)), "ab ab");
}

TEST(TokenizerVocab, ControlTokensNeedParseSpecialUserDefinedDoNot) {
  ToyVocab v;
  const Tokenizer t = load_ok(v.builder());
  const int32_t x = v.id("<|x|>");
  const int32_t u = v.id("<u>");
  EXPECT_EQ(t.encode("a<|x|>b", false, true), (std::vector<int32_t>{v.id("a"), x, v.id("b")}));
  // Without parse_special the control token is text: < | x | > byte by byte.
  EXPECT_EQ(t.encode("<|x|>", false, false),
            (std::vector<int32_t>{v.id("<"), v.id("|"), v.id("x"), v.id("|"), v.id(">")}));
  EXPECT_EQ(t.encode("a<u>b", false, false), (std::vector<int32_t>{v.id("a"), u, v.id("b")}));
  // Pieces: control renders only on request; user-defined always.
  EXPECT_EQ(t.token_to_piece(x), "");
  EXPECT_EQ(t.token_to_piece(x, true), "<|x|>");
  EXPECT_EQ(t.token_to_piece(u), "<u>");
  EXPECT_EQ(t.decode({v.id("a"), x, u}), "a<u>");
  EXPECT_EQ(t.decode({v.id("a"), x, u}, true), "a<|x|><u>");
  EXPECT_EQ(t.token_to_piece(-1), "");
  EXPECT_EQ(t.token_to_piece(t.n_vocab()), "");
}

TEST(TokenizerVocab, BytesWithoutATokenAreDropped) {
  // As llama.cpp: a symbol with no token falls back to single-byte tokens, and bytes with no
  // token of their own vanish ('d' is not in the toy vocabulary).
  ToyVocab v;
  EXPECT_EQ(load_ok(v.builder()).encode("adb", false, false),
            (std::vector<int32_t>{v.id("a"), v.id("b")}));
}

TEST(TokenizerVocab, BosEosFromMetadata) {
  ToyVocab v;
  GgufBuilder b = v.builder();
  b.add_u32("tokenizer.ggml.bos_token_id", v.id("<|x|>"))
      .add_u32("tokenizer.ggml.eos_token_id", v.id("<|endoftext|>"))
      .add_bool("tokenizer.ggml.add_bos_token", true)
      .add_bool("tokenizer.ggml.add_eos_token", true);
  const Tokenizer t = load_ok(b);
  EXPECT_EQ(t.bos(), v.id("<|x|>"));
  EXPECT_EQ(t.eos(), v.id("<|endoftext|>"));
  EXPECT_TRUE(t.add_bos());
  EXPECT_EQ(t.encode("a", true, false), (std::vector<int32_t>{t.bos(), v.id("a"), t.eos()}));
  EXPECT_EQ(t.encode("", true, false), (std::vector<int32_t>{t.bos(), t.eos()}));
  EXPECT_EQ(t.encode("", false, false), std::vector<int32_t>{});
  // <|endoftext|> is both EOS and, found by its text, EOT; both end generation.
  EXPECT_EQ(t.eot(), v.id("<|endoftext|>"));
  EXPECT_TRUE(t.is_eog(t.eos()));
  EXPECT_FALSE(t.is_eog(t.bos()));
  EXPECT_EQ(t.find_token("<u>"), v.id("<u>"));
  EXPECT_EQ(t.find_token("Ġa"), v.id("Ġa"));
  EXPECT_FALSE(t.find_token("nope"));
}

TEST(TokenizerVocab, Llama3IgnoresMergesForWholeWordTokens) {
  ToyVocab v;
  v.pre = "llama-bpe";
  v.tokens.push_back("abc");
  v.types.push_back(1);
  v.merges = {"b c", "a b"};  // the merges alone would give a + bc
  const Tokenizer t = load_ok(v.builder());
  EXPECT_EQ(t.encode("abc", false, false), std::vector<int32_t>{v.id("abc")});
  EXPECT_TRUE(t.add_bos());  // llama3 pre-tokenizers add BOS unless the file says otherwise
}

TEST(TokenizerVocab, UnsupportedModelIsAnError) {
  ToyVocab v;
  v.model = "llama";
  const auto t = load(v.builder());
  ASSERT_FALSE(t.has_value());
  EXPECT_NE(t.error().find("tokenizer.ggml.model 'llama'"), std::string::npos) << t.error();
}

TEST(TokenizerVocab, UnsupportedPreIsAnError) {
  ToyVocab v;
  v.pre = "deepseek-coder";
  const auto t = load(v.builder());
  ASSERT_FALSE(t.has_value());
  EXPECT_NE(t.error().find("tokenizer.ggml.pre 'deepseek-coder'"), std::string::npos) << t.error();
}

TEST(TokenizerVocab, MissingPreMeansDefault) {
  ToyVocab v;
  GgufBuilder b;
  b.add_string("tokenizer.ggml.model", "gpt2")
      .add_string_array("tokenizer.ggml.tokens", v.tokens)
      .add_string_array("tokenizer.ggml.merges", {"a b"});
  const Tokenizer t = load_ok(b);
  EXPECT_EQ(t.encode("ab", false, false), std::vector<int32_t>{v.id("ab")});
}

TEST(TokenizerVocab, MalformedMetadataIsAnError) {
  ToyVocab v;
  {
    GgufBuilder b;  // no merges
    b.add_string("tokenizer.ggml.model", "gpt2")
        .add_string_array("tokenizer.ggml.tokens", v.tokens);
    EXPECT_FALSE(load(b).has_value());
  }
  {
    GgufBuilder b;  // no tokens
    b.add_string("tokenizer.ggml.model", "gpt2").add_string_array("tokenizer.ggml.merges", {});
    EXPECT_FALSE(load(b).has_value());
  }
  {
    ToyVocab dup;
    dup.tokens.push_back("ab");
    dup.types.push_back(1);
    const auto t = load(dup.builder());
    ASSERT_FALSE(t.has_value());
    EXPECT_NE(t.error().find("duplicate token"), std::string::npos) << t.error();
  }
  {
    ToyVocab short_types;
    short_types.types.pop_back();
    EXPECT_FALSE(load(short_types.builder()).has_value());
  }
  {
    // add_bos_token without a BOS: llama.cpp's default BOS id (11) is past this vocabulary,
    // and an out-of-range bos_token_id is ignored, as llama.cpp does.
    GgufBuilder b;
    b.add_string("tokenizer.ggml.model", "gpt2")
        .add_string_array("tokenizer.ggml.tokens", {"a", "b", "c"})
        .add_string_array("tokenizer.ggml.merges", {})
        .add_u32("tokenizer.ggml.bos_token_id", 100000)
        .add_bool("tokenizer.ggml.add_bos_token", true);
    const auto t = load(b);
    ASSERT_FALSE(t.has_value());
    EXPECT_NE(t.error().find("no BOS"), std::string::npos) << t.error();
  }
}

}  // namespace
}  // namespace qevict
