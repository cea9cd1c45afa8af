// KIVI's group quantizer (Liu et al. 2024; jy-yuan/KIVI@876b4d2 quant/new_pack.py:L217-252),
// scalar reference: one group of n f16 values, asymmetric min-max with an f16 scale and
// minimum, rounded as the reference's f16 tensor ops round. Which groups exist (keys per
// channel over G tokens, values per token over G channels) is the cache's business
// (kvcache/quant_cache.h); this file only computes.
#pragma once

#include <cstddef>
#include <cstdint>

namespace qevict {

// One quantized group's parameters, both f16 bits (the reference keeps them in the model's
// f16): x ≈ code · scale + min.
struct KiviGroupParams {
  uint16_t scale = 0;
  uint16_t min = 0;
};

// Quantizes x[i · stride] (i < n, f16 bits) to `bits`-bit codes, in the order of the
// reference's f16 arithmetic (every step rounded to f16 as torch's half ops do):
//   mn, mx = min, max;  scale = f16(f16(mx − mn) / (2^b − 1))
//   code_i = round_half_even(clamp(f16(f16(x_i − mn) / scale), 0, 2^b − 1))
// Writes code i at codes[i] (one byte each; pack with kivi_pack). A group of equal values
// (scale 0) gets code 0 where the reference divides 0 by 0 (its codes are undefined there).
KiviGroupParams kivi_quantize_group(const uint16_t* x, int64_t stride, int n, int bits,
                                    uint8_t* codes);

// x̂_i = code_i · scale + min in f32 (the reference dequantizes in its attention kernels).
inline float kivi_dequant(uint8_t code, float scale, float min) {
  return float(code) * scale + min;
}

// Packs n codes of `bits` bits, code i at bit (i · bits) of the byte string, low bits first:
// the bit order of the reference's int32 packing (32/b codes per int32, code i at bit
// (i mod 32/b) · b) on a little-endian machine. n · bits must be a multiple of 8.
void kivi_pack(const uint8_t* codes, int n, int bits, uint8_t* packed);
inline uint8_t kivi_code_at(const uint8_t* packed, int64_t i, int bits) {
  const int64_t bit = i * bits;
  return uint8_t((packed[bit >> 3] >> (bit & 7)) & ((1 << bits) - 1));
}

}  // namespace qevict
