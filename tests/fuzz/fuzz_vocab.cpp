// The fuzzers' toy vocabulary; see fuzz_vocab.h.
#include "fuzz/fuzz_vocab.h"

#include <algorithm>
#include <map>
#include <utility>

#include "common/gguf_builder.h"
#include "tokenizer/pretokenize.h"
#include "tokenizer/unicode.h"

namespace qevict::fuzz {

namespace {

// Training text for the merges: English, code, digits, and a few non-Latin scripts, so that
// merged tokens span multi-byte characters too.
constexpr const char* kText =
    "The quick brown fox jumps over the lazy dog. The dog sleeps; the fox runs away.\n"
    "In the beginning there was the word, and the word was tokenized into pieces.\n"
    "def tokenize(text):\n    return [t for t in text.split(' ') if t]\n"
    "for (int i = 0; i < 1024; ++i) { sum += data[i] * 3.14159; }\n"
    "Numbers: 0 1 2 3 4 5 6 7 8 9 10 100 1000 2024 3.5 -7 1e9\n"
    "Fran\xc3\xa7"
    "ais: l'\xc3\xa9t\xc3\xa9 est l\xc3\xa0, o\xc3\xb9 est le caf\xc3\xa9 ?\n"
    "\xd0\x9f\xd1\x80\xd0\xb8\xd0\xb2\xd0\xb5\xd1\x82, \xd0\xbc\xd0\xb8\xd1\x80! "
    "\xd0\x9f\xd1\x80\xd0\xb8\xd0\xb2\xd0\xb5\xd1\x82 \xd0\xb5\xd1\x89\xd1\x91 "
    "\xd1\x80\xd0\xb0\xd0\xb7.\n"
    "\xe4\xbd\xa0\xe5\xa5\xbd\xef\xbc\x8c\xe4\xb8\x96\xe7\x95\x8c\xe3\x80\x82\xe4\xbd\xa0\xe5\xa5"
    "\xbd\xe5\x90\x97\xef\xbc\x9f\n"
    "emoji \xf0\x9f\x91\x8b\xf0\x9f\x91\x8b \xf0\x9f\x98\x80 and tabs\t\tand  spaces   here\r\n"
    "I'm you're we've they'll she'd it's DON'T WON'T\n";

constexpr int kMerges = 400;

std::vector<std::string> learn_merges(std::vector<std::string>* tokens) {
  // Words of the text as sequences of byte-level symbols.
  std::vector<std::vector<std::string>> words;
  for (const std::string& w : pre_tokenize(kText, PreTokenizer::kGpt2)) {
    std::vector<std::string> syms;
    for (unsigned char b : w) syms.push_back(unicode::byte_symbol(b));
    words.push_back(std::move(syms));
  }
  std::vector<std::string> merges;
  for (int round = 0; round < kMerges; ++round) {
    std::map<std::pair<std::string, std::string>, int> counts;  // ordered: ties break stably
    for (const auto& w : words)
      for (size_t i = 0; i + 1 < w.size(); ++i) ++counts[{w[i], w[i + 1]}];
    if (counts.empty()) break;
    auto best = counts.begin();
    for (auto it = counts.begin(); it != counts.end(); ++it)
      if (it->second > best->second) best = it;
    if (best->second < 2) break;
    const auto [l, r] = best->first;
    merges.push_back(l + " " + r);
    tokens->push_back(l + r);
    for (auto& w : words) {
      std::vector<std::string> out;
      for (size_t i = 0; i < w.size(); ++i) {
        if (i + 1 < w.size() && w[i] == l && w[i + 1] == r) {
          out.push_back(l + r);
          ++i;
        } else {
          out.push_back(w[i]);
        }
      }
      w = std::move(out);
    }
  }
  return merges;
}

struct Special {
  const char* text;
  int32_t type;  // LLAMA_TOKEN_TYPE_*: 2 unknown, 3 control, 4 user-defined, 5 unused, 6 byte
};
// Overlapping texts ("<|im" is a prefix of two control tokens) exercise the longest-first
// special-token partition.
constexpr Special kSpecials[] = {
    {"<|endoftext|>", 3}, {"<|im_start|>", 3}, {"<|im_end|>", 3}, {"<|fim_prefix|>", 3},
    {"<|fim_pad|>", 3},   {"<|im", 4},         {"<u>", 4},        {"<unk>", 2},
    {"<unused0>", 5},     {"<0x0A>", 6},
};

}  // namespace

const std::vector<std::string>& toy_vocab_specials() {
  static const std::vector<std::string> kTexts = [] {
    std::vector<std::string> v;
    for (const Special& s : kSpecials) v.push_back(s.text);
    return v;
  }();
  return kTexts;
}

std::vector<uint8_t> toy_vocab_gguf(const std::string& pre, const std::string& chat_template) {
  // Learned once per process: the vocabulary does not depend on `pre`.
  static const auto kLearned = [] {
    std::pair<std::vector<std::string>, std::vector<std::string>> tm;  // tokens, merges
    for (int b = 0; b < 256; ++b) tm.first.push_back(unicode::byte_symbol(static_cast<uint8_t>(b)));
    tm.second = learn_merges(&tm.first);
    return tm;
  }();
  std::vector<std::string> tokens = kLearned.first;
  const std::vector<std::string>& merges = kLearned.second;
  std::vector<int32_t> types(tokens.size(), 1);
  for (const Special& s : kSpecials) {
    tokens.push_back(s.text);
    types.push_back(s.type);
  }
  auto id_of = [&](const std::string& t) {
    return static_cast<uint32_t>(std::find(tokens.begin(), tokens.end(), t) - tokens.begin());
  };
  test::GgufBuilder b;
  b.add_string("general.architecture", "llama")
      .add_string("tokenizer.ggml.model", "gpt2")
      .add_string("tokenizer.ggml.pre", pre)
      .add_string_array("tokenizer.ggml.tokens", tokens)
      .add_array("tokenizer.ggml.token_type", GgufValueType::kInt32, types)
      .add_string_array("tokenizer.ggml.merges", merges)
      .add_u32("tokenizer.ggml.bos_token_id", id_of("<|im_start|>"))
      .add_u32("tokenizer.ggml.eos_token_id", id_of("<|im_end|>"))
      .add_u32("tokenizer.ggml.unknown_token_id", id_of("<unk>"))
      .add_bool("tokenizer.ggml.add_bos_token", false);
  if (!chat_template.empty()) b.add_string("tokenizer.chat_template", chat_template);
  return b.build().bytes;
}

}  // namespace qevict::fuzz
