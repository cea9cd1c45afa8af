// TieredKvCache's session state (see tiered_cache.h, engine/session.h): dropping the newest
// tokens while they are all in the local region, and writing / reading the whole state.
#include <fmt/format.h>

#include "kvcache/tiered_cache.h"

namespace qevict {

namespace {
constexpr uint32_t kStateTag = 0x54514556;  // "VEQT": the tiered cache's state follows
// "VEQ2": the same with the key metadata bits and --kv-adapt's choice after the value bits
// (the layout a saved state's low-bit copies are in); "VEQT" states are read as configured.
constexpr uint32_t kStateTag2 = 0x32514556;
}  // namespace

bool TieredKvCache::can_truncate(int64_t n) const {
  if (n == n_past_) return true;
  if (n < 0 || n > n_past_ || n_new_ != 0 || sched_.prompt_pending()) return false;
  return store_.can_truncate(n);
}

Status TieredKvCache::truncate(int64_t n) {
  if (n == n_past_) return Status::ok();
  if (!can_truncate(n))
    return Status::error(fmt::format(
        "{}: cannot drop tokens [{}, {}): some are no longer in the full-precision local region",
        p_.policy, n, n_past_));
  store_.truncate(n);
  n_past_ = n;
  scores_from_ = std::min(scores_from_, n);
  return Status::ok();
}

// The state: a tag, the params that shape it (checked against this cache's), the positions,
// the schedule and the store. Between forward calls no prompt observation is under way unless
// a prompt is pending; a pending prompt's query window is saved too.
Status TieredKvCache::save_state(ByteWriter& w) const {
  if (trace_) return Status::error("a cache writing --kv-trace cannot be saved");
  if (n_new_ != 0) return Status::error("a cache cannot be saved inside a forward call");
  w.put(kStateTag2);
  w.put<int64_t>(n_ctx_);
  w.put<uint64_t>(budget_.total);
  w.put<int32_t>(p_.window);
  w.put<int32_t>(p_.sink);
  w.put<int32_t>(qlayout_.kb());
  w.put<int32_t>(qlayout_.vb());
  w.put<int32_t>(p_.key_meta);
  w.put<int8_t>(int8_t(adapted_));
  // The prompt's focus (diagnostics; --kv-adapt decides once per sequence).
  w.put<uint32_t>(uint32_t(focus_.size()));
  for (const PromptFocus& f : focus_) {
    w.put(f.history);
    w.put(f.top1);
    w.put(f.top4);
    w.put(f.top16);
    w.put(f.far4);
    w.put(f.kl);
  }
  w.put<int64_t>(n_past_);
  w.put<int64_t>(scores_from_);
  sched_.save(w);
  w.put<int64_t>(obs_q_.held());
  w.put<uint8_t>(obs_q_.allocated());
  if (obs_q_.allocated())
    for (int l = 0; l < shape_.n_layers; ++l)
      w.put_bytes(obs_q_.rows(l), size_t(obs_q_.capacity()) * shape_.q_width() * sizeof(float));
  store_.save(w);
  return Status::ok();
}

Status TieredKvCache::load_state(ByteReader& r) {
  uint32_t tag = 0;
  int64_t n_ctx = 0, n_past = 0, scores_from = 0, obs_held = 0;
  uint64_t total = 0;
  int32_t window = 0, sink = 0, kb = 0, vb = 0, kmeta = base_p_.key_meta;
  int8_t adapted = -1;
  uint8_t obs_alloc = 0;
  std::vector<PromptFocus> focus;
  QEVICT_RETURN_IF_ERROR(r.get(&tag));
  if (tag != kStateTag && tag != kStateTag2)
    return Status::error("session state: not a tiered cache's state");
  QEVICT_RETURN_IF_ERROR(r.get(&n_ctx));
  QEVICT_RETURN_IF_ERROR(r.get(&total));
  QEVICT_RETURN_IF_ERROR(r.get(&window));
  QEVICT_RETURN_IF_ERROR(r.get(&sink));
  QEVICT_RETURN_IF_ERROR(r.get(&kb));
  QEVICT_RETURN_IF_ERROR(r.get(&vb));
  if (tag == kStateTag2) {
    uint32_t n_focus = 0;
    QEVICT_RETURN_IF_ERROR(r.get(&kmeta));
    QEVICT_RETURN_IF_ERROR(r.get(&adapted));
    QEVICT_RETURN_IF_ERROR(r.get(&n_focus));
    if (adapted < -1 || adapted > 1 || (adapted == 1 && !(base_p_.adapt > 0.0)) ||
        (n_focus != 0 && n_focus != uint32_t(shape_.n_layers)))
      return Status::error("session state: a corrupt low-bit tier choice");
    focus.resize(n_focus);
    for (PromptFocus& f : focus) {
      QEVICT_RETURN_IF_ERROR(r.get(&f.history));
      QEVICT_RETURN_IF_ERROR(r.get(&f.top1));
      QEVICT_RETURN_IF_ERROR(r.get(&f.top4));
      QEVICT_RETURN_IF_ERROR(r.get(&f.top16));
      QEVICT_RETURN_IF_ERROR(r.get(&f.far4));
      QEVICT_RETURN_IF_ERROR(r.get(&f.kl));
    }
  }
  // The layout the state was saved in: the configured one, or --kv-adapt's coverage tier.
  auto tier = tier_setup(adapted == 1);
  if (!tier) return tier.status();
  const KvCacheParams& p = tier->p;
  const KvBudget& budget = tier->budget;
  const QuantLayout& ql = tier->layout;
  if (n_ctx != n_ctx_ || total != budget.total || window != p.window || sink != p.sink ||
      kb != ql.kb() || vb != ql.vb() || kmeta != p.key_meta)
    return Status::error(fmt::format(
        "session state: saved for another cache (context {}, budget {} B/layer, ω {}, S {}, "
        "INT{}/{}, key metadata {} bits), this one has context {}, budget {} B/layer, ω {}, "
        "S {}, INT{}/{}, key metadata {} bits",
        n_ctx, total, window, sink, kb, vb, kmeta, n_ctx_, budget.total, p.window, p.sink, ql.kb(),
        ql.vb(), p.key_meta));
  QEVICT_RETURN_IF_ERROR(r.get(&n_past));
  QEVICT_RETURN_IF_ERROR(r.get(&scores_from));
  if (n_past < 0 || n_past > n_ctx_ || scores_from < 0 || scores_from > n_past)
    return Status::error("session state: positions out of range");
  RoutingSchedule sched = sched_;
  QEVICT_RETURN_IF_ERROR(sched.load(r));
  QEVICT_RETURN_IF_ERROR(r.get(&obs_held));
  QEVICT_RETURN_IF_ERROR(r.get(&obs_alloc));
  QueryWindow obs(shape_.n_layers, p_.prefill_window, shape_.q_width());
  if (obs_alloc > 1 || obs_held < 0 || obs_held > p_.prefill_window ||
      (obs_alloc && p_.prefill_window == 0))
    return Status::error("session state: a corrupt query window");
  if (obs_alloc) {
    obs.allocate();
    const size_t rows = size_t(p_.prefill_window) * shape_.q_width() * sizeof(float);
    for (int l = 0; l < shape_.n_layers; ++l)
      QEVICT_RETURN_IF_ERROR(r.get_bytes(obs.rows(l), rows));
    obs.commit(obs_held);
  }
  WindowStore store(shape_, budget, ql, p.dtype, &rope_);
  QEVICT_RETURN_IF_ERROR(store.load(r));
  const int64_t windows = n_past <= p_.sink ? 0 : (n_past - p_.sink + p_.window - 1) / p_.window;
  for (int l = 0; l < shape_.n_layers; ++l)
    if (store.n_windows(l) != windows)
      return Status::error("session state: the window table does not match the positions");
  // Nothing changed until every part was read and checked.
  if (budget.capacity_quant > 0 && rope_.bytes() == 0)
    rope_ = RopeTable(shape_.rope, shape_.head_dim, n_ctx_);  // a coverage state, no Q before
  p_ = p;
  budget_ = budget;
  qlayout_ = ql;
  adapted_ = adapted;
  focus_ = std::move(focus);
  store_ = std::move(store);
  sched_ = sched;
  obs_q_ = std::move(obs);
  n_past_ = n_past;
  n_new_ = 0;
  scores_from_ = scores_from;
  return Status::ok();
}

}  // namespace qevict
