// The KVQuant cache (kvcache/quantizers/kvquant_policy.h has the rule): every token kept, each
// quantized as it arrives with the model's calibration (KvCacheParams::kvquant_calib, one entry
// per layer; engine/kvquant_calibration.h makes it). Per layer: the first `first_fp16` tokens in
// f16 (post-RoPE, as FullKV keeps them), then per token the packed codes of the pre-RoPE key (the
// cache rotates the model's post-RoPE key back first) and of the value, the value's f16 offset
// and range, and the outliers of both as (channel, f16 value) pairs with a count per token.
// Storage grows with the tokens in steps of 64, so bytes held are the real bytes of what is
// stored (kvquant_layer_bytes) plus scratch.
//
// Attention (reference path, as KiviKvCache): one layer decoded into an f16 scratch, keys
// rotated at their positions by a RopeTable of fixed size, and the shared block loop over it. As
// in the reference's simulated quantization (quantization on the k_proj / v_proj outputs), a
// token's own key and value are quantized before it attends.
//
// --kv-trace DIR (a directory): the prompt's pre-RoPE keys and values, as quantized, are also
// kept (only then) and dumped with what the rule made of them at end_prompt() (dump_prompt;
// tools/faithfulness/kvquant_numpy.py reads them).
#pragma once

#include <string>
#include <vector>

#include "kernels/rope.h"
#include "kvcache/dense_scratch.h"
#include "kvcache/kv_cache.h"
#include "kvcache/params.h"
#include "kvcache/quantizers/kvquant_policy.h"

namespace qevict {

// The kvquant registry row's cache: KvQuantConfig from params.quant (bits, outlier share,
// f16 first tokens) and the calibration it carries, checked against the shape.
Expected<std::unique_ptr<SequenceKvCache>> make_kvquant_cache(const KvShape& shape, int64_t n_ctx,
                                                              const KvCacheParams& p);

class KvQuantCache final : public SequenceKvCache {
 public:
  // `cal` has shape.n_layers entries with kv_width thresholds and 2^bits levels (the factory
  // checks).
  // `dump_dir` non-empty: dump the prompt there at end_prompt().
  KvQuantCache(const KvShape& shape, int64_t n_ctx, const KvQuantConfig& c,
               std::shared_ptr<const std::vector<KvQuantLayerCalib>> cal,
               std::string dump_dir = {});

  int64_t n_past() const override { return n_past_; }
  int64_t n_ctx() const override { return n_ctx_; }
  Status begin(int64_t n_new) override;
  void attend(int layer, const float* q, const float* k, const float* v, float* out,
              ThreadPool& pool) override;
  Status commit() override;
  Status end_prompt() override;
  bool prefill_keeps_everything() const override { return false; }
  void clear() override;
  size_t bytes_held() const override;
  std::string describe() const override;
  void report(KvReport* out, ReportDetail detail) const override;

  const KvQuantConfig& config() const { return c_; }
  // What layer l stores (no scratch): equals kvquant_layer_bytes for its tokens and outliers.
  size_t layer_bytes(int l) const;
  // Outliers (keys and values) layer l holds.
  int64_t layer_outliers(int l) const;
  // Every token layer l stores decoded (during a call, after attend(l): the call's too),
  // f32 [n][kv_width]: keys post-RoPE (as attention reads them), values.
  // (Uses the attention scratch.)
  void export_layer(int l, std::vector<float>* k, std::vector<float>* v);
  // Writes, per layer l, f32 .npy files in `dir`: kvquant_L{l}_{k,v}_in [n][kv_width] (the
  // prompt's pre-RoPE keys and values as quantized; recorded only with a dump dir),
  // _{k,v}_codes [n − first][kv_width] (unpacked; an outlier's place holds the level nearest
  // 0), _v_par [n − first][2] (offset, range), _{k,v}_deq [n][kv_width] (decoded: keys
  // pre-RoPE, the first tokens as stored), _{k,v}_out [outliers][3] (token, channel,
  // value), _calib_k [2][kv_width] (upper, lower), _calib_lut [2][2^bits] (keys, values); and
  // kvquant_meta.json.
  Status dump_prompt(const std::string& dir) const;

 private:
  struct Layer {
    std::vector<uint16_t> k_first, v_first;  // f16 [min(n, first_fp16)][kv_width], post-RoPE
    std::vector<uint8_t> k_codes, v_codes;   // [m][kvq_row_bytes] (m = tokens after the first)
    std::vector<uint16_t> v_par;             // f16 [m][2]: offset, range
    std::vector<uint16_t> k_cnt, v_cnt;      // [m] outliers per token
    std::vector<KvqOutlier> k_out, v_out;    // in token order
  };
  // Decodes the n stored tokens of L into scr_ (keys rotated at their positions).
  void decode_layer(int layer, int64_t n, ThreadPool* pool);

  KvShape shape_;
  int64_t n_ctx_;
  KvQuantConfig c_;
  std::shared_ptr<const std::vector<KvQuantLayerCalib>> cal_;
  RopeTable rope_;
  int64_t n_past_ = 0, n_new_ = 0;
  std::vector<Layer> layers_;
  DenseLayerScratch scr_;
  std::vector<float> row_, cs_, vscr_;  // one token's row, cos/sin, value scratch
  std::vector<size_t> out_at_;  // decode_layer: where each token's key / value outliers start
  size_t peak_ = 0;
  std::string dump_dir_;  // --kv-trace: dump the prompt here at end_prompt()
  bool dumped_ = false;
  // Only with a dump dir, until the dump: the prompt's inputs per layer, f32 [n][kv_width]
  // (keys pre-RoPE).
  std::vector<std::vector<float>> k_in_, v_in_;
};

}  // namespace qevict
