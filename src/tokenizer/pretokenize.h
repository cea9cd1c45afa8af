// Pre-tokenizers: split text into the words that BPE merges run on, exactly as llama.cpp's
// unicode_regex_split does for each tokenizer.ggml.pre family (src/llama-vocab.cpp,
// LLAMA_VOCAB_PRE_TYPE_*), but with hand-written scanners instead of regexes.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace qevict {

// The regex families implemented. Each names llama.cpp's regex list:
//   kDefault: [\p{P}\$\+<=>\^~\|]+ , then the GPT-2 regex, then \p{N}+ , then [0-9][0-9][0-9]
//   kGpt2:    's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)
//   kSmollm:  \p{N} (every digit alone), then the GPT-2 regex
//   kLlama3:  (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|
//             ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+
//   kQwen2:   as kLlama3 but \p{N} (one digit at a time) instead of \p{N}{1,3}
// Later regexes in a list split the pieces produced by the earlier ones.
enum class PreTokenizer { kDefault, kGpt2, kSmollm, kLlama3, kQwen2 };

// How llama.cpp treats one tokenizer.ggml.pre name.
struct PreTokenizerInfo {
  PreTokenizer type = PreTokenizer::kDefault;
  bool ignore_merges = false;    // a word that is itself a token skips the merges (llama3)
  bool add_bos_default = false;  // add_bos when the file has no tokenizer.ggml.add_bos_token
};

// Maps a tokenizer.ggml.pre value (e.g. "smollm", "llama-bpe", "qwen2", "gpt-2", "default")
// to its family; nullopt when the name is not one of the supported families.
std::optional<PreTokenizerInfo> pre_tokenizer_from_name(std::string_view name);

// Splits code points into words; returns the word lengths in code points, in order, summing
// to cpts.size(). Empty input gives no words.
std::vector<size_t> split_words(const std::vector<uint32_t>& cpts, PreTokenizer type);

// Convenience (used by tests): decodes UTF-8 as the tokenizer does, splits, and returns the
// words as UTF-8 strings (raw text, not byte-level encoded).
std::vector<std::string> pre_tokenize(std::string_view text, PreTokenizer type);

}  // namespace qevict
