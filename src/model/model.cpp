// Model loading and the forward pass (see model.h). Layer math follows llama.cpp's
// llm_build_llama: x += Wo·attn(RoPE(Wq·n1), RoPE(Wk·n1), Wv·n1); x += Wd·(silu(Wg·n2) ⊙ Wu·n2),
// with n = RMSNorm(x)·w, and logits = W_out·RMSNorm(x)·w_out (W_out tied to the
// embedding when the file has no output.weight).
#include "model/model.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include "kernels/matmul.h"
#include "kernels/ops.h"
#include "kernels/ref/dequant.h"

namespace qevict {

namespace {

// One matmul job of a fused parallel region: y[t*ldy + r] = W·x_t.
struct MatJob {
  const WeightView* w;
  const float* x;
  int64_t ldx;
  float* y;
  int64_t ldy;
};

// Runs several matmuls over the same n_tokens as one parallel region: rows of all jobs
// are concatenated and split across threads, so there is one barrier, not one per job.
void parallel_matmul(ThreadPool& pool, const std::vector<MatJob>& jobs, int64_t n_tokens) {
  int64_t total = 0;
  for (const auto& j : jobs) total += j.w->n_rows;
  const int64_t grain = matmul_row_grain(n_tokens, total, pool.size());
  pool.parallel_for(total, grain, [&](int64_t b, int64_t e) {
    int64_t base = 0;
    for (const auto& j : jobs) {
      const int64_t lo = std::max(b, base), hi = std::min(e, base + j.w->n_rows);
      if (lo < hi) matmul(*j.w, j.x, j.ldx, n_tokens, j.y, j.ldy, lo - base, hi - base);
      base += j.w->n_rows;
    }
  });
}

}  // namespace

Expected<std::unique_ptr<Model>> Model::load(const std::string& path) {
  auto f = GgufFile::open(path);
  if (!f) return f.status();
  std::unique_ptr<Model> m(new Model());
  m->file_ = *f;
  auto cfg = ModelConfig::from_gguf(**f);
  if (!cfg) return cfg.status();
  m->config_ = *cfg;
  QEVICT_RETURN_IF_ERROR(m->bind_weights());
  return m;
}

KvShape Model::kv_shape() const {
  KvShape s;
  s.n_layers = config_.n_layers;
  s.n_q_heads = config_.n_heads;
  s.n_kv_heads = config_.n_kv_heads;
  s.head_dim = config_.head_dim;
  s.rope = config_.rope;
  return s;
}

Expected<WeightView> Model::weight(const std::string& name, int64_t n_cols, int64_t n_rows) const {
  const GgufTensorInfo* t = file_->find_tensor(name);
  if (!t) return Status::error(fmt::format("{}: missing tensor '{}'", file_->path(), name));
  if (t->dims.size() != 2 || t->dims[0] != n_cols || t->dims[1] != n_rows)
    return Status::error(fmt::format("{}: tensor '{}' has shape [{}, {}], expected [{}, {}]",
                                     file_->path(), name, t->ne(0), t->ne(1), n_cols, n_rows));
  const GgmlTypeInfo* ti = ggml_type_info(t->type);
  if (!ref::can_dequantize(t->type))
    return Status::error(
        fmt::format("{}: tensor '{}' has type {}, which this engine cannot compute with yet",
                    file_->path(), name, ti ? ti->name : "?"));
  WeightView w;
  w.type = t->type;
  w.data = t->data;
  w.n_cols = n_cols;
  w.n_rows = n_rows;
  w.row_bytes = static_cast<size_t>(n_cols / ti->block_elems * ti->block_bytes);
  QEVICT_RETURN_IF_ERROR(check_weight_view(w));
  return w;
}

Expected<const float*> Model::vector_f32(const std::string& name, int64_t n, bool optional) {
  const GgufTensorInfo* t = file_->find_tensor(name);
  if (!t) {
    if (optional) return static_cast<const float*>(nullptr);
    return Status::error(fmt::format("{}: missing tensor '{}'", file_->path(), name));
  }
  if (t->n_elements != n)
    return Status::error(fmt::format("{}: tensor '{}' has {} elements, expected {}", file_->path(),
                                     name, t->n_elements, n));
  if (!ref::can_dequantize(t->type))
    return Status::error(
        fmt::format("{}: tensor '{}' has an unsupported type", file_->path(), name));
  if (t->type == GgmlType::kF32 && reinterpret_cast<uintptr_t>(t->data) % alignof(float) == 0)
    return reinterpret_cast<const float*>(t->data);
  owned_.push_back(std::make_unique<std::vector<float>>(n));
  ref::dequantize_row(t->type, t->data, owned_.back()->data(), n);
  return static_cast<const float*>(owned_.back()->data());
}

Status Model::bind_weights() {
  const ModelConfig& c = config_;
  const int64_t qw = int64_t(c.n_heads) * c.head_dim, kvw = int64_t(c.n_kv_heads) * c.head_dim;
  auto tok = weight("token_embd.weight", c.n_embd, c.n_vocab);
  if (!tok) return tok.status();
  tok_embd_ = *tok;
  if (file_->find_tensor("output.weight")) {
    auto out = weight("output.weight", c.n_embd, c.n_vocab);
    if (!out) return out.status();
    output_ = *out;
  } else {
    output_ = tok_embd_;  // tied embeddings
  }
  auto on = vector_f32("output_norm.weight", c.n_embd, false);
  if (!on) return on.status();
  output_norm_ = *on;
  layers_.resize(c.n_layers);
  for (int l = 0; l < c.n_layers; ++l) {
    LayerWeights& L = layers_[l];
    const std::string p = fmt::format("blk.{}.", l);
    auto get = [&](const char* n, int64_t cols, int64_t rows, WeightView* dst) -> Status {
      auto w = weight(p + n, cols, rows);
      if (!w) return w.status();
      *dst = *w;
      return Status::ok();
    };
    auto vec = [&](const char* n, int64_t len, bool optional, const float** dst) -> Status {
      auto v = vector_f32(p + n, len, optional);
      if (!v) return v.status();
      *dst = *v;
      return Status::ok();
    };
    QEVICT_RETURN_IF_ERROR(vec("attn_norm.weight", c.n_embd, false, &L.attn_norm));
    QEVICT_RETURN_IF_ERROR(get("attn_q.weight", c.n_embd, qw, &L.wq));
    QEVICT_RETURN_IF_ERROR(get("attn_k.weight", c.n_embd, kvw, &L.wk));
    QEVICT_RETURN_IF_ERROR(get("attn_v.weight", c.n_embd, kvw, &L.wv));
    QEVICT_RETURN_IF_ERROR(get("attn_output.weight", qw, c.n_embd, &L.wo));
    QEVICT_RETURN_IF_ERROR(vec("attn_q.bias", qw, !c.qkv_bias, &L.bq));
    QEVICT_RETURN_IF_ERROR(vec("attn_k.bias", kvw, !c.qkv_bias, &L.bk));
    QEVICT_RETURN_IF_ERROR(vec("attn_v.bias", kvw, !c.qkv_bias, &L.bv));
    QEVICT_RETURN_IF_ERROR(vec("ffn_norm.weight", c.n_embd, false, &L.ffn_norm));
    QEVICT_RETURN_IF_ERROR(get("ffn_gate.weight", c.n_embd, c.n_ff, &L.w_gate));
    QEVICT_RETURN_IF_ERROR(get("ffn_up.weight", c.n_embd, c.n_ff, &L.w_up));
    QEVICT_RETURN_IF_ERROR(get("ffn_down.weight", c.n_ff, c.n_embd, &L.w_down));
  }
  wo_.wo.clear();
  for (const LayerWeights& L : layers_) wo_.wo.push_back(L.wo);
  return Status::ok();
}

void Model::embed(int32_t token, float* out) const {
  ref::dequantize_row(tok_embd_.type, tok_embd_.data + size_t(token) * tok_embd_.row_bytes, out,
                      tok_embd_.n_cols);
}

Status Model::forward(std::vector<BatchSegment>& segments, ThreadPool& pool) {
  const ModelConfig& c = config_;
  int64_t N = 0, n_out = 0;
  for (const auto& s : segments) {
    if (!s.cache || !s.tokens || s.n_tokens <= 0)
      return Status::error("forward: empty batch segment");
    for (int64_t i = 0; i < s.n_tokens; ++i)
      if (s.tokens[i] < 0 || s.tokens[i] >= c.n_vocab)
        return Status::error(
            fmt::format("forward: token id {} out of range [0, {})", s.tokens[i], c.n_vocab));
    N += s.n_tokens;
    n_out += s.all_logits ? s.n_tokens : 1;
  }
  if (N == 0) return Status::ok();
  for (size_t i = 0; i < segments.size(); ++i) {
    for (size_t j = 0; j < i; ++j)
      if (segments[j].cache == segments[i].cache)
        return Status::error("forward: a sequence appears twice in one batch");
    Status st = segments[i].cache->begin(segments[i].n_tokens);
    if (!st) return st;  // caches begun before i hold no new tokens until commit; nothing to undo
  }

  const int64_t E = c.n_embd, qw = int64_t(c.n_heads) * c.head_dim,
                kvw = int64_t(c.n_kv_heads) * c.head_dim;
  const int64_t F = c.n_ff, R = c.rope.n_rot / 2;
  auto grow = [](std::vector<float>& v, int64_t n) {
    if (int64_t(v.size()) < n) v.resize(size_t(n));
  };
  grow(x_, N * E);
  grow(xn_, N * E);
  grow(qkv_, N * (qw + 2 * kvw));
  grow(attn_, N * qw);
  grow(tmp_, N * E);
  grow(gu_, N * 2 * F);
  grow(h_, N * F);
  grow(rope_cs_, N * 2 * R);

  // Embeddings and the RoPE angles of every token's position (shared by all layers).
  {
    int64_t t = 0;
    for (const auto& s : segments) {
      const int64_t p0 = s.cache->n_past();
      for (int64_t i = 0; i < s.n_tokens; ++i, ++t) {
        embed(s.tokens[i], x_.data() + t * E);
        rope_cos_sin(c.rope, p0 + i, rope_cs_.data() + t * 2 * R, rope_cs_.data() + t * 2 * R + R);
      }
    }
  }

  for (auto& s : segments) s.cache->set_output_projection(&wo_);
  const int64_t ldqkv = qw + 2 * kvw;
  for (int l = 0; l < c.n_layers; ++l) {
    const LayerWeights& L = layers_[l];
    for (int64_t t = 0; t < N; ++t)
      rmsnorm(x_.data() + t * E, L.attn_norm, xn_.data() + t * E, E, c.norm_eps);
    float* q = qkv_.data();
    float* k = q + qw;
    float* v = k + kvw;
    parallel_matmul(pool,
                    {{&L.wq, xn_.data(), E, q, ldqkv},
                     {&L.wk, xn_.data(), E, k, ldqkv},
                     {&L.wv, xn_.data(), E, v, ldqkv}},
                    N);
    for (int64_t t = 0; t < N; ++t) {
      float* qt = q + t * ldqkv;
      float* kt = k + t * ldqkv;
      float* vt = v + t * ldqkv;
      if (L.bq)
        for (int64_t i = 0; i < qw; ++i) qt[i] += L.bq[i];
      if (L.bk)
        for (int64_t i = 0; i < kvw; ++i) kt[i] += L.bk[i];
      if (L.bv)
        for (int64_t i = 0; i < kvw; ++i) vt[i] += L.bv[i];
      const float* cs = rope_cs_.data() + t * 2 * R;
      rope_apply(c.rope, cs, cs + R, qt, c.n_heads, c.head_dim, c.head_dim);
      rope_apply(c.rope, cs, cs + R, kt, c.n_kv_heads, c.head_dim, c.head_dim);
    }
    // The caches take contiguous [n][width] blocks: split the fused QKV rows per segment.
    grow(q_, N * qw);
    grow(k_, N * kvw);
    grow(v_, N * kvw);
    for (int64_t t = 0; t < N; ++t) {
      std::memcpy(q_.data() + t * qw, q + t * ldqkv, sizeof(float) * qw);
      std::memcpy(k_.data() + t * kvw, k + t * ldqkv, sizeof(float) * kvw);
      std::memcpy(v_.data() + t * kvw, v + t * ldqkv, sizeof(float) * kvw);
    }
    int64_t t0 = 0;
    for (auto& s : segments) {
      s.cache->attend(l, q_.data() + t0 * qw, k_.data() + t0 * kvw, v_.data() + t0 * kvw,
                      attn_.data() + t0 * qw, pool);
      t0 += s.n_tokens;
    }
    parallel_matmul(pool, {{&L.wo, attn_.data(), qw, tmp_.data(), E}}, N);
    for (int64_t i = 0; i < N * E; ++i) x_[i] += tmp_[i];

    for (int64_t t = 0; t < N; ++t)
      rmsnorm(x_.data() + t * E, L.ffn_norm, xn_.data() + t * E, E, c.norm_eps);
    parallel_matmul(pool,
                    {{&L.w_gate, xn_.data(), E, gu_.data(), 2 * F},
                     {&L.w_up, xn_.data(), E, gu_.data() + F, 2 * F}},
                    N);
    for (int64_t t = 0; t < N; ++t)
      swiglu(gu_.data() + t * 2 * F, gu_.data() + t * 2 * F + F, h_.data() + t * F, F);
    parallel_matmul(pool, {{&L.w_down, h_.data(), F, tmp_.data(), E}}, N);
    for (int64_t i = 0; i < N * E; ++i) x_[i] += tmp_[i];
  }

  // Final norm and logits for the requested rows only.
  {
    int64_t t0 = 0, o = 0;
    for (const auto& s : segments) {
      const int64_t first = s.all_logits ? 0 : s.n_tokens - 1;
      for (int64_t i = first; i < s.n_tokens; ++i, ++o)
        rmsnorm(x_.data() + (t0 + i) * E, output_norm_, xn_.data() + o * E, E, c.norm_eps);
      t0 += s.n_tokens;
    }
  }
  // One-row segments (decode) share their calls to the output matrix, the largest: it is
  // read once per kHeadRows rows instead of once per sequence (a batch of 56 decoding
  // sequences read Qwen 0.5B's 145 MB head 56 times a step). Calls stay within the per-token
  // paths, so a row's logits are the same whatever decodes beside it. Longer segments
  // (all_logits prefill) keep their own call.
  constexpr int64_t kHeadRows = 16;
  static_assert(kHeadRows <= kMatmulPerTokenMaxTokens);
  std::vector<std::pair<int64_t, float*>> rows;  // (row of xn_, where its logits go)
  int64_t o = 0;
  for (auto& s : segments) {
    const int64_t n = s.all_logits ? s.n_tokens : 1;
    if (s.logits && n == 1)
      rows.emplace_back(o, s.logits);
    else if (s.logits)
      parallel_matmul(pool, {{&output_, xn_.data() + o * E, E, s.logits, c.n_vocab}}, n);
    o += n;
  }
  if (rows.size() == 1) {
    parallel_matmul(pool,
                    {{&output_, xn_.data() + rows[0].first * E, E, rows[0].second, c.n_vocab}}, 1);
  } else if (!rows.empty()) {
    for (size_t r0 = 0; r0 < rows.size(); r0 += size_t(kHeadRows)) {
      const int64_t m = std::min<int64_t>(kHeadRows, int64_t(rows.size() - r0));
      head_x_.resize(size_t(m * E));
      head_y_.resize(size_t(m) * size_t(c.n_vocab));
      for (int64_t i = 0; i < m; ++i)
        std::copy_n(xn_.data() + rows[r0 + size_t(i)].first * E, E, head_x_.data() + i * E);
      parallel_matmul(pool, {{&output_, head_x_.data(), E, head_y_.data(), c.n_vocab}}, m);
      for (int64_t i = 0; i < m; ++i)
        std::copy_n(head_y_.data() + i * c.n_vocab, c.n_vocab, rows[r0 + size_t(i)].second);
    }
  }
  // Every segment commits (and routes when due) even if an earlier one failed, so that no
  // cache is left mid-call; the first error is returned. The caches are distinct and none
  // uses the pool in commit(), so a batch commits over the threads (a routing event of one
  // sequence then no longer leaves the other threads idle).
  std::vector<Status> st(segments.size());
  if (segments.size() == 1) {
    st[0] = segments[0].cache->commit_alone(pool);  // its routing may use the threads
  } else {
    pool.parallel_for(int64_t(segments.size()), 1, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) st[size_t(i)] = segments[size_t(i)].cache->commit();
    });
  }
  for (const Status& x : st)
    if (!x) return x;
  return Status::ok();
}

}  // namespace qevict
