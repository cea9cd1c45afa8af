// Table of ggml block layouts (sizes from ggml-common.h's block_* structs).
#include "gguf/ggml_types.h"

namespace qevict {

const GgmlTypeInfo* ggml_type_info(uint32_t id) {
  static const GgmlTypeInfo kF32{"f32", 1, 4};
  static const GgmlTypeInfo kF16{"f16", 1, 2};
  static const GgmlTypeInfo kBF16{"bf16", 1, 2};
  static const GgmlTypeInfo kQ4_0{"q4_0", 32, 18};
  static const GgmlTypeInfo kQ4_1{"q4_1", 32, 20};
  static const GgmlTypeInfo kQ5_0{"q5_0", 32, 22};
  static const GgmlTypeInfo kQ5_1{"q5_1", 32, 24};
  static const GgmlTypeInfo kQ8_0{"q8_0", 32, 34};
  static const GgmlTypeInfo kQ8_1{"q8_1", 32, 36};
  static const GgmlTypeInfo kQ2_K{"q2_k", 256, 84};
  static const GgmlTypeInfo kQ3_K{"q3_k", 256, 110};
  static const GgmlTypeInfo kQ4_K{"q4_k", 256, 144};
  static const GgmlTypeInfo kQ5_K{"q5_k", 256, 176};
  static const GgmlTypeInfo kQ6_K{"q6_k", 256, 210};
  static const GgmlTypeInfo kQ8_K{"q8_k", 256, 292};
  static const GgmlTypeInfo kI8{"i8", 1, 1};
  static const GgmlTypeInfo kI16{"i16", 1, 2};
  static const GgmlTypeInfo kI32{"i32", 1, 4};
  static const GgmlTypeInfo kI64{"i64", 1, 8};
  static const GgmlTypeInfo kF64{"f64", 1, 8};
  switch (static_cast<GgmlType>(id)) {
    case GgmlType::kF32:
      return &kF32;
    case GgmlType::kF16:
      return &kF16;
    case GgmlType::kBF16:
      return &kBF16;
    case GgmlType::kQ4_0:
      return &kQ4_0;
    case GgmlType::kQ4_1:
      return &kQ4_1;
    case GgmlType::kQ5_0:
      return &kQ5_0;
    case GgmlType::kQ5_1:
      return &kQ5_1;
    case GgmlType::kQ8_0:
      return &kQ8_0;
    case GgmlType::kQ8_1:
      return &kQ8_1;
    case GgmlType::kQ2_K:
      return &kQ2_K;
    case GgmlType::kQ3_K:
      return &kQ3_K;
    case GgmlType::kQ4_K:
      return &kQ4_K;
    case GgmlType::kQ5_K:
      return &kQ5_K;
    case GgmlType::kQ6_K:
      return &kQ6_K;
    case GgmlType::kQ8_K:
      return &kQ8_K;
    case GgmlType::kI8:
      return &kI8;
    case GgmlType::kI16:
      return &kI16;
    case GgmlType::kI32:
      return &kI32;
    case GgmlType::kI64:
      return &kI64;
    case GgmlType::kF64:
      return &kF64;
  }
  return nullptr;
}

}  // namespace qevict
