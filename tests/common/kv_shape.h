// Test helper: the small model shape most cache tests run on — RoPE over every channel of a
// head (the shape's default style), frequency base 10^4.
#pragma once

#include "kvcache/shape.h"

namespace qevict::test {

inline KvShape rope_shape(int n_layers, int n_q_heads, int n_kv_heads, int head_dim) {
  KvShape s;
  s.n_layers = n_layers;
  s.n_q_heads = n_q_heads;
  s.n_kv_heads = n_kv_heads;
  s.head_dim = head_dim;
  s.rope.n_rot = head_dim;
  s.rope.freq_base = 10000.0f;
  return s;
}

}  // namespace qevict::test
