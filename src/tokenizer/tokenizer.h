// Byte-level BPE tokenizer for GGUF files with tokenizer.ggml.model = "gpt2", reproducing
// llama.cpp's token ids exactly (special-token splitting, pre-tokenizer, merges, byte fallback).
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "core/status.h"
#include "gguf/gguf.h"
#include "tokenizer/pretokenize.h"

namespace qevict {

class Tokenizer {
 public:
  // Reads the tokenizer.ggml.* metadata. An error names the key when the model or pre-tokenizer
  // is unsupported, or a required array is missing or malformed.
  static Expected<Tokenizer> from_gguf(const GgufFile& f);

  // Text -> token ids. add_special: add BOS/EOS as the file's add_bos_token/add_eos_token say.
  // parse_special: text that spells a control token (e.g. "<|im_start|>") becomes that token,
  // as llama.cpp's special=true; user-defined tokens are always matched, as in llama.cpp.
  std::vector<int32_t> encode(std::string_view text, bool add_special, bool parse_special) const;

  // Raw bytes of one token (byte-level symbols decoded). Control and unknown tokens render
  // empty unless render_special; user-defined tokens always render their text. An id out of
  // range renders empty.
  std::string token_to_piece(int32_t id, bool render_special = false) const;
  // Concatenated pieces. Unlike llama_detokenize it never cleans up spaces, so that
  // decode(encode(s)) == s for valid UTF-8 (llama.cpp only does that for some pre-tokenizers).
  std::string decode(const std::vector<int32_t>& ids, bool render_special = false) const;

  int32_t bos() const { return bos_; }  // -1 if none
  int32_t eos() const { return eos_; }  // -1 if none
  int32_t eot() const { return eot_; }  // -1 if none
  // End of generation: eos, eot, eom, and the tokens llama.cpp recognises by text
  // (<|im_end|>, <|endoftext|>, <|eot_id|>, FIM pad/repo/file-sep, ...).
  bool is_eog(int32_t id) const;
  int32_t n_vocab() const { return static_cast<int32_t>(tokens_.size()); }
  bool add_bos() const { return add_bos_; }
  // The id of the token whose vocabulary text is exactly `piece` (the byte-level form for
  // normal tokens, e.g. "Ġthe"; special tokens are spelled as written, e.g. "<|im_end|>").
  std::optional<int32_t> find_token(std::string_view piece) const;

 private:
  // Token attributes, as llama.cpp's llama_token_attr bits (from tokenizer.ggml.token_type).
  enum Attr : uint8_t {
    kUndefined = 0,
    kUnknown = 1 << 0,
    kUnused = 1 << 1,
    kNormal = 1 << 2,
    kControl = 1 << 3,
    kUserDefined = 1 << 4,
    kByte = 1 << 5,
  };
  struct StringHash {
    using is_transparent = void;
    size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
  };
  using StringMap = std::unordered_map<std::string, int32_t, StringHash, std::equal_to<>>;
  struct Fragment;  // a piece of the input: raw text or an already-matched special token

  Tokenizer() = default;
  int32_t text_to_id(std::string_view text) const;
  void partition_special(std::string_view text, bool parse_special,
                         std::vector<Fragment>* fragments) const;
  void encode_text(std::string_view text,
                   std::unordered_map<std::string, std::vector<int32_t>>* cache,
                   std::vector<int32_t>* out) const;
  void bpe_word(const std::string& word, std::vector<int32_t>* out) const;

  std::vector<std::string> tokens_;   // [n_vocab] vocabulary text
  std::vector<uint8_t> attrs_;        // [n_vocab] Attr bits
  std::vector<std::string> pieces_;   // [n_vocab] token_to_piece(id, render_special=true)
  StringMap token_ids_;               // vocabulary text -> id
  StringMap merge_ranks_;             // "left right" -> rank (position in tokenizer.ggml.merges)
  std::vector<int32_t> special_ids_;  // control/user-defined/unknown ids, longest text first
  std::vector<int32_t> eog_ids_;      // sorted
  PreTokenizerInfo pre_;
  int32_t bos_ = -1;
  int32_t eos_ = -1;
  int32_t eot_ = -1;
  bool add_bos_ = false;
  bool add_eos_ = false;
};

// Streaming output helper: accumulates piece bytes and returns only complete UTF-8 prefixes,
// holding back an incomplete multi-byte tail until the rest arrives. Bytes that can never
// complete (invalid UTF-8) are passed through rather than held forever.
class Utf8Streamer {
 public:
  std::string push(std::string_view bytes);
  std::string flush();  // returns whatever is held back, complete or not

 private:
  std::string pending_;
};

}  // namespace qevict
