// GGUF image writer for tests; layout follows ggml's docs/gguf.md (header, metadata, tensor
// infos, padding to the alignment, tensor data each at an aligned offset).
#include "common/gguf_builder.h"

#include <cstdio>
#include <cstdlib>

namespace qevict::test {

void put_string(std::vector<uint8_t>& out, std::string_view s) {
  put<uint64_t>(out, s.size());
  out.insert(out.end(), s.begin(), s.end());
}

std::vector<uint8_t> truncated(const std::vector<uint8_t>& image, size_t n) {
  if (n > image.size()) n = image.size();
  return std::vector<uint8_t>(image.begin(), image.begin() + static_cast<std::ptrdiff_t>(n));
}

size_t gguf_scalar_size(uint32_t type_id) {
  switch (static_cast<GgufValueType>(type_id)) {
    case GgufValueType::kUint8:
    case GgufValueType::kInt8:
    case GgufValueType::kBool:
      return 1;
    case GgufValueType::kUint16:
    case GgufValueType::kInt16:
      return 2;
    case GgufValueType::kUint32:
    case GgufValueType::kInt32:
    case GgufValueType::kFloat32:
      return 4;
    case GgufValueType::kUint64:
    case GgufValueType::kInt64:
    case GgufValueType::kFloat64:
      return 8;
    case GgufValueType::kString:
    case GgufValueType::kArray:
      return 0;
  }
  return 0;
}

GgufBuilder& GgufBuilder::magic(uint32_t m) {
  magic_ = m;
  return *this;
}
GgufBuilder& GgufBuilder::version(uint32_t v) {
  version_ = v;
  return *this;
}
GgufBuilder& GgufBuilder::n_kv_override(uint64_t n) {
  n_kv_override_ = n;
  return *this;
}
GgufBuilder& GgufBuilder::n_tensors_override(uint64_t n) {
  n_tensors_override_ = n;
  return *this;
}
GgufBuilder& GgufBuilder::alignment(uint32_t a) {
  layout_alignment_ = a;
  return add_u32("general.alignment", a);
}
GgufBuilder& GgufBuilder::layout_alignment(uint64_t a) {
  layout_alignment_ = a;
  return *this;
}
GgufBuilder& GgufBuilder::pad_end(bool on) {
  pad_end_ = on;
  return *this;
}

GgufBuilder& GgufBuilder::add_scalar(const std::string& key, GgufValueType t,
                                     std::vector<uint8_t> payload) {
  return add_raw(key, static_cast<uint32_t>(t), std::move(payload));
}

#define QEVICT_GGUF_SCALAR(fn, ctype, vtype)                      \
  GgufBuilder& GgufBuilder::fn(const std::string& key, ctype v) { \
    std::vector<uint8_t> p;                                       \
    put<ctype>(p, v);                                             \
    return add_scalar(key, GgufValueType::vtype, std::move(p));   \
  }
QEVICT_GGUF_SCALAR(add_u8, uint8_t, kUint8)
QEVICT_GGUF_SCALAR(add_i8, int8_t, kInt8)
QEVICT_GGUF_SCALAR(add_u16, uint16_t, kUint16)
QEVICT_GGUF_SCALAR(add_i16, int16_t, kInt16)
QEVICT_GGUF_SCALAR(add_u32, uint32_t, kUint32)
QEVICT_GGUF_SCALAR(add_i32, int32_t, kInt32)
QEVICT_GGUF_SCALAR(add_u64, uint64_t, kUint64)
QEVICT_GGUF_SCALAR(add_i64, int64_t, kInt64)
QEVICT_GGUF_SCALAR(add_f32, float, kFloat32)
QEVICT_GGUF_SCALAR(add_f64, double, kFloat64)
#undef QEVICT_GGUF_SCALAR

GgufBuilder& GgufBuilder::add_bool(const std::string& key, bool v) {
  return add_scalar(key, GgufValueType::kBool, {static_cast<uint8_t>(v ? 1 : 0)});
}

GgufBuilder& GgufBuilder::add_string(const std::string& key, std::string_view v) {
  std::vector<uint8_t> p;
  put_string(p, v);
  return add_scalar(key, GgufValueType::kString, std::move(p));
}

GgufBuilder& GgufBuilder::add_string_array(const std::string& key,
                                           const std::vector<std::string>& values) {
  std::vector<uint8_t> payload;
  for (const std::string& s : values) put_string(payload, s);
  return add_raw_array(key, static_cast<uint32_t>(GgufValueType::kString), values.size(),
                       std::move(payload));
}

namespace {

// Encodes one parsed scalar (or string) of type t as it is stored on disk.
void put_value(std::vector<uint8_t>& out, GgufValueType t, const GgufValue& v) {
  switch (t) {
    case GgufValueType::kUint8:
      put<uint8_t>(out, static_cast<uint8_t>(v.u));
      break;
    case GgufValueType::kInt8:
      put<int8_t>(out, static_cast<int8_t>(v.i));
      break;
    case GgufValueType::kUint16:
      put<uint16_t>(out, static_cast<uint16_t>(v.u));
      break;
    case GgufValueType::kInt16:
      put<int16_t>(out, static_cast<int16_t>(v.i));
      break;
    case GgufValueType::kUint32:
      put<uint32_t>(out, static_cast<uint32_t>(v.u));
      break;
    case GgufValueType::kInt32:
      put<int32_t>(out, static_cast<int32_t>(v.i));
      break;
    case GgufValueType::kFloat32:
      put<float>(out, static_cast<float>(v.f));
      break;
    case GgufValueType::kBool:
      put<uint8_t>(out, static_cast<uint8_t>(v.u != 0));
      break;
    case GgufValueType::kString:
      put_string(out, v.s);
      break;
    case GgufValueType::kUint64:
      put<uint64_t>(out, v.u);
      break;
    case GgufValueType::kInt64:
      put<int64_t>(out, v.i);
      break;
    case GgufValueType::kFloat64:
      put<double>(out, v.f);
      break;
    case GgufValueType::kArray:
      break;  // nested arrays are not valid GGUF
  }
}

}  // namespace

GgufBuilder& GgufBuilder::add_value(const std::string& key, const GgufValue& v) {
  std::vector<uint8_t> payload;
  if (v.type == GgufValueType::kArray) {
    for (const GgufValue& e : v.arr) put_value(payload, v.arr_type, e);
    return add_raw_array(key, static_cast<uint32_t>(v.arr_type), v.arr.size(), std::move(payload));
  }
  put_value(payload, v.type, v);
  return add_raw(key, static_cast<uint32_t>(v.type), std::move(payload));
}

GgufBuilder& GgufBuilder::add_raw(const std::string& key, uint32_t type_id,
                                  std::vector<uint8_t> payload) {
  kvs_.push_back(Kv{key, type_id, std::move(payload)});
  return *this;
}

GgufBuilder& GgufBuilder::add_raw_array(const std::string& key, uint32_t elem_type_id,
                                        uint64_t count, std::vector<uint8_t> payload,
                                        size_t elem_size) {
  if (elem_size != 0 && elem_size != gguf_scalar_size(elem_type_id)) {
    std::fprintf(stderr, "GgufBuilder: array '%s': C++ element size %zu does not match type %u\n",
                 key.c_str(), elem_size, elem_type_id);
    std::abort();  // a bug in the test, not in the code under test
  }
  std::vector<uint8_t> p;
  put<uint32_t>(p, elem_type_id);
  put<uint64_t>(p, count);
  p.insert(p.end(), payload.begin(), payload.end());
  return add_raw(key, static_cast<uint32_t>(GgufValueType::kArray), std::move(p));
}

GgufBuilder& GgufBuilder::add_tensor(const std::string& name, std::vector<int64_t> dims,
                                     uint32_t type_id, std::vector<uint8_t> data) {
  tensors_.push_back(Tensor{name, std::move(dims), type_id, std::move(data), std::nullopt});
  return *this;
}

GgufBuilder& GgufBuilder::offset_override(uint64_t offset) {
  if (tensors_.empty()) {
    std::fprintf(stderr, "GgufBuilder: offset_override() before any add_tensor()\n");
    std::abort();
  }
  tensors_.back().offset_override = offset;
  return *this;
}

GgufImage GgufBuilder::build() const {
  const uint64_t align = layout_alignment_ == 0 ? 1 : layout_alignment_;
  auto align_up = [align](uint64_t x) { return (x + align - 1) / align * align; };

  GgufImage img;
  std::vector<uint8_t>& out = img.bytes;
  put<uint32_t>(out, magic_);
  put<uint32_t>(out, version_);
  put<uint64_t>(out, n_tensors_override_.value_or(tensors_.size()));
  put<uint64_t>(out, n_kv_override_.value_or(kvs_.size()));

  for (const Kv& kv : kvs_) {
    put_string(out, kv.key);
    put<uint32_t>(out, kv.type_id);
    out.insert(out.end(), kv.payload.begin(), kv.payload.end());
  }

  // Data layout first, so that the infos can carry the offsets.
  uint64_t cursor = 0;
  for (const Tensor& t : tensors_) {
    cursor = align_up(cursor);
    img.tensor_offsets.push_back(cursor);
    cursor += t.data.size();
  }

  for (size_t i = 0; i < tensors_.size(); ++i) {
    const Tensor& t = tensors_[i];
    put_string(out, t.name);
    put<uint32_t>(out, static_cast<uint32_t>(t.dims.size()));
    for (int64_t d : t.dims) put<int64_t>(out, d);
    put<uint32_t>(out, t.type_id);
    put<uint64_t>(out, t.offset_override.value_or(img.tensor_offsets[i]));
  }

  // ggml pads the info section to the alignment even when there are no tensors.
  img.data_start = align_up(out.size());
  out.resize(img.data_start, 0);
  for (size_t i = 0; i < tensors_.size(); ++i) {
    out.resize(img.data_start + img.tensor_offsets[i], 0);
    out.insert(out.end(), tensors_[i].data.begin(), tensors_[i].data.end());
  }
  if (pad_end_ && !tensors_.empty())
    out.resize(align_up(out.size() - img.data_start) + img.data_start, 0);
  return img;
}

}  // namespace qevict::test
