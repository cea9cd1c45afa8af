// TieredKvCache (see tiered_cache.h).
#include "kvcache/tiered_cache.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>

#include "kernels/ops.h"

namespace qevict {

namespace {
using Clock = std::chrono::steady_clock;
double since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}
}  // namespace

TieredKvCache::TieredKvCache(const KvShape& shape, int64_t n_ctx, const KvCacheParams& params,
                             std::unique_ptr<RoutingPolicy> policy)
    : shape_(shape), n_ctx_(n_ctx), p_(params), policy_(std::move(policy)), rope_(shape.rope) {
  const int H = shape_.n_kv_heads, d = shape_.head_dim, W = p_.window;
  qlayout_ = QuantLayout{p_.bits, H, d, W, p_.value_group};
  m_f_ = size_t(2) * H * W * d * sizeof(uint16_t);
  m_q_ = qlayout_.window_bytes();
  budget_total_ = p_.budget_per_layer(shape_, n_ctx);
  const size_t b_sink = size_t(p_.sink) * shape_.token_bytes();
  const size_t b_local = size_t(p_.local_windows()) * m_f_;
  const size_t b_hist = budget_total_ > b_sink + b_local ? budget_total_ - b_sink - b_local : 0;
  // Eq. 3: K_f = floor((1-q) B_hist / M_f), K_q = floor(q B_hist / M_q).
  const size_t k_f = size_t(std::floor((1.0 - p_.q) * double(b_hist) / double(m_f_)));
  const size_t k_q = size_t(std::floor(p_.q * double(b_hist) / double(m_q_)));
  rbudget_.window_full = m_f_;
  rbudget_.window_quant = m_q_;
  rbudget_.full_bytes = k_f * m_f_;
  rbudget_.quant_bytes = k_q * m_q_;
  rbudget_.strict_ledger = p_.strict_ledger;
  layers_.resize(shape_.n_layers);
  for (auto& L : layers_) {
    L.sink_k.assign(size_t(H) * p_.sink * d, 0);
    L.sink_v.assign(size_t(H) * p_.sink * d, 0);
    L.fpool = SlotPool(m_f_);
    L.qpool = SlotPool(m_q_);
  }
  if (!p_.trace_path.empty()) trace_ = std::fopen(p_.trace_path.c_str(), "w");
}

TieredKvCache::~TieredKvCache() {
  if (trace_) std::fclose(trace_);
}

Status TieredKvCache::begin(int64_t n_new) {
  QEVICT_RETURN_IF_ERROR(check_begin(n_past_, n_new, n_ctx_));
  if (!p_.trace_path.empty() && !trace_)
    return Status::error(fmt::format("{}: cannot write the KV trace", p_.trace_path));
  rope_.ensure(n_past_ + n_new);
  n_new_ = n_new;
  return Status::ok();
}

uint16_t* TieredKvCache::f_k(Layer& L, int32_t slot, int h) const {
  return reinterpret_cast<uint16_t*>(L.fpool.at(slot)) + size_t(h) * p_.window * shape_.head_dim;
}

uint16_t* TieredKvCache::f_v(Layer& L, int32_t slot, int h) const {
  return reinterpret_cast<uint16_t*>(L.fpool.at(slot)) +
         size_t(shape_.n_kv_heads + h) * p_.window * shape_.head_dim;
}

void TieredKvCache::store_token(Layer& L, int64_t pos, const float* k, const float* v) {
  const int H = shape_.n_kv_heads, d = shape_.head_dim;
  if (pos < p_.sink) {
    for (int h = 0; h < H; ++h) {
      f32_to_half(p_.dtype, k + h * d, L.sink_k.data() + (size_t(h) * p_.sink + pos) * d, d);
      f32_to_half(p_.dtype, v + h * d, L.sink_v.data() + (size_t(h) * p_.sink + pos) * d, d);
    }
    return;
  }
  const int64_t w = (pos - p_.sink) / p_.window, o = (pos - p_.sink) % p_.window;
  if (w == int64_t(L.windows.size())) {
    Window nw;
    nw.f_slot = L.fpool.acquire();
    L.windows.push_back(nw);
  }
  Window& win = L.windows[size_t(w)];
  for (int h = 0; h < H; ++h) {
    f32_to_half(p_.dtype, k + h * d, f_k(L, win.f_slot, h) + o * d, d);
    f32_to_half(p_.dtype, v + h * d, f_v(L, win.f_slot, h) + o * d, d);
  }
  win.n = static_cast<int32_t>(o + 1);
}

