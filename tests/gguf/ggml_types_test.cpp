// Tests for the ggml type table: ids, names and block layouts against constants written out
// independently from ggml.h (enum ggml_type) and ggml-common.h (the block_* structs).
#include "gguf/ggml_types.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <set>
#include <string>

namespace qevict {
namespace {

struct Expect {
  uint32_t id;
  const char* name;
  int64_t block_elems;
  int64_t block_bytes;
};

// Block sizes derived from the structs in ggml-common.h (QK = elements per block, QK_K = 256):
constexpr Expect kKnown[] = {
    {0, "f32", 1, 4},
    {1, "f16", 1, 2},
    {2, "q4_0", 32, 2 + 32 / 2},                          // f16 d; 4-bit qs[16]
    {3, "q4_1", 32, 2 * 2 + 32 / 2},                      // f16 d, m; qs[16]
    {6, "q5_0", 32, 2 + 4 + 32 / 2},                      // f16 d; qh[4]; qs[16]
    {7, "q5_1", 32, 2 * 2 + 4 + 32 / 2},                  // f16 d, m; qh[4]; qs[16]
    {8, "q8_0", 32, 2 + 32},                              // f16 d; int8 qs[32]
    {9, "q8_1", 32, 2 * 2 + 32},                          // f16 d, s; qs[32]
    {10, "q2_k", 256, 256 / 16 + 256 / 4 + 2 * 2},        // scales[16]; qs[64]; f16 d, dmin
    {11, "q3_k", 256, 256 / 8 + 256 / 4 + 12 + 2},        // hmask[32]; qs[64]; scales[12]; f16 d
    {12, "q4_k", 256, 2 * 2 + 12 + 256 / 2},              // f16 d, dmin; scales[12]; qs[128]
    {13, "q5_k", 256, 2 * 2 + 12 + 256 / 8 + 256 / 2},    // + qh[32]
    {14, "q6_k", 256, 256 / 2 + 256 / 4 + 256 / 16 + 2},  // ql[128]; qh[64]; int8 scales[16]; d
    {15, "q8_k", 256, 4 + 256 + 2 * 256 / 16},            // f32 d; int8 qs[256]; int16 bsums[16]
    {24, "i8", 1, 1},
    {25, "i16", 1, 2},
    {26, "i32", 1, 4},
    {27, "i64", 1, 8},
    {28, "f64", 1, 8},
    {30, "bf16", 1, 2},
};

TEST(GgmlTypes, KnownTypesHaveGgmlBlockLayouts) {
  for (const Expect& e : kKnown) {
    SCOPED_TRACE(e.name);
    const GgmlTypeInfo* info = ggml_type_info(e.id);
    ASSERT_NE(info, nullptr) << "id " << e.id;
    EXPECT_EQ(info->name, e.name);
    EXPECT_EQ(info->block_elems, e.block_elems);
    EXPECT_EQ(info->block_bytes, e.block_bytes);
    // The enum overload is the same table.
    EXPECT_EQ(ggml_type_info(static_cast<GgmlType>(e.id)), info);
  }
}

TEST(GgmlTypes, EnumValuesAreTheOnDiskIds) {
  EXPECT_EQ(static_cast<uint32_t>(GgmlType::kF32), 0u);
  EXPECT_EQ(static_cast<uint32_t>(GgmlType::kF16), 1u);
  EXPECT_EQ(static_cast<uint32_t>(GgmlType::kQ4_0), 2u);
  EXPECT_EQ(static_cast<uint32_t>(GgmlType::kQ4_1), 3u);
  EXPECT_EQ(static_cast<uint32_t>(GgmlType::kQ5_0), 6u);
  EXPECT_EQ(static_cast<uint32_t>(GgmlType::kQ5_1), 7u);
  EXPECT_EQ(static_cast<uint32_t>(GgmlType::kQ8_0), 8u);
  EXPECT_EQ(static_cast<uint32_t>(GgmlType::kQ8_1), 9u);
  EXPECT_EQ(static_cast<uint32_t>(GgmlType::kQ2_K), 10u);
  EXPECT_EQ(static_cast<uint32_t>(GgmlType::kQ3_K), 11u);
  EXPECT_EQ(static_cast<uint32_t>(GgmlType::kQ4_K), 12u);
  EXPECT_EQ(static_cast<uint32_t>(GgmlType::kQ5_K), 13u);
  EXPECT_EQ(static_cast<uint32_t>(GgmlType::kQ6_K), 14u);
  EXPECT_EQ(static_cast<uint32_t>(GgmlType::kQ8_K), 15u);
  EXPECT_EQ(static_cast<uint32_t>(GgmlType::kI8), 24u);
  EXPECT_EQ(static_cast<uint32_t>(GgmlType::kI16), 25u);
  EXPECT_EQ(static_cast<uint32_t>(GgmlType::kI32), 26u);
  EXPECT_EQ(static_cast<uint32_t>(GgmlType::kI64), 27u);
  EXPECT_EQ(static_cast<uint32_t>(GgmlType::kF64), 28u);
  EXPECT_EQ(static_cast<uint32_t>(GgmlType::kBF16), 30u);
}

TEST(GgmlTypes, UnknownIdsReturnNull) {
  // 4, 5: removed Q4_2/Q4_3; 16..23, 29: IQ* types we do not read; 31..33: removed
  // Q4_0_4_4 etc.; 34, 35: TQ1_0/TQ2_0; then ids past the end and absurd values.
  std::set<uint32_t> known;
  for (const Expect& e : kKnown) known.insert(e.id);
  for (uint32_t id = 0; id < 256; ++id) {
    if (known.count(id)) continue;
    EXPECT_EQ(ggml_type_info(id), nullptr) << "id " << id;
  }
  EXPECT_EQ(ggml_type_info(0x7fffffffu), nullptr);
  EXPECT_EQ(ggml_type_info(0xffffffffu), nullptr);
}

TEST(GgmlTypes, NamesAreUnique) {
  std::set<std::string> names;
  for (const Expect& e : kKnown) {
    const GgmlTypeInfo* info = ggml_type_info(e.id);
    ASSERT_NE(info, nullptr);
    EXPECT_TRUE(names.insert(std::string(info->name)).second) << info->name;
  }
}

}  // namespace
}  // namespace qevict
