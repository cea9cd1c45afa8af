// KIVI-style asymmetric low-bit quantization of one KV window (SPEC §5; KIVI, Liu et al.
// 2024): keys per channel over the window's tokens (pre-RoPE), values per token in groups
// of g channels. Scales and zero-points are stored as f16 — or, for the keys with kmeta = 8,
// as one byte each (key_scale_of_code below); codes are packed 4 per byte (INT2) or 2 per
// byte (INT4), low bits first. Scalar code: quantization runs once per window (the ledger
// keeps the codes), and decoding is a few ops per element.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "core/status.h"

namespace qevict {

// Layout of one quantized window for all KV heads of one layer.
struct QuantLayout {
  int bits = 2;  // 2 or 4: the keys' bits, and the values' unless vbits says otherwise
  int n_kv_heads = 0;
  int head_dim = 0;
  int window = 8;  // tokens per window (ω)
  int group = 0;   // value group size g (divides head_dim); 0 means head_dim
  int vbits = 0;   // the values' bits, 2 or 4; 0 means `bits`
  // The keys' per-channel scale and zero: 16 = two f16 (4 bytes a channel); 8 = a scale code
  // and a zero code of one byte each (key_scale_of_code, key_zero_of_code): half the bytes,
  // the step up to ~12.5 % coarser (more where a channel sits far from zero).
  int kmeta = 16;

  Status validate() const;
  int g() const { return group > 0 ? group : head_dim; }
  int kb() const { return bits; }
  int vb() const { return vbits > 0 ? vbits : bits; }
  // A window is n_kv_heads head blocks one after another, so attention over one KV head
  // reads one contiguous run of head_bytes() per window (prefetchable, no strided pieces):
  //   [key codes W][value codes W] packed rows of head_dim codes (W = window tokens),
  //   then f16 [key scales d][key zeros d][value scales W·d/g][value zeros W·d/g]
  //   (kmeta 8: u8 [key scale codes d], i8 [key zero codes d] in place of the two f16 arrays).
  size_t k_row_bytes() const { return size_t(head_dim) * kb() / 8; }
  size_t v_row_bytes() const { return size_t(head_dim) * vb() / 8; }
  size_t k_head_code_bytes() const { return size_t(window) * k_row_bytes(); }
  size_t v_head_code_bytes() const { return size_t(window) * v_row_bytes(); }
  size_t k_meta_bytes() const { return kmeta == 8 ? 1 : 2; }  // a key scale (or zero)
  size_t head_bytes() const {
    return k_head_code_bytes() + v_head_code_bytes() + 2 * k_meta_bytes() * size_t(head_dim) +
           2 * 2 * size_t(window) * (head_dim / g());
  }
  // Exact bytes of one window in the low-bit tier, metadata included (M_q of SPEC §3).
  size_t window_bytes() const { return size_t(n_kv_heads) * head_bytes(); }
  // Offsets inside a window's byte block, of head h's parts.
  size_t k_codes_off(int h) const { return size_t(h) * head_bytes(); }
  size_t v_codes_off(int h) const { return k_codes_off(h) + k_head_code_bytes(); }
  size_t k_scale_off(int h) const { return v_codes_off(h) + v_head_code_bytes(); }
  size_t k_zero_off(int h) const { return k_scale_off(h) + k_meta_bytes() * size_t(head_dim); }
  size_t v_scale_off(int h) const { return k_zero_off(h) + k_meta_bytes() * size_t(head_dim); }
  size_t v_zero_off(int h) const { return v_scale_off(h) + 2 * size_t(window) * (head_dim / g()); }
};

// The f16 scale/zero i of the array at p. Windows may start at any byte (a pool slot, a
// caller's buffer), so scales and zeros are read and written byte-wise, never through a
// uint16_t pointer.
inline uint16_t load_f16_bits(const uint8_t* p, size_t i) {
  uint16_t v;
  std::memcpy(&v, p + 2 * i, sizeof v);
  return v;
}
inline void store_f16_bits(uint8_t* p, size_t i, uint16_t v) {
  std::memcpy(p + 2 * i, &v, sizeof v);
}

// kmeta 8: a key channel's scale code c is an 8-bit float with no sign, 5 exponent and 3
// mantissa bits, c < 8 meaning 0: s = 2^((c >> 3) − 20)·(1 + (c & 7)/8), i.e. the f32 whose
// bits are (c << 20) + (107 << 23) — 2^-19 … 3840. Its zero code n (int8) gives z = n·(s/2),
// exact in f32. The quantizer takes the smallest scale code whose grid has a point within half
// a step of every value of the channel's [lo, hi] (the grid's ends inside it by up to half a
// step, not on lo and hi as the f16 layout's are; see kv_quant.cpp).
inline float key_scale_of_code(uint8_t c) {
  if (c < 8) return 0.0f;
  const uint32_t bits = (uint32_t(c) << 20) + (107u << 23);
  float s;
  std::memcpy(&s, &bits, sizeof s);
  return s;
}
inline float key_zero_of_code(int8_t n, float s) { return float(n) * (s * 0.5f); }

// Head h's key scales and zeros as f32, either format: channels [c0, head_dim) into
// s[c0..head_dim) and z[c0..head_dim) (c0 = 0: the whole head; a SIMD path's tail channels).
void key_params(const QuantLayout& L, const uint8_t* win, int h, float* s, float* z, int c0 = 0);

// Quantizes a window. k_pre: f32 [window][n_kv_heads][head_dim] pre-RoPE keys;
// v: f32 [window][n_kv_heads][head_dim]; n_tokens <= window (missing tokens code as zero and
// are excluded from min/max). out: window_bytes() bytes.
void quantize_window(const QuantLayout& L, const float* k_pre, const float* v, int n_tokens,
                     uint8_t* out);

// Decodes kv head h's keys (pre-RoPE) and values of tokens [0, n_tokens) into f32
// [n_tokens][head_dim] each (either pointer may be null to skip it).
void dequantize_window_head(const QuantLayout& L, const uint8_t* win, int h, int n_tokens,
                            float* k_pre, float* v);

}  // namespace qevict
