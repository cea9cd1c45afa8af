// Scalar reference dequantizers (see dequant.h). Each decoder is written per element from
// the block layout in ggml-common.h, so it reads as the format's definition.
#include "kernels/ref/dequant.h"

#include <cstring>
#include <limits>

#include "core/f16.h"

namespace qevict::ref {

// q4_k_scale_min (dequant.h), as ggml-quants.c get_scale_min_k4: sub-blocks 0..3 keep
// theirs in the low 6 bits of bytes s and s + 4; sub-blocks 4..7 put the low 4 bits in the
// nibbles of byte s + 4 and the top 2 bits in the spare top bits of bytes s - 4 (scale) and
// s (min).
void q4_k_scale_min(const uint8_t* sc, int s, int* scale, int* min) {
  if (s < 4) {
    *scale = sc[s] & 63;
    *min = sc[s + 4] & 63;
  } else {
    *scale = (sc[s + 4] & 0xF) | ((sc[s - 4] >> 6) << 4);
    *min = (sc[s + 4] >> 4) | ((sc[s] >> 6) << 4);
  }
}

// Q4_K: chunk c (64 elements) uses qs[32c .. 32c + 32) (qs at byte 16): its first 32
// elements are the low nibbles (sub-block 2c), the next 32 the high nibbles (2c + 1).
int q4_k_code(const uint8_t* b, int e) {
  const int byte = b[16 + 32 * (e / 64) + e % 32];
  return ((e / 32) % 2 == 0) ? (byte & 0xF) : (byte >> 4);
}

// Q6_K: half h (128 elements) uses ql[64h ..] and qh[32h ..] (qh at byte 128); within it,
// quarter g (32 elements, lane l) takes the low 4 bits from ql[64h + 32(g & 1) + l] (low
// nibble for g < 2, high for g >= 2) and the top 2 bits from bits 2g..2g+1 of qh[32h + l].
int q6_k_code(const uint8_t* b, int e) {
  const int h = e / 128, g = (e % 128) / 32, l = e % 32;
  const int lo = (b[64 * h + 32 * (g & 1) + l] >> (4 * (g >> 1))) & 0xF;
  const int hi = (b[128 + 32 * h + l] >> (2 * g)) & 3;
  return lo | (hi << 4);
}

namespace {

uint16_t load_u16(const uint8_t* p) {
  uint16_t v;
  std::memcpy(&v, p, 2);
  return v;
}
float load_f16(const uint8_t* p) { return f16_to_f32(load_u16(p)); }

// Q4_0, 18 bytes: f16 d | u8 qs[16]. Element j < 16 is the low nibble of qs[j], element
// j + 16 the high nibble; x = (q - 8) * d.
void dequant_q4_0(const uint8_t* b, float* y) {
  const float d = load_f16(b);
  const uint8_t* qs = b + 2;
  for (int e = 0; e < 32; ++e) {
    const int q = e < 16 ? (qs[e] & 0xF) : (qs[e - 16] >> 4);
    y[e] = static_cast<float>(q - 8) * d;
  }
}

// Q4_1, 20 bytes: f16 d | f16 m | u8 qs[16]. Nibbles as Q4_0; x = q * d + m.
void dequant_q4_1(const uint8_t* b, float* y) {
  const float d = load_f16(b);
  const float m = load_f16(b + 2);
  const uint8_t* qs = b + 4;
  for (int e = 0; e < 32; ++e) {
    const int q = e < 16 ? (qs[e] & 0xF) : (qs[e - 16] >> 4);
    y[e] = static_cast<float>(q) * d + m;
  }
}

// Fifth bit of element e (0..31) in the Q5 formats: bit e of the little-endian u32 qh.
int q5_high_bit(const uint8_t* qh, int e) { return (qh[e / 8] >> (e % 8)) & 1; }

// Q5_0, 22 bytes: f16 d | u8 qh[4] | u8 qs[16]. q = nibble (as Q4_0) | high bit << 4;
// x = (q - 16) * d.
void dequant_q5_0(const uint8_t* b, float* y) {
  const float d = load_f16(b);
  const uint8_t* qh = b + 2;
  const uint8_t* qs = b + 6;
  for (int e = 0; e < 32; ++e) {
    const int lo = e < 16 ? (qs[e] & 0xF) : (qs[e - 16] >> 4);
    const int q = lo | (q5_high_bit(qh, e) << 4);
    y[e] = static_cast<float>(q - 16) * d;
  }
}

// Q5_1, 24 bytes: f16 d | f16 m | u8 qh[4] | u8 qs[16]; x = q * d + m.
void dequant_q5_1(const uint8_t* b, float* y) {
  const float d = load_f16(b);
  const float m = load_f16(b + 2);
  const uint8_t* qh = b + 4;
  const uint8_t* qs = b + 8;
  for (int e = 0; e < 32; ++e) {
    const int lo = e < 16 ? (qs[e] & 0xF) : (qs[e - 16] >> 4);
    const int q = lo | (q5_high_bit(qh, e) << 4);
    y[e] = static_cast<float>(q) * d + m;
  }
}

// Q8_0, 34 bytes: f16 d | i8 qs[32]; x = q * d.
void dequant_q8_0(const uint8_t* b, float* y) {
  const float d = load_f16(b);
  const int8_t* qs = reinterpret_cast<const int8_t*>(b + 2);
  for (int e = 0; e < 32; ++e) y[e] = static_cast<float>(qs[e]) * d;
}

// Q4_K, 144 bytes: f16 d | f16 dmin | u8 scales[12] | u8 qs[128]; 256 elements in 8
// sub-blocks of 32 (codes: q4_k_code). x = d * scale * q - dmin * min.
void dequant_q4_k(const uint8_t* b, float* y) {
  const float d = load_f16(b);
  const float dmin = load_f16(b + 2);
  const uint8_t* scales = b + 4;
  for (int e = 0; e < 256; ++e) {
    int scale, min;
    q4_k_scale_min(scales, e / 32, &scale, &min);
    const float d1 = d * static_cast<float>(scale);   // exact: 11 x 6 bits
    const float m1 = dmin * static_cast<float>(min);  // exact
    y[e] = d1 * static_cast<float>(q4_k_code(b, e)) - m1;
  }
}

// Q6_K, 210 bytes: u8 ql[128] | u8 qh[64] | i8 scales[16] | f16 d; 256 elements, scale
// scales[e / 16] (codes: q6_k_code). x = d * scale * (q - 32).
void dequant_q6_k(const uint8_t* b, float* y) {
  const int8_t* scales = reinterpret_cast<const int8_t*>(b + 192);
  const float d = load_f16(b + 208);
  for (int e = 0; e < 256; ++e) {
    const int q = q6_k_code(b, e) - 32;
    const float ds = d * static_cast<float>(scales[e / 16]);  // exact: 11 x 8 bits
    y[e] = ds * static_cast<float>(q);                        // exact: + 6 bits
  }
}

template <void (*kDecodeBlock)(const uint8_t*, float*)>
void dequant_blocks(const uint8_t* src, float* dst, int64_t n, int64_t block_elems,
                    int64_t block_bytes) {
  for (int64_t i = 0; i < n / block_elems; ++i) {
    kDecodeBlock(src + i * block_bytes, dst + i * block_elems);
  }
}

}  // namespace

bool can_dequantize(GgmlType type) {
  switch (type) {
    case GgmlType::kF32:
    case GgmlType::kF16:
    case GgmlType::kBF16:
    case GgmlType::kQ4_0:
    case GgmlType::kQ4_1:
    case GgmlType::kQ5_0:
    case GgmlType::kQ5_1:
    case GgmlType::kQ8_0:
    case GgmlType::kQ4_K:
    case GgmlType::kQ6_K:
      return true;
    default:
      return false;
  }
}

void dequantize_row(GgmlType type, const void* src, float* dst, int64_t n) {
  const auto* s = static_cast<const uint8_t*>(src);
  switch (type) {
    case GgmlType::kF32:
      if (n > 0) std::memcpy(dst, s, static_cast<size_t>(n) * sizeof(float));
      return;
    case GgmlType::kF16:
      for (int64_t i = 0; i < n; ++i) dst[i] = f16_to_f32(load_u16(s + 2 * i));
      return;
    case GgmlType::kBF16:
      for (int64_t i = 0; i < n; ++i) dst[i] = bf16_to_f32(load_u16(s + 2 * i));
      return;
    case GgmlType::kQ4_0:
      return dequant_blocks<dequant_q4_0>(s, dst, n, 32, 18);
    case GgmlType::kQ4_1:
      return dequant_blocks<dequant_q4_1>(s, dst, n, 32, 20);
    case GgmlType::kQ5_0:
      return dequant_blocks<dequant_q5_0>(s, dst, n, 32, 22);
    case GgmlType::kQ5_1:
      return dequant_blocks<dequant_q5_1>(s, dst, n, 32, 24);
    case GgmlType::kQ8_0:
      return dequant_blocks<dequant_q8_0>(s, dst, n, 32, 34);
    case GgmlType::kQ4_K:
      return dequant_blocks<dequant_q4_k>(s, dst, n, 256, 144);
    case GgmlType::kQ6_K:
      return dequant_blocks<dequant_q6_k>(s, dst, n, 256, 210);
    default:  // precondition violated (!can_dequantize): make it loud, not silent
      for (int64_t i = 0; i < n; ++i) dst[i] = std::numeric_limits<float>::quiet_NaN();
      return;
  }
}

}  // namespace qevict::ref
