// FullKV: every token's key/value kept in 16-bit floats (f16 default, bf16 selectable), in
// pages of kPageTokens tokens allocated as the sequence grows (real bytes = pages held).
// Attention splits keys by page and merges partial softmax states (flash-decoding), so
// decode uses every thread even with few KV heads.
#pragma once

#include <vector>

#include "kvcache/kv_cache.h"

namespace qevict {

class FullKvCache final : public SequenceKvCache {
 public:
  static constexpr int64_t kPageTokens = 256;

  FullKvCache(const KvShape& shape, int64_t n_ctx, HalfType dtype = HalfType::kF16);

  int64_t n_past() const override { return n_past_; }
  int64_t n_ctx() const override { return n_ctx_; }
  Status begin(int64_t n_new) override;
  void attend(int layer, const float* q, const float* k, const float* v, float* out,
              ThreadPool& pool) override;
  void commit() override;
  void clear() override;
  size_t bytes_held() const override;
  std::string describe() const override;
  Status set_attention_observer(AttentionObserver* observer) override {
    observer_ = observer;
    return Status::ok();
  }

 private:
  // One page: K and V of kPageTokens tokens for every KV head of one layer,
  // each half [n_kv_heads][kPageTokens][head_dim].
  struct Page {
    std::vector<uint16_t> k, v;
  };
  uint16_t* k_at(int layer, int64_t pos, int kv_head);
  uint16_t* v_at(int layer, int64_t pos, int kv_head);
  // Second pass for the observer: materialized probabilities of this call's queries.
  void observe(int layer, const float* q, ThreadPool& pool);

  KvShape shape_;
  int64_t n_ctx_;
  HalfType dtype_;
  int64_t n_past_ = 0;
  int64_t n_new_ = 0;
  std::vector<std::vector<Page>> pages_;  // [layer][page]
  std::vector<float> partial_;            // per-task softmax partial states (scratch)
  AttentionObserver* observer_ = nullptr;
  std::vector<float> probs_;  // f32 [n_kv_heads][n_keys] for the observer
};

}  // namespace qevict
