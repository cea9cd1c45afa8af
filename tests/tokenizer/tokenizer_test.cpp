// Tokenizer against llama.cpp on the real model: every corpus string of
// tests/golden/tokenizer_golden.json (made by tools/golden/make_tokenizer_golden.py) must give
// llama.cpp's ids exactly, with the model's pre-tokenizer and with the other families applied
// to the same vocabulary. Needs QEVICT_TEST_MODEL (skipped when unset).
#include "tokenizer/tokenizer.h"

#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>

#include "common/gguf_builder.h"
#include "tokenizer/unicode.h"

namespace qevict {
namespace {

using Ids = std::vector<int32_t>;

std::string ids_str(const Ids& ids) {
  std::string s = "[";
  for (size_t i = 0; i < ids.size(); ++i) s += (i ? ", " : "") + std::to_string(ids[i]);
  return s + "]";
}

// Describes the first difference between two id lists (for failure messages).
std::string first_difference(const Ids& got, const Ids& want) {
  size_t i = 0;
  while (i < got.size() && i < want.size() && got[i] == want[i]) ++i;
  auto window = [&](const Ids& v) {
    const size_t b = i >= 3 ? i - 3 : 0;
    return ids_str(Ids(v.begin() + std::min(b, v.size()), v.begin() + std::min(i + 5, v.size())));
  };
  return "first difference at index " + std::to_string(i) + " (sizes " +
         std::to_string(got.size()) + " vs " + std::to_string(want.size()) + "): got ..." +
         window(got) + " want ..." + window(want);
}

// Escapes control and non-ASCII bytes so that failing strings print readably.
std::string printable(const std::string& s, size_t max_len = 120) {
  std::string out;
  for (size_t i = 0; i < s.size() && i < max_len; ++i) {
    const auto c = static_cast<uint8_t>(s[i]);
    if (c >= 0x20 && c < 0x7F) {
      out.push_back(static_cast<char>(c));
    } else {
      char buf[8];
      std::snprintf(buf, sizeof(buf), "\\x%02X", c);
      out += buf;
    }
  }
  return s.size() > max_len ? out + "..." : out;
}

class RealModelTokenizer : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    const char* path = std::getenv("QEVICT_TEST_MODEL");
    if (!path || !*path) return;
    auto f = GgufFile::open(path);
    ASSERT_TRUE(f.has_value()) << f.error();
    file_ = new std::shared_ptr<GgufFile>(*f);
    auto t = Tokenizer::from_gguf(**f);
    ASSERT_TRUE(t.has_value()) << t.error();
    tok_ = new Tokenizer(std::move(t.value()));
    std::ifstream in(QEVICT_TEST_DATA_DIR "/golden/tokenizer_golden.json");
    ASSERT_TRUE(in) << "missing tests/golden/tokenizer_golden.json";
    golden_ = new nlohmann::json(nlohmann::json::parse(in));
  }
  static void TearDownTestSuite() {
    delete tok_;
    delete file_;
    delete golden_;
    tok_ = nullptr;
    file_ = nullptr;
    golden_ = nullptr;
  }
  void SetUp() override {
    if (!tok_) GTEST_SKIP() << "QEVICT_TEST_MODEL is not set";
  }

  // The model's tokenizer metadata with tokenizer.ggml.pre replaced, as an in-memory GGUF.
  static Tokenizer with_pre(const std::string& pre) {
    test::GgufBuilder b;
    for (const auto& [key, value] : (*file_)->metadata()) {
      if (key.rfind("tokenizer.ggml.", 0) != 0 || key == "tokenizer.ggml.pre") continue;
      b.add_value(key, value);
    }
    b.add_string("tokenizer.ggml.pre", pre);
    auto m = test::open_memory_gguf(b.build().bytes);
    EXPECT_TRUE(m.has_value()) << m.error();
    auto t = Tokenizer::from_gguf(*(*m)->file);
    EXPECT_TRUE(t.has_value()) << t.error();
    return std::move(t.value());
  }

