// The KVQuant cache (see kvquant_cache.h): quantize on arrival, decode a layer for attention.
#include "kvcache/quantizers/kvquant_cache.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstdio>
#include <cstring>

#include "core/f16.h"
#include "core/npy.h"

namespace qevict {

namespace {

// Grows v to hold `size` elements, in steps of 64 tokens of `per_token` elements.
template <class T>
void grow(std::vector<T>& v, size_t size, size_t per_token) {
  if (v.capacity() < size) v.reserve(size + 64 * per_token);
}

}  // namespace

KvQuantCache::KvQuantCache(const KvShape& shape, int64_t n_ctx, const KvQuantConfig& c,
                           std::shared_ptr<const std::vector<KvQuantLayerCalib>> cal,
                           std::string dump_dir)
    : shape_(shape),
      n_ctx_(n_ctx),
      c_(c),
      cal_(std::move(cal)),
      rope_(shape.rope, shape.head_dim, n_ctx),
      layers_(size_t(shape.n_layers)),
      dump_dir_(std::move(dump_dir)) {
  if (!dump_dir_.empty()) {
    k_in_.resize(size_t(shape.n_layers));
    v_in_.resize(size_t(shape.n_layers));
  }
}

Status KvQuantCache::begin(int64_t n_new) {
  QEVICT_RETURN_IF_ERROR(check_begin(n_past_, n_new, n_ctx_));
  n_new_ = n_new;
  return Status::ok();
}

void KvQuantCache::attend(int layer, const float* q, const float* k, const float* v, float* out,
                          ThreadPool& pool) {
  Layer& L = layers_[size_t(layer)];
  const KvQuantLayerCalib& cal = (*cal_)[size_t(layer)];
  const int kvw = shape_.kv_width(), hkv = shape_.n_kv_heads, d = shape_.head_dim;
  const size_t rb = kvq_row_bytes(kvw, c_.bits);
  const int half = std::max(1, shape_.rope.n_rot / 2);
  row_.resize(size_t(kvw));
  cs_.resize(size_t(half) * 2);
  for (int64_t i = 0; i < n_new_; ++i) {
    const int64_t pos = n_past_ + i;
    const float* ki = k + i * kvw;
    const float* vi = v + i * kvw;
    const bool record = !k_in_.empty() && !dumped_;  // --kv-trace, until the prompt's dump
    if (pos >= c_.first_fp16 || record) {
      // The reference quantizes the k_proj output: undo this position's rotation.
      std::memcpy(row_.data(), ki, size_t(kvw) * sizeof(float));
      rope_.cos_sin(pos, cs_.data(), cs_.data() + half);
      rope_apply(shape_.rope, cs_.data(), cs_.data() + half, row_.data(), hkv, d, d,
                 /*inverse=*/true);
    }
    if (record) {
      k_in_[size_t(layer)].insert(k_in_[size_t(layer)].end(), row_.begin(), row_.end());
      v_in_[size_t(layer)].insert(v_in_[size_t(layer)].end(), vi, vi + kvw);
    }
    if (pos < c_.first_fp16) {  // the attention sink stays in 16 bits
      for (auto [dst, src] : {std::pair{&L.k_first, ki}, std::pair{&L.v_first, vi}}) {
        const size_t off = dst->size();
        dst->resize(off + size_t(kvw));
        f32_to_half(HalfType::kF16, src, dst->data() + off, kvw);
      }
      continue;
    }
    const size_t m = L.k_cnt.size();
    grow(L.k_codes, (m + 1) * rb, rb);
    grow(L.v_codes, (m + 1) * rb, rb);
    grow(L.v_par, (m + 1) * 2, 2);
    grow(L.k_cnt, m + 1, 1);
    grow(L.v_cnt, m + 1, 1);
    L.k_codes.resize((m + 1) * rb);
    L.v_codes.resize((m + 1) * rb);
    L.v_par.resize((m + 1) * 2);
    const size_t k0 = L.k_out.size(), v0 = L.v_out.size();
    kvquant_quantize_key(c_, cal, row_.data(), kvw, L.k_codes.data() + m * rb, &L.k_out);
    kvquant_quantize_value(c_, cal, vi, kvw, L.v_codes.data() + m * rb, &L.v_par[m * 2],
                           &L.v_par[m * 2 + 1], &L.v_out, &vscr_);
    L.k_cnt.push_back(uint16_t(L.k_out.size() - k0));
    L.v_cnt.push_back(uint16_t(L.v_out.size() - v0));
  }
  decode_layer(layer, n_past_ + n_new_, &pool);
  scr_.attend(HalfType::kF16, q, n_new_, n_past_, out, pool);
}

void KvQuantCache::decode_layer(int layer, int64_t n, ThreadPool* pool) {
  const Layer& L = layers_[size_t(layer)];
  const KvQuantLayerCalib& cal = (*cal_)[size_t(layer)];
  const int kvw = shape_.kv_width(), hkv = shape_.n_kv_heads, d = shape_.head_dim;
  const size_t rb = kvq_row_bytes(kvw, c_.bits);
  const int half = std::max(1, shape_.rope.n_rot / 2);
  scr_.resize(shape_, n);
  const int64_t first = std::min<int64_t>(n, c_.first_fp16);
  for (int64_t t = 0; t < first; ++t)
    for (int h = 0; h < hkv; ++h) {
      std::memcpy(scr_.k_row(h, t), L.k_first.data() + size_t(t) * kvw + size_t(h) * d,
                  size_t(d) * 2);
      std::memcpy(scr_.v_row(h, t), L.v_first.data() + size_t(t) * kvw + size_t(h) * d,
                  size_t(d) * 2);
    }
  // Where each token's outliers start (they are stored token after token), so that the
  // tokens can be decoded over the threads, each into its own rows.
  const int64_t m = n - first;
  out_at_.resize(size_t(m + 1) * 2);
  out_at_[0] = out_at_[1] = 0;
  for (int64_t j = 0; j < m; ++j) {
    out_at_[size_t(j + 1) * 2] = out_at_[size_t(j) * 2] + L.k_cnt[size_t(j)];
    out_at_[size_t(j + 1) * 2 + 1] = out_at_[size_t(j) * 2 + 1] + L.v_cnt[size_t(j)];
  }
  for_rows(pool, m, 64, [&](int64_t j0, int64_t j1) {
    std::vector<float> row(static_cast<size_t>(kvw)), row2(static_cast<size_t>(kvw));
    std::vector<float> cs(size_t(half) * 2);
    for (int64_t jj = j0; jj < j1; ++jj) {
      const size_t j = size_t(jj);
      const int64_t t = first + jj;
      kvquant_dequantize_key(c_, cal, L.k_codes.data() + j * rb, L.k_out.data() + out_at_[j * 2],
                             L.k_cnt[j], kvw, row.data());
      kvquant_dequantize_value(c_, cal, L.v_codes.data() + j * rb, L.v_par[j * 2],
                               L.v_par[j * 2 + 1], L.v_out.data() + out_at_[j * 2 + 1], L.v_cnt[j],
                               kvw, row2.data());
      rope_.cos_sin(t, cs.data(), cs.data() + half);
      rope_apply(shape_.rope, cs.data(), cs.data() + half, row.data(), hkv, d, d);
      for (int h = 0; h < hkv; ++h) {
        f32_to_half(HalfType::kF16, row.data() + size_t(h) * d, scr_.k_row(h, t), d);
        f32_to_half(HalfType::kF16, row2.data() + size_t(h) * d, scr_.v_row(h, t), d);
      }
    }
  });
}

Status KvQuantCache::end_prompt() {
  if (k_in_.empty() || dumped_) return Status::ok();
  dumped_ = true;
  const Status s = dump_prompt(dump_dir_);
  k_in_ = {};  // the dump-only copy is gone
  v_in_ = {};
  return s;
}

Status KvQuantCache::dump_prompt(const std::string& dir) const {
  const int kvw = shape_.kv_width();
  auto write = [&](int l, const char* what, const std::vector<float>& x, int64_t cols) {
    return write_npy(fmt::format("{}/kvquant_L{}_{}.npy", dir, l, what), x.data(),
                     int64_t(x.size()) / cols, cols);
  };
  for (int l = 0; l < shape_.n_layers; ++l) {
    const Layer& L = layers_[size_t(l)];
    const KvQuantLayerCalib& cal = (*cal_)[size_t(l)];
    const int64_t m = int64_t(L.k_cnt.size()), first = int64_t(L.k_first.size()) / kvw;
    const size_t rb = kvq_row_bytes(kvw, c_.bits);
    std::vector<float> kc(size_t(m) * kvw), vc(size_t(m) * kvw), par(size_t(m) * 2);
    for (int64_t j = 0; j < m; ++j)
      for (int ch = 0; ch < kvw; ++ch) {
        kc[size_t(j) * kvw + ch] = float(kvq_get_code(L.k_codes.data() + j * rb, ch, c_.bits));
        vc[size_t(j) * kvw + ch] = float(kvq_get_code(L.v_codes.data() + j * rb, ch, c_.bits));
      }
    for (size_t i = 0; i < par.size(); ++i) par[i] = f16_to_f32(L.v_par[i]);
    // Decoded (pre-RoPE; the first tokens as stored, post-RoPE).
    std::vector<float> kd(size_t(first + m) * kvw), vd(kd.size());
    for (size_t i = 0; i < L.k_first.size(); ++i) {
      kd[i] = f16_to_f32(L.k_first[i]);
      vd[i] = f16_to_f32(L.v_first[i]);
    }
    const KvqOutlier *ko = L.k_out.data(), *vo = L.v_out.data();
    for (int64_t j = 0; j < m; ++j) {
      float* kr = kd.data() + size_t(first + j) * kvw;
      float* vr = vd.data() + size_t(first + j) * kvw;
      kvquant_dequantize_key(c_, cal, L.k_codes.data() + j * rb, ko, L.k_cnt[size_t(j)], kvw, kr);
      kvquant_dequantize_value(c_, cal, L.v_codes.data() + j * rb, L.v_par[size_t(j) * 2],
                               L.v_par[size_t(j) * 2 + 1], vo, L.v_cnt[size_t(j)], kvw, vr);
      ko += L.k_cnt[size_t(j)];
      vo += L.v_cnt[size_t(j)];
    }
    // Outliers as (token, channel, value) rows.
    auto outliers = [&](const std::vector<KvqOutlier>& o, const std::vector<uint16_t>& cnt) {
      std::vector<float> r;
      size_t at = 0;
      for (int64_t j = 0; j < m; ++j)
        for (int q = 0; q < cnt[size_t(j)]; ++q, ++at)
          r.insert(r.end(), {float(first + j), float(o[at].channel), f16_to_f32(o[at].value)});
      return r;
    };
    std::vector<float> thr = cal.k_upper, lut = cal.k_lut;
    thr.insert(thr.end(), cal.k_lower.begin(), cal.k_lower.end());
    lut.insert(lut.end(), cal.v_lut.begin(), cal.v_lut.end());
    QEVICT_RETURN_IF_ERROR(write(l, "k_in", k_in_[size_t(l)], kvw));
    QEVICT_RETURN_IF_ERROR(write(l, "v_in", v_in_[size_t(l)], kvw));
    QEVICT_RETURN_IF_ERROR(write(l, "k_codes", kc, kvw));
    QEVICT_RETURN_IF_ERROR(write(l, "v_codes", vc, kvw));
    QEVICT_RETURN_IF_ERROR(write(l, "v_par", par, 2));
    QEVICT_RETURN_IF_ERROR(write(l, "k_deq", kd, kvw));
    QEVICT_RETURN_IF_ERROR(write(l, "v_deq", vd, kvw));
    QEVICT_RETURN_IF_ERROR(write(l, "k_out", outliers(L.k_out, L.k_cnt), 3));
    QEVICT_RETURN_IF_ERROR(write(l, "v_out", outliers(L.v_out, L.v_cnt), 3));
    QEVICT_RETURN_IF_ERROR(write(l, "calib_k", thr, kvw));
    QEVICT_RETURN_IF_ERROR(write(l, "calib_lut", lut, int64_t(cal.k_lut.size())));
  }
  const std::string meta = dir + "/kvquant_meta.json";
  std::FILE* f = std::fopen(meta.c_str(), "w");
  if (!f) return Status::error(fmt::format("cannot write {}", meta));
  std::fprintf(f,
               "{\"bits\": %d, \"sparsity\": %.17g, \"first_fp16\": %d, \"n\": %lld, "
               "\"n_layers\": %d, \"n_kv_heads\": %d, \"head_dim\": %d}\n",
               c_.bits, c_.sparsity, c_.first_fp16, (long long)n_past_, shape_.n_layers,
               shape_.n_kv_heads, shape_.head_dim);
  return std::fclose(f) == 0 ? Status::ok() : Status::error(fmt::format("cannot write {}", meta));
}

Status KvQuantCache::commit() {
  if (n_new_ > 1) scr_.trim();
  n_past_ += n_new_;
  n_new_ = 0;
  peak_ = std::max(peak_, bytes_held());
  return Status::ok();
}

void KvQuantCache::clear() {
  for (Layer& L : layers_) {
    L.k_first.clear();
    L.v_first.clear();
    L.k_codes.clear();
    L.v_codes.clear();
    L.v_par.clear();
    L.k_cnt.clear();
    L.v_cnt.clear();
    L.k_out.clear();
    L.v_out.clear();
  }
  for (size_t l = 0; l < k_in_.size(); ++l) k_in_[l].clear(), v_in_[l].clear();
  n_past_ = n_new_ = 0;
}

size_t KvQuantCache::layer_bytes(int l) const {
  const Layer& L = layers_[size_t(l)];
  return (L.k_first.size() + L.v_first.size() + L.v_par.size() + L.k_cnt.size() + L.v_cnt.size()) *
             sizeof(uint16_t) +
         L.k_codes.size() + L.v_codes.size() +
         (L.k_out.size() + L.v_out.size()) * sizeof(KvqOutlier);
}

int64_t KvQuantCache::layer_outliers(int l) const {
  const Layer& L = layers_[size_t(l)];
  return int64_t(L.k_out.size() + L.v_out.size());
}

size_t KvQuantCache::bytes_held() const {
  size_t b = 0;
  for (const Layer& L : layers_)
    b += (L.k_first.capacity() + L.v_first.capacity() + L.v_par.capacity() + L.k_cnt.capacity() +
          L.v_cnt.capacity()) *
             sizeof(uint16_t) +
         L.k_codes.capacity() + L.v_codes.capacity() +
         (L.k_out.capacity() + L.v_out.capacity()) * sizeof(KvqOutlier);
  for (size_t l = 0; l < k_in_.size(); ++l)  // the dump-only copy (--kv-trace only)
    b += (k_in_[l].capacity() + v_in_[l].capacity()) * sizeof(float);
  return b + scr_.bytes() + rope_.bytes() +
         (row_.capacity() + cs_.capacity() + vscr_.capacity()) * sizeof(float) +
         out_at_.capacity() * sizeof(size_t);
}

std::string KvQuantCache::describe() const {
  return fmt::format(
      "kvquant {}-bit non-uniform (calibrated levels), pre-RoPE keys per channel, values per "
      "token, {:.1f} % dense-and-sparse outliers, first {} token(s) in f16",
      c_.bits, (1.0 - c_.sparsity) * 100, c_.first_fp16);
}

void KvQuantCache::report(KvReport* out, ReportDetail detail) const {
  *out = quantizer_report("kvquant", describe(), shape_, bytes_held(), peak_);
  for (int l = 0; l < shape_.n_layers; ++l) {
    const Layer& L = layers_[size_t(l)];
    KvLayerReport r;
    r.windows_quant = int64_t(L.k_cnt.size());    // tokens quantized
    r.windows_local = n_past_ - r.windows_quant;  // tokens in f16
    r.outliers = layer_outliers(l);               // outliers kept exactly
    r.bytes_full = (L.k_first.size() + L.v_first.size()) * sizeof(uint16_t);
    r.bytes_quant = layer_bytes(l) - r.bytes_full;
    r.bytes_budgeted = r.bytes_quant + r.bytes_full;
    r.bytes_allocated = r.bytes_budgeted;
    out->layers.push_back(r);
  }
  if (detail != ReportDetail::kTiers) return;
  for (const Layer& L : layers_) {
    std::vector<Tier> t(size_t(n_past_), Tier::kQuant);
    for (int64_t p = 0; p < n_past_ - int64_t(L.k_cnt.size()); ++p) t[size_t(p)] = Tier::kLocal;
    out->position_tiers.push_back(std::move(t));
  }
}

void KvQuantCache::export_layer(int l, std::vector<float>* k, std::vector<float>* v) {
  const Layer& L = layers_[size_t(l)];
  const int kvw = shape_.kv_width(), d = shape_.head_dim;
  const int64_t n = int64_t(L.k_first.size()) / kvw + int64_t(L.k_cnt.size());
  decode_layer(l, n, nullptr);
  k->assign(size_t(n) * kvw, 0.0f);
  v->assign(size_t(n) * kvw, 0.0f);
  for (int64_t t = 0; t < n; ++t)
    for (int h = 0; h < shape_.n_kv_heads; ++h)
      for (int c = 0; c < d; ++c) {
        (*k)[size_t(t) * kvw + size_t(h) * d + c] = f16_to_f32(scr_.k_row(h, t)[c]);
        (*v)[size_t(t) * kvw + size_t(h) * d + c] = f16_to_f32(scr_.v_row(h, t)[c]);
      }
}

Expected<std::unique_ptr<SequenceKvCache>> make_kvquant_cache(const KvShape& shape, int64_t n_ctx,
                                                              const KvCacheParams& p) {
  KvQuantConfig c;
  c.bits = p.quant.bits;
  c.sparsity = 1.0 - p.quant.outlier_share;
  c.first_fp16 = p.quant.f16_first;
  QEVICT_RETURN_IF_ERROR(c.validate());
  if (p.dtype != HalfType::kF16)
    return Status::error("kvquant keeps its parameters and first tokens in f16");
  const auto& cal = p.quant.kvquant_calib;
  if (!cal)
    return Status::error(
        "kvquant needs the model's calibration (made from a calibration text by "
        "engine/kvquant_calibration.h; the CLI does it when --kv-policy kvquant is given)");
  if (int(cal->size()) != shape.n_layers)
    return Status::error(fmt::format("kvquant: the calibration has {} layers, the model {}",
                                     cal->size(), shape.n_layers));
  for (const KvQuantLayerCalib& l : *cal)
    if (int(l.k_upper.size()) != shape.kv_width() || int(l.k_lower.size()) != shape.kv_width() ||
        l.k_offset.size() != l.k_upper.size() || l.k_range.size() != l.k_upper.size() ||
        l.k_lut.size() != (size_t(1) << c.bits) || l.v_lut.size() != (size_t(1) << c.bits))
      return Status::error(
          fmt::format("kvquant: the calibration does not fit this model or --kv-bits {}", c.bits));
  // --kv-trace DIR: the prompt's quantization is dumped there (KvQuantCache::dump_prompt).
  return std::unique_ptr<SequenceKvCache>(new KvQuantCache(shape, n_ctx, c, cal, p.trace_path));
}

}  // namespace qevict
