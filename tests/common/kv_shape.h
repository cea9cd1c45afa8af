// Test helpers: the small model shapes cache tests run on.
#pragma once

#include "kvcache/shape.h"

namespace qevict::test {

// No RoPE (n_rot = 0): keys arrive as they are stored, already rotated or never.
inline KvShape plain_shape(int n_layers, int n_q_heads, int n_kv_heads, int head_dim) {
  KvShape s;
  s.n_layers = n_layers;
  s.n_q_heads = n_q_heads;
  s.n_kv_heads = n_kv_heads;
  s.head_dim = head_dim;
  return s;
}

// RoPE over every channel of a head (the shape's default style), frequency base 10^4 unless
// given.
inline KvShape rope_shape(int n_layers, int n_q_heads, int n_kv_heads, int head_dim,
                          float freq_base = 10000.0f) {
  KvShape s = plain_shape(n_layers, n_q_heads, n_kv_heads, head_dim);
  s.rope.n_rot = head_dim;
  s.rope.freq_base = freq_base;
  return s;
}

}  // namespace qevict::test
