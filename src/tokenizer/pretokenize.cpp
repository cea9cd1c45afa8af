// Pre-tokenizers (see pretokenize.h). Each scanner reproduces what llama.cpp computes for one
// regex, including its quirks: the GPT-2 and llama3 regexes follow llama.cpp's hand-written
// splitters (unicode.cpp: unicode_regex_split_custom_*); the others follow std::regex over
// llama.cpp's "collapsed" text, where each non-ASCII code point stands for its class.
#include "tokenizer/pretokenize.h"

#include <array>

#include "tokenizer/unicode.h"

namespace qevict {

namespace {

using Chunks = std::vector<size_t>;  // piece lengths in code points

// Appends the piece [prev, end) when it is not empty; returns its length.
struct Emitter {
  size_t prev;
  Chunks* out;
  size_t emit(size_t end) {
    const size_t len = end - prev;
    if (len > 0) out->push_back(len);
    prev = end;
    return len;
  }
};

// Runs split(begin, end, out) over every chunk of the previous stage.
template <typename Split>
Chunks split_chunks(const Chunks& chunks, Split&& split) {
  Chunks out;
  out.reserve(chunks.size() * 2);
  size_t begin = 0;
  for (size_t len : chunks) {
    split(begin, begin + len, &out);
    begin += len;
  }
  return out;
}

// One chunk's code points with the class tests the regexes need. Positions at or past `end`
// belong to no class: llama.cpp's scanners never look across a chunk boundary.
struct Span {
  const std::vector<uint32_t>& cpts;
  size_t end;

