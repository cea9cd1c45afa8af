// The ZipCache cache (see zipcache_cache.h): storage, probes, the rule at the prompt's end and
// every `gap` decode tokens, and attention over a dequantized scratch (reference path).
#include "kvcache/quantizers/zipcache_cache.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/f16.h"
#include "core/npy.h"
#include "kernels/ops.h"
#include "kvcache/quantizers/quantizer_params.h"

namespace qevict {

ZipKvCache::ZipKvCache(const KvShape& shape, int64_t n_ctx, const KvCacheParams& p,
                       const ZipCacheConfig& c)
    : shape_(shape),
      n_ctx_(n_ctx),
      c_(c),
      sched_(p.prefill_route, 1),
      layers_(size_t(shape.n_layers)),
      dump_dir_(p.trace_path) {
  for (Layer& L : layers_) {
    L.imp.resize(size_t(shape.n_kv_heads));
    L.unimp.resize(size_t(shape.n_kv_heads));
  }
}

Status ZipKvCache::begin(int64_t n_new) {
  QEVICT_RETURN_IF_ERROR(check_begin(n_past_, n_new, n_ctx_));
  // A decode step with the prompt still pending (no end_prompt()): the prompt's rule first.
  if (n_new == 1 && sched_.prompt_pending()) QEVICT_RETURN_IF_ERROR(end_prompt());
  n_new_ = n_new;
  return Status::ok();
}

void ZipKvCache::dequantize_layer(const Layer& L, int64_t n, ThreadPool* pool) {
  const int hkv = shape_.n_kv_heads, d = shape_.head_dim, kvw = shape_.kv_width();
  scr_.resize(shape_, n);
  // zip_dequant_key/value per element, with the sets' f16 parameters converted once per call
  // instead of per element (the same f32 operations in the same order: the same halfs).
  auto code = [](const ZipSet& z, int64_t i) {
    const int64_t bit = i * z.bits;
    return float((z.codes[size_t(bit >> 3)] >> (bit & 7)) & ((1 << z.bits) - 1));
  };
  std::vector<float> vscale(L.v_scale.size()), ka, kb;  // (no scales before the first rule)
  for (size_t c = 0; c < vscale.size(); ++c) vscale[c] = f16_to_f32(L.v_scale[c]);
  for (int set = 0; set < 2; ++set) {
    const auto& lists = set == 0 ? L.imp : L.unimp;
    const ZipSet& ks = set == 0 ? L.k_imp : L.k_unimp;
    const ZipSet& vs = set == 0 ? L.v_imp : L.v_unimp;
    ka.resize(ks.col_a.size());
    kb.resize(ks.col_b.size());
    for (size_t c = 0; c < ka.size(); ++c) ka[c] = f16_to_f32(ks.col_a[c]);
    for (size_t c = 0; c < kb.size(); ++c) kb[c] = f16_to_f32(ks.col_b[c]);
    for (int h = 0; h < hkv; ++h) {
      const auto& ids = lists[size_t(h)];
      // Rows of distinct tokens: over the threads when attend() has them.
      for_rows(pool, int64_t(ids.size()), 256, [&](int64_t j0, int64_t j1) {
        for (int64_t j = j0; j < j1; ++j) {
          uint16_t* kd = scr_.k_row(h, ids[size_t(j)]);
          uint16_t* vd = scr_.v_row(h, ids[size_t(j)]);
          const float vstep = f16_to_f32(vs.row_step[size_t(j)]);
          const float vmin = f16_to_f32(vs.row_min[size_t(j)]);
          for (int ch = 0; ch < d; ++ch) {
            const int c = h * d + ch;
            kd[ch] = f32_to_f16(code(ks, j * ks.cols + c) * kb[size_t(c)] + ka[size_t(c)]);
            vd[ch] = f32_to_f16((code(vs, j * vs.cols + c) * vstep + vmin) * vscale[size_t(c)]);
          }
        }
      });
    }
  }
  for (int64_t t = L.nq; t < n; ++t)
    for (int h = 0; h < hkv; ++h) {
      std::memcpy(scr_.k_row(h, t), L.k_buf.data() + size_t(t - L.nq) * kvw + size_t(h) * d,
                  size_t(d) * 2);
      std::memcpy(scr_.v_row(h, t), L.v_buf.data() + size_t(t - L.nq) * kvw + size_t(h) * d,
                  size_t(d) * 2);
    }
}

void ZipKvCache::add_probe(const float* q, int64_t pos, int64_t n, int64_t t0, float* sal) {
  const int hkv = shape_.n_kv_heads, d = shape_.head_dim, g = shape_.group();
  const int64_t len = pos + 1;  // causal: keys [0, pos]
  logits_.resize(size_t(g) * len);
  for (int h = 0; h < hkv; ++h) {
    qk_scores(dtype_, q + size_t(h) * g * d, d, g, scr_.k_row(h, 0), d, len, d,
              1.0f / std::sqrt(float(d)), logits_.data(), len);
    for (int i = 0; i < g; ++i) {
      float* p = logits_.data() + size_t(i) * len;
      softmax_inplace(p, len);
      for (int64_t t = std::max<int64_t>(t0, 0); t < len; ++t)
        sal[size_t(t - t0) * hkv + size_t(h)] += p[t];
    }
  }
}

void ZipKvCache::advance_ring(int layer, Layer& L, int64_t n) {
  const int qw = shape_.q_width();
  const int64_t thr = L.nq + c_.recent_probe_start(n - L.nq);
  int64_t dropped = 0;
  std::vector<float> qrow(static_cast<size_t>(qw));
  for (; L.ring_pos0 + dropped < thr; ++dropped) {
    const int64_t pos = L.ring_pos0 + dropped;
    if (!c_.is_random_probe(layer, pos - L.nq)) continue;
    half_to_f32(dtype_, L.ring.data() + size_t(dropped) * qw, qrow.data(), qw);
    add_probe(qrow.data(), pos, n, L.nq, L.saliency.data());
  }
  if (dropped == 0) return;
  L.ring.erase(L.ring.begin(), L.ring.begin() + dropped * qw);
  L.ring_pos0 += dropped;
}

void ZipKvCache::requantize(Layer& L, int64_t n, const std::vector<float>& sal) {
  const int hkv = shape_.n_kv_heads, d = shape_.head_dim, kvw = shape_.kv_width();
  const int32_t m = int32_t(n - L.nq);
  const int32_t k = int32_t(c_.unimportant_count(m));
  std::vector<float> score(static_cast<size_t>(m));
  std::vector<uint8_t> is_unimp(static_cast<size_t>(m));
  for (int h = 0; h < hkv; ++h) {
    for (int32_t i = 0; i < m; ++i) score[size_t(i)] = sal[size_t(i) * hkv + size_t(h)];
    std::fill(is_unimp.begin(), is_unimp.end(), 0);
    for (int32_t i : zip_bottom_k(score.data(), m, k)) {
      L.unimp[size_t(h)].push_back(int32_t(L.nq) + i);
      is_unimp[size_t(i)] = 1;
    }
    for (int32_t i = 0; i < m; ++i)
      if (!is_unimp[size_t(i)]) L.imp[size_t(h)].push_back(int32_t(L.nq) + i);
  }
  // Every token again from the scratch (the quantized ones dequantized: the reference
  // decompresses and compresses the whole cache). The values' column scales span all of them.
  // (zip_value_scale's rule, read from the f16 scratch without an f32 copy of the layer.)
  std::vector<float> amax(static_cast<size_t>(kvw), 0.0f);
  for (int h = 0; h < hkv; ++h)
    for (int64_t t = 0; t < n; ++t) {
      const uint16_t* v = scr_.v_row(h, t);
      for (int ch = 0; ch < d; ++ch)
        amax[size_t(h) * d + ch] = std::max(amax[size_t(h) * d + ch], std::fabs(f16_to_f32(v[ch])));
    }
  L.v_scale.resize(size_t(kvw));
  for (int c = 0; c < kvw; ++c) L.v_scale[size_t(c)] = f32_to_f16(std::sqrt(amax[size_t(c)]));
  for (int set = 0; set < 2; ++set) {
    const auto& lists = set == 0 ? L.imp : L.unimp;
    const int bits = set == 0 ? c_.hi_bits : c_.lo_bits;
    const int64_t rows = int64_t(lists[0].size());
    for (int kv = 0; kv < 2; ++kv) {
      rows_.resize(size_t(rows) * kvw);
      for (int h = 0; h < hkv; ++h)
        for (int64_t j = 0; j < rows; ++j)
          half_to_f32(dtype_,
                      kv == 0 ? scr_.k_row(h, lists[size_t(h)][size_t(j)])
                              : scr_.v_row(h, lists[size_t(h)][size_t(j)]),
                      rows_.data() + size_t(j) * kvw + size_t(h) * d, d);
      ZipSet s = kv == 0 ? zip_quantize_keys(rows_.data(), rows, kvw, bits)
                         : zip_quantize_values(rows_.data(), rows, kvw, bits, L.v_scale.data());
      (kv == 0 ? (set == 0 ? L.k_imp : L.k_unimp) : (set == 0 ? L.v_imp : L.v_unimp)) =
          std::move(s);
    }
  }
  L.nq = n;
  L.k_buf.clear();
  L.v_buf.clear();
  ++requantizations_;
}

void ZipKvCache::attend(int layer, const float* q, const float* k, const float* v, float* out,
                        ThreadPool& pool) {
  store_new(layer, k, v, &pool);
  scr_.attend(dtype_, q, n_new_, n_past_, out, pool);
  after_call(layer, q);
}

void ZipKvCache::append_prompt(int layer, const float* q, const float* k, const float* v,
                               const PromptExtras& x) {
  (void)x;
  store_new(layer, k, v, nullptr);
  after_call(layer, q);
}

void ZipKvCache::store_new(int layer, const float* k, const float* v, ThreadPool* pool) {
  Layer& L = layers_[size_t(layer)];
  const int kvw = shape_.kv_width();
  for (auto [buf, src] : {std::pair{&L.k_buf, k}, std::pair{&L.v_buf, v}}) {
    const size_t off = buf->size();
    const size_t need = off + size_t(n_new_) * kvw;
    // Decode never buffers more than gap tokens: reserve that once.
    if (buf->capacity() < need) buf->reserve(std::max(need, size_t(c_.gap + 1) * kvw));
    buf->resize(need);
    f32_to_half(dtype_, src, buf->data() + off, n_new_ * kvw);
  }
  dequantize_layer(L, n_past_ + n_new_, pool);  // attention's keys, which the probes read too
}

void ZipKvCache::after_call(int layer, const float* q) {
  Layer& L = layers_[size_t(layer)];
  const int hkv = shape_.n_kv_heads, qw = shape_.q_width();
  const int64_t n = n_past_ + n_new_;
  if (n_new_ > 1) {  // a prompt call: keep the queries that can still be probes
    if (!dump_dir_.empty() && !dumped_) {
      dump_q_.resize(size_t(shape_.n_layers));
      dump_q_[size_t(layer)].insert(dump_q_[size_t(layer)].end(), q, q + n_new_ * qw);
    }
    if (L.ring.empty() && L.saliency.empty()) L.ring_pos0 = n_past_;
    const size_t off = L.ring.size();
    L.ring.resize(off + size_t(n_new_) * qw);
    f32_to_half(dtype_, q, L.ring.data() + off, n_new_ * qw);
    L.saliency.resize(size_t(n - L.nq) * hkv, 0.0f);
    advance_ring(layer, L, n);
    return;
  }
  // Decode: every `gap` buffered tokens, the current query marks the least salient of them.
  if (n - L.nq < c_.gap) return;
  std::vector<float> sal(size_t(n - L.nq) * hkv, 0.0f);
  add_probe(q + size_t(n_new_ - 1) * qw, n - 1, n, L.nq, sal.data());
  requantize(L, n, sal);
}

Status ZipKvCache::commit() {
  if (n_new_ > 1) {
    scr_.trim();
    sched_.hold_prompt();
  }
  n_past_ += n_new_;
  n_new_ = 0;
  peak_ = std::max(peak_, bytes_held());
  // --prefill-route chunk: every prompt chunk gets the prompt's rule at once (its own probes).
  if (!sched_.defers_prompt() && sched_.prompt_pending()) return end_prompt();
  return Status::ok();
}

Status ZipKvCache::end_prompt() {
  if (!sched_.prompt_pending()) return Status::ok();
  const int hkv = shape_.n_kv_heads, qw = shape_.q_width();
  const int64_t n = n_past_;
  std::vector<float> qrow(static_cast<size_t>(qw));
  const bool dump = !dump_dir_.empty() && !dumped_;
  std::vector<std::vector<float>> k_in, v_in;  // the prompt as buffered (for the dump)
  for (int l = 0; l < shape_.n_layers; ++l) {
    Layer& L = layers_[size_t(l)];
    if (dump) {
      k_in.emplace_back(L.k_buf.size());
      v_in.emplace_back(L.v_buf.size());
      half_to_f32(dtype_, L.k_buf.data(), k_in.back().data(), int64_t(L.k_buf.size()));
      half_to_f32(dtype_, L.v_buf.data(), v_in.back().data(), int64_t(L.v_buf.size()));
    }
    dequantize_layer(L, n, nullptr);
    L.saliency.resize(size_t(n - L.nq) * hkv, 0.0f);
    advance_ring(l, L, n);  // the random probes before the last 5 %
    const int64_t rows = int64_t(L.ring.size()) / qw;
    for (int64_t i = 0; i < rows; ++i) {  // the last 5 %
      half_to_f32(dtype_, L.ring.data() + size_t(i) * qw, qrow.data(), qw);
      add_probe(qrow.data(), L.ring_pos0 + i, n, L.nq, L.saliency.data());
    }
    // Normalized by the queries that can see each token: n − t.
    for (int64_t t = L.nq; t < n; ++t)
      for (int h = 0; h < hkv; ++h) L.saliency[size_t(t - L.nq) * hkv + size_t(h)] /= float(n - t);
    requantize(L, n, L.saliency);
    std::vector<uint16_t>().swap(L.ring);
    std::vector<float>().swap(L.saliency);
    L.ring_pos0 = 0;
    L.k_buf.shrink_to_fit();  // the prompt's f16 copy is gone
    L.v_buf.shrink_to_fit();
  }
  sched_.prompt_routed();
  if (!dump) return Status::ok();
  dumped_ = true;
  const Status st = dump_prompt(k_in, v_in);
  std::vector<std::vector<float>>().swap(dump_q_);
  return st;
}

Status ZipKvCache::dump_prompt(const std::vector<std::vector<float>>& k_in,
                               const std::vector<std::vector<float>>& v_in) const {
  const int hkv = shape_.n_kv_heads, kvw = shape_.kv_width(), qw = shape_.q_width();
  auto write = [&](int l, const std::string& what, const std::vector<float>& x,
                   int64_t cols) -> Status {
    return write_npy(fmt::format("{}/zip_L{}_{}.npy", dump_dir_, l, what), x.data(),
                     cols ? int64_t(x.size()) / cols : 0, cols);
  };
  for (int l = 0; l < shape_.n_layers; ++l) {
    const Layer& L = layers_[size_t(l)];
    if (int64_t(k_in[size_t(l)].size()) != L.nq * kvw)
      return Status::error(
          "--kv-trace with zipcache dumps one whole prompt (use --prefill-route end)");
    QEVICT_RETURN_IF_ERROR(write(l, "k_in", k_in[size_t(l)], kvw));
    QEVICT_RETURN_IF_ERROR(write(l, "v_in", v_in[size_t(l)], kvw));
    // Every query row, and the probes the rule used: the last 5 % and the random ones before.
    std::vector<float> pos;
    for (int64_t t = 0; t < L.nq; ++t)
      if (t >= c_.recent_probe_start(L.nq) || c_.is_random_probe(l, t)) pos.push_back(float(t));
    QEVICT_RETURN_IF_ERROR(write(l, "probe_pos", pos, 1));
    QEVICT_RETURN_IF_ERROR(write(l, "q", dump_q_[size_t(l)], qw));
    for (int set = 0; set < 2; ++set) {
      const char* sn = set == 0 ? "imp" : "unimp";
      const auto& lists = set == 0 ? L.imp : L.unimp;
      std::vector<float> ids;
      for (int h = 0; h < hkv; ++h)
        for (int32_t t : lists[size_t(h)]) ids.push_back(float(t));
      QEVICT_RETURN_IF_ERROR(write(l, sn, ids, int64_t(lists[0].size())));
      const ZipSet& ks = set == 0 ? L.k_imp : L.k_unimp;
      const ZipSet& vs = set == 0 ? L.v_imp : L.v_unimp;
      std::vector<float> kc(size_t(ks.rows) * kvw), vc(kc.size());
      for (int64_t i = 0; i < ks.rows * kvw; ++i) {
        kc[size_t(i)] = float(zip_code(ks, i));
        vc[size_t(i)] = float(zip_code(vs, i));
      }
      auto f32 = [](const std::vector<uint16_t>& x) {
        std::vector<float> y(x.size());
        for (size_t i = 0; i < x.size(); ++i) y[i] = f16_to_f32(x[i]);
        return y;
      };
      QEVICT_RETURN_IF_ERROR(write(l, fmt::format("k_codes_{}", sn), kc, kvw));
      QEVICT_RETURN_IF_ERROR(write(l, fmt::format("v_codes_{}", sn), vc, kvw));
      QEVICT_RETURN_IF_ERROR(write(l, fmt::format("k_min_{}", sn), f32(ks.col_a), kvw));
      QEVICT_RETURN_IF_ERROR(write(l, fmt::format("k_step_{}", sn), f32(ks.col_b), kvw));
      QEVICT_RETURN_IF_ERROR(write(l, fmt::format("v_rmin_{}", sn), f32(vs.row_min), 1));
      QEVICT_RETURN_IF_ERROR(write(l, fmt::format("v_rstep_{}", sn), f32(vs.row_step), 1));
    }
    std::vector<float> sc(L.v_scale.size());
    for (size_t i = 0; i < sc.size(); ++i) sc[i] = f16_to_f32(L.v_scale[i]);
    QEVICT_RETURN_IF_ERROR(write(l, "v_scale", sc, kvw));
  }
  std::FILE* f = std::fopen((dump_dir_ + "/zip_meta.json").c_str(), "w");
  if (!f) return Status::error(fmt::format("cannot write {}/zip_meta.json", dump_dir_));
  std::fprintf(f,
               "{\"hi_bits\": %d, \"lo_bits\": %d, \"unimportant_ratio\": %g, \"probe_ratio\": "
               "%g, \"n\": %lld, \"n_layers\": %d, \"n_kv_heads\": %d, \"n_q_heads\": %d, "
               "\"head_dim\": %d}\n",
               c_.hi_bits, c_.lo_bits, c_.unimportant_ratio, c_.probe_ratio, (long long)n_past_,
               shape_.n_layers, hkv, shape_.n_q_heads, shape_.head_dim);
  std::fclose(f);
  return Status::ok();
}

void ZipKvCache::clear() {
  for (Layer& L : layers_) {
    L = Layer();
    L.imp.resize(size_t(shape_.n_kv_heads));
    L.unimp.resize(size_t(shape_.n_kv_heads));
  }
  n_past_ = n_new_ = 0;
  sched_.prompt_routed();
}

size_t ZipKvCache::layer_bytes(int l) const {
  const Layer& L = layers_[size_t(l)];
  size_t b = L.k_imp.bytes() + L.k_unimp.bytes() + L.v_imp.bytes() + L.v_unimp.bytes() +
             (L.k_buf.size() + L.v_buf.size() + L.v_scale.size()) * 2;
  for (int h = 0; h < shape_.n_kv_heads; ++h)
    b += (L.imp[size_t(h)].size() + L.unimp[size_t(h)].size()) * sizeof(int32_t);
  return b;
}

size_t ZipKvCache::bytes_held() const {
  auto set_cap = [](const ZipSet& s) {
    return s.codes.capacity() + (s.col_a.capacity() + s.col_b.capacity() + s.row_min.capacity() +
                                 s.row_step.capacity()) *
                                    2;
  };
  size_t b = 0;
  for (const Layer& L : layers_) {
    b += set_cap(L.k_imp) + set_cap(L.k_unimp) + set_cap(L.v_imp) + set_cap(L.v_unimp);
    b += (L.k_buf.capacity() + L.v_buf.capacity() + L.ring.capacity() + L.v_scale.capacity()) * 2 +
         L.saliency.capacity() * 4;
    for (int h = 0; h < shape_.n_kv_heads; ++h)
      b += (L.imp[size_t(h)].capacity() + L.unimp[size_t(h)].capacity()) * sizeof(int32_t);
  }
  for (const std::vector<float>& q : dump_q_) b += q.capacity() * 4;  // --kv-trace only
  return b + scr_.bytes() + (rows_.capacity() + logits_.capacity()) * 4;
}

std::string ZipKvCache::describe() const {
  return fmt::format(
      "zipcache {}/{} bits (the {:.0f} % least salient tokens per KV head at {} bits, by "
      "normalized attention of {:.0f} % recent + {:.0f} % random probe queries; keys per "
      "channel, values channel-scaled per token); new tokens in f16, all requantized every {}",
      c_.hi_bits, c_.lo_bits, c_.unimportant_ratio * 100, c_.lo_bits, c_.probe_ratio * 100,
      c_.probe_ratio * 100, c_.gap);
}

void ZipKvCache::report(KvReport* out, ReportDetail detail) const {
  *out = quantizer_report("zipcache", describe(), shape_, bytes_held(), peak_);
  out->routing_events = requantizations_ / std::max(1, shape_.n_layers);
  for (int l = 0; l < shape_.n_layers; ++l) {
    const Layer& L = layers_[size_t(l)];
    KvLayerReport r;
    r.windows_quant = L.nq;                          // tokens quantized
    r.windows_local = n_past_ - L.nq;                // tokens in the f16 buffer
    r.quantized_units = int64_t(L.unimp[0].size());  // tokens at the low bit width (per head)
    r.bytes_full = (L.k_buf.size() + L.v_buf.size()) * 2;
    r.bytes_quant = layer_bytes(l) - r.bytes_full;
    r.bytes_budgeted = r.bytes_quant + r.bytes_full;
    r.bytes_allocated = r.bytes_budgeted;
    out->layers.push_back(r);
  }
  if (detail != ReportDetail::kTiers) return;
  for (const Layer& L : layers_) {
    std::vector<Tier> t(size_t(n_past_), Tier::kLocal);
    for (int64_t p = 0; p < L.nq; ++p) t[size_t(p)] = Tier::kQuant;
    out->position_tiers.push_back(std::move(t));
  }
}

ZipLayerExport ZipKvCache::export_layer(int l) const {
  const Layer& L = layers_[size_t(l)];
  const int hkv = shape_.n_kv_heads, d = shape_.head_dim, kvw = shape_.kv_width();
  ZipLayerExport e;
  e.n = n_past_;
  e.quantized = L.nq;
  e.important = L.imp;
  e.unimportant = L.unimp;
  e.k.assign(size_t(n_past_) * kvw, 0.0f);
  e.v.assign(size_t(n_past_) * kvw, 0.0f);
  for (int set = 0; set < 2; ++set) {
    const auto& lists = set == 0 ? L.imp : L.unimp;
    const ZipSet& ks = set == 0 ? L.k_imp : L.k_unimp;
    const ZipSet& vs = set == 0 ? L.v_imp : L.v_unimp;
    for (int h = 0; h < hkv; ++h)
      for (int64_t j = 0; j < int64_t(lists[size_t(h)].size()); ++j) {
        const size_t t = size_t(lists[size_t(h)][size_t(j)]);
        for (int ch = 0; ch < d; ++ch) {
          e.k[t * kvw + size_t(h) * d + ch] = zip_dequant_key(ks, j, h * d + ch);
          e.v[t * kvw + size_t(h) * d + ch] =
              zip_dequant_value(vs, L.v_scale.data(), j, h * d + ch);
        }
      }
  }
  for (int64_t t = L.nq; t < n_past_; ++t)
    for (int c = 0; c < kvw; ++c) {
      e.k[size_t(t) * kvw + c] = f16_to_f32(L.k_buf[size_t(t - L.nq) * kvw + c]);
      e.v[size_t(t) * kvw + c] = f16_to_f32(L.v_buf[size_t(t - L.nq) * kvw + c]);
    }
  return e;
}

Expected<std::unique_ptr<SequenceKvCache>> make_zipcache_cache(const KvShape& shape, int64_t n_ctx,
                                                               const KvCacheParams& p) {
  ZipCacheConfig c;
  c.lo_bits = p.quant.bits;
  c.unimportant_ratio = p.quant.low_share;
  c.gap = p.quant.gap;
  QEVICT_RETURN_IF_ERROR(c.validate());
  QEVICT_RETURN_IF_ERROR(
      check_quantizer_params(p, "zipcache", "buffer and parameters", "the prompt's rule"));
  return std::unique_ptr<SequenceKvCache>(new ZipKvCache(shape, n_ctx, p, c));
}

}  // namespace qevict