void TieredKvCache::attend(int layer, const float* q, const float* k, const float* v, float* out,
                           ThreadPool& pool) {
  Layer& L = layers_[layer];
  const int H = shape_.n_kv_heads, d = shape_.head_dim, g = shape_.group();
  const int qw = shape_.q_width(), kvw = shape_.kv_width();
  for (int64_t t = 0; t < n_new_; ++t) store_token(L, n_past_ + t, k + t * kvw, v + t * kvw);

  // Blocks, in position order, for every KV head: [H][nb].
  const int64_t total = n_past_ + n_new_;
  block_window_.clear();
  if (p_.sink > 0) block_window_.push_back(-1);
  for (int32_t id = 0; id < int32_t(L.windows.size()); ++id)
    if (L.windows[id].tier != Tier::kEvicted) block_window_.push_back(id);
  const int nb = int(block_window_.size());
  blocks_.resize(size_t(H) * nb);
  for (int h = 0; h < H; ++h) {
    for (int b = 0; b < nb; ++b) {
      KvBlockRef& r = blocks_[size_t(h) * nb + b];
      const int32_t id = block_window_[b];
      r = KvBlockRef();
      if (id < 0) {
        r.pos0 = 0;
        r.n = int32_t(std::min<int64_t>(p_.sink, total));
        r.k = L.sink_k.data() + size_t(h) * p_.sink * d;
        r.v = L.sink_v.data() + size_t(h) * p_.sink * d;
        r.ld = d;
        continue;
      }
      const Window& w = L.windows[id];
      r.pos0 = p_.sink + int64_t(id) * p_.window;
      r.n = w.n;
      if (w.f_slot >= 0) {
        r.k = f_k(L, w.f_slot, h);
        r.v = f_v(L, w.f_slot, h);
        r.ld = d;
      } else {
        r.qwin = L.qpool.at(w.q_slot);
      }
    }
  }

  // Outer tiles of query tokens bound the per-block scratch. Inside a tile, a task is
  // (KV head, run of up to kRun queries, segment of blocks): the run shares every decoded
  // low-bit window; segments split the blocks only when runs × heads are too few for the
  // threads (decode).
  constexpr int64_t kRun = 16;
  const int64_t per_token = int64_t(H) * nb * g * 2;
  const int64_t T =
      std::clamp<int64_t>((int64_t(1) << 20) / std::max<int64_t>(per_token, 1), 1, n_new_);
  const int st = attn_state_stride(d);
  FusedAttnParams fp;
  fp.dtype = p_.dtype;
  fp.group = g;
  fp.head_dim = d;
  fp.scale = 1.0f / std::sqrt(float(d));
  fp.qlayout = &qlayout_;
  fp.rope = &rope_;
  mass_acc_.assign(size_t(nb), 0.0);
  gml_.resize(size_t(g) * 2);
  const int64_t ml_tok = int64_t(H) * nb * g * 2;  // block_ml_ floats per query token
  for (int64_t t0 = 0; t0 < n_new_; t0 += T) {
    const int64_t tn = std::min(T, n_new_ - t0);
    const int64_t runs = (tn + kRun - 1) / kRun;
    const int64_t base = runs * H;
    const int64_t segs = std::clamp<int64_t>((pool.size() * 4 + base - 1) / base, 1, nb);
    parts_.resize(size_t(tn * H * segs) * g * st);  // [token][head][seg][g][st]
    block_ml_.resize(size_t(tn) * ml_tok);          // [token][head][block][g][2]
    pool.parallel_for(base * segs, 1, [&](int64_t b0, int64_t b1) {
      for (int64_t task = b0; task < b1; ++task) {
        const int64_t s = task % segs, h = (task / segs) % H, r = task / segs / H;
        const int64_t i0 = r * kRun, nq = std::min(kRun, tn - i0);
        const int blo = int(nb * s / segs), bhi = int(nb * (s + 1) / segs);
        FusedAttnParams hp = fp;
        hp.kv_head = int(h);
        // The run's states are strided by heads × segs in parts_: gather them contiguously.
        thread_local std::vector<float> run_state;
        run_state.resize(size_t(nq) * g * st);
        for (int64_t i = 0; i < nq; ++i) attn_state_init(run_state.data() + i * g * st, g, d);
        fused_attention_partial(
            hp, q + (t0 + i0) * qw + h * g * d, qw, int(nq), n_past_ + t0 + i0,
            blocks_.data() + h * nb + blo, bhi - blo, run_state.data(),
            block_ml_.data() + size_t(i0) * ml_tok + (size_t(h) * nb + blo) * g * 2, ml_tok);
        for (int64_t i = 0; i < nq; ++i)
          std::memcpy(parts_.data() + ((size_t(i0 + i) * H + h) * segs + s) * g * st,
                      run_state.data() + i * g * st, sizeof(float) * g * st);
      }
    });
    // Merge segments per (token, head) and turn block (m_b, l_b) into masses (Eq. 1).
    for (int64_t t = 0; t < tn; ++t) {
      for (int h = 0; h < H; ++h) {
        attn_merge(parts_.data() + ((size_t(t) * H + h) * segs) * g * st, int(segs),
                   int64_t(g) * st, g, d, out + (t0 + t) * qw + h * g * d, gml_.data());
        const float* ml = block_ml_.data() + size_t(t) * ml_tok + size_t(h) * nb * g * 2;
        for (int b = 0; b < nb; ++b)
          for (int j = 0; j < g; ++j)
            mass_acc_[b] += attn_block_mass(ml + (size_t(b) * g + j) * 2, gml_.data() + 2 * j);
      }
    }
  }
  // S̄(w) += (1/H_q) Σ_h Σ_τ Σ_{i∈w} a_τ^h(i): masses were summed over heads and tokens.
  const double inv_hq = 1.0 / shape_.n_q_heads;
  for (int b = 0; b < nb; ++b) {
    const int32_t id = block_window_[b];
    if (id >= 0)
      L.windows[id].score += mass_acc_[b] * inv_hq;
    else
      L.sink_score += mass_acc_[b] * inv_hq;
  }
}

