// FullKV cache (see full_cache.h). Attention = the shared block loop over pages.
#include "kvcache/full_cache.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <limits>

namespace qevict {

FullKvCache::FullKvCache(const KvShape& shape, int64_t n_ctx, HalfType dtype)
    : shape_(shape), n_ctx_(n_ctx), dtype_(dtype), pages_(shape.n_layers) {}

Status FullKvCache::begin(int64_t n_new) {
  QEVICT_RETURN_IF_ERROR(check_begin(n_past_, n_new, n_ctx_));
  const int64_t pages_needed = (n_past_ + n_new + kPageTokens - 1) / kPageTokens;
  const size_t page_elems = size_t(shape_.n_kv_heads) * kPageTokens * shape_.head_dim;
  for (auto& layer_pages : pages_) {
    while (int64_t(layer_pages.size()) < pages_needed) {
      Page p;
      p.k.resize(page_elems);
      p.v.resize(page_elems);
      layer_pages.push_back(std::move(p));
    }
  }
  n_new_ = n_new;
  return Status::ok();
}

uint16_t* FullKvCache::k_at(int layer, int64_t pos, int kv_head) {
  Page& p = pages_[layer][pos / kPageTokens];
  return p.k.data() + (size_t(kv_head) * kPageTokens + pos % kPageTokens) * shape_.head_dim;
}

uint16_t* FullKvCache::v_at(int layer, int64_t pos, int kv_head) {
  Page& p = pages_[layer][pos / kPageTokens];
  return p.v.data() + (size_t(kv_head) * kPageTokens + pos % kPageTokens) * shape_.head_dim;
}

void FullKvCache::append_prompt(int layer, const float* q, const float* k, const float* v,
                                const PromptExtras& x) {
  (void)q, (void)x;
  const int d = shape_.head_dim, hkv = shape_.n_kv_heads, kvw = shape_.kv_width();
  for (int64_t t = 0; t < n_new_; ++t) {
    for (int h = 0; h < hkv; ++h) {
      f32_to_half(dtype_, k + t * kvw + h * d, k_at(layer, n_past_ + t, h), d);
      f32_to_half(dtype_, v + t * kvw + h * d, v_at(layer, n_past_ + t, h), d);
    }
  }
}

void FullKvCache::attend(int layer, const float* q, const float* k, const float* v, float* out,
                         ThreadPool& pool) {
  const int d = shape_.head_dim, g = shape_.group(), hkv = shape_.n_kv_heads;
  const int qw = shape_.q_width();
  append_prompt(layer, q, k, v, PromptExtras());  // stores the call's tokens

  // Blocks: one per page (KV head h's pages are contiguous rows of head_dim).
  const int64_t total = n_past_ + n_new_;
  const int64_t nb = (total + kPageTokens - 1) / kPageTokens;
  blocks_.resize(size_t(hkv * nb));
  head_off_.resize(size_t(hkv) + 1);
  for (int h = 0; h <= hkv; ++h) head_off_[h] = h * nb;
  for (int h = 0; h < hkv; ++h)
    for (int64_t b = 0; b < nb; ++b) {
      KvBlockRef& r = blocks_[size_t(h * nb + b)];
      const Page& page = pages_[layer][b];
      r.pos0 = b * kPageTokens;
      r.n = int32_t(std::min(kPageTokens, total - r.pos0));
      r.k = page.k.data() + size_t(h) * kPageTokens * d;
      r.v = page.v.data() + size_t(h) * kPageTokens * d;
      r.ld = d;
    }
  FusedAttnParams fp = FusedAttnParams::make(dtype_, g, d);
  fp.token_ml = observer_ != nullptr;  // the observer wants every position's probability
  if (observer_) mass_.assign(size_t(hkv * total), 0.0);
  attend_blocks(fp, hkv, q, qw, n_new_, n_past_, blocks_.data(), head_off_.data(), out,
                observer_ ? mass_.data() : nullptr, MassLayout::kPerHeadBlock, attn_, pool);
  if (observer_) {
    probs_.resize(mass_.size());
    for (size_t i = 0; i < mass_.size(); ++i) probs_[i] = float(mass_[i] / g);
    observer_->on_attention(layer, total, probs_.data());
  }
}

void FullKvCache::set_attention_observer(AttentionObserver* observer) {
  observer_ = observer;
  if (observer) return;
  std::vector<double>().swap(mass_);
  std::vector<float>().swap(probs_);
  // The attention scratch grew for every position's mass: a plain call regrows its own.
  attn_.trim();
  std::vector<int64_t>().swap(attn_.unit_off);
}

Status FullKvCache::commit() {
  if (n_new_ > 1) attn_.trim();  // a chunk's attention scratch is far larger than decode's
  n_past_ += n_new_;
  n_new_ = 0;
  return Status::ok();
}

void FullKvCache::clear() {
  n_past_ = 0;
  n_new_ = 0;
}

Status FullKvCache::truncate(int64_t n) {
  if (!can_truncate(n))
    return Status::error(fmt::format("full: cannot truncate {} tokens to {}", n_past_, n));
  const size_t keep = size_t((n + kPageTokens - 1) / kPageTokens);
  for (auto& lp : pages_)
    if (lp.size() > keep) lp.resize(keep);
  n_past_ = n;
  n_new_ = 0;
  return Status::ok();
}

// State: the dtype, n_past, then every layer's pages that hold tokens, K then V, whole pages
// (the bytes past n_past in the last page are written too, so a restored cache is identical).
Status FullKvCache::save_state(ByteWriter& w) const {
  w.put<uint8_t>(dtype_ == HalfType::kF16 ? 0 : 1);
  w.put<int64_t>(n_past_);
  const size_t pages = size_t((n_past_ + kPageTokens - 1) / kPageTokens);
  const size_t page_elems = size_t(shape_.n_kv_heads) * kPageTokens * shape_.head_dim;
  for (const auto& lp : pages_)
    for (size_t i = 0; i < pages; ++i) {
      w.put_bytes(lp[i].k.data(), page_elems * sizeof(uint16_t));
      w.put_bytes(lp[i].v.data(), page_elems * sizeof(uint16_t));
    }
  return Status::ok();
}

Status FullKvCache::load_state(ByteReader& r) {
  uint8_t dt = 0;
  int64_t n = 0;
  QEVICT_RETURN_IF_ERROR(r.get(&dt));
  QEVICT_RETURN_IF_ERROR(r.get(&n));
  if (dt != (dtype_ == HalfType::kF16 ? 0 : 1))
    return Status::error("full: the saved state's 16-bit type differs from this cache's");
  if (n < 0 || n > n_ctx_)
    return Status::error(
        fmt::format("full: saved state holds {} tokens, the context is {}", n, n_ctx_));
  const size_t pages = size_t((n + kPageTokens - 1) / kPageTokens);
  const size_t page_elems = size_t(shape_.n_kv_heads) * kPageTokens * shape_.head_dim;
  const size_t need = pages * page_elems * 2 * sizeof(uint16_t) * size_t(shape_.n_layers);
  if (r.left() < need)
    return Status::error(
        fmt::format("full: saved state is truncated ({} bytes of pages, {} left)", need, r.left()));
  std::vector<std::vector<Page>> loaded(size_t(shape_.n_layers));
  for (auto& lp : loaded) {
    lp.resize(pages);
    for (Page& p : lp) {
      p.k.resize(page_elems);
      p.v.resize(page_elems);
      QEVICT_RETURN_IF_ERROR(r.get_bytes(p.k.data(), page_elems * sizeof(uint16_t)));
      QEVICT_RETURN_IF_ERROR(r.get_bytes(p.v.data(), page_elems * sizeof(uint16_t)));
    }
  }
  pages_ = std::move(loaded);
  n_past_ = n;
  n_new_ = 0;
  return Status::ok();
}

size_t FullKvCache::bytes_held() const {
  size_t b = 0;
  for (const auto& lp : pages_)
    for (const auto& p : lp) b += (p.k.capacity() + p.v.capacity()) * sizeof(uint16_t);
  return b + attn_.bytes() + blocks_.capacity() * sizeof(KvBlockRef) +
         head_off_.capacity() * sizeof(int64_t) + mass_.capacity() * sizeof(double) +
         probs_.capacity() * sizeof(float);
}

std::string FullKvCache::describe() const {
  return fmt::format("full ({}, pages of {} tokens)", dtype_ == HalfType::kF16 ? "f16" : "bf16",
                     kPageTokens);
}

void FullKvCache::report(KvReport* out, ReportDetail detail) const {
  *out = KvReport();
  out->policy = "full";
  out->describe = describe();
  out->bytes_held = bytes_held();
  out->peak_bytes_held = out->bytes_held;  // pages are only added until clear()
  for (int l = 0; l < shape_.n_layers; ++l) {
    KvLayerReport r;
    r.windows_full = n_past_;
    for (const auto& p : pages_[size_t(l)])
      r.bytes_allocated += (p.k.capacity() + p.v.capacity()) * sizeof(uint16_t);
    r.bytes_full = size_t(n_past_) * shape_.token_bytes();
    r.bytes_budgeted = r.bytes_full;
    out->layers.push_back(r);
  }
  if (detail != ReportDetail::kTiers) return;
  out->position_tiers.assign(size_t(shape_.n_layers),
                             std::vector<Tier>(size_t(n_past_), Tier::kFull));
}

}  // namespace qevict
