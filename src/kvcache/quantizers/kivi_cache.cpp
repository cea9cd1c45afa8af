// The KIVI cache (see kivi_cache.h): storage, the rule applied after each call's attention,
// and attention over a dequantized scratch (reference path).
#include "kvcache/quantizers/kivi_cache.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstring>

#include "core/f16.h"
#include "core/npy.h"
#include "kernels/kivi_group.h"
#include "kvcache/quantizers/quantizer_params.h"

namespace qevict {

namespace {
uint16_t load_u16(const uint8_t* p) {
  uint16_t x;
  std::memcpy(&x, p, 2);
  return x;
}
void store_u16(uint8_t* p, uint16_t x) { std::memcpy(p, &x, 2); }
}  // namespace

KiviKvCache::KiviKvCache(const KvShape& shape, int64_t n_ctx, const KvCacheParams& p,
                         const KiviConfig& c)
    : shape_(shape),
      n_ctx_(n_ctx),
      c_(c),
      sched_(p.prefill_route, 1),
      layers_(size_t(shape.n_layers)),
      dump_dir_(p.trace_path) {}

template <class T>
void KiviKvCache::grow(std::vector<T>& v, size_t size, size_t per_token) {
  if (v.capacity() < size) v.reserve(size + size_t(kGrowTokens) * per_token);
}

Status KiviKvCache::begin(int64_t n_new) {
  QEVICT_RETURN_IF_ERROR(check_begin(n_past_, n_new, n_ctx_));
  // A decode step with the prompt still in f16 (no end_prompt()): the prompt's rule first.
  if (n_new == 1 && sched_.prompt_pending()) QEVICT_RETURN_IF_ERROR(end_prompt());
  n_new_ = n_new;
  return Status::ok();
}

void KiviKvCache::apply_rule(Layer& L, int64_t n) {
  const int hkv = shape_.n_kv_heads, d = shape_.head_dim, kvw = shape_.kv_width();
  const int G = c_.group, b = c_.bits;
  const size_t rec = 4 + size_t(G) * b / 8;  // one group: scale, min, codes
  codes_.resize(size_t(G));
  // Keys: whole groups of G tokens per channel (llama_kivi.py:L204 quantizes [H, D, T] along T).
  const int64_t kq = c_.keys_quantized(n);
  if (kq > L.kq) {
    const int64_t groups = (kq - L.kq) / G;
    const size_t group_bytes = size_t(hkv) * d * rec;
    size_t off = L.k_groups.size();
    grow(L.k_groups, off + size_t(groups) * group_bytes, group_bytes / size_t(G));
    L.k_groups.resize(off + size_t(groups) * group_bytes);
    for (int64_t g = 0; g < groups; ++g)
      for (int h = 0; h < hkv; ++h)
        for (int ch = 0; ch < d; ++ch, off += rec) {
          const uint16_t* x = L.k_res.data() + size_t(g) * G * kvw + size_t(h) * d + ch;
          const KiviGroupParams gp = kivi_quantize_group(x, kvw, G, b, codes_.data());
          store_u16(&L.k_groups[off], gp.scale);
          store_u16(&L.k_groups[off + 2], gp.min);
          kivi_pack(codes_.data(), G, b, &L.k_groups[off + 4]);
        }
    L.k_res.erase(L.k_res.begin(), L.k_res.begin() + (kq - L.kq) * kvw);
    quantized_groups_ += groups * hkv * d;
    L.kq = kq;
  }
  // Values: each token per group of G channels.
  const int64_t vq = c_.values_quantized(n);
  if (vq > L.vq) {
    const size_t tok_bytes = size_t(hkv) * (d / G) * rec;
    size_t off = L.v_tokens.size();
    grow(L.v_tokens, off + size_t(vq - L.vq) * tok_bytes, tok_bytes);
    L.v_tokens.resize(off + size_t(vq - L.vq) * tok_bytes);
    for (int64_t t = 0; t < vq - L.vq; ++t)
      for (int h = 0; h < hkv; ++h)
        for (int gj = 0; gj < d / G; ++gj, off += rec) {
          const uint16_t* x = L.v_res.data() + size_t(t) * kvw + size_t(h) * d + size_t(gj) * G;
          const KiviGroupParams gp = kivi_quantize_group(x, 1, G, b, codes_.data());
          store_u16(&L.v_tokens[off], gp.scale);
          store_u16(&L.v_tokens[off + 2], gp.min);
          kivi_pack(codes_.data(), G, b, &L.v_tokens[off + 4]);
        }
    L.v_res.erase(L.v_res.begin(), L.v_res.begin() + (vq - L.vq) * kvw);
    quantized_groups_ += (vq - L.vq) * hkv * (d / G);
    L.vq = vq;
  }
}

void KiviKvCache::dequantize_layer(const Layer& L, int64_t n, ThreadPool* pool) {
  const int hkv = shape_.n_kv_heads, d = shape_.head_dim, kvw = shape_.kv_width();
  const int G = c_.group, b = c_.bits;
  const size_t rec = 4 + size_t(G) * b / 8;
  scr_.resize(shape_, n);
  // Key groups and value tokens write disjoint rows: over the threads when attend() has them.
  for_rows(pool, L.kq / G, 4, [&](int64_t g0, int64_t g1) {
    const uint8_t* kg = L.k_groups.data() + size_t(g0) * hkv * d * rec;
    for (int64_t g = g0; g < g1; ++g)
      for (int h = 0; h < hkv; ++h)
        for (int ch = 0; ch < d; ++ch, kg += rec) {
          const float s = f16_to_f32(load_u16(kg)), mn = f16_to_f32(load_u16(kg + 2));
          for (int i = 0; i < G; ++i)
            scr_.k_row(h, g * G + i)[ch] =
                f32_to_f16(kivi_dequant(kivi_code_at(kg + 4, i, b), s, mn));
        }
  });
  for_rows(pool, L.vq, 128, [&](int64_t t0, int64_t t1) {
    const uint8_t* vt = L.v_tokens.data() + size_t(t0) * hkv * (d / G) * rec;
    for (int64_t t = t0; t < t1; ++t)
      for (int h = 0; h < hkv; ++h)
        for (int gj = 0; gj < d / G; ++gj, vt += rec) {
          const float s = f16_to_f32(load_u16(vt)), mn = f16_to_f32(load_u16(vt + 2));
          uint16_t* dst = scr_.v_row(h, t) + size_t(gj) * G;
          for (int i = 0; i < G; ++i)
            dst[i] = f32_to_f16(kivi_dequant(kivi_code_at(vt + 4, i, b), s, mn));
        }
  });
  for (int64_t t = L.kq; t < n; ++t)
    for (int h = 0; h < hkv; ++h)
      std::memcpy(scr_.k_row(h, t), L.k_res.data() + size_t(t - L.kq) * kvw + size_t(h) * d,
                  size_t(d) * 2);
  for (int64_t t = L.vq; t < n; ++t)
    for (int h = 0; h < hkv; ++h)
      std::memcpy(scr_.v_row(h, t), L.v_res.data() + size_t(t - L.vq) * kvw + size_t(h) * d,
                  size_t(d) * 2);
}

void KiviKvCache::attend(int layer, const float* q, const float* k, const float* v, float* out,
                         ThreadPool& pool) {
  store_new(layer, k, v, &pool);
  scr_.attend(dtype_, q, n_new_, n_past_, out, pool);
  apply_rule_after_call(layer);
}

void KiviKvCache::append_prompt(int layer, const float* q, const float* k, const float* v,
                                const PromptExtras& x) {
  (void)q, (void)x;
  store_new(layer, k, v, nullptr);
  apply_rule_after_call(layer);
}

void KiviKvCache::store_new(int layer, const float* k, const float* v, ThreadPool* pool) {
  Layer& L = layers_[size_t(layer)];
  const int kvw = shape_.kv_width();
  const int64_t n = n_past_ + n_new_;
  // The new tokens join the f16 residuals (the reference's key_states_full / value_states_full).
  for (auto [res, src] : {std::pair{&L.k_res, k}, std::pair{&L.v_res, v}}) {
    const size_t off = res->size();
    // Decode never holds more than R + 1 residual tokens: reserve that once (a prompt held
    // for --prefill-route end takes what it needs and is shrunk by end_prompt()).
    const size_t need = off + size_t(n_new_) * kvw;
    if (res->capacity() < need) res->reserve(std::max(need, size_t(c_.residual + 1) * kvw));
    res->resize(off + size_t(n_new_) * kvw);
    f32_to_half(dtype_, src, res->data() + off, n_new_ * kvw);
  }
  // The quantized tokens (dequantized) and the residual, new tokens included, for attention
  // (also when replayed, so that the scratch and the bytes held are attend()'s).
  dequantize_layer(L, n, pool);
}

void KiviKvCache::apply_rule_after_call(int layer) {
  // The rule after attention, as the reference quantizes (llama_kivi.py:L131, L174); a
  // deferred prompt (--prefill-route end) waits for end_prompt().
  if (sched_.defers_prompt() && n_new_ > 1) {
    sched_.hold_prompt();
    return;
  }
  apply_rule(layers_[size_t(layer)], n_past_ + n_new_);
}

Status KiviKvCache::commit() {
  if (n_new_ > 1) scr_.trim();
  n_past_ += n_new_;
  n_new_ = 0;
  peak_ = std::max(peak_, bytes_held());
  return Status::ok();
}

Status KiviKvCache::end_prompt() {
  if (!sched_.prompt_pending()) return Status::ok();
  std::vector<KiviLayerExport> inputs;  // the prompt in f16, before the rule (for the dump)
  if (!dump_dir_.empty())
    for (int l = 0; l < shape_.n_layers; ++l) inputs.push_back(export_layer(l));
  for (Layer& L : layers_) {
    apply_rule(L, n_past_);
    L.k_res.shrink_to_fit();  // the prompt's f16 copy is gone; keep what decode needs
    L.v_res.shrink_to_fit();
  }
  sched_.prompt_routed();
  if (dump_dir_.empty()) return Status::ok();
  for (int l = 0; l < shape_.n_layers; ++l) {
    const KiviLayerExport& in = inputs[size_t(l)];
    const KiviLayerExport e = export_layer(l);
    const int64_t kvw = shape_.kv_width();
    auto write = [&](const char* what, const auto& x, int64_t cols) -> Status {
      std::vector<float> f(x.size());
      for (size_t i = 0; i < x.size(); ++i) {
        if constexpr (sizeof(x[0]) == 2)
          f[i] = f16_to_f32(x[i]);
        else
          f[i] = float(x[i]);
      }
      return write_npy(fmt::format("{}/kivi_L{}_{}.npy", dump_dir_, l, what), f.data(),
                       int64_t(f.size()) / cols, cols);
    };
    QEVICT_RETURN_IF_ERROR(write("k_in", in.k_res, kvw));
    QEVICT_RETURN_IF_ERROR(write("v_in", in.v_res, kvw));
    QEVICT_RETURN_IF_ERROR(write("k_codes", e.k_codes, kvw));
    QEVICT_RETURN_IF_ERROR(write("k_scale", e.k_scale, kvw));
    QEVICT_RETURN_IF_ERROR(write("k_min", e.k_min, kvw));
    QEVICT_RETURN_IF_ERROR(write("v_codes", e.v_codes, kvw));
    QEVICT_RETURN_IF_ERROR(write("v_scale", e.v_scale, kvw / c_.group));
    QEVICT_RETURN_IF_ERROR(write("v_min", e.v_min, kvw / c_.group));
  }
  std::FILE* f = std::fopen((dump_dir_ + "/kivi_meta.json").c_str(), "w");
  if (!f) return Status::error(fmt::format("cannot write {}/kivi_meta.json", dump_dir_));
  std::fprintf(f,
               "{\"bits\": %d, \"group\": %d, \"residual\": %d, \"n\": %lld, \"n_layers\": "
               "%d, \"n_kv_heads\": %d, \"head_dim\": %d}\n",
               c_.bits, c_.group, c_.residual, (long long)n_past_, shape_.n_layers,
               shape_.n_kv_heads, shape_.head_dim);
  std::fclose(f);
  return Status::ok();
}

void KiviKvCache::clear() {
  for (Layer& L : layers_) L = Layer();
  n_past_ = n_new_ = 0;
  sched_.prompt_routed();
}

size_t KiviKvCache::layer_bytes(int l) const {
  const Layer& L = layers_[size_t(l)];
  return L.k_groups.size() + L.v_tokens.size() + (L.k_res.size() + L.v_res.size()) * 2;
}

size_t KiviKvCache::bytes_held() const {
  size_t b = 0;
  for (const Layer& L : layers_)
    b += L.k_groups.capacity() + L.v_tokens.capacity() +
         (L.k_res.capacity() + L.v_res.capacity()) * 2;
  return b + scr_.bytes() + codes_.capacity();
}

std::string KiviKvCache::describe() const {
  return fmt::format(
      "kivi-{} (keys per channel over {} tokens, values per token over {} channels, f16 scale "
      "and min; f16 residual of {} tokens; prompt quantized {})",
      c_.bits, c_.group, c_.group, c_.residual,
      sched_.defers_prompt() ? "at its end" : "per chunk");
}

void KiviKvCache::report(KvReport* out, ReportDetail detail) const {
  *out = quantizer_report("kivi", describe(), shape_, bytes_held(), peak_);
  for (const Layer& L : layers_) {
    KvLayerReport r;
    r.windows_quant = L.kq;               // tokens whose keys are quantized
    r.windows_local = n_past_ - L.kq;     // tokens whose keys are in the f16 residual
    r.quantized_units = L.kq / c_.group;  // key groups (per head)
    r.bytes_quant = L.k_groups.size() + L.v_tokens.size();
    r.bytes_full = (L.k_res.size() + L.v_res.size()) * 2;
    r.bytes_budgeted = r.bytes_quant + r.bytes_full;
    r.bytes_allocated = L.k_groups.capacity() + L.v_tokens.capacity() +
                        (L.k_res.capacity() + L.v_res.capacity()) * 2;
    out->layers.push_back(r);
  }
  if (detail != ReportDetail::kTiers) return;
  // kQuant where the key or the value of a position is quantized, kLocal for the residual.
  for (const Layer& L : layers_) {
    std::vector<Tier> t(size_t(n_past_), Tier::kLocal);
    for (int64_t p = 0; p < std::max(L.kq, L.vq); ++p) t[size_t(p)] = Tier::kQuant;
    out->position_tiers.push_back(std::move(t));
  }
}

KiviLayerExport KiviKvCache::export_layer(int l) const {
  const Layer& L = layers_[size_t(l)];
  const int hkv = shape_.n_kv_heads, d = shape_.head_dim, G = c_.group, b = c_.bits;
  const size_t rec = 4 + size_t(G) * b / 8;
  KiviLayerExport e;
  e.n = n_past_;
  e.keys_quantized = L.kq;
  e.values_quantized = L.vq;
  e.k_codes.resize(size_t(L.kq) * hkv * d);
  const uint8_t* kg = L.k_groups.data();
  for (int64_t g = 0; g < L.kq / G; ++g)
    for (int h = 0; h < hkv; ++h)
      for (int ch = 0; ch < d; ++ch, kg += rec) {
        e.k_scale.push_back(load_u16(kg));
        e.k_min.push_back(load_u16(kg + 2));
        for (int i = 0; i < G; ++i)
          e.k_codes[((size_t(g) * G + i) * hkv + h) * d + ch] = kivi_code_at(kg + 4, i, b);
      }
  const uint8_t* vt = L.v_tokens.data();
  for (int64_t t = 0; t < L.vq; ++t)
    for (int h = 0; h < hkv; ++h)
      for (int gj = 0; gj < d / G; ++gj, vt += rec) {
        e.v_scale.push_back(load_u16(vt));
        e.v_min.push_back(load_u16(vt + 2));
        for (int i = 0; i < G; ++i) e.v_codes.push_back(kivi_code_at(vt + 4, i, b));
      }
  e.k_res = L.k_res;
  e.v_res = L.v_res;
  return e;
}

Expected<std::unique_ptr<SequenceKvCache>> make_kivi_cache(const KvShape& shape, int64_t n_ctx,
                                                           const KvCacheParams& p) {
  const KiviConfig c{p.quant.bits, p.quant.group, p.quant.residual};
  QEVICT_RETURN_IF_ERROR(c.validate(shape.head_dim));
  QEVICT_RETURN_IF_ERROR(
      check_quantizer_params(p, "kivi", "residual and parameters", "the prompt's quantization"));
  return std::unique_ptr<SequenceKvCache>(new KiviKvCache(shape, n_ctx, p, c));
}

}  // namespace qevict
