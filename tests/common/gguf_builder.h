// Test helper: builds GGUF images in memory — any metadata value (scalars, strings, arrays of
// every element type), tensor infos and data with alignment padding, versions 2 and 3 — and
// deliberately broken images (bad magic or version, wrong header counts, raw type ids and
// payloads, explicit offsets, truncation). Linked into every layer's tests, so it uses only
// the core/gguf *headers* (enum values), never a function from the gguf library.
#pragma once

#include <cstdint>
#include <cstring>
#include <optional>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include "gguf/ggml_types.h"
#include "gguf/gguf.h"

namespace qevict::test {

// Little-endian encoders (GGUF is little-endian; so is every host we build for).
template <typename T>
void put(std::vector<uint8_t>& out, T v) {
  static_assert(std::is_trivially_copyable_v<T>);
  const size_t at = out.size();
  out.resize(at + sizeof(T));
  std::memcpy(out.data() + at, &v, sizeof(T));
}
// A GGUF string: uint64 byte length, then the bytes (no terminator).
void put_string(std::vector<uint8_t>& out, std::string_view s);

// The first n bytes of an image (n is clamped to its size).
std::vector<uint8_t> truncated(const std::vector<uint8_t>& image, size_t n);

// Byte size of one scalar of type t on disk (0 for string, array and unknown ids).
size_t gguf_scalar_size(uint32_t type_id);

struct GgufImage {
  std::vector<uint8_t> bytes;
  size_t data_start = 0;                 // file offset of the tensor data section
  std::vector<uint64_t> tensor_offsets;  // where each tensor's data was placed, from data_start
};

class GgufBuilder {
 public:
  // --- header ---------------------------------------------------------------------------
  GgufBuilder& magic(uint32_t m);
  GgufBuilder& version(uint32_t v);  // default 3
  // Counts written into the header instead of the real ones (the lists are written unchanged).
  GgufBuilder& n_kv_override(uint64_t n);
  GgufBuilder& n_tensors_override(uint64_t n);
  // Writes general.alignment (uint32) and lays the data section out with it.
  GgufBuilder& alignment(uint32_t a);
  // Lays the data section out with `a` without writing any key (default 32).
  GgufBuilder& layout_alignment(uint64_t a);
  // Pad the data of the last tensor up to the alignment (as ggml's writer does). Default true.
  GgufBuilder& pad_end(bool on);

  // --- metadata (written in the order added; duplicates are written as given) -------------
  GgufBuilder& add_u8(const std::string& key, uint8_t v);
  GgufBuilder& add_i8(const std::string& key, int8_t v);
  GgufBuilder& add_u16(const std::string& key, uint16_t v);
  GgufBuilder& add_i16(const std::string& key, int16_t v);
  GgufBuilder& add_u32(const std::string& key, uint32_t v);
  GgufBuilder& add_i32(const std::string& key, int32_t v);
  GgufBuilder& add_u64(const std::string& key, uint64_t v);
  GgufBuilder& add_i64(const std::string& key, int64_t v);
  GgufBuilder& add_f32(const std::string& key, float v);
  GgufBuilder& add_f64(const std::string& key, double v);
  GgufBuilder& add_bool(const std::string& key, bool v);
  GgufBuilder& add_string(const std::string& key, std::string_view v);

  // An array of scalars; sizeof(T) must equal the on-disk size of elem_type (bool: uint8_t).
  template <typename T>
  GgufBuilder& add_array(const std::string& key, GgufValueType elem_type,
                         const std::vector<T>& values) {
    std::vector<uint8_t> payload;
    for (const T& v : values) put(payload, v);
    return add_raw_array(key, static_cast<uint32_t>(elem_type), values.size(), std::move(payload),
                         sizeof(T));
  }
  GgufBuilder& add_string_array(const std::string& key, const std::vector<std::string>& values);
  // Copies a parsed value (scalar or array of scalars/strings), e.g. to rebuild a variant of
  // a real file's metadata.
  GgufBuilder& add_value(const std::string& key, const GgufValue& v);

  // Raw value: the type id and payload are written verbatim after the key.
  GgufBuilder& add_raw(const std::string& key, uint32_t type_id, std::vector<uint8_t> payload);
  // Raw array: element type id and count written verbatim (count need not match the payload).
  // When elem_size is given it must match the on-disk element size (a guard for typed callers).
  GgufBuilder& add_raw_array(const std::string& key, uint32_t elem_type_id, uint64_t count,
                             std::vector<uint8_t> payload, size_t elem_size = 0);

  // --- tensors --------------------------------------------------------------------------
  // n_dims written is dims.size(); data is placed at the next aligned offset of the data
  // section and that offset is written in the info.
  GgufBuilder& add_tensor(const std::string& name, std::vector<int64_t> dims, uint32_t type_id,
                          std::vector<uint8_t> data);
  GgufBuilder& add_tensor(const std::string& name, std::vector<int64_t> dims, GgmlType type,
                          std::vector<uint8_t> data) {
    return add_tensor(name, std::move(dims), static_cast<uint32_t>(type), std::move(data));
  }
  // Writes `offset` in the most recently added tensor's info instead of its real offset
  // (its data stays where the layout put it).
  GgufBuilder& offset_override(uint64_t offset);

  GgufImage build() const;

 private:
  struct Kv {
    std::string key;
    uint32_t type_id;
    std::vector<uint8_t> payload;
  };
  struct Tensor {
    std::string name;
    std::vector<int64_t> dims;
    uint32_t type_id;
    std::vector<uint8_t> data;
    std::optional<uint64_t> offset_override;
  };
  GgufBuilder& add_scalar(const std::string& key, GgufValueType t, std::vector<uint8_t> payload);

  uint32_t magic_ = 0x46554747;  // "GGUF"
  uint32_t version_ = 3;
  std::optional<uint64_t> n_kv_override_;
  std::optional<uint64_t> n_tensors_override_;
  uint64_t layout_alignment_ = 32;
  bool pad_end_ = true;
  std::vector<Kv> kvs_;
  std::vector<Tensor> tensors_;
};

// A parsed in-memory GGUF together with the bytes it points into (header-only so that test
// executables that never call it need not link the GGUF reader).
struct MemoryGguf {
  std::vector<uint8_t> bytes;
  std::shared_ptr<GgufFile> file;
};

inline Expected<std::unique_ptr<MemoryGguf>> open_memory_gguf(std::vector<uint8_t> bytes) {
  auto m = std::make_unique<MemoryGguf>();
  m->bytes = std::move(bytes);
  auto f = GgufFile::from_memory(m->bytes.data(), m->bytes.size());
  if (!f) return f.status();
  m->file = *f;
  return m;
}

}  // namespace qevict::test