int64_t TieredKvCache::aged_windows() const {
  const int64_t n = n_past_ - p_.local - p_.sink;
  return n > 0 ? n / p_.window : 0;
}

void TieredKvCache::demote(Layer& L, Window& w, int32_t id) {
  if (w.q_slot < 0) {
    // First demotion: invert RoPE on the f16 keys and quantize (once per window, ever).
    auto t0 = Clock::now();
    const int H = shape_.n_kv_heads, d = shape_.head_dim, W = p_.window;
    thread_local std::vector<float> kp, vp;
    kp.assign(size_t(W) * H * d, 0.0f);
    vp.assign(size_t(W) * H * d, 0.0f);
    const int64_t pos0 = p_.sink + int64_t(id) * W;
    for (int h = 0; h < H; ++h) {
      for (int t = 0; t < w.n; ++t) {
        float* kr = kp.data() + (size_t(t) * H + h) * d;
        half_to_f32(p_.dtype, f_k(L, w.f_slot, h) + size_t(t) * d, kr, d);
        rope_apply(rope_.params(), rope_.cos_at(pos0 + t), rope_.sin_at(pos0 + t), kr, 1, d, d,
                   /*inverse=*/true);
        half_to_f32(p_.dtype, f_v(L, w.f_slot, h) + size_t(t) * d,
                    vp.data() + (size_t(t) * H + h) * d, d);
      }
    }
    w.q_slot = L.qpool.acquire();
    quantize_window(qlayout_, kp.data(), vp.data(), w.n, L.qpool.at(w.q_slot));
    ++L.st.quantizations;
    quant_s_ += since(t0);
  }
  if (w.f_slot >= 0) {
    L.fpool.release(w.f_slot);
    w.f_slot = -1;
  }
  w.tier = Tier::kQuant;
  ++L.st.demotions;
}

