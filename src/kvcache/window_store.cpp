// WindowStore (see window_store.h).
#include "kvcache/window_store.h"

#include <fmt/format.h>

#include <algorithm>
#include <cassert>
#include <chrono>

namespace qevict {

namespace {
using Clock = std::chrono::steady_clock;
double since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}
}  // namespace

WindowStore::WindowStore(const KvShape& shape, const KvBudget& budget, const QuantLayout& ql,
                         HalfType dtype, const RopeTable* rope)
    : shape_(shape), budget_(budget), ql_(ql), dtype_(dtype), rope_(rope) {
  const int H = shape_.n_kv_heads, d = shape_.head_dim;
  layers_.resize(size_t(shape_.n_layers));
  for (auto& L : layers_) {
    L.sink_k.assign(size_t(H) * budget_.sink * d, 0);
    L.sink_v.assign(size_t(H) * budget_.sink * d, 0);
    L.fpool = SlotPool(budget_.full_slot(), pool_chunk_bytes(budget_));
    L.qpool = SlotPool(budget_.quant_slot(), pool_chunk_bytes(budget_));
  }
}

Status WindowStore::relayout(const KvBudget& budget, const QuantLayout& ql) {
  if (budget.total != budget_.total || budget.sink != budget_.sink ||
      budget.local != budget_.local || budget.window != budget_.window ||
      budget.full_slot() != budget_.full_slot())
    return Status::error("relayout: the budget differs beyond the low-bit tier");
  for (const Layer& L : layers_)
    if (L.qpool.in_use() > 0) return Status::error("relayout: windows already have low-bit copies");
  budget_ = budget;
  ql_ = ql;
  for (Layer& L : layers_) L.qpool = SlotPool(budget_.quant_slot(), pool_chunk_bytes(budget_));
  return Status::ok();
}

size_t WindowStore::lower(const Layer& L, int32_t id) {
  return size_t(std::lower_bound(L.windows.begin(), L.windows.end(), id,
                                 [](const Window& w, int32_t x) { return w.id < x; }) -
                L.windows.begin());
}
WindowStore::Window* WindowStore::find(Layer& L, int32_t id) {
  const size_t i = lower(L, id);
  return i < L.windows.size() && L.windows[i].id == id ? &L.windows[i] : nullptr;
}
const WindowStore::Window* WindowStore::find(const Layer& L, int32_t id) {
  return find(const_cast<Layer&>(L), id);
}
WindowStore::Window* WindowStore::seek(Layer& L, size_t& i, int32_t id) {
  const size_t n = L.windows.size();
  if (i > 0 && L.windows[i - 1].id >= id) {
    i = lower(L, id);  // behind the cursor
  } else {
    while (i < n && L.windows[i].id < id) ++i;
  }
  return i < n && L.windows[i].id == id ? &L.windows[i] : nullptr;
}

const WindowStore::Window& WindowStore::window(int layer, int32_t id) const {
  static const Window kDropped = [] {
    Window w;
    w.tier = Tier::kEvicted;
    w.routed = true;
    return w;
  }();
  const Window* w = find(layers_[layer], id);
  return w ? *w : kDropped;
}

uint16_t* WindowStore::f_k(Layer& L, int32_t slot, int h) const {
  return reinterpret_cast<uint16_t*>(L.fpool.at(slot)) +
         size_t(h) * budget_.window * shape_.head_dim;
}
uint16_t* WindowStore::f_v(Layer& L, int32_t slot, int h) const {
  return reinterpret_cast<uint16_t*>(L.fpool.at(slot)) +
         size_t(shape_.n_kv_heads + h) * budget_.window * shape_.head_dim;
}
const uint16_t* WindowStore::f_k(const Layer& L, int32_t slot, int h) const {
  return reinterpret_cast<const uint16_t*>(L.fpool.at(slot)) +
         size_t(h) * budget_.window * shape_.head_dim;
}
const uint16_t* WindowStore::f_v(const Layer& L, int32_t slot, int h) const {
  return reinterpret_cast<const uint16_t*>(L.fpool.at(slot)) +
         size_t(shape_.n_kv_heads + h) * budget_.window * shape_.head_dim;
}

