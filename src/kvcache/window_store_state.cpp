// WindowStore's session state: truncation to a prefix and save / load (see window_store.h).
#include <fmt/format.h>

#include "kvcache/window_store.h"

namespace qevict {

namespace {
// First window id holding a position >= n (windows start at the sink's end).
int64_t first_window_at(int64_t n, int sink, int window) {
  return n <= sink ? 0 : (n - sink) / window;
}
}  // namespace

bool WindowStore::can_truncate(int64_t n) const {
  const int64_t first = first_window_at(n, budget_.sink, budget_.window);
  for (const Layer& L : layers_)
    for (auto it = L.windows.rbegin(); it != L.windows.rend() && it->id >= first; ++it)
      if (it->tier != Tier::kLocal || it->routed || it->q_slot >= 0) return false;
  return true;
}

void WindowStore::truncate(int64_t n) {
  const int S = budget_.sink, W = budget_.window;
  const int64_t first = first_window_at(n, S, W);
  for (Layer& L : layers_) {
    while (!L.windows.empty() && L.windows.back().id >= first) {
      Window& w = L.windows.back();
      const int64_t start = S + int64_t(w.id) * W;
      if (start < n) {  // the window holding n keeps its tokens before n
        w.n = int32_t(n - start);
        break;
      }
      if (w.f_slot >= 0) L.fpool.release(w.f_slot);
      L.windows.pop_back();
    }
    L.next_id =
        L.windows.empty() ? int32_t(std::min<int64_t>(first, L.next_id)) : L.windows.back().id + 1;
    if (n <= S) L.next_id = 0;
  }
}

// Window entries field by field (the struct has padding, whose bytes are not state).
void WindowStore::save(ByteWriter& w) const {
  w.put<int32_t>(shape_.n_layers);
  for (const Layer& L : layers_) {
    w.put_vec(L.sink_k);
    w.put_vec(L.sink_v);
    w.put<uint64_t>(L.windows.size());
    w.put<uint64_t>(L.windows.capacity());
    for (const Window& x : L.windows) {
      w.put(x.id), w.put(x.f_slot), w.put(x.q_slot), w.put(x.n), w.put(x.score);
      w.put(uint8_t(x.tier)), w.put(uint8_t(x.routed)), w.put(uint8_t(x.to));
    }
    w.put(L.next_id);
    w.put(L.dropped);
    L.fpool.save(w);
    L.qpool.save(w);
    w.put(L.counters);  // (the quantize / promote times are not state: they restart)
  }
}

Status WindowStore::load(ByteReader& r) {
  int32_t n_layers = 0;
  QEVICT_RETURN_IF_ERROR(r.get(&n_layers));
  if (n_layers != shape_.n_layers)
    return Status::error(
        fmt::format("session state: {} layers, the model has {}", n_layers, shape_.n_layers));
  const size_t sink_elems = size_t(shape_.n_kv_heads) * budget_.sink * shape_.head_dim;
  std::vector<Layer> layers(static_cast<size_t>(n_layers));
  for (Layer& L : layers) {
    L.fpool = SlotPool(budget_.full_slot(), pool_chunk_bytes(budget_));
    L.qpool = SlotPool(budget_.quant_slot(), pool_chunk_bytes(budget_));
    QEVICT_RETURN_IF_ERROR(r.get_vec(&L.sink_k, sink_elems));
    QEVICT_RETURN_IF_ERROR(r.get_vec(&L.sink_v, sink_elems));
    if (L.sink_k.size() != sink_elems || L.sink_v.size() != sink_elems)
      return Status::error("session state: the sink's size differs from this cache's");
    uint64_t n = 0, cap = 0;
    QEVICT_RETURN_IF_ERROR(r.get(&n));
    QEVICT_RETURN_IF_ERROR(r.get(&cap));
    constexpr size_t kEntry = 4 * 4 + 8 + 3;  // the fields save() writes
    if (n > r.left() / kEntry || cap < n || cap > 2 * n + 1024)
      return Status::error("session state: a window table's size is inconsistent");
    L.windows.reserve(size_t(cap));
    for (uint64_t i = 0; i < n; ++i) {
      Window x;
      uint8_t tier = 0, routed = 0, to = 0;
      QEVICT_RETURN_IF_ERROR(r.get(&x.id));
      QEVICT_RETURN_IF_ERROR(r.get(&x.f_slot));
      QEVICT_RETURN_IF_ERROR(r.get(&x.q_slot));
      QEVICT_RETURN_IF_ERROR(r.get(&x.n));
      QEVICT_RETURN_IF_ERROR(r.get(&x.score));
      QEVICT_RETURN_IF_ERROR(r.get(&tier));
      QEVICT_RETURN_IF_ERROR(r.get(&routed));
      QEVICT_RETURN_IF_ERROR(r.get(&to));
      if (tier > uint8_t(Tier::kEvicted) || to > uint8_t(Tier::kEvicted) || routed > 1 || x.n < 0 ||
          x.n > budget_.window || x.id < 0 || (!L.windows.empty() && x.id <= L.windows.back().id))
        return Status::error("session state: a corrupt window entry");
      x.tier = Tier(tier), x.routed = routed != 0, x.to = Tier(to);
      L.windows.push_back(x);
    }
    QEVICT_RETURN_IF_ERROR(r.get(&L.next_id));
    QEVICT_RETURN_IF_ERROR(r.get(&L.dropped));
    if (!L.windows.empty() && L.next_id <= L.windows.back().id)
      return Status::error("session state: a window id past the next one");
    QEVICT_RETURN_IF_ERROR(L.fpool.load(r));
    QEVICT_RETURN_IF_ERROR(L.qpool.load(r));
    // Every slot a window names must be one the pool holds, and each tier's slots present.
    const int64_t nf =
        int64_t(L.fpool.bytes_allocated() / std::max<size_t>(1, L.fpool.slot_bytes()));
    const int64_t nq =
        int64_t(L.qpool.bytes_allocated() / std::max<size_t>(1, L.qpool.slot_bytes()));
    for (const Window& x : L.windows) {
      const bool f_ok = x.f_slot == -1 || (x.f_slot >= 0 && x.f_slot < nf);
      const bool q_ok = x.q_slot == -1 || (x.q_slot >= 0 && x.q_slot < nq);
      const bool has = (x.tier == Tier::kLocal || x.tier == Tier::kFull) ? x.f_slot >= 0
                       : x.tier == Tier::kQuant                          ? x.q_slot >= 0
                                                                         : true;
      if (!f_ok || !q_ok || !has)
        return Status::error("session state: a window names a slot its pool does not hold");
    }
    QEVICT_RETURN_IF_ERROR(r.get(&L.counters));
  }
  layers_ = std::move(layers);
  return Status::ok();
}

}  // namespace qevict
