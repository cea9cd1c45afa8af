// Byte-level BPE tokenizer (see tokenizer.h). The steps and their order follow llama.cpp's
// llama_vocab (src/llama-vocab.cpp): load + special-token detection, tokenizer_st_partition,
// llm_tokenizer_bpe_session::tokenize and token_to_piece.
#include "tokenizer/tokenizer.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstdlib>
#include <queue>

#include "tokenizer/unicode.h"

namespace qevict {

namespace {

const GgufValue* find_string_array(const GgufFile& f, const std::string& key) {
  const GgufValue* v = f.find(key);
  if (!v || v->type != GgufValueType::kArray || v->arr_type != GgufValueType::kString) {
    return nullptr;
  }
  return v;
}

std::optional<int64_t> find_int(const GgufFile& f, const std::string& key) {
  const GgufValue* v = f.find(key);
  if (!v || !v->is_integer()) return std::nullopt;
  return v->i;
}

// A normal token's text is byte-level symbols; map each back to its byte. A code point that
// is not a byte symbol is spelled out as llama.cpp's llama_decode_text does.
std::string decode_byte_symbols(const std::string& text) {
  std::string out;
  for (uint32_t cp : unicode::decode_utf8(text)) {
    const int b = unicode::byte_of_symbol(cp);
    if (b >= 0) {
      out.push_back(static_cast<char>(b));
      continue;
    }
    std::string utf8;
    unicode::append_utf8(cp, &utf8);
    out += "[UNK_BYTE_0x";
    for (char c : utf8) out += fmt::format("{:02x}", static_cast<uint8_t>(c));
    out += text + "]";
  }
  return out;
}

// Texts that make a token end generation (llama_vocab::impl::load, special_eog_ids).
const std::vector<std::string_view>& eog_texts() {
  // clang-format off
  static const std::vector<std::string_view> kTexts = {
      "<|eot_id|>", "<|im_end|>", "<|end|>", "<|return|>", "<|call|>", "<|flush|>", "<|calls|>",
      "<end_of_turn>", "<|endoftext|>", "</s>", "<|eom_id|>", "<EOT>", "_<EOT>", "[EOT]", "[EOS]",
      "<|end_of_text|>", "<end_of_utterance>", "<eos>", "<turn|>", "<|tool_response>",
      "<｜end▁of▁sentence｜>", "[e~["};
  // clang-format on
  return kTexts;
}

}  // namespace

struct Tokenizer::Fragment {
  int32_t token;  // -1: raw text [offset, offset + length) of the input
  size_t offset;
  size_t length;
};

Expected<Tokenizer> Tokenizer::from_gguf(const GgufFile& f) {
  Tokenizer t;
  const GgufValue* model = f.find("tokenizer.ggml.model");
  if (!model || model->type != GgufValueType::kString) {
    return Status::error(fmt::format("{}: missing tokenizer.ggml.model", f.path()));
  }
  if (model->s != "gpt2") {
    return Status::error(
        fmt::format("{}: tokenizer.ggml.model '{}' is not supported (only 'gpt2', byte-level BPE)",
                    f.path(), model->s));
  }
  // A missing or empty pre-tokenizer means llama.cpp's "default" regexes.
  const std::string pre = f.get_string_or("tokenizer.ggml.pre", "");
  const auto info = pre_tokenizer_from_name(pre.empty() ? "default" : pre);
  if (!info) {
    return Status::error(fmt::format(
        "{}: tokenizer.ggml.pre '{}' is not supported (supported families: default, gpt-2, "
        "smollm, llama-bpe/llama3, qwen2 and their llama.cpp aliases)",
        f.path(), pre));
  }
  t.pre_ = *info;

  const GgufValue* tokens = find_string_array(f, "tokenizer.ggml.tokens");
  if (!tokens || tokens->arr.empty()) {
    return Status::error(
        fmt::format("{}: tokenizer.ggml.tokens is missing or not a string array", f.path()));
  }
  const size_t n = tokens->arr.size();
  const GgufValue* types = f.find("tokenizer.ggml.token_type");
  if (types && (types->type != GgufValueType::kArray || types->arr.size() < n)) {
    return Status::error(
        fmt::format("{}: tokenizer.ggml.token_type must be an integer array of at least {} entries",
                    f.path(), n));
  }
  t.tokens_.resize(n);
  t.attrs_.resize(n, kNormal);
  t.token_ids_.reserve(n);
  for (size_t i = 0; i < n; ++i) {
    std::string text = tokens->arr[i].s;
    if (text.empty()) text = fmt::format("[EMPTY_{}]", i);  // as llama.cpp
    if (!t.token_ids_.emplace(text, static_cast<int32_t>(i)).second) {
      return Status::error(
          fmt::format("{}: duplicate token '{}' in tokenizer.ggml.tokens", f.path(), text));
    }
    t.tokens_[i] = std::move(text);
    if (types) {
      // LLAMA_TOKEN_TYPE_*: 1 normal, 2 unknown, 3 control, 4 user-defined, 5 unused, 6 byte.
      static constexpr uint8_t kAttrOfType[7] = {kUndefined,   kNormal, kUnknown, kControl,
                                                 kUserDefined, kUnused, kByte};
      const int64_t type = types->arr[i].is_integer() ? types->arr[i].i : 0;
      t.attrs_[i] = type >= 0 && type < 7 ? kAttrOfType[type] : uint8_t{kUndefined};
    }
  }

  const GgufValue* merges = find_string_array(f, "tokenizer.ggml.merges");
  if (!merges) {
    return Status::error(
        fmt::format("{}: tokenizer.ggml.merges is missing or not a string array", f.path()));
  }
  t.merge_ranks_.reserve(merges->arr.size());
  for (size_t i = 0; i < merges->arr.size(); ++i) {
    // "left right", split at the first space after the first byte; the key keeps that form.
    // A malformed entry becomes the empty pair, which never matches. The first rank wins.
    const std::string& m = merges->arr[i].s;
    const bool ok = m.size() > 1 && m.find(' ', 1) != std::string::npos;
    t.merge_ranks_.try_emplace(ok ? m : std::string(" "), static_cast<int32_t>(i));
  }

  // Special ids: llama.cpp's defaults for BPE vocabularies, then the file's values.
  auto in_range = [&](int64_t id) { return id >= 0 && id < static_cast<int64_t>(n); };
  auto read_id = [&](const char* key, int32_t dflt) -> int32_t {
    int32_t id = in_range(dflt) ? dflt : -1;
    if (auto v = find_int(f, key); v && in_range(*v)) id = static_cast<int32_t>(*v);
    return id;
  };
  t.bos_ = read_id("tokenizer.ggml.bos_token_id", 11);
  t.eos_ = read_id("tokenizer.ggml.eos_token_id", 11);
  t.eot_ = read_id("tokenizer.ggml.eot_token_id", -1);
  int32_t eom = read_id("tokenizer.ggml.eom_token_id", -1);
  int32_t fim_pre = read_id("tokenizer.ggml.fim_pre_token_id", -1);
  int32_t fim_suf = read_id("tokenizer.ggml.fim_suf_token_id", -1);
  int32_t fim_mid = read_id("tokenizer.ggml.fim_mid_token_id", -1);
  fim_pre = read_id("tokenizer.ggml.prefix_token_id", fim_pre);  // deprecated spellings
  fim_suf = read_id("tokenizer.ggml.suffix_token_id", fim_suf);
  fim_mid = read_id("tokenizer.ggml.middle_token_id", fim_mid);
  int32_t fim_pad = read_id("tokenizer.ggml.fim_pad_token_id", -1);
  int32_t fim_rep = read_id("tokenizer.ggml.fim_rep_token_id", -1);
  int32_t fim_sep = read_id("tokenizer.ggml.fim_sep_token_id", -1);

  t.add_bos_ = t.pre_.add_bos_default;
  if (auto v = find_int(f, "tokenizer.ggml.add_bos_token")) t.add_bos_ = *v != 0;
  if (auto v = find_int(f, "tokenizer.ggml.add_eos_token")) t.add_eos_ = *v != 0;
  if (t.add_bos_ && t.bos_ < 0) {
    return Status::error(fmt::format("{}: add_bos_token is true but there is no BOS", f.path()));
  }
  if (t.add_eos_ && t.eos_ < 0) {
    return Status::error(fmt::format("{}: add_eos_token is true but there is no EOS", f.path()));
  }

  // Tokens the file does not name are recognised by text and made control tokens. llama.cpp
  // takes the first match in hash-map order; we take the lowest id (for SmolLM2 both give
  // <|endoftext|> as EOT).
  auto detect = [&](int32_t* id, std::initializer_list<std::string_view> texts) {
    if (*id >= 0) return;
    for (std::string_view text : texts) {
      const int32_t found = t.text_to_id(text);
      if (found >= 0 && (*id < 0 || found < *id)) *id = found;
    }
    if (*id >= 0) t.attrs_[*id] |= kControl;
  };
  detect(&t.eot_, {"<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>",
                   "<|end_of_text|>", "<EOT>", "_<EOT>", "[EOT]", "<｜end▁of▁sentence｜>",
                   "<end_of_utterance>"});
  detect(&eom, {"<|eom_id|>"});
  detect(&fim_pre, {"<|fim_prefix|>", "<fim-prefix>", "<fim_prefix>", "<｜fim▁begin｜>", "<PRE>",
                    "▁<PRE>", "<|code_prefix|>", "<|prefix|>"});
  detect(&fim_suf, {"<|fim_suffix|>", "<fim-suffix>", "<fim_suffix>", "<｜fim▁hole｜>", "<SUF>",
                    "▁<SUF>", "<|code_suffix|>", "<|suffix|>"});
  detect(&fim_mid, {"<|fim_middle|>", "<fim-middle>", "<fim_middle>", "<｜fim▁end｜>", "<MID>",
                    "▁<MID>", "<|code_middle|>", "<|middle|>"});
  detect(&fim_pad, {"<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]"});
  detect(&fim_rep, {"<|fim_repo|>", "<|repo_name|>", "<fim-repo>", "<REPO>", "<reponame>"});
  detect(&fim_sep, {"<|file_sep|>"});

  // End-of-generation set, in llama.cpp's order of insertion.
  std::vector<int32_t> eog;
  for (int32_t id : {fim_pad, fim_rep, fim_sep}) {
    if (id >= 0) eog.push_back(id);
  }
  for (std::string_view text : eog_texts()) {
    const int32_t id = t.text_to_id(text);
    if (id < 0) continue;
    eog.push_back(id);
    t.attrs_[id] |= kControl;
  }
  // gpt-oss: these render as text even though they are special.
  for (std::string_view text : {"<|channel|>", "<|message|>", "<|start|>", "<|constrain|>"}) {
    if (const int32_t id = t.text_to_id(text); id >= 0) t.attrs_[id] = kUserDefined;
  }
  for (int32_t id : {t.eos_, t.eot_, eom}) {
    if (id >= 0) eog.push_back(id);
  }
  std::sort(eog.begin(), eog.end());
  eog.erase(std::unique(eog.begin(), eog.end()), eog.end());
  // o200k_harmony / solar-open: with <|return|>+<|call|> or <|calls|>+<|flush|>, <|end|> only
  // ends a message, not the generation.
  auto eog_has = [&](std::string_view text) {
    const int32_t id = t.text_to_id(text);
    return id >= 0 && std::binary_search(eog.begin(), eog.end(), id);
  };
  const bool has_call = eog_has("<|call|>") || eog_has("<|calls|>");
  if (eog_has("<|end|>") && has_call && (eog_has("<|return|>") || eog_has("<|flush|>"))) {
    const int32_t end_id = t.text_to_id("<|end|>");
    eog.erase(std::find(eog.begin(), eog.end(), end_id));
    t.attrs_[end_id] = kUserDefined;
  }
  t.eog_ids_ = std::move(eog);

  // Special tokens are matched longest first (llama.cpp sorts by length; ties by id here).
  for (size_t i = 0; i < n; ++i) {
    if (t.attrs_[i] & (kControl | kUserDefined | kUnknown)) {
      t.special_ids_.push_back(static_cast<int32_t>(i));
    }
  }
  std::stable_sort(t.special_ids_.begin(), t.special_ids_.end(),
                   [&](int32_t a, int32_t b) { return t.tokens_[a].size() > t.tokens_[b].size(); });

  // Pieces as llama.cpp's token_to_piece(special=true) would render them.
  t.pieces_.resize(n);
  for (size_t i = 0; i < n; ++i) {
    const uint8_t attr = t.attrs_[i];
    const std::string& text = t.tokens_[i];
    if (attr & (kUnknown | kControl | kUserDefined)) {
      t.pieces_[i] = text;
    } else if (attr & kNormal) {
      t.pieces_[i] = decode_byte_symbols(text);
    } else if (attr & kByte) {
      // "<0xXX>"; like llama.cpp's strtol, anything unparsable gives byte 0.
      const std::string hex = text.size() >= 5 ? text.substr(3, 2) : std::string();
      t.pieces_[i] = std::string(1, static_cast<char>(std::strtol(hex.c_str(), nullptr, 16)));
    }
  }
  return t;
}

int32_t Tokenizer::text_to_id(std::string_view text) const {
  const auto it = token_ids_.find(text);
  return it == token_ids_.end() ? -1 : it->second;
}

std::optional<int32_t> Tokenizer::find_token(std::string_view piece) const {
  const int32_t id = text_to_id(piece);
  if (id < 0) return std::nullopt;
  return id;
}

bool Tokenizer::is_eog(int32_t id) const {
  return std::binary_search(eog_ids_.begin(), eog_ids_.end(), id);
}

// Splits the input around special tokens, longest token first, each token splitting every
// raw fragment left by the ones before it (llama.cpp's tokenizer_st_partition). Control and
// unknown tokens take part only with parse_special; user-defined tokens always do.
void Tokenizer::partition_special(std::string_view text, bool parse_special,
                                  std::vector<Fragment>* fragments) const {
  fragments->assign(1, Fragment{-1, 0, text.size()});
  std::vector<Fragment> next;
  for (int32_t id : special_ids_) {
    if (!parse_special && (attrs_[id] & (kControl | kUnknown))) continue;
    const std::string& special = tokens_[id];
    if (text.find(special) == std::string_view::npos) continue;  // common case: absent
    next.clear();
    for (const Fragment& frag : *fragments) {
      if (frag.token >= 0) {
        next.push_back(frag);
        continue;
      }
      size_t begin = frag.offset;
      const size_t end = frag.offset + frag.length;
      while (begin < end) {
        const size_t match = text.substr(0, end).find(special, begin);
        if (match == std::string_view::npos) break;
        if (match > begin) next.push_back(Fragment{-1, begin, match - begin});
        next.push_back(Fragment{id, 0, 0});
        begin = match + special.size();
      }
      if (begin < end) next.push_back(Fragment{-1, begin, end - begin});
    }
    fragments->swap(next);
  }
}

std::vector<int32_t> Tokenizer::encode(std::string_view text, bool add_special,
                                       bool parse_special) const {
  std::vector<int32_t> out;
  out.reserve(text.size() / 3 + 2);
  if (add_special && add_bos_) out.push_back(bos_);
  if (!text.empty()) {
    std::vector<Fragment> fragments;
    partition_special(text, parse_special, &fragments);
    std::unordered_map<std::string, std::vector<int32_t>> cache;  // encoded word -> ids
    for (const Fragment& frag : fragments) {
      if (frag.token >= 0) {
        out.push_back(frag.token);
      } else {
        encode_text(text.substr(frag.offset, frag.length), &cache, &out);
      }
    }
  }
  if (add_special && add_eos_) out.push_back(eos_);
  return out;
}

// One raw fragment: pre-tokenize into words, byte-level encode each, run BPE on it.
void Tokenizer::encode_text(std::string_view text,
                            std::unordered_map<std::string, std::vector<int32_t>>* cache,
                            std::vector<int32_t>* out) const {
  const std::vector<uint32_t> cpts = unicode::decode_utf8(text);
  std::string utf8;
  std::string word;
  size_t start = 0;
  for (size_t len : split_words(cpts, pre_.type)) {
    // Re-encode the code points: malformed input was decoded to U+FFFD, as in llama.cpp.
    utf8.clear();
    for (size_t i = start; i < start + len; ++i) unicode::append_utf8(cpts[i], &utf8);
    start += len;
    word.clear();
    for (char c : utf8) word += unicode::byte_symbol(static_cast<uint8_t>(c));
    auto it = cache->find(word);
    if (it == cache->end()) {
      std::vector<int32_t> ids;
      bpe_word(word, &ids);
      it = cache->emplace(word, std::move(ids)).first;
    }
    out->insert(out->end(), it->second.begin(), it->second.end());
  }
}

// BPE on one byte-level encoded word: repeatedly merge the adjacent pair of lowest rank
// (leftmost on ties), then map each symbol to its token, falling back to one token per byte
// of the symbol's text (llm_tokenizer_bpe_session::tokenize).
void Tokenizer::bpe_word(const std::string& word, std::vector<int32_t>* out) const {
  if (pre_.ignore_merges) {
    if (const int32_t id = text_to_id(word); id >= 0) {
      out->push_back(id);
      return;
    }
  }
  struct Symbol {
    int32_t prev, next;
    uint32_t offset, length;  // into word; length 0 once merged into its left neighbour
  };
  struct Bigram {
    int32_t rank, left, right;
    uint32_t length;  // left.length + right.length when queued; stale if that changed
  };
  std::vector<Symbol> symbols;
  for (uint32_t off = 0; off < word.size();) {
    const uint32_t len = static_cast<uint32_t>(
        std::min(unicode::utf8_len(static_cast<uint8_t>(word[off])), word.size() - off));
    const int32_t i = static_cast<int32_t>(symbols.size());
    symbols.push_back(Symbol{i - 1, off + len < word.size() ? i + 1 : -1, off, len});
    off += len;
  }
  auto worse = [](const Bigram& a, const Bigram& b) {
    return a.rank > b.rank || (a.rank == b.rank && a.left > b.left);
  };
  std::priority_queue<Bigram, std::vector<Bigram>, decltype(worse)> queue(worse);
  std::string key;
  auto try_add = [&](int32_t left, int32_t right) {
    if (left < 0 || right < 0) return;
    const Symbol& l = symbols[left];
    const Symbol& r = symbols[right];
    key.assign(word, l.offset, l.length);
    key += ' ';
    key.append(word, r.offset, r.length);
    const auto it = merge_ranks_.find(key);
    if (it != merge_ranks_.end()) queue.push(Bigram{it->second, left, right, l.length + r.length});
  };
  for (int32_t i = 1; i < static_cast<int32_t>(symbols.size()); ++i) try_add(i - 1, i);
  while (!queue.empty()) {
    const Bigram b = queue.top();
    queue.pop();
    Symbol& l = symbols[b.left];
    Symbol& r = symbols[b.right];
    if (l.length == 0 || r.length == 0 || l.length + r.length != b.length) continue;
    l.length += r.length;
    r.length = 0;
    l.next = r.next;
    if (r.next >= 0) symbols[r.next].prev = b.left;
    try_add(l.prev, b.left);
    try_add(b.left, l.next);
  }
  for (int32_t i = symbols.empty() ? -1 : 0; i >= 0; i = symbols[i].next) {
    const std::string_view text(word.data() + symbols[i].offset, symbols[i].length);
    if (const int32_t id = text_to_id(text); id >= 0) {
      out->push_back(id);
      continue;
    }
    for (char c : text) {
      if (const int32_t id = text_to_id(std::string_view(&c, 1)); id >= 0) out->push_back(id);
    }
  }
}

std::string Tokenizer::token_to_piece(int32_t id, bool render_special) const {
  if (id < 0 || id >= n_vocab()) return {};
  if (!render_special && (attrs_[id] & (kControl | kUnknown))) return {};
  return pieces_[id];
}

std::string Tokenizer::decode(const std::vector<int32_t>& ids, bool render_special) const {
  std::string out;
  for (int32_t id : ids) {
    if (id < 0 || id >= n_vocab()) continue;
    if (!render_special && (attrs_[id] & (kControl | kUnknown))) continue;
    out += pieces_[id];
  }
  return out;
}

// Length of the tail of s that is the start of a multi-byte sequence still missing bytes.
static size_t incomplete_utf8_tail(std::string_view s) {
  for (size_t k = 1; k <= std::min<size_t>(3, s.size()); ++k) {
    const uint8_t b = static_cast<uint8_t>(s[s.size() - k]);
    if ((b & 0xC0) == 0x80) continue;     // continuation byte: look further back for the lead
    if (b < 0xC0 || b >= 0xF8) return 0;  // ASCII or a byte that never starts a sequence
    const size_t need = b >= 0xF0 ? 4 : b >= 0xE0 ? 3 : 2;
    return need > k ? k : 0;
  }
  return 0;  // only continuation bytes: nothing will complete them
}

std::string Utf8Streamer::push(std::string_view bytes) {
  pending_.append(bytes);
  const size_t ready = pending_.size() - incomplete_utf8_tail(pending_);
  std::string out = pending_.substr(0, ready);
  pending_.erase(0, ready);
  return out;
}

std::string Utf8Streamer::flush() {
  std::string out;
  out.swap(pending_);
  return out;
}

}  // namespace qevict
