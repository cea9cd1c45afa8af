// KIVI-style window quantization (see kv_quant.h). Parameters are rounded to f16 first and
// codes computed against the rounded parameters, so reconstruction error is at most half a
// step of the stored scale (plus f16 rounding of the zero-point).
#include "kernels/kv_quant.h"

#include <fmt/format.h>

#include <algorithm>
#include <cassert>
#include <cmath>
#include <cstring>

#include "core/f16.h"
#include "kernels/ops.h"

namespace qevict {

Status QuantLayout::validate() const {
  if (bits != 2 && bits != 4)
    return Status::error(fmt::format("low-bit tier needs 2 or 4 bits, got {}", bits));
  if (vbits != 0 && vbits != 2 && vbits != 4)
    return Status::error(fmt::format("low-bit tier values need 2 or 4 bits, got {}", vbits));
  if (n_kv_heads <= 0 || head_dim <= 0 || window <= 0)
    return Status::error("invalid quantization layout");
  if (head_dim % g() != 0)
    return Status::error(fmt::format("value group {} does not divide head_dim {}", g(), head_dim));
  for (const int b : {kb(), vb()}) {
    if ((size_t(window) * head_dim * b) % 8 != 0)
      return Status::error("window * head_dim * bits must fill whole bytes");
    if (head_dim % (8 / b) != 0)
      return Status::error("head_dim must be a multiple of the codes per byte");
  }
  if (kmeta != 8 && kmeta != 16)
    return Status::error(fmt::format("key scales and zeros take 8 or 16 bits, got {}", kmeta));
  if (g() % (8 / vb()) != 0)
    return Status::error(
        fmt::format("value group {} must be a multiple of {} codes per byte", g(), 8 / vb()));
  return Status::ok();
}

namespace {

// f16-rounded (scale, zero) for values in [lo, hi] with `levels` steps.
void params(float lo, float hi, int levels, uint16_t* s16, uint16_t* z16, float* s, float* z) {
  *z16 = f32_to_f16(lo);
  *z = f16_to_f32(*z16);
  float step = (hi - *z) / float(levels);
  if (!(step > 0.0f) || !std::isfinite(step)) step = 0.0f;
  *s16 = f32_to_f16(step);
  *s = f16_to_f32(*s16);
}

// kmeta 8 (kv_quant.h): the smallest scale code whose grid z + {0..levels}·s puts a point
// within half a step of every value in [lo, hi] — z = ⌊2·lo/s + 1⌋·s/2, in (lo, lo + s/2], that
// zero code in int8, and z + (levels + ½)·s ≥ hi — so s can be as fine as (hi − lo)/(levels + ½)
// where the f16 grid's min-max ends need (hi − lo)/levels (INT2: 3.5 steps against 3); the
// largest code when none does (values past it clamp). A channel of zeros, or one that is not
// finite, codes as 0.
void params8(float lo, float hi, int levels, uint8_t* sc, int8_t* zc, float* s, float* z) {
  *sc = 0, *zc = 0, *s = 0.0f, *z = 0.0f;
  if (!std::isfinite(lo) || !std::isfinite(hi) || (lo == 0.0f && hi == 0.0f)) return;
  const double want = std::max(double(hi - lo) / (levels + 0.5), std::fabs(double(lo)) / 64.0);
  int c = 8;  // the smallest nonzero scale, 2^-19
  if (want > 0.0) {
    int e2 = 0;
    const double f = 2.0 * std::frexp(want, &e2);  // want = f·2^(e2 - 1), f in [1, 2)
    int e = e2 - 1 + 20, m = int(std::ceil((f - 1.0) * 8.0));
    if (m == 8) ++e, m = 0;
    c = e < 1 ? 8 : e > 31 ? 255 : (e << 3) | m;
  }
  for (;; ++c) {
    const float sv = key_scale_of_code(uint8_t(c));
    const double n = std::floor(2.0 * double(lo) / double(sv) + 1.0);
    const bool in_range = n >= -128.0 && n <= 127.0;
    const double nc = std::clamp(n, -128.0, 127.0);
    const float zv = key_zero_of_code(int8_t(nc), sv);
    if ((in_range && double(zv) + (levels + 0.5) * double(sv) >= double(hi)) || c == 255) {
      *sc = uint8_t(c), *zc = int8_t(nc), *s = sv, *z = zv;
      return;
    }
  }
}

inline int code_of(float x, float s, float z, int levels) {
  if (s == 0.0f) return 0;
  const float c = std::nearbyint((x - z) / s);
  return static_cast<int>(std::clamp(c, 0.0f, float(levels)));
}

inline void put_code(uint8_t* row, int i, int bits, int c) {
  const int per = 8 / bits;
  row[i / per] = static_cast<uint8_t>(row[i / per] | (c << (bits * (i % per))));
}

}  // namespace

void quantize_window(const QuantLayout& L, const float* k_pre, const float* v, int n_tokens,
                     uint8_t* out) {
  const int H = L.n_kv_heads, d = L.head_dim, g = L.g();
  const int k_levels = (1 << L.kb()) - 1, v_levels = (1 << L.vb()) - 1;
  std::memset(out, 0, L.window_bytes());
  const size_t k_row_bytes = L.k_row_bytes(), v_row_bytes = L.v_row_bytes();
  for (int h = 0; h < H; ++h) {
    uint8_t* kc = out + L.k_codes_off(h);
    uint8_t* vc = out + L.v_codes_off(h);
    uint8_t* ks = out + L.k_scale_off(h);
    uint8_t* kz = out + L.k_zero_off(h);
    uint8_t* vs = out + L.v_scale_off(h);
    uint8_t* vz = out + L.v_zero_off(h);
    // Keys: one (scale, zero) per channel over the window's tokens.
    const bool meta8 = L.kmeta == 8;
    for (int c = 0; c < d; ++c) {
      float lo = INFINITY, hi = -INFINITY;
      for (int t = 0; t < n_tokens; ++t) {
        const float x = k_pre[(size_t(t) * H + h) * d + c];
        lo = std::min(lo, x);
        hi = std::max(hi, x);
      }
      if (n_tokens == 0) lo = hi = 0.0f;
      float s, z;
      if (meta8) {
        uint8_t sc;
        int8_t zc;
        params8(lo, hi, k_levels, &sc, &zc, &s, &z);
        ks[c] = sc;
        kz[c] = uint8_t(zc);
      } else {
        uint16_t s16, z16;
        params(lo, hi, k_levels, &s16, &z16, &s, &z);
        store_f16_bits(ks, size_t(c), s16);
        store_f16_bits(kz, size_t(c), z16);
      }
      for (int t = 0; t < n_tokens; ++t)
        put_code(kc + size_t(t) * k_row_bytes, c, L.kb(),
                 code_of(k_pre[(size_t(t) * H + h) * d + c], s, z, k_levels));
    }
    // Values: one (scale, zero) per token and group of g channels.
    for (int t = 0; t < n_tokens; ++t) {
      const float* row = v + (size_t(t) * H + h) * d;
      for (int g0 = 0; g0 < d; g0 += g) {
        float lo = INFINITY, hi = -INFINITY;
        for (int c = g0; c < g0 + g; ++c) lo = std::min(lo, row[c]), hi = std::max(hi, row[c]);
        float s, z;
        uint16_t s16, z16;
        params(lo, hi, v_levels, &s16, &z16, &s, &z);
        const size_t p = size_t(t) * (d / g) + g0 / g;
        store_f16_bits(vs, p, s16);
        store_f16_bits(vz, p, z16);
        for (int c = g0; c < g0 + g; ++c)
          put_code(vc + size_t(t) * v_row_bytes, c, L.vb(), code_of(row[c], s, z, v_levels));
      }
    }
  }
}

namespace {

// byte -> its codes as floats, low bits first: INT2 (4 codes) and INT4 (2 codes). A table
// lookup plus one multiply-add per element replaces shifting and masking every code.
struct CodeTables {
  float int2[256][4];
  float int4[256][2];
  CodeTables() {
    for (int b = 0; b < 256; ++b) {
      for (int i = 0; i < 4; ++i) int2[b][i] = float((b >> (2 * i)) & 3);
      for (int i = 0; i < 2; ++i) int4[b][i] = float((b >> (4 * i)) & 15);
    }
  }
};
const CodeTables kCodes;

// out[c] = code(c) * s[c] + z[c] for c < d (keys: per-channel parameters).
template <int kBits>
inline void decode_row(const uint8_t* __restrict__ row, int d, const float* __restrict__ s,
                       const float* __restrict__ z, float* __restrict__ out) {
  constexpr int kPer = 8 / kBits;
  for (int j = 0; j < d / kPer; ++j) {
    const float* codes = kBits == 2 ? kCodes.int2[row[j]] : kCodes.int4[row[j]];
    for (int i = 0; i < kPer; ++i) out[j * kPer + i] = codes[i] * s[j * kPer + i] + z[j * kPer + i];
  }
}

// out[c] = code(c) * s + z for c in [c0, c0 + n) (values: one group's parameters);
// c0 and n are multiples of the codes per byte (validated by QuantLayout).
template <int kBits>
inline void decode_run(const uint8_t* __restrict__ row, int c0, int n, float s, float z,
                       float* __restrict__ out) {
  constexpr int kPer = 8 / kBits;
  for (int j = c0 / kPer; j < (c0 + n) / kPer; ++j) {
    const float* codes = kBits == 2 ? kCodes.int2[row[j]] : kCodes.int4[row[j]];
    for (int i = 0; i < kPer; ++i) out[j * kPer + i] = codes[i] * s + z;
  }
}

}  // namespace

void key_params(const QuantLayout& L, const uint8_t* win, int h, float* s, float* z, int c0) {
  const int d = L.head_dim;
  assert(c0 >= 0 && c0 <= d);
  const uint8_t* ks = win + L.k_scale_off(h);
  const uint8_t* kz = win + L.k_zero_off(h);
  if (L.kmeta == 8) {
    for (int c = c0; c < d; ++c) {
      s[c] = key_scale_of_code(ks[c]);
      z[c] = key_zero_of_code(int8_t(kz[c]), s[c]);
    }
    return;
  }
  const int n = d - c0;
  uint16_t s16[1024], z16[1024];  // head_dim <= 1024 (checked by the cache factory)
  std::memcpy(s16, ks + 2 * size_t(c0), 2 * size_t(n));  // any alignment
  std::memcpy(z16, kz + 2 * size_t(c0), 2 * size_t(n));
  half_to_f32(HalfType::kF16, s16, s + c0, n);  // F16C / SIMD conversion
  half_to_f32(HalfType::kF16, z16, z + c0, n);
}

void dequantize_window_head(const QuantLayout& L, const uint8_t* win, int h, int n_tokens,
                            float* k_pre, float* v) {
  const int d = L.head_dim, g = L.g();
  const uint8_t* vs = win + L.v_scale_off(h);
  const uint8_t* vz = win + L.v_zero_off(h);
  if (k_pre) {
    float s[1024], z[1024];
    key_params(L, win, h, s, z);
    for (int t = 0; t < n_tokens; ++t) {
      const uint8_t* row = win + L.k_codes_off(h) + size_t(t) * L.k_row_bytes();
      if (L.kb() == 2)
        decode_row<2>(row, d, s, z, k_pre + size_t(t) * d);
      else
        decode_row<4>(row, d, s, z, k_pre + size_t(t) * d);
    }
  }
  if (v) {
    for (int t = 0; t < n_tokens; ++t) {
      const uint8_t* row = win + L.v_codes_off(h) + size_t(t) * L.v_row_bytes();
      for (int g0 = 0; g0 < d; g0 += g) {
        const size_t p = size_t(t) * (d / g) + g0 / g;
        const float s = f16_to_f32(load_f16_bits(vs, p)), z = f16_to_f32(load_f16_bits(vz, p));
        if (L.vb() == 2)
          decode_run<2>(row, g0, g, s, z, v + size_t(t) * d);
        else
          decode_run<4>(row, g0, g, s, z, v + size_t(t) * d);
      }
    }
  }
}

}  // namespace qevict
