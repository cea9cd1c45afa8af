// Fuzzing helper: a small byte-level BPE vocabulary built in code (no model file needed), so
// the tokenizer target runs anywhere. 256 byte symbols, merges learned by a few hundred
// rounds of plain BPE on a short multilingual text, and special tokens of every kind.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace qevict::fuzz {

// A GGUF image (built with tests/common/gguf_builder.h) holding tokenizer.ggml.* metadata for
// that vocabulary with tokenizer.ggml.pre = `pre`, and, when non-empty, tokenizer.chat_template.
std::vector<uint8_t> toy_vocab_gguf(const std::string& pre, const std::string& chat_template = "");

// The special tokens it contains (control, user-defined, unknown), for seeds and dictionaries.
const std::vector<std::string>& toy_vocab_specials();

}  // namespace qevict::fuzz
