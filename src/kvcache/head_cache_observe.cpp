// HeadKvCache's inputs to routing (see head_cache.h): the observation window of the SnapKV
// family — the prompt's last w queries, then the decode queries since the last event — as
// attention probabilities over each head's kept tokens, and CriticalKV's value norms.
#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <limits>

#include "kernels/matmul.h"
#include "kernels/ops.h"
#include "kernels/ref/dequant.h"
#include "kernels/softmax_state.h"
#include "kvcache/head_cache.h"
#include "kvcache/head_cache_util.h"
#include "kvcache/policies/snapkv_policy.h"

namespace qevict {

using namespace head_cache_detail;  // NOLINT: this class's own helpers

void value_norm_rows(const float* wo, int64_t E, int64_t qw, int h, int g, int d, const float* v,
                     int64_t m, float* nu, std::vector<float>* y) {
  y->resize(size_t(m) * E);
  std::vector<double> acc(size_t(m), 0.0);
  for (int j = 0; j < g; ++j) {
    WeightView wh;
    wh.type = GgmlType::kF32;
    wh.data = reinterpret_cast<const uint8_t*>(wo + size_t(h * g + j) * d);
    wh.n_cols = d;
    wh.n_rows = E;
    wh.row_bytes = size_t(qw) * sizeof(float);
    matmul(wh, v, d, m, y->data(), E, 0, E);
    for (int64_t t = 0; t < m; ++t) {
      double l1 = 0.0;
      for (int64_t e = 0; e < E; ++e) l1 += std::fabs((*y)[size_t(t * E + e)]);
      acc[size_t(t)] += l1;
    }
  }
  for (int64_t t = 0; t < m; ++t) nu[t] = float(acc[size_t(t)] / g);
}

void HeadKvCache::query_probs(const HeadStore& s, const float* q, int64_t qpos) {
  const int g = shape_.group(), d = shape_.head_dim, st = d + 2;
  const int64_t n = s.n();
  FusedAttnParams fp = FusedAttnParams::make(p_.dtype, g, d);
  fp.token_ml = true;
  // Every kept token of the head, one block per run of consecutive positions.
  blocks_.clear();
  append_runs(s.pos, s.k.data(), s.v.data(), d, &blocks_);
  obs_st_.resize(size_t(g) * st);
  obs_ml_.resize(size_t(n) * g * 2);
  attn_state_init(obs_st_.data(), g, d);
  for (size_t u = 0; u < obs_ml_.size(); u += 2) obs_ml_[u] = -INFINITY, obs_ml_[u + 1] = 0.0f;
  fused_attention_partial(fp, q, d, 1, qpos, blocks_.data(), int(blocks_.size()), obs_st_.data(),
                          obs_ml_.data(), 0, attn_.slot(0));
  probs_.resize(size_t(g) * n);
  for (int j = 0; j < g; ++j) {
    const float* gml = obs_st_.data() + size_t(j) * st;  // (M, L) of query head j
    for (int64_t i = 0; i < n; ++i)
      probs_[size_t(j) * n + i] = attn_block_mass(obs_ml_.data() + (size_t(i) * g + j) * 2, gml);
  }
}

void HeadKvCache::observe_step(int layer, const float* q) {
  const int H = shape_.n_kv_heads, g = shape_.group(), d = shape_.head_dim;
  const int64_t qw = shape_.q_width();
  const int k = needs_.obs_max_kernel;
  for (int h = 0; h < H; ++h) {
    HeadStore& s = head(layer, h);
    const int64_t n = s.n();
    for (int64_t t = 0; t < n_new_; ++t) {
      query_probs(s, q + t * qw + size_t(h) * g * d, n_past_ + t);
      for (int j = 0; j < g; ++j) {
        const float* p = probs_.data() + size_t(j) * n;
        for (int64_t i = 0; i < n; ++i) s.osum[size_t(i) * g + j] += p[i];
        if (k <= 0) continue;
        // DefensiveKV's row: pooled along the head's tokens, rescaled to its pre-pool sum.
        pool_in_.resize(size_t(n));
        pool_out_.resize(size_t(n));
        double base = 0.0, psum = 0.0;
        for (int64_t i = 0; i < n; ++i) base += pool_in_[size_t(i)] = p[i];
        snapkv::pool1d(pool_in_.data(), n, k, ObsPool::kAvg, pool_out_.data());
        for (int64_t i = 0; i < n; ++i) psum += pool_out_[size_t(i)];
        const double scale = psum > 0.0 ? base / psum : 0.0;
        for (int64_t i = 0; i < n; ++i)
          s.omax[size_t(i)] = std::max(s.omax[size_t(i)], float(pool_out_[size_t(i)] * scale));
      }
    }
  }
}

void HeadKvCache::start_decode_window() {
  if (needs_.obs_window <= 0 || obs_decode_) return;
  const int g = shape_.group();
  obs_decode_ = true;
  obs_acc_ = 0;
  obs_q_.release();
  for (HeadStore& s : heads_) {
    s.osum.reserve(size_t(s.cap) * g);
    s.osum.assign(size_t(s.n()) * g, 0.0f);
    if (needs_.obs_max_kernel > 0) {
      s.omax.reserve(size_t(s.cap));
      s.omax.assign(size_t(s.n()), 0.0f);
    }
  }
}

void HeadKvCache::reopen_prompt_window() {
  obs_decode_ = false;
  obs_acc_ = 0;
  obs_q_.reset_count();
  obs_q_.allocate();
  for (HeadStore& s : heads_) {
    std::vector<float>().swap(s.osum);  // rebuilt by start_decode_window()
    std::vector<float>().swap(s.omax);
  }
}

void HeadKvCache::observe(int layer) {
  const int H = shape_.n_kv_heads, g = shape_.group(), d = shape_.head_dim;
  const int64_t qw = shape_.q_width();
  const int64_t n_obs = obs_decode_ ? 1 : obs_q_.held();
  request_.group = g;
  request_.n_obs = int(n_obs);
  request_.obs.resize(size_t(g) * n_obs * request_.candidates.size());
  request_.obs_max.clear();
  if (obs_decode_ && needs_.obs_max_kernel > 0) request_.obs_max.resize(request_.candidates.size());
  // Decode: the mean over the queries since the last routing event.
  const float inv_acc = obs_acc_ > 0 ? 1.0f / float(obs_acc_) : 0.0f;
  for (int h = 0; h < H; ++h) {
    const HeadStore& s = head(layer, h);
    const int64_t n_h = request_.n_cand(h);
    if (n_h == 0) continue;
    // The candidates are rows [first, first + n_h) of the head (route_layer).
    const int64_t first =
        std::lower_bound(s.pos.begin(), s.pos.end(), budget_.sink) - s.pos.begin();
    if (obs_decode_) {
      for (int j = 0; j < g; ++j) {
        float* row = const_cast<float*>(request_.obs_row(h, j, 0));
        for (int64_t i = 0; i < n_h; ++i) row[i] = s.osum[size_t(first + i) * g + j] * inv_acc;
      }
      if (!request_.obs_max.empty())
        std::copy_n(s.omax.data() + first, n_h, request_.obs_max.data() + request_.cand_begin(h));
      continue;
    }
    for (int64_t r = 0; r < n_obs; ++r) {
      const float* qr = obs_q_.rows(layer) + r * qw + size_t(h) * g * d;
      query_probs(s, qr, n_past_ - n_obs + r);
      for (int j = 0; j < g; ++j) {
        float* row = const_cast<float*>(request_.obs_row(h, j, int(r)));
        std::copy_n(probs_.data() + size_t(j) * s.n() + first, n_h, row);
      }
    }
  }
}

Status HeadKvCache::value_norms(int layer) {
  const int H = shape_.n_kv_heads, g = shape_.group(), d = shape_.head_dim;
  const int64_t qw = shape_.q_width();
  if (!wo_ || layer >= int(wo_->wo.size()) || wo_->wo[size_t(layer)].n_cols != qw)
    return Status::error(fmt::format(
        "{} scores by value norms through the attention output projection, which the model "
        "did not bind (set_output_projection) for layer {}",
        policy_->name(), layer));
  const WeightView& W = wo_->wo[size_t(layer)];
  const int64_t E = W.n_rows;
  request_.value_norm.resize(request_.candidates.size());
  bool dequantized = false;
  constexpr int64_t kTile = 64;  // value rows per matmul
  std::vector<float> vf(size_t(kTile) * d), y(size_t(kTile) * E);
  std::vector<int64_t> rows;
  for (int h = 0; h < H; ++h) {
    HeadStore& s = head(layer, h);
    const int64_t b = request_.cand_begin(h), n_h = request_.n_cand(h);
    if (n_h == 0) continue;
    const int64_t first =
        std::lower_bound(s.pos.begin(), s.pos.end(), budget_.sink) - s.pos.begin();
    rows.clear();
    for (int64_t i = 0; i < n_h; ++i)
      if (std::isnan(s.nu[size_t(first + i)])) rows.push_back(first + i);
    if (!rows.empty() && !dequantized) {
      // W_O in f32 [n_embd][q_width] for this routing event (a quantized GGUF weight).
      wo_f32_.resize(size_t(E) * qw);
      for (int64_t r = 0; r < E; ++r)
        ref::dequantize_row(W.type, W.data + size_t(r) * W.row_bytes, wo_f32_.data() + r * qw, qw);
      dequantized = true;
    }
    std::vector<float> nu(static_cast<size_t>(kTile));
    for (size_t t0 = 0; t0 < rows.size(); t0 += kTile) {
      const int64_t m = std::min<int64_t>(kTile, int64_t(rows.size() - t0));
      for (int64_t t = 0; t < m; ++t)
        half_to_f32(p_.dtype, s.v.data() + rows[t0 + t] * d, vf.data() + t * d, d);
      value_norm_rows(wo_f32_.data(), E, qw, h, g, d, vf.data(), m, nu.data(), &y);
      for (int64_t t = 0; t < m; ++t) s.nu[size_t(rows[t0 + t])] = nu[size_t(t)];
    }
    for (int64_t i = 0; i < n_h; ++i) request_.value_norm[size_t(b + i)] = s.nu[size_t(first + i)];
  }
  return Status::ok();
}

}  // namespace qevict
