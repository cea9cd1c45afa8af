// KIVI's group quantizer (see kivi_group.h): scalar reference, run once per group.
#include "kernels/kivi_group.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/f16.h"

namespace qevict {

namespace {
// f32 → f16 → f32: one torch half op (the exact result rounded to f16; f32 holds the exact
// difference/quotient of two halves closely enough that the double rounding cannot differ).
float h(float x) { return f16_to_f32(f32_to_f16(x)); }
}  // namespace

KiviGroupParams kivi_quantize_group(const uint16_t* x, int64_t stride, int n, int bits,
                                    uint8_t* codes) {
  float mn = INFINITY, mx = -INFINITY;
  for (int i = 0; i < n; ++i) {
    const float v = f16_to_f32(x[i * stride]);
    mn = std::min(mn, v);
    mx = std::max(mx, v);
  }
  const float max_int = float((1 << bits) - 1);
  const float scale = h(h(mx - mn) / max_int);  // L238
  for (int i = 0; i < n; ++i) {
    if (!(scale > 0.0f)) {
      codes[i] = 0;
      continue;
    }
    const float d = h(h(f16_to_f32(x[i * stride]) - mn) / scale);  // L239-240
    // L241: clamp_(0, max_int).round_(): round half to even (the default rounding mode).
    codes[i] = uint8_t(std::nearbyint(std::clamp(d, 0.0f, max_int)));
  }
  return {f32_to_f16(scale), f32_to_f16(mn)};
}

void kivi_pack(const uint8_t* codes, int n, int bits, uint8_t* packed) {
  std::memset(packed, 0, size_t(n) * bits / 8);
  for (int i = 0; i < n; ++i) {
    const int bit = i * bits;
    packed[bit >> 3] |= uint8_t(codes[i] << (bit & 7));
  }
}

}  // namespace qevict
