// Shared prefill: one forward pass over a prompt serves several caches. A RecordingKvCache
// sits between the model and a source cache, passes every call through and keeps the
// queries, keys and values the model handed to each layer; replay() then feeds the same
// calls to another empty cache — begin, attend every layer, commit — so it ends in the
// state its own prefill would have reached, without running the model again.
//
// Exact only when the other cache, before end_prompt(), attends over every prompt token in
// full precision as the source does (SequenceKvCache::prefill_keeps_everything(): FullKV,
// and every policy with --prefill-route end): then each layer's attention output, and so the
// next layer's inputs, are what the model computed for the source. A cache that evicts or
// quantizes during prefill (--prefill-route chunk) would have seen other hidden states, so
// replay() refuses it. The two caches' kernels may still round differently (f16 pages vs
// windows): replay carries the source's activations, not the copy's own.
#pragma once

#include <cstdint>
#include <map>
#include <vector>

#include "core/status.h"
#include "core/thread_pool.h"
#include "kvcache/kv_cache.h"
#include "kvcache/shape.h"

namespace qevict {

struct BlockAttnScratch;

class RecordingKvCache final : public SequenceKvCache {
 public:
  // `inner` (not owned) must outlive this object.
  RecordingKvCache(SequenceKvCache* inner, const KvShape& shape);

  int64_t n_past() const override { return inner_->n_past(); }
  int64_t n_ctx() const override { return inner_->n_ctx(); }
  Status begin(int64_t n_new) override;
  void attend(int layer, const float* q, const float* k, const float* v, float* out,
              ThreadPool& pool) override;
  Status commit() override;
  Status end_prompt() override { return inner_->end_prompt(); }
  Status route() override { return inner_->route(); }
  void clear() override;
  size_t bytes_held() const override { return inner_->bytes_held(); }
  bool prefill_keeps_everything() const override { return inner_->prefill_keeps_everything(); }
  // Passed on, and kept for replay(): a target's routing at end_prompt() may read W_O
  // (CriticalKV) before any forward call of its own binds it.
  void set_output_projection(const OutputProjection* wo) override {
    wo_ = wo;
    inner_->set_output_projection(wo);
  }
  std::string describe() const override { return inner_->describe(); }
  void report(KvReport* out, ReportDetail detail) const override { inner_->report(out, detail); }

  // Tokens recorded (every committed call since construction or clear()).
  int64_t n_recorded() const { return n_recorded_; }
  // Bytes the recording holds: (q_width + 2 kv_width) f32 per token and layer.
  size_t recorded_bytes() const;

  // Feeds every recorded call to `dst`, which must be empty, hold the shape this recording
  // was made for, and keep every prompt token until end_prompt() (see the header comment).
  // Does not call dst->end_prompt(): the caller does, as after its own prefill. A cache that
  // needs no attention outputs (SequenceKvCache::prompt_replay()) gets its tokens without
  // attention, and the attention masses when it scores by them: computed on the first such
  // replay (one f16 attention pass over the recording; for an observation window of the last
  // N queries, one pass of those N) and kept for the next.
  Status replay(SequenceKvCache* dst, ThreadPool& pool);
  // Bytes the kept masses and value norms hold: f64 per (call, layer, KV head, position so
  // far), f32 per (layer, KV head, token).
  size_t mass_bytes() const;

 private:
  struct Call {
    int64_t n_new = 0;
    std::vector<float> q, k, v;  // f32 [n_layers][n_new][q_width or kv_width]
    // The replay masses (SequenceKvCache::append_prompt), once computed:
    // f64 [n_layers][n_kv_heads][n_past + n_new].
    std::vector<double> mass;
    // The new tokens' value norms (SequenceKvCache::PromptExtras), once computed:
    // f32 [n_layers][n_kv_heads][n_new].
    std::vector<float> nu;
  };
  // Fills every call's nu from the bound output projection (value_norm_rows).
  void compute_value_norms(ThreadPool& pool);
  // Fills every call's mass: causal f16 attention of its queries over every recorded token.
  void compute_masses(ThreadPool& pool);
  // The masses of the last `window` recorded queries over every recorded token, f64
  // [n_layers][n_kv_heads][n_recorded] (SequenceKvCache::prompt_mass_window), computed on first
  // use and kept.
  const std::vector<double>& window_masses(int64_t window, ThreadPool& pool);
  // Every recorded key and value in f16: half [n_layers][n_kv_heads][n_recorded][head_dim].
  void half_rows(std::vector<uint16_t>* kh, std::vector<uint16_t>* vh) const;
  // Layer's causal f16 attention masses of n_q queries at positions [n_past, n_past + n_q)
  // over the rows of half_rows(): f64 [n_kv_heads][n_past + n_q] into `mass`.
  void attend_masses(const std::vector<uint16_t>& kh, const std::vector<uint16_t>& vh, int layer,
                     const float* q, int64_t n_q, int64_t n_past, double* mass,
                     BlockAttnScratch& scratch, ThreadPool& pool) const;
  SequenceKvCache* inner_;
  KvShape shape_;
  std::vector<Call> calls_;
  int64_t n_recorded_ = 0;
  bool open_ = false;                                   // a call between begin() and commit()
  bool have_mass_ = false;                              // every call's mass is filled
  bool have_nu_ = false;                                // every call's nu is filled
  std::map<int64_t, std::vector<double>> window_mass_;  // by window (window_masses())
  const OutputProjection* wo_ = nullptr;
};

}  // namespace qevict
