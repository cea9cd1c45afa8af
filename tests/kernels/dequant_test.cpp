// Tests for the scalar reference dequantizers (kernels/ref/dequant.h) on hand-built blocks:
// each block is packed here from chosen scales and quants, and the expected floats are
// either literals worked out by hand or the format's formula applied to the chosen values
// (never the code under test).
#include "kernels/ref/dequant.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "core/f16.h"

namespace qevict {
namespace {

// f16 bit patterns of exactly representable values.
constexpr uint16_t kF16One = 0x3C00;       // 1.0
constexpr uint16_t kF16Half = 0x3800;      // 0.5
constexpr uint16_t kF16Quarter = 0x3400;   // 0.25
constexpr uint16_t kF16MinusOne = 0xBC00;  // -1.0
constexpr uint16_t kF16MinusTwo = 0xC000;  // -2.0

void put_u16(std::vector<uint8_t>& b, size_t at, uint16_t v) { std::memcpy(&b[at], &v, 2); }

std::vector<float> dequant(GgmlType t, const std::vector<uint8_t>& src, int64_t n) {
  std::vector<float> out(static_cast<size_t>(n), -12345.0f);
  ref::dequantize_row(t, src.data(), out.data(), n);
  return out;
}

TEST(Dequant, CanDequantize) {
  for (GgmlType t :
       {GgmlType::kF32, GgmlType::kF16, GgmlType::kBF16, GgmlType::kQ4_0, GgmlType::kQ4_1,
        GgmlType::kQ5_0, GgmlType::kQ5_1, GgmlType::kQ8_0, GgmlType::kQ4_K, GgmlType::kQ6_K}) {
    EXPECT_TRUE(ref::can_dequantize(t)) << static_cast<int>(t);
  }
  for (GgmlType t : {GgmlType::kQ8_1, GgmlType::kQ2_K, GgmlType::kQ3_K, GgmlType::kQ5_K,
                     GgmlType::kQ8_K, GgmlType::kI8, GgmlType::kF64}) {
    EXPECT_FALSE(ref::can_dequantize(t)) << static_cast<int>(t);
  }
}

TEST(Dequant, UnsupportedTypeGivesNaN) {
  std::vector<uint8_t> src(84, 0);  // one Q2_K block
  const std::vector<float> y = dequant(GgmlType::kQ2_K, src, 256);
  for (float v : y) EXPECT_TRUE(std::isnan(v));
}

TEST(Dequant, F32IsACopy) {
  const float vals[5] = {1.5f, -0.0f, 3e-38f, -7.25f, 1e30f};
  std::vector<uint8_t> src(sizeof(vals));
  std::memcpy(src.data(), vals, sizeof(vals));
  const std::vector<float> y = dequant(GgmlType::kF32, src, 5);
  for (int i = 0; i < 5; ++i) EXPECT_EQ(f32_to_bits(y[i]), f32_to_bits(vals[i])) << i;
}

TEST(Dequant, F16) {
  std::vector<uint8_t> src(10);
  put_u16(src, 0, kF16One);
  put_u16(src, 2, kF16MinusTwo);
  put_u16(src, 4, 0x3555);  // 1/3 rounded: 0x155 / 1024 * 0.25 + 0.25 = 0.333251953125
  put_u16(src, 6, 0x0001);  // smallest subnormal 2^-24
  put_u16(src, 8, 0x7BFF);  // largest finite 65504
  const std::vector<float> y = dequant(GgmlType::kF16, src, 5);
  EXPECT_EQ(y[0], 1.0f);
  EXPECT_EQ(y[1], -2.0f);
  EXPECT_EQ(y[2], 0.333251953125f);
  EXPECT_EQ(y[3], std::ldexp(1.0f, -24));
  EXPECT_EQ(y[4], 65504.0f);
}

TEST(Dequant, BF16) {
  std::vector<uint8_t> src(6);
  put_u16(src, 0, 0x3F80);  // 1.0
  put_u16(src, 2, 0xC0A0);  // -5.0
  put_u16(src, 4, 0x3E20);  // 0.15625
  const std::vector<float> y = dequant(GgmlType::kBF16, src, 3);
  EXPECT_EQ(y[0], 1.0f);
  EXPECT_EQ(y[1], -5.0f);
  EXPECT_EQ(y[2], 0.15625f);
}

// Byte j holds element j in its low nibble and element j + 16 in its high nibble.
void put_nibbles(std::vector<uint8_t>& b, size_t at, const int lo[16], const int hi[16]) {
  for (int j = 0; j < 16; ++j) b[at + j] = static_cast<uint8_t>(lo[j] | (hi[j] << 4));
}

TEST(Dequant, Q4_0) {
  // d = 0.5; low nibbles 0..15 (elements 0..15), high nibbles 15..0 (elements 16..31).
  int lo[16], hi[16];
  for (int j = 0; j < 16; ++j) lo[j] = j, hi[j] = 15 - j;
  std::vector<uint8_t> src(18);
  put_u16(src, 0, kF16Half);
  put_nibbles(src, 2, lo, hi);
  const std::vector<float> y = dequant(GgmlType::kQ4_0, src, 32);
  // x = (q - 8) * 0.5
  const float expect[32] = {-4.0f, -3.5f, -3.0f, -2.5f, -2.0f, -1.5f, -1.0f, -0.5f,
                            0.0f,  0.5f,  1.0f,  1.5f,  2.0f,  2.5f,  3.0f,  3.5f,
                            3.5f,  3.0f,  2.5f,  2.0f,  1.5f,  1.0f,  0.5f,  0.0f,
                            -0.5f, -1.0f, -1.5f, -2.0f, -2.5f, -3.0f, -3.5f, -4.0f};
  for (int e = 0; e < 32; ++e) EXPECT_EQ(y[e], expect[e]) << "element " << e;
}

TEST(Dequant, Q4_1) {
  // d = 0.5, m = -1; nibbles as in the Q4_0 test.
  int lo[16], hi[16];
  for (int j = 0; j < 16; ++j) lo[j] = j, hi[j] = 15 - j;
  std::vector<uint8_t> src(20);
  put_u16(src, 0, kF16Half);
  put_u16(src, 2, kF16MinusOne);
  put_nibbles(src, 4, lo, hi);
  const std::vector<float> y = dequant(GgmlType::kQ4_1, src, 32);
  // x = q * 0.5 - 1
  // clang-format off
  const float expect[32] = {-1.0f, -0.5f, 0.0f, 0.5f, 1.0f, 1.5f, 2.0f,  2.5f,
                             3.0f,  3.5f, 4.0f, 4.5f, 5.0f, 5.5f, 6.0f,  6.5f,
                             6.5f,  6.0f, 5.5f, 5.0f, 4.5f, 4.0f, 3.5f,  3.0f,
                             2.5f,  2.0f, 1.5f, 1.0f, 0.5f, 0.0f, -0.5f, -1.0f};
  // clang-format on
  for (int e = 0; e < 32; ++e) EXPECT_EQ(y[e], expect[e]) << "element " << e;
}

TEST(Dequant, Q5_0) {
  // d = 0.25; nibbles lo[j] = j, hi[j] = 15 - j; qh = 0xFF00F00F (little endian bytes
  // 0F F0 00 FF): fifth bit set for elements 0-3, 12-15, 24-31.
  int lo[16], hi[16];
  for (int j = 0; j < 16; ++j) lo[j] = j, hi[j] = 15 - j;
  std::vector<uint8_t> src(22);
  put_u16(src, 0, kF16Quarter);
  src[2] = 0x0F, src[3] = 0xF0, src[4] = 0x00, src[5] = 0xFF;
  put_nibbles(src, 6, lo, hi);
  const std::vector<float> y = dequant(GgmlType::kQ5_0, src, 32);
  // x = (q - 16) * 0.25 with q = nibble + 16 * bit
  EXPECT_EQ(y[0], 0.0f);     // 0 + 16 - 16
  EXPECT_EQ(y[3], 0.75f);    // 3 + 16 - 16
  EXPECT_EQ(y[4], -3.0f);    // 4 - 16
  EXPECT_EQ(y[11], -1.25f);  // 11 - 16
  EXPECT_EQ(y[12], 3.0f);    // 12 + 16 - 16
  EXPECT_EQ(y[15], 3.75f);   // 15
  EXPECT_EQ(y[16], -0.25f);  // 15 - 16
  EXPECT_EQ(y[23], -2.0f);   // 8 - 16
  EXPECT_EQ(y[24], 1.75f);   // 7 + 16 - 16
  EXPECT_EQ(y[31], 0.0f);    // 0 + 16 - 16
  const uint32_t qh = 0xFF00F00Fu;
  for (int e = 0; e < 32; ++e) {
    const int q = (e < 16 ? lo[e] : hi[e - 16]) + 16 * static_cast<int>((qh >> e) & 1);
    EXPECT_EQ(y[e], (q - 16) * 0.25f) << "element " << e;
  }
}

TEST(Dequant, Q5_1) {
  // d = 0.5, m = -2, qh = 0x80000001: fifth bit only for elements 0 and 31.
  int lo[16], hi[16];
  for (int j = 0; j < 16; ++j) lo[j] = 15 - j, hi[j] = j;
  std::vector<uint8_t> src(24);
  put_u16(src, 0, kF16Half);
  put_u16(src, 2, kF16MinusTwo);
  src[4] = 0x01, src[5] = 0x00, src[6] = 0x00, src[7] = 0x80;
  put_nibbles(src, 8, lo, hi);
  const std::vector<float> y = dequant(GgmlType::kQ5_1, src, 32);
  // x = q * 0.5 - 2
  EXPECT_EQ(y[0], 13.5f);   // (15 + 16) * 0.5 - 2
  EXPECT_EQ(y[1], 5.0f);    // 14 * 0.5 - 2
  EXPECT_EQ(y[15], -2.0f);  // 0
  EXPECT_EQ(y[16], -2.0f);  // 0
  EXPECT_EQ(y[30], 5.0f);   // 14
  EXPECT_EQ(y[31], 13.5f);  // 15 + 16
}

TEST(Dequant, Q8_0TwoBlocks) {
  // Block 0: d = 0.25, qs[e] = e - 16 except a few extremes; block 1: d = -2, qs = 1.
  std::vector<uint8_t> src(68);
  put_u16(src, 0, kF16Quarter);
  for (int e = 0; e < 32; ++e) src[2 + e] = static_cast<uint8_t>(static_cast<int8_t>(e - 16));
  src[2 + 0] = static_cast<uint8_t>(int8_t{-128});
  src[2 + 31] = static_cast<uint8_t>(int8_t{127});
  put_u16(src, 34, kF16MinusTwo);
  for (int e = 0; e < 32; ++e) src[36 + e] = 1;
  const std::vector<float> y = dequant(GgmlType::kQ8_0, src, 64);
  EXPECT_EQ(y[0], -32.0f);   // -128 * 0.25
  EXPECT_EQ(y[1], -3.75f);   // -15 * 0.25
  EXPECT_EQ(y[16], 0.0f);    // 0
  EXPECT_EQ(y[17], 0.25f);   // 1
  EXPECT_EQ(y[30], 3.5f);    // 14
  EXPECT_EQ(y[31], 31.75f);  // 127 * 0.25
  for (int e = 32; e < 64; ++e) EXPECT_EQ(y[e], -2.0f) << e;
}

// Q4_K scales/mins, with values >= 16 in sub-blocks 4..7 so their top bits (stored in
// the spare bits of bytes 0..7) matter.
constexpr int kQ4KScale[8] = {1, 2, 3, 4, 17, 33, 50, 63};
constexpr int kQ4KMin[8] = {0, 5, 10, 63, 16, 31, 47, 60};

// Packs the 12 scale bytes: bytes 0-3 = scale[0-3] | top bits of scale[4-7] << 6,
// bytes 4-7 = min[0-3] | top bits of min[4-7] << 6, bytes 8-11 = low 4 bits of
// scale[4-7] | low 4 bits of min[4-7] << 4.
void put_q4_k_scales(std::vector<uint8_t>& b, size_t at) {
  for (int s = 0; s < 4; ++s) {
    b[at + s] = static_cast<uint8_t>(kQ4KScale[s] | ((kQ4KScale[s + 4] >> 4) << 6));
    b[at + 4 + s] = static_cast<uint8_t>(kQ4KMin[s] | ((kQ4KMin[s + 4] >> 4) << 6));
    b[at + 8 + s] = static_cast<uint8_t>((kQ4KScale[s + 4] & 0xF) | ((kQ4KMin[s + 4] & 0xF) << 4));
  }
}

TEST(Dequant, Q4_K) {
  // d = 1, dmin = 0.5; qs byte i = (i % 16) | (15 - i % 16) << 4.
  std::vector<uint8_t> src(144);
  put_u16(src, 0, kF16One);
  put_u16(src, 2, kF16Half);
  put_q4_k_scales(src, 4);
  for (int i = 0; i < 128; ++i) src[16 + i] = static_cast<uint8_t>((i % 16) | ((15 - i % 16) << 4));
  const std::vector<float> y = dequant(GgmlType::kQ4_K, src, 256);
  // x = d * scale[s] * q - dmin * min[s], s = e / 32. Hand-computed anchors:
  EXPECT_EQ(y[0], 0.0f);      // s 0: 1 * 0 - 0.5 * 0
  EXPECT_EQ(y[5], 5.0f);      // s 0, byte 5 low nibble 5: 1 * 5 - 0
  EXPECT_EQ(y[33], 25.5f);    // s 1, byte 1 high nibble 14: 2 * 14 - 0.5 * 5
  EXPECT_EQ(y[64], -5.0f);    // s 2, byte 32 low nibble 0: 3 * 0 - 0.5 * 10
  EXPECT_EQ(y[127], -31.5f);  // s 3, byte 63 high nibble 0: 4 * 0 - 0.5 * 63
  EXPECT_EQ(y[128], -8.0f);   // s 4, byte 64 low nibble 0: 17 * 0 - 0.5 * 16
  EXPECT_EQ(y[129], 9.0f);    // s 4, byte 65 low nibble 1: 17 * 1 - 8
  EXPECT_EQ(y[160], 479.5f);  // s 5, byte 64 high nibble 15: 33 * 15 - 0.5 * 31
  EXPECT_EQ(y[200], 376.5f);  // s 6, byte 104 low nibble 8: 50 * 8 - 0.5 * 47
  for (int e = 0; e < 256; ++e) {
    const int s = e / 32, byte_index = 32 * (e / 64) + e % 32;
    const int nib = byte_index % 16;  // low nibble of that byte; high = 15 - low
    const int q = (s % 2 == 0) ? nib : 15 - nib;
    EXPECT_EQ(y[e], 1.0f * kQ4KScale[s] * q - 0.5f * kQ4KMin[s]) << "element " << e;
  }
}

TEST(Dequant, Q6_K) {
  // d = 0.5, scales[j] = j - 8 (negative ones included), q6 of element e = (7 e) % 64.
  // Packing: half h = e / 128, quarter g = (e % 128) / 32, lane l = e % 32; the low 4
  // bits go to ql[64h + 32(g & 1) + l] (low nibble if g < 2, else high nibble), the top 2
  // to bits 2g..2g+1 of qh[32h + l].
  std::vector<uint8_t> src(210, 0);
  for (int e = 0; e < 256; ++e) {
    const int q6 = (7 * e) % 64;
    const int h = e / 128, g = (e % 128) / 32, l = e % 32;
    src[64 * h + 32 * (g & 1) + l] |= static_cast<uint8_t>((q6 & 0xF) << (4 * (g >> 1)));
    src[128 + 32 * h + l] |= static_cast<uint8_t>((q6 >> 4) << (2 * g));
  }
  for (int j = 0; j < 16; ++j) src[192 + j] = static_cast<uint8_t>(static_cast<int8_t>(j - 8));
  put_u16(src, 208, kF16Half);
  const std::vector<float> y = dequant(GgmlType::kQ6_K, src, 256);
  // x = d * scales[e / 16] * (q6 - 32). Hand-computed anchors:
  EXPECT_EQ(y[0], 128.0f);    // 0.5 * -8 * (0 - 32)
  EXPECT_EQ(y[1], 100.0f);    // 0.5 * -8 * (7 - 32)
  EXPECT_EQ(y[100], -28.0f);  // q6 = 700 % 64 = 60, scale 6 - 8: 0.5 * -2 * 28
  EXPECT_EQ(y[128], 0.0f);    // q6 = 896 % 64 = 0, scale 0: 0.5 * 0 * -32
  EXPECT_EQ(y[255], 87.5f);   // q6 = 1785 % 64 = 57, scale 7: 0.5 * 7 * 25
  for (int e = 0; e < 256; ++e) {
    EXPECT_EQ(y[e], 0.5f * static_cast<float>(e / 16 - 8) * static_cast<float>((7 * e) % 64 - 32))
        << "element " << e;
  }
}

}  // namespace
}  // namespace qevict
