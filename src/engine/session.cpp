// Sessions (see session.h).
#include "engine/session.h"

#include <fmt/format.h>

#include <chrono>
#include <fstream>
#include <sstream>

#include "core/atomic_file.h"
#include "engine/prompt_drive.h"
#include "engine/session_file.h"
#include "kvcache/factory.h"
#include "kvcache/registry.h"

namespace qevict {

namespace {
using Clock = std::chrono::steady_clock;
double since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}
}  // namespace

int64_t common_prefix(const std::vector<int32_t>& a, const std::vector<int32_t>& b) {
  const size_t n = std::min(a.size(), b.size());
  size_t i = 0;
  while (i < n && a[i] == b[i]) ++i;
  return int64_t(i);
}

Session::Session(Model& model, const SessionOptions& opts, std::unique_ptr<SequenceKvCache> cache)
    : model_(model), opts_(opts), cache_(std::move(cache)) {}

Expected<std::unique_ptr<Session>> Session::create(Model& model, const SessionOptions& opts) {
  SessionOptions o = opts;
  if (o.n_ctx <= 0) o.n_ctx = model.config().n_ctx_train;
  if (o.n_ctx <= 0) return Status::error("session: no context size (the model states none)");
  if (o.prefill_chunk <= 0) return Status::error("session: the prefill chunk must be positive");
  auto cache = make_kv_cache(model.kv_shape(), o.n_ctx, o.kv);
  if (!cache) return cache.status();
  return std::unique_ptr<Session>(new Session(model, o, std::move(cache.value())));
}

std::unique_ptr<Session> Session::adopt(Model& model, const SessionOptions& opts,
                                        std::unique_ptr<SequenceKvCache> cache,
                                        std::vector<int32_t> tokens) {
  std::unique_ptr<Session> s(new Session(model, opts, std::move(cache)));
  s->tokens_ = std::move(tokens);
  return s;
}

std::unique_ptr<SequenceKvCache> Session::release_cache() {
  broken_ = true;
  return std::move(cache_);
}

void Session::counters(int64_t* promotions, int64_t* demotions, int64_t* evictions) const {
  KvReport r;
  cache_->report(&r, ReportDetail::kSummary);
  *promotions = *demotions = *evictions = 0;
  for (const KvLayerReport& l : r.layers) {
    *promotions += l.promotions;
    *demotions += l.demotions;
    *evictions += l.evictions;
  }
}

Status Session::append(const std::vector<int32_t>& turn, ThreadPool& pool,
                       std::vector<float>* last_logits) {
  if (broken_) return Status::error("session: a previous turn failed; start a new session");
  const int64_t n0 = cache_->n_past();
  std::vector<int32_t> feed(tokens_.begin() + n0, tokens_.end());
  feed.insert(feed.end(), turn.begin(), turn.end());
  if (feed.empty()) return Status::error("session: nothing to append");
  if (n0 + int64_t(feed.size()) > cache_->n_ctx())
    return Status::error(fmt::format("session: {} tokens held + {} new exceed the context size {}",
                                     n0, feed.size(), cache_->n_ctx()));
  TurnStats ts;
  int64_t p0, d0, e0;
  counters(&p0, &d0, &e0);
  std::vector<float> logits(size_t(model_.config().n_vocab));
  const auto t0 = Clock::now();
  PromptFeed f{cache_.get(), feed.data(), int64_t(feed.size()), logits.data()};
  const Status st = prefill_prompts(model_, {f}, opts_.prefill_chunk, pool, true);
  if (!st) {
    if (cache_->n_past() != n0) broken_ = true;
    return st;
  }
  ts.prompt_seconds = since(t0);
  ts.prompt_tokens = int64_t(feed.size());
  ts.reused_tokens = n0;
  tokens_.insert(tokens_.end(), turn.begin(), turn.end());
  int64_t p1, d1, e1;
  counters(&p1, &d1, &e1);
  ts.promotions = p1 - p0, ts.demotions = d1 - d0, ts.evictions = e1 - e0;
  ts.bytes_held = cache_->bytes_held();
  turns_.push_back(ts);
  if (last_logits) *last_logits = std::move(logits);
  return Status::ok();
}

Status Session::generate(const std::vector<int32_t>& turn, int n_predict,
                         const SamplingParams& sampling, const std::vector<int32_t>& stop_tokens,
                         ThreadPool& pool, const std::function<bool(int32_t)>& on_token,
                         GenerateResult* out) {
  if (broken_) return Status::error("session: a previous turn failed; start a new session");
  if (n_predict < 0) return Status::error("session: n_predict must be >= 0");
  // The model needs at least one token to run on: with nothing pending and no new turn, the
  // last token is run again (dropped from the cache first, when the cache can).
  if (turn.empty() && cache_->n_past() == int64_t(tokens_.size())) {
    if (tokens_.empty()) return Status::error("session: nothing to generate from");
    QEVICT_RETURN_IF_ERROR(cache_->truncate(cache_->n_past() - 1));
  }
  const int64_t n0 = cache_->n_past();
  GenerationRequest r;
  r.cache = cache_.get();
  r.prompt.assign(tokens_.begin() + n0, tokens_.end());
  r.prompt.insert(r.prompt.end(), turn.begin(), turn.end());
  r.n_predict = n_predict;
  r.sampling = sampling;
  r.stop_tokens = stop_tokens;
  if (n0 + int64_t(r.prompt.size()) + n_predict > cache_->n_ctx() + 1)
    return Status::error(
        fmt::format("session: {} tokens held + {} new + {} to generate exceed the context size {}",
                    n0, r.prompt.size(), n_predict, cache_->n_ctx()));
  int64_t p0, d0, e0;
  counters(&p0, &d0, &e0);
  std::vector<GenerationRequest> reqs{std::move(r)};
  GenerateOptions go;
  go.prefill_chunk = opts_.prefill_chunk;
  GenerationStats gs;
  TokenCallback cb = [&](size_t, int32_t tok) { return on_token ? on_token(tok) : true; };
  const Status st = qevict::generate(model_, pool, reqs, go, cb, &gs);
  if (!st) {
    if (cache_->n_past() != n0) broken_ = true;
    return st;
  }
  const GenerationRequest& g = reqs[0];
  tokens_.insert(tokens_.end(), turn.begin(), turn.end());
  tokens_.insert(tokens_.end(), g.output.begin(), g.output.end());
  TurnStats ts;
  ts.prompt_tokens = int64_t(g.prompt.size());
  ts.reused_tokens = n0;
  ts.generated = int64_t(g.output.size());
  ts.prompt_seconds = gs.prompt_seconds;
  ts.decode_seconds = gs.decode_seconds;
  int64_t p1, d1, e1;
  counters(&p1, &d1, &e1);
  ts.promotions = p1 - p0, ts.demotions = d1 - d0, ts.evictions = e1 - e0;
  ts.bytes_held = cache_->bytes_held();
  turns_.push_back(ts);
  if (out) {
    out->tokens = g.output;
    out->hit_stop = g.hit_stop;
  }
  return Status::ok();
}

