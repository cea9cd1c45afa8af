// KIVI's rule (Liu et al., ICML 2024, arXiv 2402.02750; jy-yuan/KIVI@876b4d2): which tokens'
// keys and values are quantized after n tokens, and the bytes that leaves. Keys are
// quantized per channel over groups of G consecutive tokens, values per token over groups of
// G channels (quant/new_pack.py:L217-252 with the [H, D, T] key transpose of
// models/llama_kivi.py:L204); an f16 residual keeps the recent tokens:
//   prefill (llama_kivi.py:L193-220): keys [0, n − n mod R) quantized, values [0, n − R);
//   decode: the key residual is quantized all at once when it reaches R tokens (L131-142),
//   the oldest residual value each time a new one makes it R + 1 (L174-185).
// Both leave the same state as a function of n alone — keys n − n mod R, values
// max(0, n − R) — so the cache applies these two counts after every call's attention (which,
// as in the reference, reads the new tokens in f16). Defaults: KIVI's LongBench runs
// (docs/long_bench.md:L7,L30): G = 32, R = 128; bits 2 or 4 (KIVI-2 / KIVI-4).
// There is no budget to meet: the bytes follow from (b, G, R) and n (kivi_layer_bytes).
#pragma once

#include <cstddef>
#include <cstdint>

#include "core/status.h"

namespace qevict {

struct KiviConfig {
  int bits = 2;        // b: 2 or 4, keys and values alike (k_bits = v_bits in the LongBench runs)
  int group = 32;      // G: tokens per key group, channels per value group
  int residual = 128;  // R: f16 recent tokens (R mod G = 0, llama_kivi.py:L132)

  Status validate(int head_dim) const;
  // Tokens whose keys / values are quantized after n tokens.
  int64_t keys_quantized(int64_t n) const { return n - n % residual; }
  int64_t values_quantized(int64_t n) const { return n > residual ? n - residual : 0; }
  // Bytes of one key group (G tokens, one KV head): per channel an f16 scale, an f16 min and
  // G·b/8 bytes of codes.
  size_t key_group_bytes(int head_dim) const {
    return size_t(head_dim) * (4 + size_t(group) * bits / 8);
  }
  // Bytes of one token's quantized value (one KV head): per group of G channels an f16 scale
  // and min, plus head_dim·b/8 bytes of codes.
  size_t value_token_bytes(int head_dim) const {
    return size_t(head_dim / group) * 4 + size_t(head_dim) * bits / 8;
  }
};

// The bytes KIVI holds for one layer after n tokens: quantized keys and values plus the f16
// residuals (2 bytes per element), for n_kv_heads heads of head_dim. BASELINES.md: for
// D = 128, G = 32: 96 B per token and head at b = 2 (K 48 + V 48), 160 B at b = 4.
size_t kivi_layer_bytes(const KiviConfig& c, int64_t n, int n_kv_heads, int head_dim);

}  // namespace qevict
