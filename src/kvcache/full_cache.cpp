// FullKV cache (see full_cache.h). Attention = flash-decoding over pages: each task computes
// an online-softmax partial state (m, l, o) for one (query token, KV head, page range) and
// the states are merged per head (FlashInfer's merge of attention states).
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

void FullKvCache::attend(int layer, const float* q, const float* k, const float* v, float* out,
                         ThreadPool& pool) {
  const int d = shape_.head_dim, g = shape_.group(), hkv = shape_.n_kv_heads;
  const int qw = shape_.q_width(), kvw = shape_.kv_width();
  for (int64_t t = 0; t < n_new_; ++t) {
    for (int h = 0; h < hkv; ++h) {
      f32_to_half(dtype_, k + t * kvw + h * d, k_at(layer, n_past_ + t, h), d);
      f32_to_half(dtype_, v + t * kvw + h * d, v_at(layer, n_past_ + t, h), d);
    }
  }

  // Split each (token, head) over `segs` page ranges so that even one-token decode with
  // few KV heads gives every thread work.
  const int64_t max_pages = (n_past_ + n_new_ + kPageTokens - 1) / kPageTokens;
  const int64_t base_tasks = n_new_ * hkv;
  const int64_t segs =
      std::clamp<int64_t>((pool.size() * 4 + base_tasks - 1) / base_tasks, 1, max_pages);
  const int64_t n_tasks = base_tasks * segs;
  const int64_t state = int64_t(g) * (d + 2);  // per head: m, l, o[d]
  partial_.resize(size_t(n_tasks * state));
  const float scale = 1.0f / std::sqrt(float(d));
  const HalfType dt = dtype_;

  pool.parallel_for(n_tasks, 1, [&](int64_t b, int64_t e) {
    thread_local std::vector<float> scores;
    scores.resize(size_t(g) * kPageTokens);
    for (int64_t task = b; task < e; ++task) {
      const int64_t seg = task % segs;
      const int h = int((task / segs) % hkv);
      const int64_t t = task / segs / hkv;
      const int64_t n_keys = n_past_ + t + 1;  // causal: keys [0, pos_t]
      const int64_t n_pages = (n_keys + kPageTokens - 1) / kPageTokens;
      const int64_t p0 = n_pages * seg / segs, p1 = n_pages * (seg + 1) / segs;
      float* st = partial_.data() + task * state;
      const float* qh = q + t * qw + h * g * d;
      for (int j = 0; j < g; ++j) {
        st[j * (d + 2)] = -std::numeric_limits<float>::infinity();
        st[j * (d + 2) + 1] = 0.0f;
        std::fill_n(st + j * (d + 2) + 2, d, 0.0f);
      }
      for (int64_t pg = p0; pg < p1; ++pg) {
        const int64_t k0 = pg * kPageTokens;
        const int64_t n = std::min(kPageTokens, n_keys - k0);
        const Page& page = pages_[layer][pg];
        const uint16_t* kp = page.k.data() + size_t(h) * kPageTokens * d;
        const uint16_t* vp = page.v.data() + size_t(h) * kPageTokens * d;
        qk_scores(dt, qh, d, g, kp, d, n, d, scale, scores.data(), kPageTokens);
        for (int j = 0; j < g; ++j) {
          float* sj = scores.data() + j * kPageTokens;
          float* sj_state = st + j * (d + 2);
          const float m_old = sj_state[0];
          const float m_new = std::max(m_old, max_of(sj, n));
          const float alpha = std::exp(m_old - m_new);  // 0 when m_old = -inf
          sj_state[0] = m_new;
          sj_state[1] = sj_state[1] * alpha + exp_sub_sum(sj, n, m_new);
          if (alpha != 1.0f)
            for (int c = 0; c < d; ++c) sj_state[2 + c] *= alpha;
        }
        // o_j += sum_i p_j[i] v_i for all heads of the group, reading each V row once.
        pv_accumulate(dt, scores.data(), kPageTokens, g, vp, d, n, d, st + 2, d + 2);
      }
    }
  });

  // Merge the segments of each (token, query head): M = max m_s, L = sum l_s e^{m_s - M},
  // O = sum o_s e^{m_s - M}; out = O / L.
  for (int64_t t = 0; t < n_new_; ++t) {
    for (int h = 0; h < hkv; ++h) {
      for (int j = 0; j < g; ++j) {
        float* o = out + t * qw + (h * g + j) * d;
        float mx = -std::numeric_limits<float>::infinity();
        for (int64_t s = 0; s < segs; ++s)
          mx = std::max(mx, partial_[size_t(((t * hkv + h) * segs + s) * state + j * (d + 2))]);
        float l = 0.0f;
        std::fill_n(o, d, 0.0f);
        for (int64_t s = 0; s < segs; ++s) {
          const float* st = partial_.data() + ((t * hkv + h) * segs + s) * state + j * (d + 2);
          if (st[1] == 0.0f) continue;  // empty segment
          const float w = std::exp(st[0] - mx);
          l += st[1] * w;
          for (int c = 0; c < d; ++c) o[c] += st[2 + c] * w;
        }
        const float inv = 1.0f / l;
        for (int c = 0; c < d; ++c) o[c] *= inv;
      }
    }
  }
  if (observer_) observe(layer, q, pool);
}

