// Test helper: writes GGUF v3 images in memory (metadata only, no tensors) so tokenizer tests
// can build small vocabularies or variants of a real model's tokenizer metadata.
#pragma once

#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "gguf/gguf.h"

namespace qevict::testing {

// Layout (ggml docs/gguf.md): "GGUF", u32 version, u64 n_tensors, u64 n_kv, then per key:
// u64 length + bytes, u32 value type, value. Strings are u64 length + bytes; arrays are
// u32 element type + u64 count + elements. Little-endian throughout.
class GgufBuilder {
 public:
  GgufBuilder& add_string(std::string_view key, std::string_view value) {
    begin(key, GgufValueType::kString);
    put_string(value);
    return *this;
  }
  GgufBuilder& add_u32(std::string_view key, uint32_t value) {
    begin(key, GgufValueType::kUint32);
    put(value);
    return *this;
  }
  GgufBuilder& add_bool(std::string_view key, bool value) {
    begin(key, GgufValueType::kBool);
    put(static_cast<uint8_t>(value));
    return *this;
  }
  GgufBuilder& add_strings(std::string_view key, const std::vector<std::string>& values) {
    begin(key, GgufValueType::kArray);
    put(static_cast<uint32_t>(GgufValueType::kString));
    put(static_cast<uint64_t>(values.size()));
    for (const auto& s : values) put_string(s);
    return *this;
  }
  GgufBuilder& add_i32s(std::string_view key, const std::vector<int32_t>& values) {
    begin(key, GgufValueType::kArray);
    put(static_cast<uint32_t>(GgufValueType::kInt32));
    put(static_cast<uint64_t>(values.size()));
    for (int32_t v : values) put(v);
    return *this;
  }
  // Copies a parsed value (scalar or array) under `key`.
  GgufBuilder& add_value(std::string_view key, const GgufValue& v) {
    begin(key, v.type);
    if (v.type == GgufValueType::kArray) {
      put(static_cast<uint32_t>(v.arr_type));
      put(static_cast<uint64_t>(v.arr.size()));
      for (const GgufValue& e : v.arr) put_scalar(v.arr_type, e);
    } else {
      put_scalar(v.type, v);
    }
    return *this;
  }

  std::vector<uint8_t> bytes() const {
    std::vector<uint8_t> out;
    auto append = [&](const void* p, size_t n) {
      const auto* b = static_cast<const uint8_t*>(p);
      out.insert(out.end(), b, b + n);
    };
    const uint32_t version = 3;
    const uint64_t n_tensors = 0;
    append("GGUF", 4);
    append(&version, sizeof(version));
    append(&n_tensors, sizeof(n_tensors));
    append(&n_kv_, sizeof(n_kv_));
    out.insert(out.end(), kv_.begin(), kv_.end());
    return out;
  }

 private:
  template <typename T>
  void put(T v) {
    uint8_t b[sizeof(T)];
    std::memcpy(b, &v, sizeof(T));
    kv_.insert(kv_.end(), b, b + sizeof(T));
  }
  void put_string(std::string_view s) {
    put(static_cast<uint64_t>(s.size()));
    kv_.insert(kv_.end(), s.begin(), s.end());
  }
  void begin(std::string_view key, GgufValueType type) {
    put_string(key);
    put(static_cast<uint32_t>(type));
    ++n_kv_;
  }
  void put_scalar(GgufValueType type, const GgufValue& v) {
    switch (type) {
      case GgufValueType::kUint8:
        put(static_cast<uint8_t>(v.u));
        break;
      case GgufValueType::kInt8:
        put(static_cast<int8_t>(v.i));
        break;
      case GgufValueType::kUint16:
        put(static_cast<uint16_t>(v.u));
        break;
      case GgufValueType::kInt16:
        put(static_cast<int16_t>(v.i));
        break;
      case GgufValueType::kUint32:
        put(static_cast<uint32_t>(v.u));
        break;
      case GgufValueType::kInt32:
        put(static_cast<int32_t>(v.i));
        break;
      case GgufValueType::kFloat32:
        put(static_cast<float>(v.f));
        break;
      case GgufValueType::kBool:
        put(static_cast<uint8_t>(v.u != 0));
        break;
      case GgufValueType::kString:
        put_string(v.s);
        break;
      case GgufValueType::kUint64:
        put(static_cast<uint64_t>(v.u));
        break;
      case GgufValueType::kInt64:
        put(static_cast<int64_t>(v.i));
        break;
      case GgufValueType::kFloat64:
        put(v.f);
        break;
      case GgufValueType::kArray:
        break;  // nested arrays do not occur in tokenizer metadata
    }
  }

  std::vector<uint8_t> kv_;
  uint64_t n_kv_ = 0;
};

// A parsed in-memory GGUF together with the bytes it points into.
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

}  // namespace qevict::testing