  static std::vector<std::string> corpus() {
    std::vector<std::string> texts;
    for (const auto& c : (*golden_)["cases"]) texts.push_back(c["text"].get<std::string>());
    return texts;
  }

  static inline Tokenizer* tok_ = nullptr;
  static inline std::shared_ptr<GgufFile>* file_ = nullptr;
  static inline nlohmann::json* golden_ = nullptr;
};

TEST_F(RealModelTokenizer, VocabularyAndSpecialIds) {
  const Tokenizer& t = *tok_;
  EXPECT_EQ(t.n_vocab(), 49152);
  EXPECT_EQ(t.bos(), 1);  // <|im_start|>
  EXPECT_EQ(t.eos(), 2);  // <|im_end|>
  EXPECT_EQ(t.eot(), 0);  // <|endoftext|>, as llama.cpp picks it
  EXPECT_FALSE(t.add_bos());
  // llama.cpp's EOG set for this model: <|endoftext|>, <|im_end|>, <reponame> (FIM repo).
  for (int32_t id = 0; id < t.n_vocab(); ++id) {
    const bool want = id == 0 || id == 2 || id == 4;
    ASSERT_EQ(t.is_eog(id), want) << "id " << id;
  }
  EXPECT_EQ(t.find_token("<|im_start|>"), 1);
  EXPECT_EQ(t.find_token("<|im_end|>"), 2);
  EXPECT_FALSE(t.find_token("<|not_a_token|>"));
}

TEST_F(RealModelTokenizer, CorpusMatchesLlamaCpp) {
  const auto& cases = (*golden_)["cases"];
  ASSERT_GE(cases.size(), 40u);
  int n_checked = 0;
  for (size_t i = 0; i < cases.size(); ++i) {
    const std::string text = cases[i]["text"].get<std::string>();
    for (const bool special : {false, true}) {
      const Ids want = cases[i][special ? "ids_special" : "ids"].get<Ids>();
      const Ids got = tok_->encode(text, /*add_special=*/false, special);
      EXPECT_EQ(got, want) << "case " << i << " special=" << special << " \"" << printable(text)
                           << "\": " << first_difference(got, want);
      ++n_checked;
    }
    // The model does not add BOS/EOS, so add_special changes nothing.
    EXPECT_EQ(tok_->encode(text, true, false), cases[i]["ids"].get<Ids>()) << "case " << i;
  }
  EXPECT_EQ(n_checked, 2 * static_cast<int>(cases.size()));
}

TEST_F(RealModelTokenizer, OtherPreTokenizersMatchLlamaCpp) {
  const std::vector<std::string> texts = corpus();
  for (const auto& variant : (*golden_)["pre_variants"]) {
    const std::string pre = variant["pre"].get<std::string>();
    const Tokenizer t = with_pre(pre);
    const auto& all_ids = variant["ids"];
    ASSERT_EQ(all_ids.size(), texts.size()) << pre;
    for (size_t i = 0; i < texts.size(); ++i) {
      const Ids want = all_ids[i].get<Ids>();
      const Ids got = t.encode(texts[i], false, false);
      EXPECT_EQ(got, want) << "pre=" << pre << " case " << i << " \"" << printable(texts[i])
                           << "\": " << first_difference(got, want);
    }
  }
}

TEST_F(RealModelTokenizer, DecodeInvertsEncode) {
  for (const std::string& text : corpus()) {
    EXPECT_EQ(tok_->decode(tok_->encode(text, false, false)), text) << printable(text);
    // Parsed special tokens come back only when rendered.
    EXPECT_EQ(tok_->decode(tok_->encode(text, false, true), /*render_special=*/true), text)
        << printable(text);
  }
}

