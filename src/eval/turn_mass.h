// Attention mass by tier during one turn of a multi-turn protocol (issue 51 item 2): where the
// turn's queries look, split by where a compressed cache keeps those positions.
//   fullkv  FullKV's attention in the same sample (AttentionObserver), split by each cache's
//           position tiers when the question arrived (metrics.h mass_by_tier, per unit as the
//           diagnose runner does): the share the uncompressed model pays to what that cache
//           holds in F, in Q, or evicted. Evicted positions get no attention in a compressed
//           cache, so only a reference can say how much they would have had.
//   own     a tiered cache's own attention by the tier of each window at the moment it
//           attended (TierMassObserver; promotions during the turn count as F from then on).
// Both keep the turn's prompt queries (the question, and a carried token) apart from its
// generated ones; the turn is both. Memory: the tier maps of the caches, no per-position
// arrays.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <vector>

#include "eval/metrics.h"
#include "kvcache/full_cache.h"
#include "kvcache/tiered_cache.h"

namespace qevict::eval {

// Shares of one turn's attention by tier, each summing to 1: its prompt queries' and all of
// its queries' (prompt and generated tokens fed back: every generated token but the last).
struct TurnMass {
  TierMass prompt, turn;
};

// Accumulates normalised shares weighted by their query count: add(m, w) with m summing to 1
// (or all zero) for w queries; mean() is Σ w·m / Σ w.
class TierMassMean {
 public:
  void add(const TierMass& m, double w) {
    sum_ += m.scaled(w);
    weight_ += w;
  }
  TierMass mean() const { return weight_ > 0.0 ? sum_.scaled(1.0 / weight_) : TierMass{}; }
  double weight() const { return weight_; }
  // The mean of both accumulators' queries.
  static TierMass mean_of(const TierMassMean& a, const TierMassMean& b);

 private:
  TierMass sum_;
  double weight_ = 0.0;
};

// FullKV's attention during a turn by the tiers of several caches (see above). tiers[v][u]:
// cache v's position tiers of unit u (KvReport::position_tiers) — units are layers
// (n_layers of them) or (layer, KV head) pairs, u = layer · n_kv_heads + head; positions
// past a unit's map (the turn's own tokens, or all positions when the map is empty) count as
// local. A call whose keys end at or before prompt_end holds prompt queries; later calls are
// decode steps.
class FullKvTurnMass final : public AttentionObserver {
 public:
  FullKvTurnMass(int n_layers, int n_kv_heads, int64_t prompt_end,
                 std::vector<std::vector<std::vector<Tier>>> tiers);
  void on_attention(int layer, int64_t n_keys, const float* probs) override;
  // Cache v's shares; none when its map has neither n_layers nor n_layers · n_kv_heads units
  // or no prompt query was seen.
  std::optional<TurnMass> result(size_t v) const;

 private:
  int nl_, h_;
  int64_t prompt_end_;
  std::vector<std::vector<std::vector<Tier>>> tiers_;
  std::vector<TierMassMean> prompt_, decode_;  // [cache]
  std::vector<float> layer_row_;               // one layer's rows summed over its KV heads
};

// A tiered cache's own attention by tier during a turn (prompt_end as FullKvTurnMass's).
class OwnTurnMass final : public TierMassObserver {
 public:
  explicit OwnTurnMass(int64_t prompt_end) : prompt_end_(prompt_end) {}
  void on_tier_mass(int layer, int64_t n_keys, const double* mass) override;
  std::optional<TurnMass> result() const;

 private:
  int64_t prompt_end_;
  TierMassMean prompt_, decode_;
};

// {"prompt": {"L", "F", "Q", "E"}, "turn": {...}}.
nlohmann::json turn_mass_json(const TurnMass& m);

}  // namespace qevict::eval