void TieredKvCache::promote(Layer& L, Window& w, int32_t id) {
  // Rebuild the full-precision copy from the ledger: dequantize, re-apply RoPE at the
  // original positions. The ledger entry stays, so a later demotion reuses its codes.
  auto t0 = Clock::now();
  const int H = shape_.n_kv_heads, d = shape_.head_dim, W = p_.window;
  thread_local std::vector<float> kb, vb;
  kb.resize(size_t(W) * d);
  vb.resize(size_t(W) * d);
  w.f_slot = L.fpool.acquire();
  const int64_t pos0 = p_.sink + int64_t(id) * W;
  for (int h = 0; h < H; ++h) {
    dequantize_window_head(qlayout_, L.qpool.at(w.q_slot), h, w.n, kb.data(), vb.data());
    for (int t = 0; t < w.n; ++t)
      rope_apply(rope_.params(), rope_.cos_at(pos0 + t), rope_.sin_at(pos0 + t),
                 kb.data() + size_t(t) * d, 1, d, d);
    f32_to_half(p_.dtype, kb.data(), f_k(L, w.f_slot, h), int64_t(w.n) * d);
    f32_to_half(p_.dtype, vb.data(), f_v(L, w.f_slot, h), int64_t(w.n) * d);
  }
  w.tier = Tier::kFull;
  ++L.st.promotions;
  promote_s_ += since(t0);
}

void TieredKvCache::evict(Layer& L, Window& w) {
  if (w.f_slot >= 0) L.fpool.release(w.f_slot);
  if (w.q_slot >= 0) L.qpool.release(w.q_slot);
  w.f_slot = w.q_slot = -1;
  w.tier = Tier::kEvicted;
  ++L.st.evictions;
}

void TieredKvCache::route_layer(int layer) {
  Layer& L = layers_[layer];
  const int64_t aged = std::min<int64_t>(aged_windows(), int64_t(L.windows.size()));
  cand_.clear();
  const bool by_age = p_.score == "age";
  for (int32_t id = 0; id < aged; ++id) {
    const Window& w = L.windows[id];
    if (w.tier == Tier::kEvicted) continue;
    cand_.push_back({id, rank_score(w.score, n_past_, p_.sink + int64_t(id) * p_.window, by_age),
                     w.tier, w.q_slot >= 0});
  }
  policy_->route(cand_, rbudget_, &plan_);
  // Apply the plan in an order that never holds more than the budget: evictions free slots
  // first, demotions then free F slots as they take ledger slots, promotions come last.
  for (int pass = 0; pass < 3; ++pass) {
    for (size_t i = 0; i < cand_.size(); ++i) {
      const int32_t id = cand_[i].window;
      Window& w = L.windows[id];
      const Tier to = plan_[i];
      if (pass == 0 && to == Tier::kEvicted) {
        if (!w.routed) ++L.st.evicted_at_first_routing;
        evict(L, w);
      } else if (pass == 1 && to == Tier::kQuant) {
        if (w.tier != Tier::kQuant) demote(L, w, id);
      } else if (pass == 2 && to == Tier::kFull) {
        if (w.tier == Tier::kQuant) promote(L, w, id);
        w.tier = Tier::kFull;
      }
    }
  }
  for (const auto& c : cand_) {
    Window& w = L.windows[c.window];
    if (!w.routed) ++L.st.aged;
    w.routed = true;
  }
  // Give memory back when a tier shrank by a whole pool chunk (e.g. after the early phase
  // in which every window fit in F), so held bytes follow the budget, not its peak.
  auto remap = [&](SlotPool& pool, bool full) {
    const auto moves = pool.compact();
    if (moves.empty()) return;
    for (Window& w : L.windows) {
      int32_t& slot = full ? w.f_slot : w.q_slot;
      if (slot < 0) continue;
      for (const auto& [from, to] : moves)
        if (slot == from) {
          slot = to;
          break;
        }
    }
  };
  remap(L.fpool, true);
  remap(L.qpool, false);
  if (trace_) {
    std::string tiers(L.windows.size(), 'E');
    for (size_t id = 0; id < L.windows.size(); ++id) tiers[id] = tier_char(L.windows[id].tier);
    std::string scores;
    scores.reserve(L.windows.size() * 8);
    for (size_t id = 0; id < L.windows.size(); ++id) {
      if (id) scores += ',';
      scores += fmt::format("{:.4g}", L.windows[id].score);
    }
    std::fprintf(
        trace_, "{\"event\":%lld,\"n_past\":%lld,\"layer\":%d,\"tiers\":\"%s\",\"scores\":[%s]}\n",
        (long long)routing_events_, (long long)n_past_, layer, tiers.c_str(), scores.c_str());
  }
}