TEST_F(RealModelTokenizer, TokenToPieceDecodesByteSymbols) {
  const Tokenizer& t = *tok_;
  // Single-byte tokens (a byte's GPT-2 symbol) render as that byte. This vocabulary lacks 21
  // of them (rare controls and bytes that never occur in UTF-8, e.g. 0xC0, 0xF5..0xFF).
  int n_byte_tokens = 0;
  for (int b = 0; b < 256; ++b) {
    const auto id = t.find_token(unicode::byte_symbol(static_cast<uint8_t>(b)));
    if (!id) continue;
    ++n_byte_tokens;
    EXPECT_EQ(t.token_to_piece(*id), std::string(1, static_cast<char>(b))) << "byte " << b;
  }
  EXPECT_EQ(n_byte_tokens, 256 - 21);
  // A byte without a token is dropped, as llama.cpp does (ids from llama-cpp-python).
  EXPECT_FALSE(t.find_token(unicode::byte_symbol(0x04)));
  EXPECT_EQ(t.encode("a\x04"
                     "b",
                     false, false),
            (Ids{81, 82}));
  EXPECT_EQ(t.token_to_piece(*t.find_token("Ċ")), "\n");
  EXPECT_EQ(t.token_to_piece(*t.find_token("Ġthe")), " the");
  EXPECT_EQ(t.token_to_piece(2), "");  // control tokens render only on request
  EXPECT_EQ(t.token_to_piece(2, true), "<|im_end|>");
}

TEST_F(RealModelTokenizer, StreamingEmojiAcrossTokens) {
  const std::string text = "Family: \U0001F468\u200D\U0001F469\u200D\U0001F467 ok \U0001F600!";
  const Ids ids = tok_->encode(text, false, false);
  Utf8Streamer streamer;
  std::string streamed;
  bool some_piece_was_partial = false;
  for (int32_t id : ids) {
    const std::string piece = tok_->token_to_piece(id);
    const std::string out = streamer.push(piece);
    if (out != piece) some_piece_was_partial = true;
    // Every chunk handed out decodes without a replacement character.
    for (uint32_t cp : unicode::decode_utf8(out)) ASSERT_NE(cp, 0xFFFDu) << printable(out);
    streamed += out;
  }
  streamed += streamer.flush();
  EXPECT_EQ(streamed, text);
  EXPECT_TRUE(some_piece_was_partial) << "the emoji should be split across tokens";
}

// 100 KB of English-like text: the corpus paragraph's words in a fixed pseudo-random order,
// with numbers and line breaks mixed in.
std::string hundred_kb_of_english(const std::string& paragraph) {
  std::vector<std::string> words;
  std::istringstream in(paragraph);
  for (std::string w; in >> w;) words.push_back(w);
  std::mt19937 rng(1234);
  std::string text;
  while (text.size() < 100 * 1024) {
    text += words[rng() % words.size()];
    const uint32_t r = rng() % 50;
    if (r == 0) {
      text += "\n\n";
    } else if (r == 1) {
      text += ' ';
      text += std::to_string(rng() % 100000);
      text += ' ';
    } else {
      text += ' ';
    }
  }
  return text;
}

// Round trip of 100 KB (timing is printed for information; timings are not tests).
TEST_F(RealModelTokenizer, HundredKilobytesRoundTrips) {
  const std::vector<std::string> texts = corpus();
  const std::string& paragraph = texts.back();
  ASSERT_GT(paragraph.size(), 5000u);
  const std::string text = hundred_kb_of_english(paragraph);
  const auto t0 = std::chrono::steady_clock::now();
  const Ids ids = tok_->encode(text, false, false);
  const double ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  std::printf("[ perf     ] encode of %zu bytes: %zu tokens in %.1f ms\n", text.size(), ids.size(),
              ms);
  RecordProperty("encode_100kb_ms", std::to_string(ms));
  EXPECT_EQ(tok_->decode(ids), text);
}

}  // namespace
}  // namespace qevict
