// Scalar reference matmuls (see matmul_ref.h).
#include "kernels/ref/matmul_ref.h"

#include <cmath>
#include <cstring>
#include <vector>

#include "core/f16.h"
#include "kernels/ref/dequant.h"

namespace qevict::ref {

void matmul(const WeightView& w, const float* x, int64_t ldx, int64_t n_tokens, float* y,
            int64_t ldy, int64_t row_begin, int64_t row_end) {
  std::vector<float> row(static_cast<size_t>(w.n_cols));
  for (int64_t r = row_begin; r < row_end; ++r) {
    dequantize_row(w.type, w.data + static_cast<size_t>(r) * w.row_bytes, row.data(), w.n_cols);
    for (int64_t t = 0; t < n_tokens; ++t) {
      const float* xt = x + t * ldx;
      double sum = 0.0;
      for (int64_t k = 0; k < w.n_cols; ++k) {
        sum += static_cast<double>(row[k]) * static_cast<double>(xt[k]);
      }
      y[t * ldy + r] = static_cast<float>(sum);
    }
  }
}

Q8Block quantize_q8_block(const float* x) {
  Q8Block b;
  float amax = 0.0f;
  for (int i = 0; i < 32; ++i) amax = std::fmax(amax, std::fabs(x[i]));
  bool finite = true;
  for (int i = 0; i < 32; ++i) finite = finite && std::isfinite(x[i]);
  if (!finite) {
    b.d = std::nanf("");
    return b;
  }
  if (amax == 0.0f) return b;
  b.d = amax / 127.0f;
  const float id = 127.0f / amax;
  for (int i = 0; i < 32; ++i) {
    b.q[i] = static_cast<int8_t>(std::nearbyint(x[i] * id));
    b.sum += b.q[i];
  }
  return b;
}

bool q8_supported(GgmlType t) {
  return t == GgmlType::kQ4_0 || t == GgmlType::kQ4_1 || t == GgmlType::kQ5_0 ||
         t == GgmlType::kQ5_1 || t == GgmlType::kQ8_0;
}

namespace {

float f16_at(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return f16_to_f32(h);
}

// d_w, m_w and the 32 codes of one weight block (codes as in matmul_q8's formulas).
struct WBlock {
  float d = 0, m = 0;
  int bias = 0;  // 8 (Q4_0), 16 (Q5_0), else 0
  bool has_m = false;
  int c[32] = {};
};

WBlock weight_block(GgmlType t, const uint8_t* b) {
  WBlock o;
  o.d = f16_at(b);
  const uint8_t* qs = nullptr;
  uint32_t qh = 0;
  switch (t) {
    case GgmlType::kQ4_0:
      o.bias = 8, qs = b + 2;
      break;
    case GgmlType::kQ4_1:
      o.m = f16_at(b + 2), o.has_m = true, qs = b + 4;
      break;
    case GgmlType::kQ5_0:
      o.bias = 16, std::memcpy(&qh, b + 2, 4), qs = b + 6;
      break;
    case GgmlType::kQ5_1:
      o.m = f16_at(b + 2), o.has_m = true, std::memcpy(&qh, b + 4, 4), qs = b + 8;
      break;
    default:  // Q8_0
      for (int i = 0; i < 32; ++i) o.c[i] = static_cast<int8_t>(b[2 + i]);
      return o;
  }
  for (int i = 0; i < 16; ++i) {
    o.c[i] = (qs[i] & 0xF) | static_cast<int>(((qh >> i) & 1) << 4);
    o.c[i + 16] = (qs[i] >> 4) | static_cast<int>(((qh >> (i + 16)) & 1) << 4);
  }
  return o;
}

}  // namespace

void matmul_q8(const WeightView& w, const float* x, int64_t ldx, int64_t n_tokens, float* y,
               int64_t ldy, int64_t row_begin, int64_t row_end) {
  const int64_t nb = w.n_cols / 32;
  const size_t bb = ggml_type_info(w.type)->block_bytes;
  std::vector<Q8Block> xq(static_cast<size_t>(n_tokens * nb));
  for (int64_t t = 0; t < n_tokens; ++t) {
    for (int64_t b = 0; b < nb; ++b) xq[t * nb + b] = quantize_q8_block(x + t * ldx + b * 32);
  }
  for (int64_t r = row_begin; r < row_end; ++r) {
    const uint8_t* row = w.data + static_cast<size_t>(r) * w.row_bytes;
    for (int64_t t = 0; t < n_tokens; ++t) {
      double sum = 0.0;
      for (int64_t b = 0; b < nb; ++b) {
        const WBlock wb = weight_block(w.type, row + b * bb);
        const Q8Block& a = xq[t * nb + b];
        int64_t dot = 0;
        for (int i = 0; i < 32; ++i) dot += int64_t{wb.c[i]} * a.q[i];
        dot -= int64_t{wb.bias} * a.sum;
        sum += double{wb.d} * a.d * static_cast<double>(dot);
        if (wb.has_m) sum += double{wb.m} * a.d * a.sum;
      }
      y[t * ldy + r] = static_cast<float>(sum);
    }
  }
}

}  // namespace qevict::ref
