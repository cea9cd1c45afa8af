// GGUF reader (versions 2 and 3): memory-maps the file, parses every metadata value type
// and the tensor infos, and checks every offset and size against the file before use.
// Format: ggml's docs/gguf.md.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "core/status.h"
#include "gguf/ggml_types.h"

namespace qevict {

enum class GgufValueType : uint32_t {
  kUint8 = 0,
  kInt8 = 1,
  kUint16 = 2,
  kInt16 = 3,
  kUint32 = 4,
  kInt32 = 5,
  kFloat32 = 6,
  kBool = 7,
  kString = 8,
  kArray = 9,
  kUint64 = 10,
  kInt64 = 11,
  kFloat64 = 12,
};

// One metadata value. Scalars live in the numeric fields (integers in both i and u when
// representable), strings in s, arrays in arr with their element type in arr_type.
struct GgufValue {
  GgufValueType type = GgufValueType::kUint8;
  int64_t i = 0;
  uint64_t u = 0;
  double f = 0.0;
  std::string s;
  GgufValueType arr_type = GgufValueType::kUint8;
  std::vector<GgufValue> arr;

  bool is_integer() const;
  bool is_number() const {
    return is_integer() || type == GgufValueType::kFloat32 || type == GgufValueType::kFloat64;
  }
  double as_double() const;
};

struct GgufTensorInfo {
  std::string name;
  std::vector<int64_t> dims;  // ne[0] is the fastest-varying (row length), as in ggml
  GgmlType type = GgmlType::kF32;
  uint64_t offset = 0;  // from the start of the data section
  int64_t n_elements = 0;
  uint64_t n_bytes = 0;
  const uint8_t* data = nullptr;  // into the mapping

  int64_t ne(int d) const { return d < static_cast<int>(dims.size()) ? dims[d] : 1; }
};

class GgufFile {
 public:
  // Opens and fully validates a file. Errors name the file and what is wrong.
  static Expected<std::shared_ptr<GgufFile>> open(const std::string& path);
  // Parses an in-memory image (used by tests); the buffer must outlive the object.
  static Expected<std::shared_ptr<GgufFile>> from_memory(const uint8_t* data, size_t size,
                                                         const std::string& name = "<memory>");
  ~GgufFile();
  GgufFile(const GgufFile&) = delete;
  GgufFile& operator=(const GgufFile&) = delete;

  uint32_t version() const { return version_; }
  uint32_t alignment() const { return alignment_; }
  const std::string& path() const { return path_; }
  const std::map<std::string, GgufValue>& metadata() const { return kv_; }
  const std::vector<GgufTensorInfo>& tensors() const { return tensors_; }

  const GgufValue* find(const std::string& key) const;
  const GgufTensorInfo* find_tensor(const std::string& name) const;

  // Typed getters: an error when the key is missing or of the wrong kind.
  Expected<std::string> get_string(const std::string& key) const;
  Expected<int64_t> get_int(const std::string& key) const;
  Expected<double> get_float(const std::string& key) const;
  int64_t get_int_or(const std::string& key, int64_t dflt) const;
  double get_float_or(const std::string& key, double dflt) const;
  std::string get_string_or(const std::string& key, const std::string& dflt) const;

 private:
  GgufFile() = default;
  Status parse();

  std::string path_;
  const uint8_t* base_ = nullptr;
  size_t size_ = 0;
  bool mapped_ = false;
  uint32_t version_ = 0;
  uint32_t alignment_ = 32;
  std::map<std::string, GgufValue> kv_;
  std::vector<GgufTensorInfo> tensors_;
  std::map<std::string, size_t> tensor_index_;
};

const char* gguf_value_type_name(GgufValueType t);

}  // namespace qevict