void WindowStore::store_token(int layer, int64_t pos, const float* k, const float* v) {
  Layer& L = layers_[layer];
  const int H = shape_.n_kv_heads, d = shape_.head_dim, S = budget_.sink, W = budget_.window;
  if (pos < S) {
    for (int h = 0; h < H; ++h) {
      f32_to_half(dtype_, k + h * d, L.sink_k.data() + (size_t(h) * S + pos) * d, d);
      f32_to_half(dtype_, v + h * d, L.sink_v.data() + (size_t(h) * S + pos) * d, d);
    }
    return;
  }
  const int64_t w = (pos - S) / W, o = (pos - S) % W;
  if (w == L.next_id) {
    Window nw;
    nw.id = L.next_id++;
    nw.f_slot = L.fpool.acquire();
    L.windows.push_back(nw);
  }
  Window& win = L.windows.back().id == w ? L.windows.back() : *find(L, int32_t(w));
  for (int h = 0; h < H; ++h) {
    f32_to_half(dtype_, k + h * d, f_k(L, win.f_slot, h) + o * d, d);
    f32_to_half(dtype_, v + h * d, f_v(L, win.f_slot, h) + o * d, d);
  }
  win.n = static_cast<int32_t>(o + 1);
}

void WindowStore::attention_blocks(int layer, int64_t total, std::vector<KvBlockRef>* blocks,
                                   std::vector<int32_t>* block_window) const {
  const Layer& L = layers_[layer];
  const int d = shape_.head_dim, S = budget_.sink;
  block_window->clear();
  blocks->clear();  // one entry a block for every KV head (head_rows)
  if (S > 0) {
    KvBlockRef r;
    r.n = int32_t(std::min<int64_t>(S, total));
    r.k = L.sink_k.data();
    r.v = L.sink_v.data();
    r.ld = d;
    r.head_rows = S;  // head h's sink rows are S·d halfs after head h − 1's
    blocks->push_back(r);
    block_window->push_back(-1);
  }
  for (const Window& w : L.windows) {
    if (w.tier == Tier::kEvicted) continue;
    KvBlockRef r;
    r.pos0 = S + int64_t(w.id) * budget_.window;
    r.n = w.n;
    if (w.f_slot >= 0) {
      r.k = f_k(L, w.f_slot, 0);
      r.v = f_v(L, w.f_slot, 0);
      r.ld = d;
      r.head_rows = budget_.window;  // a head's keys (values) are W·d halfs after the last's
    } else {
      r.qwin = L.qpool.at(w.q_slot);
    }
    blocks->push_back(r);
    block_window->push_back(w.id);
  }
}

void WindowStore::add_score(int layer, int32_t id, double mass) {
  if (id < 0) return;
  if (Window* w = find(layers_[layer], id)) w->score += mass;
}

void WindowStore::add_scores(int layer, const int32_t* ids, const double* mass, int64_t n,
                             double factor) {
  Layer& L = layers_[layer];
  auto it = L.windows.begin();
  for (int64_t b = 0; b < n; ++b) {
    if (ids[b] < 0) continue;  // the sink
    assert(b == 0 || ids[b] > ids[b - 1]);
    while (it != L.windows.end() && it->id < ids[b]) ++it;
    if (it != L.windows.end() && it->id == ids[b]) it->score += mass[b] * factor;
  }
}

void WindowStore::reset_scores(int layer) {
  for (Window& w : layers_[layer].windows) w.score = 0.0;
}

void WindowStore::candidates(int layer, int64_t n_past, RoutingRequest* req) const {
  const Layer& L = layers_[layer];
  const int64_t aged = budget_.aged_windows(n_past);
  req->n_past = n_past;
  req->budget = budget_.routing();
  req->candidates.clear();
  for (const Window& w : L.windows) {
    if (w.id >= aged) break;
    if (w.tier == Tier::kEvicted) continue;
    req->candidates.push_back(
        {w.id, budget_.sink + int64_t(w.id) * budget_.window, w.score, w.tier, w.q_slot >= 0});
  }
}

