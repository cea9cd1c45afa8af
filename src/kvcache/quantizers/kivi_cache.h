// The KIVI cache (kvcache/quantizers/kivi_policy.h has the rule): per layer, packed low-bit key
// groups (per channel over G tokens) and value tokens (per token over G channels) with f16
// scales and minimums, plus the f16 residuals of the recent keys and values. Storage grows as
// tokens arrive, so bytes held are the real bytes of codes, parameters and residuals
// (kivi_layer_bytes), plus attention scratch. Reference path: attention dequantizes one
// layer into an f16 scratch [n_kv_heads][tokens][head_dim] and runs the shared block loop
// (kernels/attention.h) over it — correct and simple, not fused; the scratch is one layer of
// f16 K/V, reused by every layer, and is counted in bytes_held (not in the byte point).
#pragma once

#include <vector>

#include "kvcache/dense_scratch.h"
#include "kvcache/kv_cache.h"
#include "kvcache/params.h"
#include "kvcache/quantizers/kivi_policy.h"
#include "kvcache/routing_schedule.h"

namespace qevict {

// What a KIVI cache holds for one layer, exported for tests and the faithfulness dump
// (tools/faithfulness/kivi_numpy.py). Codes unpacked, one byte each.
struct KiviLayerExport {
  int64_t n = 0, keys_quantized = 0, values_quantized = 0;
  // Keys: [keys_quantized][n_kv_heads][head_dim] codes; [groups][n_kv_heads][head_dim] f16
  // scales and minimums (group = keys_quantized / G).
  std::vector<uint8_t> k_codes;
  std::vector<uint16_t> k_scale, k_min;
  // Values: [values_quantized][n_kv_heads][head_dim] codes; [values_quantized][n_kv_heads]
  // [head_dim / G] f16 scales and minimums.
  std::vector<uint8_t> v_codes;
  std::vector<uint16_t> v_scale, v_min;
  // The f16 residuals: [n − keys_quantized][n_kv_heads][head_dim], [n − values_quantized]...
  std::vector<uint16_t> k_res, v_res;
};

// The kivi registry row's cache: KiviConfig from params.quant (bits, group, residual),
// validated against the shape.
Expected<std::unique_ptr<SequenceKvCache>> make_kivi_cache(const KvShape& shape, int64_t n_ctx,
                                                           const KvCacheParams& p);

class KiviKvCache final : public SequenceKvCache {
 public:
  // `p`: policy "kivi" after its registry defaults (bits, group = value_group, residual =
  // local, prefill_route); `c` validated against shape.head_dim by the factory.
  KiviKvCache(const KvShape& shape, int64_t n_ctx, const KvCacheParams& p, const KiviConfig& c);

  int64_t n_past() const override { return n_past_; }
  int64_t n_ctx() const override { return n_ctx_; }
  Status begin(int64_t n_new) override;
  void attend(int layer, const float* q, const float* k, const float* v, float* out,
              ThreadPool& pool) override;
  Status commit() override;
  Status end_prompt() override;
  bool prefill_keeps_everything() const override { return sched_.defers_prompt(); }
  // A deferred prompt (--prefill-route end) is only stored until end_prompt(): a shared
  // prefill hands it over without attention (append_prompt: the same state as attend()).
  PromptReplay prompt_replay() const override {
    return sched_.defers_prompt() ? PromptReplay::kStore : PromptReplay::kAttend;
  }
  void append_prompt(int layer, const float* q, const float* k, const float* v,
                     const PromptExtras& x) override;
  void clear() override;
  size_t bytes_held() const override;
  std::string describe() const override;
  void report(KvReport* out, ReportDetail detail) const override;

  const KiviConfig& config() const { return c_; }
  // The stored bytes of layer l (codes, parameters, residuals; no scratch): equals
  // kivi_layer_bytes(config(), n, ...) once the rule has been applied.
  size_t layer_bytes(int l) const;
  KiviLayerExport export_layer(int l) const;
  // Writes, for every layer, the prompt's f16 keys/values (the quantizer's inputs) and what
  // the rule made of them, as f32 .npy files in `dir` (tools/faithfulness/kivi_numpy.py reads
  // them): kivi_L{l}_{k,v}_in [n][kv_width], _{k,v}_codes [tokens quantized][kv_width],
  // _k_{scale,min} [key groups][kv_width], _v_{scale,min} [values quantized][kv_width / G],
  // and kivi_meta.json. Called by end_prompt() when the cache was made with --kv-trace DIR
  // (which needs --prefill-route end: the prompt is still all f16 there).
  Status dump_prompt(const std::string& dir) const;

 private:
  struct Layer {
    // [key group][n_kv_heads][head_dim] {f16 scale, f16 min, G·b/8 bytes of codes (token i of
    // the group at bit i·b)}: key_group_bytes · n_kv_heads per group.
    std::vector<uint8_t> k_groups;
    // [token][n_kv_heads][head_dim / G] {f16 scale, f16 min, G·b/8 bytes of codes}.
    std::vector<uint8_t> v_tokens;
    std::vector<uint16_t> k_res;  // f16 [n − kq][n_kv_heads][head_dim]
    std::vector<uint16_t> v_res;  // f16 [n − vq][n_kv_heads][head_dim]
    int64_t kq = 0, vq = 0;       // tokens whose keys / values are quantized
  };
  // Applies the rule to layer l holding n tokens: quantizes residual keys while n − kq ≥ R
  // (R at a time) and residual values beyond the newest R.
  void apply_rule(Layer& L, int64_t n);
  void dequantize_layer(const Layer& L, int64_t n, ThreadPool* pool);  // into scr_
  // attend()'s steps before and after its attention (append_prompt() runs both).
  void store_new(int layer, const float* k, const float* v, ThreadPool* pool);
  void apply_rule_after_call(int layer);
  // Grows v to hold `size` elements in steps of kGrowTokens tokens (bounded slack: at most
  // kGrowTokens tokens' codes beyond what is stored).
  template <class T>
  void grow(std::vector<T>& v, size_t size, size_t per_token);

  static constexpr int64_t kGrowTokens = 64;
  KvShape shape_;
  int64_t n_ctx_;
  KiviConfig c_;
  HalfType dtype_ = HalfType::kF16;  // residuals and scratch are f16 (the reference's dtype)
  // --prefill-route end: the prompt is stored, not quantized, until its end (pending).
  RoutingSchedule sched_;
  int64_t n_past_ = 0, n_new_ = 0;
  std::vector<Layer> layers_;
  DenseLayerScratch scr_;       // one layer dequantized, for attention
  std::vector<uint8_t> codes_;  // one group's codes before packing
  std::string dump_dir_;        // --kv-trace: dump the prompt's quantization here
  size_t peak_ = 0;
  int64_t quantized_groups_ = 0;  // key groups + value groups quantized so far (all layers)
};

}  // namespace qevict
