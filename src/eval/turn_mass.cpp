// Attention mass by tier during a turn (see turn_mass.h).
#include "eval/turn_mass.h"

#include <algorithm>
#include <cmath>

namespace qevict::eval {

TierMass TierMassMean::mean_of(const TierMassMean& a, const TierMassMean& b) {
  TierMass s = a.sum_;
  s += b.sum_;
  const double w = a.weight_ + b.weight_;
  return w > 0.0 ? s.scaled(1.0 / w) : TierMass{};
}

FullKvTurnMass::FullKvTurnMass(int n_layers, int n_kv_heads, int64_t prompt_end,
                               std::vector<std::vector<std::vector<Tier>>> tiers)
    : nl_(n_layers),
      h_(n_kv_heads),
      prompt_end_(prompt_end),
      tiers_(std::move(tiers)),
      prompt_(tiers_.size()),
      decode_(tiers_.size()) {}

void FullKvTurnMass::on_attention(int layer, int64_t n_keys, const float* probs) {
  const bool prompt = n_keys <= prompt_end_;
  bool summed = false;  // layer_row_ holds this call's layer row
  for (size_t v = 0; v < tiers_.size(); ++v) {
    const auto& units = tiers_[v];
    TierMassMean& acc = prompt ? prompt_[v] : decode_[v];
    auto add = [&](const float* row, const std::vector<Tier>& t) {
      double w = 0.0;
      for (int64_t p = 0; p < n_keys; ++p) w += row[p];
      acc.add(mass_by_tier(row, n_keys, t), w);
    };
    if (units.size() == size_t(nl_) * h_) {  // per (layer, KV head); also per layer when h = 1
      for (int h = 0; h < h_; ++h) add(probs + size_t(h) * n_keys, units[size_t(layer) * h_ + h]);
    } else if (units.size() == size_t(nl_)) {  // per layer: its KV heads' rows summed
      if (!summed) {
        layer_row_.assign(size_t(n_keys), 0.0f);
        for (int h = 0; h < h_; ++h)
          for (int64_t p = 0; p < n_keys; ++p) layer_row_[size_t(p)] += probs[h * n_keys + p];
        summed = true;
      }
      add(layer_row_.data(), units[size_t(layer)]);
    }
  }
}

std::optional<TurnMass> FullKvTurnMass::result(size_t v) const {
  if (v >= tiers_.size() || prompt_[v].weight() <= 0.0) return std::nullopt;
  return TurnMass{prompt_[v].mean(), TierMassMean::mean_of(prompt_[v], decode_[v])};
}

void OwnTurnMass::on_tier_mass(int layer, int64_t n_keys, const double* mass) {
  (void)layer;
  const TierMass m{mass[int(Tier::kFull)], mass[int(Tier::kQuant)], mass[int(Tier::kEvicted)],
                   mass[int(Tier::kLocal)]};
  const double w = m.full + m.quant + m.evicted + m.local;
  if (w <= 0.0) return;
  (n_keys <= prompt_end_ ? prompt_ : decode_).add(m.scaled(1.0 / w), w);
}

std::optional<TurnMass> OwnTurnMass::result() const {
  if (prompt_.weight() <= 0.0) return std::nullopt;
  return TurnMass{prompt_.mean(), TierMassMean::mean_of(prompt_, decode_)};
}

namespace {

// Six decimals: the shares are sums of f32 probabilities.
double round6(double x) { return std::round(x * 1e6) / 1e6; }

nlohmann::json shares_json(const TierMass& m) {
  return {{"L", round6(m.local)},
          {"F", round6(m.full)},
          {"Q", round6(m.quant)},
          {"E", round6(m.evicted)}};
}

}  // namespace

nlohmann::json turn_mass_json(const TurnMass& m) {
  return {{"prompt", shares_json(m.prompt)}, {"turn", shares_json(m.turn)}};
}

}  // namespace qevict::eval