void TieredKvCache::route_now() {
  auto t0 = Clock::now();
  for (int l = 0; l < shape_.n_layers; ++l) route_layer(l);
  ++routing_events_;
  steps_since_route_ = 0;
  route_s_ += since(t0);
}

void TieredKvCache::commit() {
  const bool chunk = n_new_ > 1;
  n_past_ += n_new_;
  n_new_ = 0;
  ++steps_since_route_;
  // Routing events: after every prefill chunk and every Ω decode steps (SPEC §1).
  if (chunk) {
    route_now();
  } else if (steps_since_route_ >= p_.route_every) {
    const double before = route_s_;
    route_now();
    route_decode_s_ += route_s_ - before;
  }
}

void TieredKvCache::clear() {
  for (auto& L : layers_) {
    L.windows.clear();
    L.fpool.reset();
    L.qpool.reset();
    L.sink_score = 0.0;
    L.st = TierLayerStats();
  }
  n_past_ = n_new_ = 0;
  steps_since_route_ = 0;
  routing_events_ = 0;
  route_s_ = quant_s_ = promote_s_ = route_decode_s_ = 0.0;
}

size_t TieredKvCache::budgeted_bytes_in_use(int layer) const {
  const Layer& L = layers_[layer];
  size_t b = (L.sink_k.size() + L.sink_v.size()) * sizeof(uint16_t) + L.fpool.bytes_in_use();
  for (const Window& w : L.windows) {
    if (w.tier == Tier::kQuant) b += m_q_;
    if (w.tier == Tier::kFull && w.q_slot >= 0 && p_.strict_ledger) b += m_q_;
  }
  return b;
}

size_t TieredKvCache::bytes_held() const {
  size_t b = rope_.bytes();
  for (const Layer& L : layers_)
    b += (L.sink_k.capacity() + L.sink_v.capacity()) * sizeof(uint16_t) +
         L.fpool.bytes_allocated() + L.qpool.bytes_allocated() +
         L.windows.capacity() * sizeof(Window);
  b += (parts_.capacity() + block_ml_.capacity()) * sizeof(float) +
       mass_acc_.capacity() * sizeof(double);
  return b;
}

std::string TieredKvCache::describe() const {
  return fmt::format(
      "{}{} (budget {:.1f} KiB/layer, K_f {} K_q {}, ω {}, Ω {}, S {}, L {}, INT{}, M_f {} B, M_q "
      "{} B)",
      policy_->name(), p_.score == "age" ? " (age-normalised scores)" : "", budget_total_ / 1024.0,
      rbudget_.full_bytes / m_f_, rbudget_.quant_bytes / m_q_, p_.window, p_.route_every, p_.sink,
      p_.local, p_.bits, m_f_, m_q_);
}

