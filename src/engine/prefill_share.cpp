// Shared prefill (see prefill_share.h).
#include "engine/prefill_share.h"

#include <fmt/format.h>

#include <algorithm>

#include "kernels/attention.h"
#include "kernels/ops.h"
#include "kernels/ref/dequant.h"
#include "kvcache/head_cache.h"

namespace qevict {

RecordingKvCache::RecordingKvCache(SequenceKvCache* inner, const KvShape& shape)
    : inner_(inner), shape_(shape) {}

Status RecordingKvCache::begin(int64_t n_new) {
  QEVICT_RETURN_IF_ERROR(inner_->begin(n_new));
  Call c;
  c.n_new = n_new;
  const size_t per = size_t(shape_.n_layers) * size_t(n_new);
  c.q.resize(per * size_t(shape_.q_width()));
  c.k.resize(per * size_t(shape_.kv_width()));
  c.v.resize(per * size_t(shape_.kv_width()));
  calls_.push_back(std::move(c));
  open_ = true;
  return Status::ok();
}

void RecordingKvCache::attend(int layer, const float* q, const float* k, const float* v, float* out,
                              ThreadPool& pool) {
  Call& c = calls_.back();
  const size_t qn = size_t(c.n_new) * size_t(shape_.q_width());
  const size_t kvn = size_t(c.n_new) * size_t(shape_.kv_width());
  std::copy(q, q + qn, c.q.begin() + ptrdiff_t(size_t(layer) * qn));
  std::copy(k, k + kvn, c.k.begin() + ptrdiff_t(size_t(layer) * kvn));
  std::copy(v, v + kvn, c.v.begin() + ptrdiff_t(size_t(layer) * kvn));
  inner_->attend(layer, q, k, v, out, pool);
}

Status RecordingKvCache::commit() {
  open_ = false;
  n_recorded_ += calls_.back().n_new;
  return inner_->commit();
}

void RecordingKvCache::clear() {
  calls_.clear();
  window_mass_.clear();
  have_mass_ = have_nu_ = false;
  n_recorded_ = 0;
  open_ = false;
  inner_->clear();
}

size_t RecordingKvCache::mass_bytes() const {
  size_t b = 0;
  for (const Call& c : calls_) b += c.mass.size() * sizeof(double) + c.nu.size() * sizeof(float);
  for (const auto& [w, m] : window_mass_) b += m.size() * sizeof(double);
  return b;
}

void RecordingKvCache::compute_value_norms(ThreadPool& pool) {
  const int H = shape_.n_kv_heads, d = shape_.head_dim, g = shape_.group();
  const int64_t qw = shape_.q_width(), kvw = shape_.kv_width();
  const int L = shape_.n_layers;
  for (Call& c : calls_) c.nu.assign(size_t(L) * H * c.n_new, 0.0f);
  constexpr int64_t kTile = 64;  // value rows per matmul
  pool.parallel_for(L, 1, [&](int64_t l0, int64_t l1) {
    std::vector<float> wof, y, vf(static_cast<size_t>(kTile * d)), nu(static_cast<size_t>(kTile));
    std::vector<uint16_t> half(static_cast<size_t>(d));
    for (int64_t l = l0; l < l1; ++l) {
      const WeightView& W = wo_->wo[size_t(l)];
      const int64_t E = W.n_rows;
      wof.resize(size_t(E) * qw);
      for (int64_t r = 0; r < E; ++r)
        ref::dequantize_row(W.type, W.data + size_t(r) * W.row_bytes, wof.data() + r * qw, qw);
      for (Call& c : calls_)
        for (int h = 0; h < H; ++h)
          for (int64_t t0 = 0; t0 < c.n_new; t0 += kTile) {
            const int64_t m = std::min(kTile, c.n_new - t0);
            for (int64_t t = 0; t < m; ++t) {  // the value row as a cache stores it (f16)
              const float* src = c.v.data() + (size_t(l) * c.n_new + t0 + t) * kvw + size_t(h) * d;
              f32_to_half(HalfType::kF16, src, half.data(), d);
              half_to_f32(HalfType::kF16, half.data(), vf.data() + t * d, d);
            }
            value_norm_rows(wof.data(), E, qw, h, g, d, vf.data(), m, nu.data(), &y);
            std::copy_n(nu.data(), m, c.nu.data() + (size_t(l) * H + h) * c.n_new + t0);
          }
    }
  });
  have_nu_ = true;
}

void RecordingKvCache::half_rows(std::vector<uint16_t>* kh, std::vector<uint16_t>* vh) const {
  // Every recorded token in f16, per layer and KV head: half [n_layers][H][n_all][d].
  const int H = shape_.n_kv_heads, d = shape_.head_dim;
  const int kvw = shape_.kv_width();
  const int64_t n_all = n_recorded_;
  kh->assign(size_t(shape_.n_layers) * H * n_all * d, 0);
  vh->assign(kh->size(), 0);
  int64_t n_past = 0;
  for (const Call& c : calls_) {
    for (int l = 0; l < shape_.n_layers; ++l)
      for (int64_t t = 0; t < c.n_new; ++t)
        for (int h = 0; h < H; ++h) {
          const size_t at = (size_t(l) * c.n_new + t) * kvw + size_t(h) * d;
          const size_t to = ((size_t(l) * H + h) * n_all + n_past + t) * d;
          f32_to_half(HalfType::kF16, c.k.data() + at, kh->data() + to, d);
          f32_to_half(HalfType::kF16, c.v.data() + at, vh->data() + to, d);
        }
    n_past += c.n_new;
  }
}

void RecordingKvCache::attend_masses(const std::vector<uint16_t>& kh,
                                     const std::vector<uint16_t>& vh, int layer, const float* q,
                                     int64_t n_q, int64_t n_past, double* mass,
                                     BlockAttnScratch& scratch, ThreadPool& pool) const {
  const int H = shape_.n_kv_heads, d = shape_.head_dim, g = shape_.group();
  const int qw = shape_.q_width();
  const int64_t n_all = n_recorded_, n = n_past + n_q;
  FusedAttnParams fp = FusedAttnParams::make(HalfType::kF16, g, d);
  fp.token_ml = true;
  fp.stats_only = true;  // the masses are wanted, not the outputs
  std::vector<KvBlockRef> blocks(static_cast<size_t>(H));
  std::vector<int64_t> head_off(size_t(H) + 1);
  for (int h = 0; h <= H; ++h) head_off[size_t(h)] = h;
  for (int h = 0; h < H; ++h) {  // one block per head: positions [0, n), rows contiguous
    KvBlockRef& r = blocks[size_t(h)];
    r = KvBlockRef();
    r.pos0 = 0;
    r.n = int32_t(n);
    r.k = kh.data() + (size_t(layer) * H + h) * n_all * d;
    r.v = vh.data() + (size_t(layer) * H + h) * n_all * d;
    r.ld = d;
  }
  std::vector<float> out(size_t(n_q) * size_t(qw));
  attend_blocks(fp, H, q, qw, n_q, n_past, blocks.data(), head_off.data(), out.data(), mass,
                MassLayout::kPerHeadBlock, scratch, pool);
}

void RecordingKvCache::compute_masses(ThreadPool& pool) {
  const int H = shape_.n_kv_heads;
  const int qw = shape_.q_width();
  std::vector<uint16_t> kh, vh;
  half_rows(&kh, &vh);
  BlockAttnScratch scratch;
  int64_t n_past = 0;
  for (Call& c : calls_) {
    const int64_t n = n_past + c.n_new;
    const size_t qn = size_t(c.n_new) * size_t(qw);
    c.mass.assign(size_t(shape_.n_layers) * H * n, 0.0);
    for (int l = 0; l < shape_.n_layers; ++l)
      attend_masses(kh, vh, l, c.q.data() + size_t(l) * qn, c.n_new, n_past,
                    c.mass.data() + size_t(l) * H * n, scratch, pool);
    n_past = n;
  }
  have_mass_ = true;
}

const std::vector<double>& RecordingKvCache::window_masses(int64_t window, ThreadPool& pool) {
  auto it = window_mass_.find(window);
  if (it != window_mass_.end()) return it->second;
  const int H = shape_.n_kv_heads;
  const int64_t qw = shape_.q_width(), n_all = n_recorded_, w = std::min(window, n_all);
  std::vector<uint16_t> kh, vh;
  half_rows(&kh, &vh);
  // The last w queries of every layer, gathered across the calls they span: [w][q_width].
  std::vector<float> q(size_t(w * qw));
  std::vector<double>& mass = window_mass_[window];
  mass.assign(size_t(shape_.n_layers) * H * n_all, 0.0);
  BlockAttnScratch scratch;
  for (int l = 0; l < shape_.n_layers; ++l) {
    int64_t need = w;  // fill rows [0, w) from the last call backwards
    for (size_t ci = calls_.size(); ci-- > 0 && need > 0;) {
      const Call& c = calls_[ci];
      const int64_t take = std::min(need, c.n_new);
      const float* src = c.q.data() + (size_t(l) * c.n_new + (c.n_new - take)) * qw;
      std::copy(src, src + take * qw, q.data() + (need - take) * qw);
      need -= take;
    }
    attend_masses(kh, vh, l, q.data(), w, n_all - w, mass.data() + size_t(l) * H * n_all, scratch,
                  pool);
  }
  return mass;
}

size_t RecordingKvCache::recorded_bytes() const {
  size_t b = 0;
  for (const Call& c : calls_) b += (c.q.size() + c.k.size() + c.v.size()) * sizeof(float);
  return b;
}

Status RecordingKvCache::replay(SequenceKvCache* dst, ThreadPool& pool) {
  if (open_) return Status::error("shared prefill: a recorded call was not committed");
  if (dst->n_past() != 0)
    return Status::error(
        fmt::format("shared prefill: the target cache already holds {} tokens", dst->n_past()));
  if (!dst->prefill_keeps_everything())
    return Status::error(fmt::format(
        "shared prefill: {} evicts or quantizes during prefill, so its prompt state cannot be "
        "replayed from another cache (use --prefill-route end)",
        dst->describe()));
  if (wo_) dst->set_output_projection(wo_);
  const SequenceKvCache::PromptReplay mode = dst->prompt_replay();
  const int64_t window =
      mode == SequenceKvCache::PromptReplay::kMasses ? dst->prompt_mass_window() : 0;
  const std::vector<double>* wmass = window > 0 ? &window_masses(window, pool) : nullptr;
  const bool all =
      mode == SequenceKvCache::PromptReplay::kMasses && dst->prompt_replay_all_masses();
  if (mode == SequenceKvCache::PromptReplay::kMasses && (window == 0 || all) && !have_mass_)
    compute_masses(pool);
  const bool nu = mode != SequenceKvCache::PromptReplay::kAttend &&
                  dst->prompt_replay_value_norms() && wo_ && int(wo_->wo.size()) >= shape_.n_layers;
  if (nu && !have_nu_) compute_value_norms(pool);
  if (mode != SequenceKvCache::PromptReplay::kAttend) {
    int64_t n_past = 0;
    for (const Call& c : calls_) {
      QEVICT_RETURN_IF_ERROR(dst->begin(c.n_new));
      const size_t qn = size_t(c.n_new) * size_t(shape_.q_width());
      const size_t kvn = size_t(c.n_new) * size_t(shape_.kv_width());
      const size_t mn = size_t(shape_.n_kv_heads) * size_t(n_past + c.n_new);
      for (int l = 0; l < shape_.n_layers; ++l) {
        SequenceKvCache::PromptExtras x;
        if (wmass && &c == &calls_.back())
          x.mass = wmass->data() + size_t(l) * shape_.n_kv_heads * size_t(n_recorded_);
        else if (mode == SequenceKvCache::PromptReplay::kMasses && !wmass)
          x.mass = c.mass.data() + size_t(l) * mn;
        if (all) x.all_mass = c.mass.data() + size_t(l) * mn;
        if (nu) x.value_norm = c.nu.data() + size_t(l) * shape_.n_kv_heads * c.n_new;
        dst->append_prompt(l, c.q.data() + size_t(l) * qn, c.k.data() + size_t(l) * kvn,
                           c.v.data() + size_t(l) * kvn, x);
      }
      QEVICT_RETURN_IF_ERROR(dst->commit());
      n_past += c.n_new;
    }
    return Status::ok();
  }
  std::vector<float> out;
  for (const Call& c : calls_) {
    QEVICT_RETURN_IF_ERROR(dst->begin(c.n_new));
    const size_t qn = size_t(c.n_new) * size_t(shape_.q_width());
    const size_t kvn = size_t(c.n_new) * size_t(shape_.kv_width());
    out.resize(qn);
    for (int l = 0; l < shape_.n_layers; ++l)
      dst->attend(l, c.q.data() + size_t(l) * qn, c.k.data() + size_t(l) * kvn,
                  c.v.data() + size_t(l) * kvn, out.data(), pool);
    QEVICT_RETURN_IF_ERROR(dst->commit());
  }
  return Status::ok();
}

}  // namespace qevict