bool Session::can_rewind(int64_t n) const {
  if (n < 0 || n > int64_t(tokens_.size()) || broken_) return false;
  return n >= cache_->n_past() || cache_->can_truncate(n);
}

Status Session::rewind(int64_t n) {
  if (n < 0 || n > int64_t(tokens_.size()))
    return Status::error(fmt::format("session: cannot rewind {} tokens to {}", tokens_.size(), n));
  if (n < cache_->n_past()) QEVICT_RETURN_IF_ERROR(cache_->truncate(n));
  tokens_.resize(size_t(n));
  return Status::ok();
}

Expected<std::string> Session::serialize(SaveMode* mode) const {
  if (broken_) return Status::error("session: a failed session cannot be saved");
  SessionFileContents c;
  c.model_fingerprint = model_fingerprint(model_);
  c.model_name = model_.config().name;
  c.kv = opts_.kv;
  c.n_ctx = opts_.n_ctx;
  c.prefill_chunk = opts_.prefill_chunk;
  c.tokens = tokens_;
  c.cache_n_past = cache_->n_past();
  KvReport rep;
  cache_->report(&rep, ReportDetail::kSummary);
  for (const KvLayerReport& l : rep.layers) {
    c.bytes_sink += l.bytes_sink;
    c.bytes_full += l.bytes_full;
    c.bytes_quant += l.bytes_quant;
  }
  if (cache_->can_save_state()) {
    ByteWriter w;
    QEVICT_RETURN_IF_ERROR(cache_->save_state(w));
    c.has_state = true;
    c.state = std::move(w.bytes());
  }
  if (mode) *mode = c.has_state ? SaveMode::kState : SaveMode::kTokensOnly;
  return encode_session(c);
}

Status Session::save(const std::string& path, SaveMode* mode) const {
  auto bytes = serialize(mode);
  if (!bytes) return bytes.status();
  return write_file_atomic(path, bytes.value());
}

Expected<std::unique_ptr<Session>> Session::deserialize(Model& model, const std::string& bytes,
                                                        ThreadPool& pool, bool* restored) {
  auto dec = decode_session(bytes);
  if (!dec) return dec.status();
  SessionFileContents& c = dec.value();
  if (c.model_fingerprint != model_fingerprint(model))
    return Status::error(
        fmt::format("session was saved with another model ('{}'); this one is '{}'", c.model_name,
                    model.config().name));
  const PolicyInfo* row = find_policy(c.kv.policy);
  if (!row) return Status::error(fmt::format("session: unknown KV policy '{}'", c.kv.policy));
  if (row->needs_calibration)
    return Status::error(fmt::format(
        "session: a {} session cannot be restored (its calibration is not saved)", c.kv.policy));
  SessionOptions o;
  o.kv = c.kv;
  o.n_ctx = c.n_ctx;
  o.prefill_chunk = c.prefill_chunk;
  auto s = create(model, o);
  if (!s) return s.status();
  Session& ses = *s.value();
  if (c.has_state) {
    ByteReader r(c.state);
    QEVICT_RETURN_IF_ERROR(ses.cache_->load_state(r));
    if (r.left() != 0) return Status::error("session file: bytes after the cache state");
    if (ses.cache_->n_past() != c.cache_n_past)
      return Status::error("session file: the cache state's length differs from the header's");
    ses.tokens_ = std::move(c.tokens);
  } else if (c.cache_n_past > 0) {
    // Tokens only: the history the cache had consumed is prefilled again.
    const std::vector<int32_t> fed(c.tokens.begin(), c.tokens.begin() + c.cache_n_past);
    QEVICT_RETURN_IF_ERROR(ses.append(fed, pool));
    ses.turns_.clear();
    ses.tokens_ = std::move(c.tokens);
  } else {
    ses.tokens_ = std::move(c.tokens);
  }
  if (restored) *restored = c.has_state;
  return std::move(s.value());
}

Expected<std::unique_ptr<Session>> Session::load(Model& model, const std::string& path,
                                                 ThreadPool& pool, bool* restored) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return Status::error(fmt::format("cannot open session file '{}'", path));
  std::ostringstream ss;
  ss << in.rdbuf();
  if (in.bad()) return Status::error(fmt::format("cannot read session file '{}'", path));
  auto s = deserialize(model, ss.str(), pool, restored);
  if (!s) return Status::error(fmt::format("{}: {}", path, s.status().message()));
  return s;
}

}  // namespace qevict
