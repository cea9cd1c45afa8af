// The ZipCache cache (kvcache/quantizers/zipcache_policy.h has the rule): per layer, the
// quantized tokens as two sets (important at 4 bits, unimportant at 2) of keys and values with
// their f16 parameters and per-head token lists, plus an f16 buffer of the tokens added since
// the last quantization. Storage follows the tokens, so bytes held are the real bytes of
// codes, parameters, lists and buffer, plus scratch.
//
// Prompt: every multi-token call is prompt; its tokens stay in the f16 buffer and the cache
// attends over them exactly until end_prompt() (or the first decode step), which scores them
// with the probes and quantizes the whole layer (--prefill-route end, the default: the
// reference's one prefill pass). With --prefill-route chunk each prompt chunk gets that rule
// when it is committed, probed by its own last and random queries. While a prompt is read, the
// probe queries are kept: the query rows of the positions that can still fall in the prompt's last
// 5 % (f16, about 5 % of the prompt's rows per layer) — a random probe that leaves that range is
// scored at once into a per-token saliency vector. Both are freed when the prompt ends. Attention
// (reference path, as KiviKvCache): one layer dequantized into an f16 scratch and the shared block
// loop over it; the scratch is reused by every layer and counted in bytes_held.
#pragma once

#include <string>
#include <vector>

#include "kvcache/dense_scratch.h"
#include "kvcache/kv_cache.h"
#include "kvcache/params.h"
#include "kvcache/quantizers/zipcache_policy.h"
#include "kvcache/routing_schedule.h"

namespace qevict {

// What a ZipCache layer holds, for tests: the token lists per KV head and every stored token's
// dequantized key and value ([n][kv_width], f32; buffered tokens as stored in f16).
struct ZipLayerExport {
  int64_t n = 0, quantized = 0;
  std::vector<std::vector<int32_t>> important, unimportant;  // [n_kv_heads][...]
  std::vector<float> k, v;
};

// The zipcache registry row's cache: ZipCacheConfig from params.quant (low bits, low-bit
// share, requantization gap).
Expected<std::unique_ptr<SequenceKvCache>> make_zipcache_cache(const KvShape& shape, int64_t n_ctx,
                                                               const KvCacheParams& p);

class ZipKvCache final : public SequenceKvCache {
 public:
  ZipKvCache(const KvShape& shape, int64_t n_ctx, const KvCacheParams& p, const ZipCacheConfig& c);

  int64_t n_past() const override { return n_past_; }
  int64_t n_ctx() const override { return n_ctx_; }
  Status begin(int64_t n_new) override;
  void attend(int layer, const float* q, const float* k, const float* v, float* out,
              ThreadPool& pool) override;
  Status commit() override;
  Status end_prompt() override;
  bool prefill_keeps_everything() const override { return sched_.defers_prompt(); }
  // A prompt held to its end is only buffered and probed until end_prompt(): a shared
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

  const ZipCacheConfig& config() const { return c_; }
  // Codes, parameters, lists and buffer of layer l (no scratch, no probes): equals
  // zipcache_layer_bytes(config(), ...) for its set sizes.
  size_t layer_bytes(int l) const;
  ZipLayerExport export_layer(int l) const;

  // --kv-trace DIR: at the end of the first prompt, writes per layer l the rule's inputs and
  // result as float32 .npy files zip_L{l}_*.npy (k_in, v_in: the prompt's post-RoPE keys and
  // values as buffered, f16 values; q: every prompt query row; probe_pos: the probe positions; imp,
  // unimp: [n_kv_heads][...] token lists in row order; for each set s of imp / unimp: k_codes_s,
  // v_codes_s unpacked [rows][kv_width], k_min_s, k_step_s [1][kv_width], v_rmin_s, v_rstep_s
  // [rows][1]; v_scale [1][kv_width]) and zip_meta.json; for tools/faithfulness/zipcache_numpy.py.
  // While dumping, every prompt query row is kept.
  Status dump_prompt(const std::vector<std::vector<float>>& k_in,
                     const std::vector<std::vector<float>>& v_in) const;

 private:
  struct Layer {
    int64_t nq = 0;                                // tokens [0, nq) quantized
    std::vector<std::vector<int32_t>> imp, unimp;  // per KV head, in row order
    ZipSet k_imp, k_unimp, v_imp, v_unimp;
    std::vector<uint16_t> v_scale;       // f16 [kv_width]: the values' column scales
    std::vector<uint16_t> k_buf, v_buf;  // f16 [n − nq][kv_width]
    // While a prompt is pending (tokens [nq, n)): query rows (f16 [q_width]) of the positions
    // from ring_pos0 on, and the saliency the random probes before it gave, per pending token
    // and KV head ([n − nq][n_kv_heads]).
    std::vector<uint16_t> ring;
    int64_t ring_pos0 = 0;
    std::vector<float> saliency;
  };
  void dequantize_layer(const Layer& L, int64_t n, ThreadPool* pool);  // into scr_
  // attend()'s steps before and after its attention (append_prompt() runs both).
  void store_new(int layer, const float* k, const float* v, ThreadPool* pool);
  void after_call(int layer, const float* q);
  // Adds the causal softmax (f32) of the query row q (f32 [q_width]) at position pos, summed
  // over each KV head's query heads, to sal[(t − t0) · n_kv_heads + h] for t in [t0, pos];
  // reads the keys of the scratch, which holds n tokens.
  void add_probe(const float* q, int64_t pos, int64_t n, int64_t t0, float* sal);
  // Drops ring rows that can no longer be among the prompt's last probes (scoring the random
  // probes among them).
  void advance_ring(int layer, Layer& L, int64_t n);
  // Extends the sets with tokens [nq, n): per KV head the k least salient (sal[h · m + i]) are
  // unimportant; then quantizes every token again from the scratch.
  void requantize(Layer& L, int64_t n, const std::vector<float>& sal);

  KvShape shape_;
  int64_t n_ctx_;
  ZipCacheConfig c_;
  HalfType dtype_ = HalfType::kF16;
  // --prefill-route chunk: the rule after every prompt chunk; end: once, at the prompt's end.
  RoutingSchedule sched_;
  int64_t n_past_ = 0, n_new_ = 0;
  std::vector<Layer> layers_;
  DenseLayerScratch scr_;             // one layer dequantized, for attention and requantizing
  std::vector<float> rows_, logits_;  // quantizer input, one probe's logits
  size_t peak_ = 0;
  int64_t requantizations_ = 0;
  std::string dump_dir_;                    // --kv-trace
  bool dumped_ = false;                     // only the first prompt is dumped
  std::vector<std::vector<float>> dump_q_;  // while dumping: per layer, every prompt query row
};

}  // namespace qevict
