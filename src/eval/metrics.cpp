// Diagnostics metrics (see metrics.h).
#include "eval/metrics.h"

#include <algorithm>
#include <cmath>
#include <numeric>

namespace qevict::eval {

TierMass& TierMass::operator+=(const TierMass& o) {
  full += o.full;
  quant += o.quant;
  evicted += o.evicted;
  local += o.local;
  return *this;
}

TierMass TierMass::scaled(double s) const {
  return TierMass{full * s, quant * s, evicted * s, local * s};
}

TierMass mass_by_tier(const float* attn, int64_t n, const std::vector<Tier>& tiers) {
  TierMass m;
  double total = 0.0;
  for (int64_t p = 0; p < n; ++p) {
    const double a = attn[p];
    total += a;
    const Tier t = p < int64_t(tiers.size()) ? tiers[size_t(p)] : Tier::kLocal;
    switch (t) {
      case Tier::kFull:
        m.full += a;
        break;
      case Tier::kQuant:
        m.quant += a;
        break;
      case Tier::kEvicted:
        m.evicted += a;
        break;
      case Tier::kLocal:
        m.local += a;
        break;
    }
  }
  return total > 0.0 ? m.scaled(1.0 / total) : TierMass{};
}

std::vector<Tier> window_tiers(const std::vector<Tier>& positions, int sink, int omega) {
  std::vector<Tier> w;
  if (omega < 1 || sink < 0) return w;
  for (int64_t p = sink; p < int64_t(positions.size()); p += omega) w.push_back(positions[p]);
  return w;
}

double jaccard_distance(const std::vector<Tier>& a, const std::vector<Tier>& b, KeepSet keep,
                        bool common_only) {
  auto kept = [&](Tier t) {
    return t == Tier::kFull || (keep == KeepSet::kFullOrQuant && t == Tier::kQuant);
  };
  const size_t n = std::max(a.size(), b.size());
  int64_t inter = 0, uni = 0;
  for (size_t w = 0; w < n; ++w) {
    const Tier ta = w < a.size() ? a[w] : Tier::kLocal;
    const Tier tb = w < b.size() ? b[w] : Tier::kLocal;
    if (common_only && (ta == Tier::kLocal || tb == Tier::kLocal)) continue;
    const bool ka = kept(ta), kb = kept(tb);
    inter += ka && kb;
    uni += ka || kb;
  }
  return uni > 0 ? 1.0 - double(inter) / double(uni) : -1.0;
}

LirCounts& LirCounts::operator+=(const LirCounts& o) {
  windows += o.windows;
  left += o.left;
  returned += o.returned;
  return *this;
}

LirCounts lir_counts(const std::vector<std::vector<uint8_t>>& in_full) {
  size_t n = 0;
  for (const auto& row : in_full) n = std::max(n, row.size());
  LirCounts c;
  for (size_t w = 0; w < n; ++w) {
    bool seen = false, left = false, returned = false, prev = false;
    for (const auto& row : in_full) {
      const bool in = w < row.size() && row[w] != 0;
      if (in && !seen) seen = true;
      if (prev && !in) left = true;
      if (in && left) returned = true;
      prev = in;
    }
    c.windows += seen;
    c.left += left;
    c.returned += returned;
  }
  return c;
}

std::vector<uint8_t> top_k_membership(const std::vector<double>& score, int64_t n_candidates,
                                      int64_t k) {
  n_candidates = std::min<int64_t>(n_candidates, int64_t(score.size()));
  std::vector<int64_t> order(size_t(std::max<int64_t>(n_candidates, 0)));
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(), [&](int64_t a, int64_t b) {
    if (score[a] != score[b]) return score[a] > score[b];
    return a < b;
  });
  std::vector<uint8_t> in(order.size(), 0);
  for (int64_t i = 0; i < std::min<int64_t>(k, int64_t(order.size())); ++i) in[order[i]] = 1;
  return in;
}

double cosine(const std::vector<double>& a, const std::vector<double>& b) {
  if (a.size() != b.size()) return -2.0;
  double ab = 0.0, aa = 0.0, bb = 0.0;
  for (size_t i = 0; i < a.size(); ++i) {
    ab += a[i] * b[i];
    aa += a[i] * a[i];
    bb += b[i] * b[i];
  }
  if (aa <= 0.0 || bb <= 0.0) return -2.0;
  return ab / std::sqrt(aa * bb);
}

}  // namespace qevict::eval
