// The paper's diagnostics (QEvict §3, SPEC §8) as plain functions over recorded traces:
// attention rows from FullKV and tier snapshots from a compressed cache. No model, no cache:
// every function here is checked against hand-computed answers in tests/eval.
#pragma once

#include <cstdint>
#include <vector>

#include "kvcache/tier.h"

namespace qevict::eval {

// Share of one attention row's mass on each tier. Positions past the end of `tiers` (the
// tokens of the current call) count as local.
struct TierMass {
  double full = 0.0, quant = 0.0, evicted = 0.0, local = 0.0;
  TierMass& operator+=(const TierMass& o);
  TierMass scaled(double s) const;
};

// attn f32 [n] (probabilities of one query, or summed over queries), tiers [m] with m <= n.
// Returns the mass on each tier divided by the row's total mass (all zero for a zero row).
TierMass mass_by_tier(const float* attn, int64_t n, const std::vector<Tier>& tiers);

// Tier of each routing unit (window) from position tiers: window w covers positions
// [sink + w·ω, sink + (w+1)·ω) and takes the tier of its first position. Positions that
// have not arrived give no window; the sink gives none. ω < 1 or sink < 0: no windows.
std::vector<Tier> window_tiers(const std::vector<Tier>& positions, int sink, int omega);

// Jaccard distance 1 − |A ∩ B| / |A ∪ B| between the windows that `keep` selects in two
// consecutive snapshots. Only windows routed (not kLocal) in both snapshots take part when
// common_only, so windows that merely aged in between do not count as churn. Returns -1
// when the union is empty.
enum class KeepSet { kFull, kFullOrQuant };
double jaccard_distance(const std::vector<Tier>& a, const std::vector<Tier>& b, KeepSet keep,
                        bool common_only);

// Global LIR (long-term importance recovery): over a sequence of membership snapshots of
// the full-precision set (in_full[e][w], shorter rows: windows not yet present), a window
// "left" when it was in the set at some event and not at a later one, and "returned" when it
// was in the set again after having left. lir = returned / left (-1 when nothing left).
// Rows only grow (window ids are stable): a window missing from a later row counts as out.
struct LirCounts {
  int64_t windows = 0;   // windows ever seen in the set
  int64_t left = 0;      // windows that left the set at least once
  int64_t returned = 0;  // of those, windows that re-entered it
  double lir() const { return left > 0 ? double(returned) / double(left) : -1.0; }
  LirCounts& operator+=(const LirCounts& o);
};
LirCounts lir_counts(const std::vector<std::vector<uint8_t>>& in_full);

// Membership of the top k windows by score among the first n_candidates (ties: older
// window first — the same rule as the online policy), as a 0/1 row of n_candidates.
// Scores must not be NaN.
std::vector<uint8_t> top_k_membership(const std::vector<double>& score, int64_t n_candidates,
                                      int64_t k);

// cos(a, b) = a·b / (|a| |b|); -2 when either vector is zero or the sizes differ.
double cosine(const std::vector<double>& a, const std::vector<double>& b);

}  // namespace qevict::eval
