// Unicode helpers for the byte-level BPE tokenizer: UTF-8 decoding with llama.cpp's error
// handling, per-code-point classes (\p{L}, \p{N}, \s, ...) and GPT-2's byte <-> symbol map.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace qevict::unicode {

// General-category class of a code point, at the granularity llama.cpp's regexes use.
// The values are stored in the generated table (tools/gen_unicode_tables.py).
enum class UnicodeClass : uint8_t {
  kUndefined = 0,    // Cn (unassigned, noncharacters) and code points >= 0x110000
  kNumber = 1,       // \p{N}
  kLetter = 2,       // \p{L}
  kSeparator = 3,    // \p{Z}
  kMark = 4,         // \p{M}
  kPunctuation = 5,  // \p{P}
  kSymbol = 6,       // \p{S}
  kControl = 7,      // Cc, Cf, Cs, Co
};

constexpr uint8_t kClassMask = 0x07;
constexpr uint8_t kWhitespaceBit = 0x08;  // the White_Space property, i.e. llama.cpp's \s

// Generated table (unicode_data.cpp): ranges sorted by `first`, covering 0..0x10FFFF.
struct CodepointRange {
  uint32_t first;
  uint8_t flags;  // UnicodeClass | kWhitespaceBit
};
extern const CodepointRange kCodepointRanges[];
extern const size_t kNumCodepointRanges;

struct CodepointFlags {
  uint8_t bits = 0;
  UnicodeClass cls() const { return static_cast<UnicodeClass>(bits & kClassMask); }
  bool is_letter() const { return cls() == UnicodeClass::kLetter; }
  bool is_number() const { return cls() == UnicodeClass::kNumber; }
  bool is_punctuation() const { return cls() == UnicodeClass::kPunctuation; }
  bool is_whitespace() const { return (bits & kWhitespaceBit) != 0; }
};

// O(1) lookup (a flat table built on first use). Code points past 0x10FFFF are undefined.
CodepointFlags flags(uint32_t cp);

// Byte length of a UTF-8 sequence from its first byte, as llama.cpp's unicode_len_utf8:
// 1 for ASCII and for stray continuation bytes, 2/3/4 from the lead bits.
size_t utf8_len(uint8_t first_byte);

// Decodes UTF-8 exactly as llama.cpp's unicode_cpts_from_utf8 does, so that malformed
// input tokenizes the same: a byte that does not start a complete sequence becomes U+FFFD
// and decoding resumes at the next byte; overlong forms and surrogates are not rejected.
std::vector<uint32_t> decode_utf8(std::string_view s);

// Appends the UTF-8 encoding of cp. Values past 0x10FFFF (only reachable from malformed
// 4-byte input) are written as U+FFFD; llama.cpp throws there.
void append_utf8(uint32_t cp, std::string* out);

// GPT-2's bytes_to_unicode: every byte maps to one printable code point (as UTF-8), so that
// BPE works on text without raw spaces or control bytes. byte_of_symbol inverts it and
// returns -1 for a code point that is not such a symbol.
const std::string& byte_symbol(uint8_t byte);
int byte_of_symbol(uint32_t cp);

}  // namespace qevict::unicode