Status WindowStore::apply(int layer, const RoutingRequest& req, const RoutingPlan& plan) {
  Layer& L = layers_[layer];
  QEVICT_RETURN_IF_ERROR(check_plan(req, plan));
  size_t at = 0;  // plan entries come in candidate order, ascending ids: one walk (seek)
  for (const PlanEntry& e : plan.entries) {
    if (e.id < 0 || e.id >= L.next_id)
      return Status::error(fmt::format("routing plan names window {} of {}", e.id, L.next_id));
    const Window* w = seek(L, at, e.id);
    if ((!w || w->tier == Tier::kEvicted) && e.to != Tier::kEvicted)
      return Status::error(fmt::format("routing plan revives evicted window {}", e.id));
  }
  // Entries of windows evicted at an earlier event go now (kept one event so that
  // diagnostics see their final score).
  const size_t before = L.windows.size();
  L.windows.erase(std::remove_if(L.windows.begin(), L.windows.end(),
                                 [](const Window& w) { return w.tier == Tier::kEvicted; }),
                  L.windows.end());
  L.dropped += int64_t(before - L.windows.size());
  // A prefill chunk adds up to 512/ω entries that routing then drops, and the one routing
  // of --prefill-route end drops the whole prompt's evicted windows: give the room back once
  // a quarter of it is spare (with ω = 1, StreamingLLM's, an entry is 32 B a token, 6 % of
  // a token's K and V on a model with 2 KV heads of 64).
  if (L.windows.capacity() > L.windows.size() + L.windows.size() / 4 + 64) {
    std::vector<Window> kept;
    kept.reserve(L.windows.size() + L.windows.size() / 8 + 8);  // decode adds a few at a time
    kept.assign(L.windows.begin(), L.windows.end());
    L.windows.swap(kept);
  }
  // Evictions free slots first, demotions then free F slots as they take ledger slots,
  // promotions come last: the store never holds more than the budget in between.
  // Each entry's tier is marked on its window (entries of dropped windows are evicted
  // already), so the passes walk the windows in id order and the store keeps no list that
  // grows with the plan.
  at = 0;
  for (const PlanEntry& e : plan.entries)
    if (Window* w = seek(L, at, e.id)) w->to = e.to;
  for (int pass = 0; pass < 3; ++pass) {
    for (Window& w : L.windows) {
      if (w.to == Tier::kLocal) continue;
      if (pass == 0 && w.to == Tier::kEvicted) {
        if (w.tier == Tier::kEvicted) continue;
        if (!w.routed) ++L.counters.evicted_at_first_routing;
        evict(L, w);
      } else if (pass == 1 && w.to == Tier::kQuant) {
        if (w.tier != Tier::kQuant) demote(L, w, w.id);
      } else if (pass == 2 && w.to == Tier::kFull) {
        if (w.tier == Tier::kQuant) promote(L, w, w.id);
        w.tier = Tier::kFull;
      }
    }
  }
  for (Window& w : L.windows) {
    if (w.to == Tier::kLocal) continue;
    if (!w.routed) ++L.counters.aged;
    w.routed = true;
    w.to = Tier::kLocal;
  }
  compact(L);
  return Status::ok();
}

void WindowStore::quantize(Layer& L, Window& w, int32_t id) {
  if (w.q_slot < 0) {
    // First demotion (or staging): invert RoPE on the 16-bit keys and quantize (once per
    // window, ever).
    auto t0 = Clock::now();
    const int H = shape_.n_kv_heads, d = shape_.head_dim, W = budget_.window;
    thread_local std::vector<float> kp, vp;
    kp.assign(size_t(W) * H * d, 0.0f);
    vp.assign(size_t(W) * H * d, 0.0f);
    const int64_t pos0 = budget_.sink + int64_t(id) * W;
    thread_local std::vector<float> cs;
    cs.resize(size_t(d) + 2);  // cos | sin, n_rot/2 each
    float* rc = cs.data();
    float* rs = cs.data() + d / 2 + 1;
    for (int h = 0; h < H; ++h) {
      for (int t = 0; t < w.n; ++t) {
        float* kr = kp.data() + (size_t(t) * H + h) * d;
        half_to_f32(dtype_, f_k(L, w.f_slot, h) + size_t(t) * d, kr, d);
        rope_->cos_sin(pos0 + t, rc, rs);
        rope_apply(rope_->params(), rc, rs, kr, 1, d, d, /*inverse=*/true);
        half_to_f32(dtype_, f_v(L, w.f_slot, h) + size_t(t) * d,
                    vp.data() + (size_t(t) * H + h) * d, d);
      }
    }
    w.q_slot = L.qpool.acquire();
    quantize_window(ql_, kp.data(), vp.data(), w.n, L.qpool.at(w.q_slot));
    ++L.counters.quantizations;
    L.quant_s += since(t0);
  }
}