void FullKvCache::observe(int layer, const float* q, ThreadPool& pool) {
  // Diagnostics only: recompute each query's scores over every key, softmax them and sum
  // the probabilities per position (same f16 keys as the attention above). One task per
  // KV head, so each task owns its row of probs_.
  const int d = shape_.head_dim, g = shape_.group(), hkv = shape_.n_kv_heads;
  const int qw = shape_.q_width();
  const int64_t n_keys = n_past_ + n_new_;
  probs_.assign(size_t(hkv) * n_keys, 0.0f);
  const float scale = 1.0f / std::sqrt(float(d));
  pool.parallel_for(hkv, 1, [&](int64_t b, int64_t e) {
    thread_local std::vector<float> scores;
    scores.resize(size_t(g) * n_keys);
    for (int64_t h = b; h < e; ++h) {
      float* acc = probs_.data() + h * n_keys;
      for (int64_t t = 0; t < n_new_; ++t) {
        const int64_t n = n_past_ + t + 1;  // causal
        const float* qh = q + t * qw + h * g * d;
        for (int64_t pg = 0; pg * kPageTokens < n; ++pg) {
          const int64_t k0 = pg * kPageTokens, m = std::min(kPageTokens, n - k0);
          const uint16_t* kp = pages_[layer][pg].k.data() + size_t(h) * kPageTokens * d;
          qk_scores(dtype_, qh, d, g, kp, d, m, d, scale, scores.data() + k0, n_keys);
        }
        for (int j = 0; j < g; ++j) {
          float* sj = scores.data() + size_t(j) * n_keys;
          softmax_inplace(sj, n);
          for (int64_t i = 0; i < n; ++i) acc[i] += sj[i] / float(g);
        }
      }
    }
  });
  observer_->on_attention(layer, n_keys, probs_.data());
}

void FullKvCache::commit() {
  n_past_ += n_new_;
  n_new_ = 0;
}

void FullKvCache::clear() {
  n_past_ = 0;
  n_new_ = 0;
}

size_t FullKvCache::bytes_held() const {
  size_t b = 0;
  for (const auto& lp : pages_)
    for (const auto& p : lp) b += (p.k.capacity() + p.v.capacity()) * sizeof(uint16_t);
  return b + partial_.capacity() * sizeof(float);
}

std::string FullKvCache::describe() const {
  return fmt::format("full ({}, pages of {} tokens)", dtype_ == HalfType::kF16 ? "f16" : "bf16",
                     kPageTokens);
}

}  // namespace qevict
