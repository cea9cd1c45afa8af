// A llama-family transformer loaded from GGUF (weights stay memory-mapped, quantized) and
// its forward pass: batched over several sequences, chunked prefill or one-token decode,
// attention delegated to each sequence's KV cache.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "core/status.h"
#include "core/thread_pool.h"
#include "gguf/gguf.h"
#include "kernels/matmul.h"
#include "kvcache/kv_cache.h"
#include "model/config.h"

namespace qevict {

struct LayerWeights {
  const float* attn_norm = nullptr;  // F32 [n_embd]
  WeightView wq;                     // [n_heads*head_dim rows][n_embd]
  WeightView wk, wv;                 // [n_kv_heads*head_dim rows][n_embd]
  WeightView wo;                     // [n_embd rows][n_heads*head_dim]
  const float* bq = nullptr;         // F32 [n_heads*head_dim] (qwen2), else null
  const float* bk = nullptr;         // F32 [n_kv_heads*head_dim]
  const float* bv = nullptr;
  const float* ffn_norm = nullptr;  // F32 [n_embd]
  WeightView w_gate, w_up;          // [n_ff rows][n_embd]
  WeightView w_down;                // [n_embd rows][n_ff]
};

// One sequence's part of a batch: its tokens are appended to its cache.
struct BatchSegment {
  SequenceKvCache* cache = nullptr;
  const int32_t* tokens = nullptr;
  int64_t n_tokens = 0;
  // Logits wanted: all positions of the segment (perplexity) or only the last one.
  bool all_logits = false;
  // Output: f32 [n_out][n_vocab] with n_out = all_logits ? n_tokens : 1. May be null.
  float* logits = nullptr;
};

class Model {
 public:
  static Expected<std::unique_ptr<Model>> load(const std::string& path);

  const ModelConfig& config() const { return config_; }
  const GgufFile& gguf() const { return *file_; }
  KvShape kv_shape() const;

  // Runs the transformer over every segment's tokens (all segments in one batch; each
  // cache's begin/attend/commit is called). On error nothing is committed to any cache.
  Status forward(std::vector<BatchSegment>& segments, ThreadPool& pool);

 private:
  Model() = default;
  Status bind_weights();
  Expected<WeightView> weight(const std::string& name, int64_t n_cols, int64_t n_rows) const;
  Expected<const float*> vector_f32(const std::string& name, int64_t n, bool optional);
  void embed(int32_t token, float* out) const;

  std::shared_ptr<GgufFile> file_;
  ModelConfig config_;
  WeightView tok_embd_;
  WeightView output_;
  const float* output_norm_ = nullptr;
  std::vector<LayerWeights> layers_;
  OutputProjection wo_;  // every layer's W_O, bound to the caches (value-norm policies)
  std::vector<std::unique_ptr<std::vector<float>>> owned_;  // dequantized 1-D tensors

  // Scratch for forward(), grown on demand. Shapes for N batch tokens:
  std::vector<float> x_;          // [N][n_embd] residual stream
  std::vector<float> xn_;         // [N][n_embd] normalized input
  std::vector<float> qkv_;        // [N][q_width + 2*kv_width]
  std::vector<float> q_, k_, v_;  // [N][q_width], [N][kv_width] x2
  std::vector<float> attn_;       // [N][q_width]
  std::vector<float> tmp_;        // [N][n_embd]
  std::vector<float> gu_;         // [N][2*n_ff] gate | up
  std::vector<float> h_;          // [N][n_ff]
  std::vector<float> rope_cs_;    // [N][n_rot] cos | sin per token
  std::vector<float> head_x_;     // [<=16][n_embd] one-row segments' normalized rows
  std::vector<float> head_y_;     // [<=16][n_vocab] their logits
};

}  // namespace qevict
