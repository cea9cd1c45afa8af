// FullKV: every token's key/value kept in 16-bit floats (f16 default, bf16 selectable), in
// pages of kPageTokens tokens allocated as the sequence grows (real bytes = pages held).
// Attention passes the pages to the shared block-attention loop (kernels/attention.h), which
// splits keys by page range and merges partial softmax states (flash-decoding), so decode
// uses every thread even with few KV heads.
#pragma once

#include <vector>

#include "kernels/attention.h"
#include "kvcache/kv_cache.h"

namespace qevict {

// Receives the attention FullKV computed (diagnostics, SPEC §8). For one attend() call:
//   probs f32 [n_kv_heads][n_keys], n_keys = positions [0, n_past + n_new): the probability
//   each position received, summed over the call's query tokens and averaged over the
//   query heads that share the KV head (so each row sums to the number of query tokens).
class AttentionObserver {
 public:
  virtual ~AttentionObserver() = default;
  virtual void on_attention(int layer, int64_t n_keys, const float* probs) = 0;
};

class FullKvCache final : public SequenceKvCache {
 public:
  static constexpr int64_t kPageTokens = 256;

  FullKvCache(const KvShape& shape, int64_t n_ctx, HalfType dtype = HalfType::kF16);

  int64_t n_past() const override { return n_past_; }
  int64_t n_ctx() const override { return n_ctx_; }
  Status begin(int64_t n_new) override;
  void attend(int layer, const float* q, const float* k, const float* v, float* out,
              ThreadPool& pool) override;
  Status commit() override;
  bool prefill_keeps_everything() const override { return true; }
  // Replay stores the tokens (unless an observer wants every call's attention).
  PromptReplay prompt_replay() const override {
    return observer_ ? PromptReplay::kAttend : PromptReplay::kStore;
  }
  void append_prompt(int layer, const float* q, const float* k, const float* v,
                     const PromptExtras& x) override;
  void clear() override;
  bool can_truncate(int64_t n) const override { return n >= 0 && n <= n_past_; }
  // Drops the tokens after n and gives back the pages past the last one kept.
  Status truncate(int64_t n) override;
  bool can_save_state() const override { return true; }
  Status save_state(ByteWriter& w) const override;
  Status load_state(ByteReader& r) override;
  size_t bytes_held() const override;
  std::string describe() const override;
  void report(KvReport* out, ReportDetail detail) const override;
  // Reports every attend() call's attention probabilities to `observer` (nullptr: stop, and
  // give back the buffers the reports used, so bytes_held() is a plain cache's again).
  // The probabilities are the masses of one-token blocks in the same attention pass.
  void set_attention_observer(AttentionObserver* observer);

 private:
  // One page: K and V of kPageTokens tokens for every KV head of one layer,
  // each half [n_kv_heads][kPageTokens][head_dim].
  struct Page {
    std::vector<uint16_t> k, v;
  };
  uint16_t* k_at(int layer, int64_t pos, int kv_head);
  uint16_t* v_at(int layer, int64_t pos, int kv_head);

  KvShape shape_;
  int64_t n_ctx_;
  HalfType dtype_;
  int64_t n_past_ = 0;
  int64_t n_new_ = 0;
  std::vector<std::vector<Page>> pages_;  // [layer][page]
  BlockAttnScratch attn_;
  std::vector<KvBlockRef> blocks_;  // [n_kv_heads][pages] (observer: [n_kv_heads][tokens])
  std::vector<int64_t> head_off_;
  AttentionObserver* observer_ = nullptr;
  std::vector<double> mass_;  // f64 [n_kv_heads][n_keys] for the observer
  std::vector<float> probs_;  // f32 [n_kv_heads][n_keys] for the observer
};

}  // namespace qevict
