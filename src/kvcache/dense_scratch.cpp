// DenseLayerScratch: see dense_scratch.h.
#include "kvcache/dense_scratch.h"

namespace qevict {

void DenseLayerScratch::resize(const KvShape& shape, int64_t n) {
  shape_ = shape;
  d_ = shape.head_dim;
  n_ = n;
  const size_t need = size_t(shape.kv_width()) * size_t(n);
  if (k_.capacity() < need) {
    const size_t cap = need + size_t(64) * shape.kv_width();
    k_.reserve(cap);
    v_.reserve(cap);
  }
  k_.resize(need);
  v_.resize(need);
}

void DenseLayerScratch::attend(HalfType dtype, const float* q, int64_t n_q, int64_t q_pos0,
                               float* out, ThreadPool& pool) {
  const int hkv = shape_.n_kv_heads;
  blocks_.resize(size_t(hkv));
  head_off_.resize(size_t(hkv) + 1);
  for (int h = 0; h < hkv; ++h) {
    KvBlockRef& r = blocks_[size_t(h)];
    r = KvBlockRef{};
    r.pos0 = 0;
    r.n = int32_t(n_);
    r.k = k_row(h, 0);
    r.v = v_row(h, 0);
    r.ld = d_;
    head_off_[size_t(h)] = h;
  }
  head_off_[size_t(hkv)] = hkv;
  const FusedAttnParams fp = FusedAttnParams::make(dtype, shape_.group(), d_);
  attend_blocks(fp, hkv, q, shape_.q_width(), n_q, q_pos0, blocks_.data(), head_off_.data(), out,
                nullptr, MassLayout::kPerHeadBlock, attn_, pool);
}

size_t DenseLayerScratch::bytes() const {
  return (k_.capacity() + v_.capacity()) * sizeof(uint16_t) + attn_.bytes() +
         blocks_.capacity() * sizeof(KvBlockRef) + head_off_.capacity() * sizeof(int64_t);
}

}  // namespace qevict
