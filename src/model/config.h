// Model hyper-parameters read from GGUF metadata, for the llama family (llama, incl.
// SmolLM2 / Llama-3 / Mistral) and qwen2. Plain data plus validation.
#pragma once

#include <string>

#include "core/status.h"
#include "gguf/gguf.h"
#include "kernels/rope.h"

namespace qevict {

struct ModelConfig {
  std::string arch;        // "llama" | "qwen2"
  std::string name;        // general.name
  int n_layers = 0;        // {arch}.block_count
  int n_embd = 0;          // {arch}.embedding_length
  int n_ff = 0;            // {arch}.feed_forward_length
  int n_heads = 0;         // {arch}.attention.head_count
  int n_kv_heads = 0;      // {arch}.attention.head_count_kv (defaults to n_heads)
  int head_dim = 0;        // {arch}.attention.key_length, else n_embd / n_heads
  int n_vocab = 0;         // {arch}.vocab_size, else the token list's length
  int n_ctx_train = 0;     // {arch}.context_length
  float norm_eps = 1e-5f;  // {arch}.attention.layer_norm_rms_epsilon
  RopeParams rope;         // {arch}.rope.{freq_base,dimension_count,scaling.*}
  bool qkv_bias = false;   // qwen2: Q/K/V projections carry a bias

  static Expected<ModelConfig> from_gguf(const GgufFile& f);
  Status validate() const;
};

}  // namespace qevict
