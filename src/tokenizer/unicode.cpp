// Unicode helpers for the byte-level BPE tokenizer (see unicode.h). The code point classes
// come from the generated table in unicode_data.cpp.
#include "tokenizer/unicode.h"

#include <array>

namespace qevict::unicode {

namespace {

constexpr uint32_t kMaxCodepoint = 0x110000;
constexpr uint32_t kReplacement = 0xFFFD;

// Expands the range table into one byte per code point (1.1 MB, built once).
std::vector<uint8_t> build_flag_table() {
  std::vector<uint8_t> table(kMaxCodepoint, 0);
  for (size_t i = 0; i < kNumCodepointRanges; ++i) {
    const uint32_t begin = kCodepointRanges[i].first;
    const uint32_t end =
        i + 1 < kNumCodepointRanges ? kCodepointRanges[i + 1].first : kMaxCodepoint;
    for (uint32_t cp = begin; cp < end; ++cp) table[cp] = kCodepointRanges[i].flags;
  }
  return table;
}

// GPT-2's bytes_to_unicode: the printable Latin-1 bytes map to themselves, the other 68
// bytes to U+0100.. in byte order.
struct ByteSymbols {
  std::array<std::string, 256> symbol;
  std::array<int16_t, 324> byte_of;  // indexed by code point; symbols are all < 0x144

  ByteSymbols() {
    byte_of.fill(-1);
    auto printable = [](int b) {
      return (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
    };
    uint32_t next = 0x100;
    for (int b = 0; b < 256; ++b) {
      const uint32_t cp = printable(b) ? static_cast<uint32_t>(b) : next++;
      append_utf8(cp, &symbol[b]);
      byte_of[cp] = static_cast<int16_t>(b);
    }
  }
};

const ByteSymbols& byte_symbols() {
  static const ByteSymbols symbols;
  return symbols;
}

}  // namespace

CodepointFlags flags(uint32_t cp) {
  static const std::vector<uint8_t> table = build_flag_table();
  return CodepointFlags{cp < kMaxCodepoint ? table[cp] : uint8_t{0}};
}

size_t utf8_len(uint8_t first_byte) {
  static constexpr uint8_t kLen[16] = {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 3, 4};
  return kLen[first_byte >> 4];
}

std::vector<uint32_t> decode_utf8(std::string_view s) {
  std::vector<uint32_t> out;
  out.reserve(s.size());
  const size_t n = s.size();
  auto byte = [&](size_t i) { return static_cast<uint8_t>(s[i]); };
  auto cont = [&](size_t i) { return i < n && (byte(i) & 0xC0) == 0x80; };
  size_t i = 0;
  while (i < n) {
    const uint8_t b0 = byte(i);
    if (b0 < 0x80) {
      out.push_back(b0);
      i += 1;
    } else if ((b0 & 0xE0) == 0xC0 && cont(i + 1)) {
      out.push_back((uint32_t{b0 & 0x1Fu} << 6) | (byte(i + 1) & 0x3Fu));
      i += 2;
    } else if ((b0 & 0xF0) == 0xE0 && cont(i + 1) && cont(i + 2)) {
      out.push_back((uint32_t{b0 & 0x0Fu} << 12) | ((byte(i + 1) & 0x3Fu) << 6) |
                    (byte(i + 2) & 0x3Fu));
      i += 3;
    } else if ((b0 & 0xF8) == 0xF0 && cont(i + 1) && cont(i + 2) && cont(i + 3)) {
      out.push_back((uint32_t{b0 & 0x07u} << 18) | ((byte(i + 1) & 0x3Fu) << 12) |
                    ((byte(i + 2) & 0x3Fu) << 6) | (byte(i + 3) & 0x3Fu));
      i += 4;
    } else {
      // Stray continuation byte, 0xF8..0xFF, or a truncated sequence: one U+FFFD per byte.
      out.push_back(kReplacement);
      i += 1;
    }
  }
  return out;
}

void append_utf8(uint32_t cp, std::string* out) {
  if (cp < 0x80) {
    out->push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out->push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out->push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < kMaxCodepoint) {
    out->push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    append_utf8(kReplacement, out);
  }
}

const std::string& byte_symbol(uint8_t byte) { return byte_symbols().symbol[byte]; }

int byte_of_symbol(uint32_t cp) {
  const auto& table = byte_symbols().byte_of;
  return cp < table.size() ? table[cp] : -1;
}

}  // namespace qevict::unicode