TierStats TieredKvCache::stats() const {
  TierStats s;
  s.routing_events = routing_events_;
  s.route_seconds = route_s_;
  s.route_seconds_decode = route_decode_s_;
  s.quantize_seconds = quant_s_;
  s.promote_seconds = promote_s_;
  s.budget_bytes_per_layer = budget_total_;
  s.window_full_bytes = m_f_;
  s.window_quant_bytes = m_q_;
  s.capacity_full = int64_t(rbudget_.full_bytes / m_f_);
  s.capacity_quant = int64_t(rbudget_.quant_bytes / m_q_);
  for (const Layer& L : layers_) {
    TierLayerStats ls = L.st;
    for (const Window& w : L.windows) {
      switch (w.tier) {
        case Tier::kLocal:
          ++ls.windows_local;
          break;
        case Tier::kFull:
          ++ls.windows_full;
          break;
        case Tier::kQuant:
          ++ls.windows_quant;
          break;
        case Tier::kEvicted:
          ++ls.windows_evicted;
          break;
      }
      if (w.tier == Tier::kFull && w.q_slot >= 0) ls.bytes_ledger_of_full += m_q_;
    }
    ls.bytes_sink = (L.sink_k.size() + L.sink_v.size()) * sizeof(uint16_t);
    ls.bytes_full = L.fpool.bytes_in_use();
    ls.bytes_quant = L.qpool.bytes_in_use() - ls.bytes_ledger_of_full;
    ls.bytes_allocated = ls.bytes_sink + L.fpool.bytes_allocated() + L.qpool.bytes_allocated();
    s.layers.push_back(ls);
  }
  return s;
}

void TieredKvCache::position_tiers(int layer, int /*kv_head*/, std::vector<Tier>* out) const {
  const Layer& L = layers_[layer];
  out->assign(size_t(n_past_), Tier::kLocal);  // sink, and any position without a window
  for (int64_t p = p_.sink; p < n_past_; ++p) {
    const int64_t w = (p - p_.sink) / p_.window;
    if (w < int64_t(L.windows.size())) (*out)[size_t(p)] = L.windows[size_t(w)].tier;
  }
}

Tier TieredKvCache::window_tier(int layer, int32_t window) const {
  return layers_[layer].windows[window].tier;
}
double TieredKvCache::window_score(int layer, int32_t window) const {
  return layers_[layer].windows[window].score;
}

std::vector<uint8_t> TieredKvCache::window_ledger(int layer, int32_t window) const {
  const Layer& L = layers_[layer];
  const Window& w = L.windows[window];
  if (w.q_slot < 0) return {};
  const uint8_t* p = L.qpool.at(w.q_slot);
  return std::vector<uint8_t>(p, p + m_q_);
}

std::vector<uint16_t> TieredKvCache::window_full_keys(int layer, int32_t window) const {
  Layer& L = const_cast<Layer&>(layers_[layer]);
  const Window& w = L.windows[window];
  if (w.f_slot < 0) return {};
  const size_t n = size_t(shape_.n_kv_heads) * p_.window * shape_.head_dim;
  const uint16_t* p = f_k(L, w.f_slot, 0);
  return std::vector<uint16_t>(p, p + n);
}

void TieredKvCache::force_tier(int layer, int32_t window, Tier t) {
  Layer& L = layers_[layer];
  Window& w = L.windows[window];
  if (t == w.tier) return;
  if (t == Tier::kQuant)
    demote(L, w, window);
  else if (t == Tier::kFull && w.tier == Tier::kQuant)
    promote(L, w, window);
  else if (t == Tier::kEvicted)
    evict(L, w);
  else
    w.tier = t;
}

}  // namespace qevict