void WindowStore::demote(Layer& L, Window& w, int32_t id) {
  quantize(L, w, id);
  if (w.f_slot >= 0) {
    L.fpool.release(w.f_slot);
    w.f_slot = -1;
  }
  w.tier = Tier::kQuant;
  ++L.counters.demotions;
}

void WindowStore::promote(Layer& L, Window& w, int32_t id) {
  // Rebuild the full-precision copy from the ledger: dequantize, re-apply RoPE at the
  // original positions. The ledger entry stays, so a later demotion reuses its codes.
  auto t0 = Clock::now();
  const int H = shape_.n_kv_heads, d = shape_.head_dim, W = budget_.window;
  thread_local std::vector<float> kb, vb, cs;
  cs.resize(size_t(d) + 2);  // cos | sin, n_rot/2 each
  kb.resize(size_t(W) * d);
  vb.resize(size_t(W) * d);
  w.f_slot = L.fpool.acquire();
  const int64_t pos0 = budget_.sink + int64_t(id) * W;
  for (int h = 0; h < H; ++h) {
    dequantize_window_head(ql_, L.qpool.at(w.q_slot), h, w.n, kb.data(), vb.data());
    for (int t = 0; t < w.n; ++t) {
      rope_->cos_sin(pos0 + t, cs.data(), cs.data() + d / 2 + 1);
      rope_apply(rope_->params(), cs.data(), cs.data() + d / 2 + 1, kb.data() + size_t(t) * d, 1, d,
                 d);
    }
    f32_to_half(dtype_, kb.data(), f_k(L, w.f_slot, h), int64_t(w.n) * d);
    f32_to_half(dtype_, vb.data(), f_v(L, w.f_slot, h), int64_t(w.n) * d);
  }
  w.tier = Tier::kFull;
  ++L.counters.promotions;
  L.promote_s += since(t0);
}

int64_t WindowStore::stage(int layer, int64_t n_past, int64_t hold) {
  Layer& L = layers_[layer];
  const int64_t aged = budget_.aged_windows(n_past);
  int64_t kept = 0;
  for (const Window& w : L.windows) {
    if (w.id >= aged) break;
    if (w.tier != Tier::kEvicted) ++kept;
  }
  if (kept <= hold) return 0;
  int64_t staged = 0;
  for (Window& w : L.windows) {
    if (w.id >= aged) break;
    if (w.tier != Tier::kLocal) continue;
    quantize(L, w, w.id);
    L.fpool.release(w.f_slot);
    w.f_slot = -1;
    w.tier = Tier::kQuant;  // not `routed`: the prompt's routing is its first
    ++staged;
  }
  if (staged > 0) compact(L);  // the freed 16-bit slots go to the next chunk, or back
  return staged;
}

void WindowStore::evict(Layer& L, Window& w) {
  if (w.f_slot >= 0) L.fpool.release(w.f_slot);
  if (w.q_slot >= 0) L.qpool.release(w.q_slot);
  w.f_slot = w.q_slot = -1;
  w.tier = Tier::kEvicted;
  ++L.counters.evictions;
}

void WindowStore::compact(Layer& L) {
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
}

void WindowStore::clear() {
  for (auto& L : layers_) {
    L.windows.clear();
    L.next_id = 0;
    L.dropped = 0;
    L.fpool.reset();
    L.qpool.reset();
    L.counters = KvLayerReport();
    L.quant_s = L.promote_s = 0.0;
  }
}

