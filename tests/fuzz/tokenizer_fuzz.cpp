// libFuzzer target: the byte-level BPE tokenizer on arbitrary bytes (invalid UTF-8, special-token
// text, every pre-tokenizer family). The vocabulary is built in code once per process
// (fuzz_vocab.h), so no model file is needed.
// Input: byte 0 picks the pre-tokenizer family (bits 0-2) and the flags add_special (bit 3) and
// parse_special (bit 4); the rest is the text.
// Checks beyond the sanitizers: every id is in the vocabulary; for valid UTF-8 the round trip
// decode(encode(s)) == s holds (as tokenizer.h promises); streaming the pieces through
// Utf8Streamer gives back exactly decode()'s bytes.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "common/gguf_builder.h"
#include "fuzz/fuzz_vocab.h"
#include "tokenizer/tokenizer.h"

namespace {

using qevict::Tokenizer;

struct Loaded {
  std::unique_ptr<qevict::test::MemoryGguf> gguf;
  std::unique_ptr<Tokenizer> tok;
};

const std::vector<Loaded>& tokenizers() {
  static const std::vector<Loaded> kAll = [] {
    std::vector<Loaded> all;
    for (const char* pre : {"default", "gpt-2", "smollm", "llama-bpe", "qwen2"}) {
      auto m = qevict::test::open_memory_gguf(qevict::fuzz::toy_vocab_gguf(pre));
      if (!m) {
        std::fprintf(stderr, "toy vocab '%s': %s\n", pre, m.error().c_str());
        std::abort();
      }
      auto t = Tokenizer::from_gguf(*(*m)->file);
      if (!t) {
        std::fprintf(stderr, "toy vocab '%s': %s\n", pre, t.error().c_str());
        std::abort();
      }
      all.push_back({std::move(*m), std::make_unique<Tokenizer>(std::move(*t))});
    }
    return all;
  }();
  return kAll;
}

// Strict UTF-8 (no overlongs, surrogates or code points past U+10FFFF): the inputs for which
// the tokenizer promises an exact round trip.
bool valid_utf8(std::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    const auto c = static_cast<unsigned char>(s[i]);
    size_t n;
    uint32_t cp;
    if (c < 0x80) {
      ++i;
      continue;
    } else if ((c & 0xE0) == 0xC0) {
      n = 2;
      cp = c & 0x1F;
    } else if ((c & 0xF0) == 0xE0) {
      n = 3;
      cp = c & 0x0F;
    } else if ((c & 0xF8) == 0xF0) {
      n = 4;
      cp = c & 0x07;
    } else {
      return false;
    }
    if (i + n > s.size()) return false;
    for (size_t k = 1; k < n; ++k) {
      const auto cc = static_cast<unsigned char>(s[i + k]);
      if ((cc & 0xC0) != 0x80) return false;
      cp = (cp << 6) | (cc & 0x3F);
    }
    static constexpr uint32_t kMin[5] = {0, 0, 0x80, 0x800, 0x10000};
    if (cp < kMin[n] || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return false;
    i += n;
  }
  return true;
}

[[noreturn]] void fail(const char* what, std::string_view text) {
  std::fprintf(stderr, "tokenizer_fuzz: %s (input %zu bytes)\n", what, text.size());
  std::abort();
}

}  // namespace

// Builds the vocabularies before the first input, outside libFuzzer's per-input -timeout.
extern "C" int LLVMFuzzerInitialize(int* /*argc*/, char*** /*argv*/) {
  (void)tokenizers();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const auto& all = tokenizers();
  const Tokenizer& t = *all[(data[0] & 7) % all.size()].tok;
  const bool add_special = (data[0] & 8) != 0;
  const bool parse_special = (data[0] & 16) != 0;
  const std::string_view text(reinterpret_cast<const char*>(data + 1), size - 1);

  const std::vector<int32_t> ids = t.encode(text, add_special, parse_special);
  for (int32_t id : ids)
    if (id < 0 || id >= t.n_vocab()) fail("token id out of range", text);

  // Control tokens render only with render_special; with it, and without BOS/EOS added, the
  // pieces spell the input back.
  const std::string back = t.decode(ids, /*render_special=*/true);
  if (!add_special && valid_utf8(text) && back != text) fail("round trip changed the text", text);

  qevict::Utf8Streamer streamer;
  std::string streamed;
  for (int32_t id : ids) streamed += streamer.push(t.token_to_piece(id, true));
  streamed += streamer.flush();
  if (streamed != back) fail("Utf8Streamer output differs from decode()", text);

  (void)t.find_token(text);
  for (int32_t id : ids) (void)t.is_eog(id);
  return 0;
}
