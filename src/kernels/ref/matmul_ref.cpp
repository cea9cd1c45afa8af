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
         t == GgmlType::kQ5_1 || t == GgmlType::kQ8_0 || t == GgmlType::kQ4_K ||
         t == GgmlType::kQ6_K;
}

namespace {

float f16_at(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return f16_to_f32(h);
}

// The scales, m_w, bias and 32 codes of one 32-element weight block (codes as in matmul_q8's
// formulas): d[0] scales elements 0-15, d[1] elements 16-31 (equal but for Q6_K).
struct WBlock {
  float d[2] = {0, 0}, m = 0;
  int bias = 0;  // 8 (Q4_0), 16 (Q5_0), 32 (Q6_K), else 0
  bool has_m = false;
  int c[32] = {};
};

// Block b (32 elements) of a K-quant row: sub-block b % 8 of super-block b / 8.
WBlock k_block(GgmlType t, const uint8_t* row, int64_t b) {
  WBlock o;
  const int s = static_cast<int>(b % 8);
  const uint8_t* sb = row + static_cast<size_t>(b / 8) * ggml_type_info(t)->block_bytes;
  if (t == GgmlType::kQ4_K) {  // x = d scale q - dmin min (ref/dequant.cpp)
    int scale, min;
    q4_k_scale_min(sb + 4, s, &scale, &min);
    o.d[0] = o.d[1] = f16_at(sb) * static_cast<float>(scale);  // exact
    o.m = -(f16_at(sb + 2) * static_cast<float>(min));         // exact
    o.has_m = true;
    for (int i = 0; i < 32; ++i) o.c[i] = q4_k_code(sb, 32 * s + i);
    return o;
  }
  // Q6_K: x = d scale (q - 32), scale per 16 elements.
  const int8_t* scales = reinterpret_cast<const int8_t*>(sb + 192);
  const float d = f16_at(sb + 208);
  o.d[0] = d * static_cast<float>(scales[2 * s]);  // exact
  o.d[1] = d * static_cast<float>(scales[2 * s + 1]);
  o.bias = 32;
  for (int l = 0; l < 32; ++l) o.c[l] = q6_k_code(sb, 32 * s + l);
  return o;
}

WBlock weight_block(GgmlType t, const uint8_t* row, int64_t b) {
  if (t == GgmlType::kQ4_K || t == GgmlType::kQ6_K) return k_block(t, row, b);
  const uint8_t* blk = row + static_cast<size_t>(b) * ggml_type_info(t)->block_bytes;
  WBlock o;
  o.d[0] = o.d[1] = f16_at(blk);
  const uint8_t* qs = nullptr;
  uint32_t qh = 0;
  switch (t) {
    case GgmlType::kQ4_0:
      o.bias = 8, qs = blk + 2;
      break;
    case GgmlType::kQ4_1:
      o.m = f16_at(blk + 2), o.has_m = true, qs = blk + 4;
      break;
    case GgmlType::kQ5_0:
      o.bias = 16, std::memcpy(&qh, blk + 2, 4), qs = blk + 6;
      break;
    case GgmlType::kQ5_1:
      o.m = f16_at(blk + 2), o.has_m = true, std::memcpy(&qh, blk + 4, 4), qs = blk + 8;
      break;
    default:  // Q8_0
      for (int i = 0; i < 32; ++i) o.c[i] = static_cast<int8_t>(blk[2 + i]);
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
  std::vector<Q8Block> xq(static_cast<size_t>(n_tokens * nb));
  for (int64_t t = 0; t < n_tokens; ++t) {
    for (int64_t b = 0; b < nb; ++b) xq[t * nb + b] = quantize_q8_block(x + t * ldx + b * 32);
  }
  for (int64_t r = row_begin; r < row_end; ++r) {
    const uint8_t* row = w.data + static_cast<size_t>(r) * w.row_bytes;
    for (int64_t t = 0; t < n_tokens; ++t) {
      double sum = 0.0;
      for (int64_t b = 0; b < nb; ++b) {
        const WBlock wb = weight_block(w.type, row, b);
        const Q8Block& a = xq[t * nb + b];
        for (int h = 0; h < 2; ++h) {  // the two 16-element halves (Q6_K's scales)
          int64_t dot = 0, qsum = 0;
          for (int i = 16 * h; i < 16 * h + 16; ++i)
            dot += int64_t{wb.c[i]} * a.q[i], qsum += a.q[i];
          dot -= int64_t{wb.bias} * qsum;
          sum += double{wb.d[h]} * a.d * static_cast<double>(dot);
        }
        if (wb.has_m) sum += double{wb.m} * a.d * a.sum;
      }
      y[t * ldy + r] = static_cast<float>(sum);
    }
  }
}

}  // namespace qevict::ref
