// libFuzzer target: the GGUF reader on an arbitrary in-memory image (header, metadata of every
// type, tensor table, data bounds), then what the engine reads from a parsed file without the
// weights: the tokenizer's vocabulary (Tokenizer::from_gguf) and the chat template.
// Checks beyond the sanitizers: every tensor's data lies inside the image, at an aligned offset
// of the data section, with its size as its type and shape say; the first and last byte of each
// are read (ASan catches a read past the fuzzer's buffer).
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "chat/chat_template.h"
#include "gguf/ggml_types.h"
#include "gguf/gguf.h"
#include "tokenizer/tokenizer.h"

namespace {

[[noreturn]] void fail(const char* what, const std::string& name) {
  std::fprintf(stderr, "gguf_fuzz: %s: '%s'\n", what, name.c_str());
  std::abort();
}

volatile uint8_t g_sink;

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto f = qevict::GgufFile::from_memory(data, size, "fuzz.gguf");
  if (!f) {
    if (f.error().empty()) fail("empty error message", "");
    return 0;
  }
  const qevict::GgufFile& g = **f;
  for (const auto& t : g.tensors()) {
    const qevict::GgmlTypeInfo* ti = qevict::ggml_type_info(static_cast<uint32_t>(t.type));
    if (!ti) fail("tensor of unknown type accepted", t.name);
    if (t.dims.empty() || t.dims.size() > 4) fail("bad dims accepted", t.name);
    int64_t n = 1;
    for (int64_t d : t.dims) n *= d;
    if (n != t.n_elements || t.n_elements % ti->block_elems != 0) fail("bad n_elements", t.name);
    if (t.n_bytes != static_cast<uint64_t>(t.n_elements / ti->block_elems) * ti->block_bytes)
      fail("bad n_bytes", t.name);
    if (t.offset % g.alignment() != 0) fail("unaligned offset accepted", t.name);
    if (t.data < data || t.data > data + size ||
        t.n_bytes > static_cast<size_t>(data + size - t.data))
      fail("tensor data outside the image", t.name);
    if (g.find_tensor(t.name) != &t) fail("find_tensor disagrees", t.name);
    if (t.n_bytes > 0) g_sink = t.data[0] ^ t.data[t.n_bytes - 1];
  }
  for (const auto& [key, v] : g.metadata()) {
    if (g.find(key) != &v) fail("find disagrees", key);
    (void)g.get_int_or(key, 0);
    (void)g.get_float_or(key, 0.0);
    (void)g.get_string_or(key, "");
    (void)qevict::gguf_value_type_name(v.type);
  }
  auto tok = qevict::Tokenizer::from_gguf(g);
  if (tok) {
    const auto ids = tok->encode("Hello <|im_start|>world 123 \xff\xfe", true, true);
    (void)tok->decode(ids, true);
  }
  const std::string tmpl = g.get_string_or("tokenizer.chat_template", "");
  if (!tmpl.empty()) {
    auto ct = qevict::ChatTemplate::parse(tmpl);
    if (ct) (void)ct->render({{"user", "hi"}}, true, "<s>", "</s>");
  }
  return 0;
}