  unicode::CodepointFlags flags(size_t i) const { return unicode::flags(cpts[i]); }
  bool letter(size_t i) const { return i < end && flags(i).is_letter(); }
  bool number(size_t i) const { return i < end && flags(i).is_number(); }
  bool space(size_t i) const { return i < end && flags(i).is_whitespace(); }
  // [^\s\p{L}\p{N}]
  bool other(size_t i) const {
    if (i >= end) return false;
    const auto f = flags(i);
    return !(f.is_whitespace() || f.is_letter() || f.is_number());
  }
  bool cr_or_lf(size_t i) const { return i < end && (cpts[i] == '\r' || cpts[i] == '\n'); }
};

// ASCII lowercase is all that (?i:...) needs here: tools/gen_unicode_tables.py checks that no
// other code point lowercases to one of the contraction letters.
uint32_t ascii_lower(uint32_t cp) { return cp >= 'A' && cp <= 'Z' ? cp + ('a' - 'A') : cp; }

// Length of a contraction 's 't 're 've 'm 'll 'd at pos (0 if none); case-sensitive or not.
size_t contraction_len(const Span& s, size_t pos, bool ignore_case) {
  if (s.cpts[pos] != '\'' || pos + 1 >= s.end) return 0;
  auto lower = [&](size_t i) { return ignore_case ? ascii_lower(s.cpts[i]) : s.cpts[i]; };
  const uint32_t c1 = lower(pos + 1);
  if (c1 == 's' || c1 == 't' || c1 == 'm' || c1 == 'd') return 2;
  if (pos + 2 >= s.end) return 0;
  const uint32_t c2 = lower(pos + 2);
  if ((c1 == 'r' && c2 == 'e') || (c1 == 'v' && c2 == 'e') || (c1 == 'l' && c2 == 'l')) return 3;
  return 0;
}

// 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
void split_gpt2(const std::vector<uint32_t>& cpts, size_t begin, size_t end, Chunks* out) {
  const Span s{cpts, end};
  Emitter e{begin, out};
  size_t pos = begin;
  while (pos < end) {
    if (const size_t n = contraction_len(s, pos, /*ignore_case=*/false)) {
      pos += e.emit(pos + n);
      continue;
    }
    // " ?X+" for X in letters, numbers, others: the optional space is one U+0020 only.
    const size_t q = pos + (cpts[pos] == ' ' ? 1 : 0);
    bool (Span::*run_class)(size_t) const = nullptr;
    if (s.letter(q)) {
      run_class = &Span::letter;
    } else if (s.number(q)) {
      run_class = &Span::number;
    } else if (s.other(q)) {
      run_class = &Span::other;
    }
    if (run_class) {
      size_t p = q;
      while ((s.*run_class)(p)) ++p;
      e.emit(p);
      pos = p;
      continue;
    }
    size_t n_space = 0;
    while (s.space(pos + n_space)) ++n_space;
    if (n_space > 1 && pos + n_space < end) {
      // \s+(?!\S): leave the last whitespace to start the next word.
      pos += n_space - 1;
    } else {
      pos += n_space > 0 ? n_space : 1;
    }
    e.emit(pos);
  }
}

// (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,max_digits}|
//  ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+
void split_llama3(const std::vector<uint32_t>& cpts, size_t begin, size_t end, size_t max_digits,
                  Chunks* out) {
  const Span s{cpts, end};
  Emitter e{begin, out};
  size_t pos = begin;
  while (pos < end) {
    const uint32_t cp = cpts[pos];
    if (const size_t n = contraction_len(s, pos, /*ignore_case=*/true)) {
      pos += e.emit(pos + n);
      continue;
    }
    // [^\r\n\p{L}\p{N}]?\p{L}+
    if (!(cp == '\r' || cp == '\n' || s.number(pos)) && (s.letter(pos) || s.letter(pos + 1))) {
      size_t p = pos + 1;
      while (s.letter(p)) ++p;
      e.emit(p);
      pos = p;
      continue;
    }
    // \p{N}{1,max_digits}
    if (s.number(pos)) {
      size_t group_start = pos;
      while (s.number(pos)) {
        if (++pos - group_start >= max_digits) {
          e.emit(pos);
          group_start = pos;
        }
      }
      e.emit(pos);
      continue;
    }
    //  ?[^\s\p{L}\p{N}]+[\r\n]*  (a lone space at the chunk end also lands here, as a word)
    const size_t q = pos + (cp == ' ' ? 1 : 0);
    if (q >= end || s.other(q)) {
      size_t p = q;
      while (s.other(p)) ++p;
      while (s.cr_or_lf(p)) ++p;
      e.emit(p);
      pos = p;
      continue;
    }
    size_t n_space = 0;
    size_t after_last_newline = 0;  // \s*[\r\n]+ ends after the run's last \r or \n
    while (s.space(pos + n_space)) {
      if (s.cr_or_lf(pos + n_space)) after_last_newline = pos + n_space + 1;
      ++n_space;
    }
    if (after_last_newline > 0) {
      pos = after_last_newline;
    } else if (n_space > 1 && pos + n_space < end) {
      pos += n_space - 1;  // \s+(?!\S)
    } else {
      pos += n_space > 0 ? n_space : 1;
    }
    e.emit(pos);
  }
}

// A regex "[class]+" (or "[class]" when single) through std::regex_iterator: every match and
// every gap between matches becomes a piece.
template <typename Pred>
void split_class(const std::vector<uint32_t>& cpts, size_t begin, size_t end, bool single,
                 Pred&& in_class, Chunks* out) {
  Emitter e{begin, out};
  size_t i = begin;
  while (i < end) {
    if (!in_class(cpts[i])) {
      ++i;
      continue;
    }
    e.emit(i);
    size_t j = i + 1;
    if (!single) {
      while (j < end && in_class(cpts[j])) ++j;
    }
    e.emit(j);
    i = j;
  }
  e.emit(end);
}

// [0-9][0-9][0-9], leftmost and non-overlapping.
void split_digit_triples(const std::vector<uint32_t>& cpts, size_t begin, size_t end, Chunks* out) {
  auto digit = [&](size_t i) { return cpts[i] >= '0' && cpts[i] <= '9'; };
  Emitter e{begin, out};
  size_t i = begin;
  while (i + 3 <= end) {
    if (digit(i) && digit(i + 1) && digit(i + 2)) {
      e.emit(i);
      e.emit(i + 3);
      i += 3;
    } else {
      ++i;
    }
  }
  e.emit(end);
}

// \p{N} over collapsed text: ASCII 0-9 and the non-ASCII code points of class N.
bool is_number_cp(uint32_t cp) { return unicode::flags(cp).is_number(); }

// [\p{P}\$\+<=>\^~\|] over collapsed text: llama.cpp spells \p{P} for ASCII as every
// punctuation or symbol character except '`' (with $+<=>^~| listed explicitly), and as
// class P for the rest.
bool is_default_punct_cp(uint32_t cp) {
  if (cp < 0x80) {
    static constexpr std::string_view kAscii = "!\"#$%&'()*+,-./:;<=>?@[\\]^_{|}~";
    return kAscii.find(static_cast<char>(cp)) != std::string_view::npos;
  }
  const auto f = unicode::flags(cp);
  return f.is_punctuation() && !f.is_whitespace();
}

}  // namespace

std::optional<PreTokenizerInfo> pre_tokenizer_from_name(std::string_view name) {
  struct Entry {
    std::string_view name;
    PreTokenizerInfo info;
  };
  using P = PreTokenizer;
  // Names as llama.cpp maps them (llama_vocab::impl::load); ones that need extra handling we
  // do not implement (add_sep, per-token lstrip/rstrip, no BOS) are left out.
  static constexpr std::array kNames = {
      Entry{"default", {P::kDefault, false, false}},
      Entry{"gpt-2", {P::kGpt2, false, false}},
      Entry{"phi-2", {P::kGpt2, false, false}},
      Entry{"gigachat", {P::kGpt2, false, false}},
      Entry{"a.x-4.0", {P::kGpt2, false, false}},
      Entry{"mellum", {P::kGpt2, false, false}},
      Entry{"exaone4", {P::kGpt2, false, false}},
      Entry{"mpt", {P::kGpt2, false, false}},
      Entry{"olmo", {P::kGpt2, false, false}},
      Entry{"jais", {P::kGpt2, false, false}},
      Entry{"trillion", {P::kGpt2, false, false}},
      Entry{"granite-docling", {P::kGpt2, false, false}},
      Entry{"smollm", {P::kSmollm, false, false}},
      Entry{"starcoder", {P::kSmollm, false, false}},
      Entry{"refact", {P::kSmollm, false, false}},
      Entry{"command-r", {P::kSmollm, false, false}},
      Entry{"codeshell", {P::kSmollm, false, false}},
      Entry{"exaone", {P::kSmollm, false, false}},
      Entry{"minerva-7b", {P::kSmollm, false, false}},
      Entry{"llama3", {P::kLlama3, true, true}},
      Entry{"llama-v3", {P::kLlama3, true, true}},
      Entry{"llama-bpe", {P::kLlama3, true, true}},
      Entry{"falcon3", {P::kLlama3, true, true}},
      Entry{"falcon-h1", {P::kLlama3, true, true}},
      Entry{"pixtral", {P::kLlama3, true, true}},
      Entry{"midm-2.0", {P::kLlama3, true, true}},
      Entry{"lfm2", {P::kLlama3, true, true}},
      Entry{"dbrx", {P::kLlama3, false, false}},
      Entry{"smaug-bpe", {P::kLlama3, false, false}},
      Entry{"qwen2", {P::kQwen2, false, false}},
      Entry{"deepseek-r1-qwen", {P::kQwen2, false, false}},
      Entry{"megrez", {P::kQwen2, false, false}},
      Entry{"stablelm2", {P::kQwen2, false, false}},
      Entry{"hunyuan", {P::kQwen2, false, false}},
  };
  for (const Entry& e : kNames) {
    if (e.name == name) return e.info;
  }
  return std::nullopt;
}

std::vector<size_t> split_words(const std::vector<uint32_t>& cpts, PreTokenizer type) {
  if (cpts.empty()) return {};
  Chunks chunks = {cpts.size()};
  auto gpt2 = [&](size_t b, size_t e, Chunks* out) { split_gpt2(cpts, b, e, out); };
  switch (type) {
    case PreTokenizer::kDefault:
      chunks = split_chunks(chunks, [&](size_t b, size_t e, Chunks* out) {
        split_class(cpts, b, e, /*single=*/false, is_default_punct_cp, out);
      });
      chunks = split_chunks(chunks, gpt2);
      chunks = split_chunks(chunks, [&](size_t b, size_t e, Chunks* out) {
        split_class(cpts, b, e, /*single=*/false, is_number_cp, out);
      });
      return split_chunks(
          chunks, [&](size_t b, size_t e, Chunks* out) { split_digit_triples(cpts, b, e, out); });
    case PreTokenizer::kGpt2:
      return split_chunks(chunks, gpt2);
    case PreTokenizer::kSmollm:
      chunks = split_chunks(chunks, [&](size_t b, size_t e, Chunks* out) {
        split_class(cpts, b, e, /*single=*/true, is_number_cp, out);
      });
      return split_chunks(chunks, gpt2);
    case PreTokenizer::kLlama3:
    case PreTokenizer::kQwen2: {
      const size_t max_digits = type == PreTokenizer::kLlama3 ? 3 : 1;
      return split_chunks(chunks, [&](size_t b, size_t e, Chunks* out) {
        split_llama3(cpts, b, e, max_digits, out);
      });
    }
  }
  return chunks;
}

std::vector<std::string> pre_tokenize(std::string_view text, PreTokenizer type) {
  const std::vector<uint32_t> cpts = unicode::decode_utf8(text);
  std::vector<std::string> words;
  size_t start = 0;
  for (size_t len : split_words(cpts, type)) {
    std::string& w = words.emplace_back();
    for (size_t i = start; i < start + len; ++i) unicode::append_utf8(cpts[i], &w);
    start += len;
  }
  return words;
}

}  // namespace qevict
