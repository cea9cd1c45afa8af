// Internals shared by the diagnose runner's files (runner, metrics, oracle, report): the
// recorded FullKV attention, each variant's state and its tier snapshots at routing events.
#pragma once

#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "eval/diagnose.h"
#include "eval/metrics.h"
#include "kvcache/full_cache.h"
#include "kvcache/kv_cache.h"

namespace qevict::eval::detail {

using json = nlohmann::json;

// FullKV's attention: prompt queries summed per position, decode steps one row per step.
class Recorder final : public AttentionObserver {
 public:
  Recorder(int n_layers, int n_kv_heads, int64_t n_ctx)
      : nl_(n_layers),
        h_(n_kv_heads),
        n_ctx_(n_ctx),
        prefill_(size_t(n_layers) * n_ctx, 0.0),
        step_(size_t(n_layers)) {}
  void on_attention(int layer, int64_t n_keys, const float* probs) override {
    if (!decode_) {
      double* acc = prefill_.data() + size_t(layer) * n_ctx_;
      for (int h = 0; h < h_; ++h)
        for (int64_t p = 0; p < n_keys; ++p) acc[p] += double(probs[h * n_keys + p]) / h_;
      return;
    }
    step_[size_t(layer)].assign(probs, probs + size_t(h_) * n_keys);
    n_keys_ = n_keys;
  }
  void set_decode() { decode_ = true; }
  int64_t n_keys() const { return n_keys_; }
  // Step row of one KV head, or (head = -1) averaged over KV heads into `out`.
  const float* head_row(int layer, int h) const {
    return step_[size_t(layer)].data() + size_t(h) * n_keys_;
  }
  void avg_row(int layer, float* out) const {
    std::fill_n(out, n_keys_, 0.0f);
    for (int h = 0; h < h_; ++h) {
      const float* r = head_row(layer, h);
      for (int64_t p = 0; p < n_keys_; ++p) out[p] += r[p] / float(h_);
    }
  }
  const double* prefill_row(int layer) const { return prefill_.data() + size_t(layer) * n_ctx_; }

 private:
  int nl_, h_;
  int64_t n_ctx_;
  bool decode_ = false;
  std::vector<double> prefill_;           // [layer][n_ctx]
  std::vector<std::vector<float>> step_;  // [layer] -> [n_kv_heads][n_keys]
  int64_t n_keys_ = 0;
};

// Tiers and scores of one variant at a routing event.
struct Snapshot {
  int64_t n_past = 0;
  std::vector<std::vector<Tier>> windows;   // [unit] window tiers
  std::vector<std::vector<double>> scores;  // [layer] window scores (windowed caches)
  double ledger_bytes_per_layer = 0.0;      // ledger copies held by windows in F
  int64_t promotions = 0, demotions = 0;    // totals so far
};

struct Variant {
  std::string name;
  KvCacheParams params;
  std::unique_ptr<SequenceKvCache> cache;
  KvReport report;                    // the latest report (kTiers)
  bool windowed = false;              // a tiered cache (windows in F / Q / E)
  int sink = 0, unit = 1, units = 0;  // units: layers × (per-head ? KV heads : 1)
  bool per_head = false;
  std::vector<std::vector<Tier>> tiers;  // [unit] position tiers before the current step
  std::vector<float> logits;
  std::vector<double> fmm, fmm_q;
  TierMass mass;
  int64_t top1 = 0, compared = 0;
  double kl_sum = 0.0;
  int64_t last_events = 0;
  std::vector<Snapshot> snaps;
};

// Appends the variant's tiers and scores now (refreshes v.report).
void snapshot(Variant& v, int n_layers);

double mean_valid(const std::vector<double>& x);
json lir_json(const LirCounts& c);

// Σ of a position row over each window [sink + w·ω, sink + (w+1)·ω), w < n_windows.
template <typename T>
void window_sums(const T* row, int64_t n_pos, int sink, int omega, int64_t n_windows,
                 std::vector<double>* out) {
  out->assign(size_t(n_windows), 0.0);
  for (int64_t w = 0; w < n_windows; ++w)
    for (int64_t p = sink + w * omega; p < std::min<int64_t>(sink + (w + 1) * omega, n_pos); ++p)
      (*out)[size_t(w)] += double(row[p]);
}

// Every number of one variant (and its tier map on `map_layer`) from the recorded traces:
// hist f32 [gen][n_layers][n_ctx] is FullKV's head-averaged attention per decode step.
json variant_json(const Variant& v, const std::vector<float>& hist, const DiagnoseOptions& o,
                  int n_layers, int n_kv_heads, int64_t n_ctx, int map_layer);

// Oracle LIR in R3's geometry and F capacity (see diagnose_oracle.cpp).
json oracle_json(const Variant& r3, const Recorder& rec, const std::vector<float>& hist,
                 const DiagnoseOptions& o, int n_layers, int64_t n_ctx);

}  // namespace qevict::eval::detail