const uint8_t* WindowStore::ledger(int layer, int32_t id) const {
  const Layer& L = layers_[layer];
  const Window* w = find(L, id);
  return w && w->q_slot >= 0 ? L.qpool.at(w->q_slot) : nullptr;
}

const uint16_t* WindowStore::full_keys(int layer, int32_t id) const {
  const Layer& L = layers_[layer];
  const Window* w = find(L, id);
  return w && w->f_slot >= 0 ? f_k(L, w->f_slot, 0) : nullptr;
}

size_t WindowStore::budgeted_bytes_in_use(int layer) const {
  const Layer& L = layers_[layer];
  // M_f / M_q per window (slot + entry); a promoted window's ledger copy pays M_q in strict
  // mode, as the policies charge it.
  size_t b = (L.sink_k.size() + L.sink_v.size()) * sizeof(uint16_t) + L.fpool.bytes_in_use();
  for (const Window& w : L.windows) {
    if (w.f_slot >= 0) b += budget_.window_entry;
    if (w.tier == Tier::kQuant) b += budget_.window_quant;
    if (w.tier == Tier::kFull && w.q_slot >= 0 && budget_.strict_ledger) b += budget_.window_quant;
  }
  return b;
}

size_t WindowStore::bytes_allocated() const {
  size_t b = sizeof(*this) + layers_.capacity() * sizeof(Layer) + entry_bytes();
  for (const Layer& L : layers_)
    b += (L.sink_k.capacity() + L.sink_v.capacity()) * sizeof(uint16_t) +
         L.fpool.bytes_allocated() + L.qpool.bytes_allocated() + L.fpool.overhead_bytes() +
         L.qpool.overhead_bytes();
  return b;
}

size_t WindowStore::entry_bytes() const {
  size_t b = 0;
  for (const Layer& L : layers_) b += L.windows.capacity() * sizeof(Window);
  return b;
}

KvLayerReport WindowStore::layer_report(int layer) const {
  const Layer& L = layers_[layer];
  KvLayerReport r = L.counters;
  r.windows_evicted = L.dropped;
  for (const Window& w : L.windows) {
    switch (w.tier) {
      case Tier::kLocal:
        ++r.windows_local;
        break;
      case Tier::kFull:
        ++r.windows_full;
        break;
      case Tier::kQuant:
        ++r.windows_quant;
        break;
      case Tier::kEvicted:
        ++r.windows_evicted;
        break;
    }
    if (w.tier == Tier::kFull && w.q_slot >= 0) r.bytes_ledger_of_full += budget_.quant_slot();
  }
  // F (local included) and Q at M_f / M_q a window, entries included; ledger copies are
  // their slots alone (their window's entry is counted in F).
  r.bytes_sink = (L.sink_k.size() + L.sink_v.size()) * sizeof(uint16_t);
  r.bytes_full = size_t(r.windows_full + r.windows_local) * budget_.window_full;
  r.bytes_quant = size_t(r.windows_quant) * budget_.window_quant;
  r.bytes_budgeted = budgeted_bytes_in_use(layer);
  r.bytes_allocated = r.bytes_sink + L.fpool.bytes_allocated() + L.qpool.bytes_allocated();
  return r;
}

void WindowStore::position_tiers(int layer, int64_t n_past, std::vector<Tier>* out) const {
  const Layer& L = layers_[layer];
  const int S = budget_.sink, W = budget_.window;
  // Positions of windows without an entry were evicted; the sink is kLocal.
  out->assign(size_t(n_past), Tier::kEvicted);
  for (int64_t p = 0; p < std::min<int64_t>(S, n_past); ++p) (*out)[size_t(p)] = Tier::kLocal;
  for (const Window& w : L.windows)
    for (int64_t p = S + int64_t(w.id) * W;
         p < std::min<int64_t>(S + int64_t(w.id + 1) * W, n_past); ++p)
      (*out)[size_t(p)] = w.tier;
}

}  // namespace qevict
