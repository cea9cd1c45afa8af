// The ggml tensor types that GGUF files use: ids (as stored on disk), block sizes and
// byte sizes. Ids follow ggml.h's enum ggml_type (they are a file-format constant).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

namespace qevict {

enum class GgmlType : uint32_t {
  kF32 = 0,
  kF16 = 1,
  kQ4_0 = 2,
  kQ4_1 = 3,
  kQ5_0 = 6,
  kQ5_1 = 7,
  kQ8_0 = 8,
  kQ8_1 = 9,
  kQ2_K = 10,
  kQ3_K = 11,
  kQ4_K = 12,
  kQ5_K = 13,
  kQ6_K = 14,
  kQ8_K = 15,
  kI8 = 24,
  kI16 = 25,
  kI32 = 26,
  kI64 = 27,
  kF64 = 28,
  kBF16 = 30,
};

struct GgmlTypeInfo {
  std::string_view name;
  int64_t block_elems;  // elements per block (1 for plain types)
  int64_t block_bytes;  // bytes per block
};

// Returns nullptr for an id we do not know.
const GgmlTypeInfo* ggml_type_info(uint32_t type_id);

inline const GgmlTypeInfo* ggml_type_info(GgmlType t) {
  return ggml_type_info(static_cast<uint32_t>(t));
}

}  // namespace qevict
