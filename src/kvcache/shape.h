// The shape of what a sequence's KV cache stores (plain data, from the model config).
#pragma once

#include <cstddef>
#include <cstdint>

#include "core/status.h"
#include "kernels/rope.h"

namespace qevict {

// What one sequence's cache stores per layer (plain data, from the model config).
struct KvShape {
  int n_layers = 0;
  int n_q_heads = 0;
  int n_kv_heads = 0;  // GQA: n_q_heads / n_kv_heads query heads share one KV head
  int head_dim = 0;
  RopeParams rope;  // how keys were rotated (caches that re-rotate keys need it)

  int group() const { return n_q_heads / n_kv_heads; }
  // Bytes of one token's keys and values for all KV heads in a 16-bit type (f16 or bf16).
  size_t token_bytes() const { return size_t(2) * n_kv_heads * head_dim * sizeof(uint16_t); }
  int q_width() const { return n_q_heads * head_dim; }
  int kv_width() const { return n_kv_heads * head_dim; }
  Status validate() const;
};

}  // namespace qevict
