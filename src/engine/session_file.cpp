// Session files (see session_file.h).
#include "engine/session_file.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstring>

#include "core/byte_io.h"

namespace qevict {

namespace {
constexpr char kMagic[8] = {'Q', 'E', 'V', 'S', 'E', 'S', 'S', '\0'};
constexpr size_t kHeaderBytes = 8 + 4 + 4 + 8 + 8;

void put_params(ByteWriter& w, const KvCacheParams& p) {
  w.put_str(p.policy);
  w.put<uint8_t>(uint8_t(p.dtype));
  w.put(p.budget_fraction);
  w.put(p.budget_bytes);
  w.put(p.budget_tokens);
  w.put(p.q);
  w.put<int32_t>(p.window);
  w.put<int32_t>(p.route_every);
  w.put<int32_t>(p.sink);
  w.put<int32_t>(p.local);
  w.put<uint8_t>(p.local_half_budget);
  w.put<int32_t>(p.bits);
  w.put<int32_t>(p.value_group);
  w.put<int32_t>(p.value_bits);
  w.put<uint8_t>(p.strict_ledger);
  w.put<uint8_t>(uint8_t(p.score));
  w.put<int32_t>(p.pool);
  w.put<uint8_t>(uint8_t(p.pool_side));
  w.put<uint8_t>(uint8_t(p.prefill_route));
  w.put<int32_t>(p.prefill_window);
  const QuantizerOptions& q = p.quant;
  w.put<int32_t>(q.bits);
  w.put<int32_t>(q.group);
  w.put<int32_t>(q.residual);
  w.put(q.outlier_share);
  w.put<int32_t>(q.f16_first);
  w.put(q.low_share);
  w.put<int32_t>(q.gap);
  w.put<int32_t>(p.key_meta);  // from version 2
  w.put(p.adapt);              // from version 3
}

template <typename T>
Status get_int(ByteReader& r, T* v, int64_t lo, int64_t hi, const char* what) {
  int32_t x = 0;
  QEVICT_RETURN_IF_ERROR(r.get(&x));
  if (x < lo || x > hi)
    return Status::error(fmt::format("session file: {} = {} is out of range", what, x));
  *v = T(x);
  return Status::ok();
}

Status get_u8(ByteReader& r, uint8_t* v, uint8_t hi, const char* what) {
  QEVICT_RETURN_IF_ERROR(r.get(v));
  if (*v > hi) return Status::error(fmt::format("session file: {} = {} is out of range", what, *v));
  return Status::ok();
}

Status get_params(ByteReader& r, uint32_t version, KvCacheParams* p) {
  uint8_t u = 0;
  QEVICT_RETURN_IF_ERROR(r.get_str(&p->policy, 64));
  QEVICT_RETURN_IF_ERROR(get_u8(r, &u, 1, "the 16-bit type"));
  p->dtype = HalfType(u);
  QEVICT_RETURN_IF_ERROR(r.get(&p->budget_fraction));
  QEVICT_RETURN_IF_ERROR(r.get(&p->budget_bytes));
  QEVICT_RETURN_IF_ERROR(r.get(&p->budget_tokens));
  QEVICT_RETURN_IF_ERROR(r.get(&p->q));
  QEVICT_RETURN_IF_ERROR(get_int(r, &p->window, 1, 1 << 16, "the window"));
  QEVICT_RETURN_IF_ERROR(get_int(r, &p->route_every, 0, 1 << 30, "route_every"));
  QEVICT_RETURN_IF_ERROR(get_int(r, &p->sink, 0, 1 << 20, "the sink"));
  QEVICT_RETURN_IF_ERROR(get_int(r, &p->local, -1, 1 << 24, "the local region"));
  QEVICT_RETURN_IF_ERROR(get_u8(r, &u, 1, "local_half_budget"));
  p->local_half_budget = u != 0;
  QEVICT_RETURN_IF_ERROR(get_int(r, &p->bits, 0, 16, "bits"));
  QEVICT_RETURN_IF_ERROR(get_int(r, &p->value_group, 0, 1 << 16, "value_group"));
  QEVICT_RETURN_IF_ERROR(get_int(r, &p->value_bits, 0, 16, "value_bits"));
  QEVICT_RETURN_IF_ERROR(get_u8(r, &u, 1, "strict_ledger"));
  p->strict_ledger = u != 0;
  QEVICT_RETURN_IF_ERROR(get_u8(r, &u, uint8_t(ScoreMode::kAge), "the score"));
  p->score = ScoreMode(u);
  QEVICT_RETURN_IF_ERROR(get_int(r, &p->pool, 0, 1 << 16, "pool"));
  QEVICT_RETURN_IF_ERROR(get_u8(r, &u, uint8_t(PoolSide::kAfter), "pool_side"));
  p->pool_side = PoolSide(u);
  QEVICT_RETURN_IF_ERROR(get_u8(r, &u, uint8_t(PrefillRoute::kStaged), "prefill_route"));
  p->prefill_route = PrefillRoute(u);
  QEVICT_RETURN_IF_ERROR(get_int(r, &p->prefill_window, 0, 1 << 20, "prefill_window"));
  QuantizerOptions& q = p->quant;
  QEVICT_RETURN_IF_ERROR(get_int(r, &q.bits, 0, 16, "quant bits"));
  QEVICT_RETURN_IF_ERROR(get_int(r, &q.group, 0, 1 << 16, "quant group"));
  QEVICT_RETURN_IF_ERROR(get_int(r, &q.residual, 0, 1 << 24, "quant residual"));
  QEVICT_RETURN_IF_ERROR(r.get(&q.outlier_share));
  QEVICT_RETURN_IF_ERROR(get_int(r, &q.f16_first, 0, 1 << 24, "f16_first"));
  QEVICT_RETURN_IF_ERROR(r.get(&q.low_share));
  QEVICT_RETURN_IF_ERROR(get_int(r, &q.gap, 0, 1 << 24, "gap"));
  p->key_meta = 16;  // version 1 had f16 key scales and zeros only
  if (version >= 2) QEVICT_RETURN_IF_ERROR(get_int(r, &p->key_meta, 8, 16, "key_meta"));
  p->adapt = 0.0;  // versions 1 and 2 had no --kv-adapt
  if (version >= 3) QEVICT_RETURN_IF_ERROR(r.get(&p->adapt));
  // The rest (a known policy, ranges that depend on each other) is the cache factory's check,
  // which Session::load runs by building the cache.
  return p->validate();
}
}  // namespace

uint64_t fnv1a64(const void* data, size_t n, uint64_t h) {
  const auto* p = static_cast<const uint8_t*>(data);
  // Eight lanes over 8-byte words, folded at the end: ~8× the speed of the byte-wise loop on a
  // state of hundreds of MiB; the tail byte-wise.
  uint64_t lanes[8];
  for (int i = 0; i < 8; ++i) lanes[i] = h ^ uint64_t(i);
  size_t i = 0;
  for (; i + 64 <= n; i += 64)
    for (int j = 0; j < 8; ++j) {
      uint64_t x;
      std::memcpy(&x, p + i + 8 * j, 8);
      lanes[j] = (lanes[j] ^ x) * 0x100000001b3ull;
    }
  for (int j = 0; j < 8; ++j) h = (h ^ lanes[j]) * 0x100000001b3ull;
  for (; i < n; ++i) h = (h ^ p[i]) * 0x100000001b3ull;
  return h;
}

uint64_t model_fingerprint(const Model& model) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (const GgufTensorInfo& t : model.gguf().tensors()) {
    h = fnv1a64(t.name.data(), t.name.size(), h);
    h = fnv1a64(t.dims.data(), t.dims.size() * sizeof(int64_t), h);
    const uint64_t meta[3] = {uint64_t(t.type), t.offset, t.n_bytes};
    h = fnv1a64(meta, sizeof(meta), h);
    if (t.data && t.n_bytes) {
      const size_t head = size_t(std::min<uint64_t>(t.n_bytes, 4096));
      h = fnv1a64(t.data, head, h);
      h = fnv1a64(t.data + (t.n_bytes - head), head, h);
    }
  }
  return h;
}

std::string encode_session(const SessionFileContents& c) {
  ByteWriter w;
  w.put(c.model_fingerprint);
  w.put_str(c.model_name);
  put_params(w, c.kv);
  w.put(c.n_ctx);
  w.put<int32_t>(c.prefill_chunk);
  w.put_vec(c.tokens);
  w.put(c.cache_n_past);
  for (size_t b : {c.bytes_sink, c.bytes_full, c.bytes_quant}) w.put<uint64_t>(b);
  w.put<uint8_t>(c.has_state);
  if (c.has_state) w.put_bytes(c.state.data(), c.state.size());
  std::string& payload = w.bytes();
  ByteWriter head;
  head.put_bytes(kMagic, sizeof(kMagic));
  head.put<uint32_t>(kSessionFileVersion);
  head.put<uint32_t>(0);
  head.put<uint64_t>(payload.size());
  head.put<uint64_t>(fnv1a64(payload.data(), payload.size()));
  return head.bytes() + payload;
}

Expected<SessionFileContents> decode_session(const std::string& bytes, bool verify_checksum) {
  if (bytes.size() < kHeaderBytes || std::memcmp(bytes.data(), kMagic, sizeof(kMagic)) != 0)
    return Status::error("not a qevict session file (bad magic)");
  ByteReader h(reinterpret_cast<const uint8_t*>(bytes.data()) + 8, kHeaderBytes - 8);
  uint32_t version = 0, reserved = 0;
  uint64_t size = 0, sum = 0;
  QEVICT_RETURN_IF_ERROR(h.get(&version));
  QEVICT_RETURN_IF_ERROR(h.get(&reserved));
  QEVICT_RETURN_IF_ERROR(h.get(&size));
  QEVICT_RETURN_IF_ERROR(h.get(&sum));
  if (version < 1 || version > kSessionFileVersion)
    return Status::error(fmt::format("session file version {} (this build reads versions 1 to {})",
                                     version, kSessionFileVersion));
  if (size != bytes.size() - kHeaderBytes)
    return Status::error(fmt::format(
        "session file is truncated or has trailing bytes: header says {} payload bytes, the file "
        "has {}",
        size, bytes.size() - kHeaderBytes));
  const auto* payload = reinterpret_cast<const uint8_t*>(bytes.data()) + kHeaderBytes;
  if (verify_checksum && fnv1a64(payload, size_t(size)) != sum)
    return Status::error("session file is corrupt (checksum mismatch)");
  ByteReader r(payload, size_t(size));
  SessionFileContents c;
  QEVICT_RETURN_IF_ERROR(r.get(&c.model_fingerprint));
  QEVICT_RETURN_IF_ERROR(r.get_str(&c.model_name, 4096));
  QEVICT_RETURN_IF_ERROR(get_params(r, version, &c.kv));
  QEVICT_RETURN_IF_ERROR(r.get(&c.n_ctx));
  QEVICT_RETURN_IF_ERROR(get_int(r, &c.prefill_chunk, 1, 1 << 24, "the prefill chunk"));
  QEVICT_RETURN_IF_ERROR(r.get_vec(&c.tokens, uint64_t(1) << 28));
  QEVICT_RETURN_IF_ERROR(r.get(&c.cache_n_past));
  if (c.n_ctx < 1 || int64_t(c.tokens.size()) > c.n_ctx || c.cache_n_past < 0 ||
      c.cache_n_past > int64_t(c.tokens.size()))
    return Status::error(
        fmt::format("session file: {} tokens, {} in the cache, context {}: inconsistent",
                    c.tokens.size(), c.cache_n_past, c.n_ctx));
  for (int32_t t : c.tokens)
    if (t < 0) return Status::error("session file: a negative token id");
  uint64_t b[3];
  for (uint64_t& x : b) QEVICT_RETURN_IF_ERROR(r.get(&x));
  c.bytes_sink = size_t(b[0]), c.bytes_full = size_t(b[1]), c.bytes_quant = size_t(b[2]);
  uint8_t has = 0;
  QEVICT_RETURN_IF_ERROR(get_u8(r, &has, 1, "the state flag"));
  c.has_state = has != 0;
  if (c.has_state) {
    c.state.resize(r.left());
    QEVICT_RETURN_IF_ERROR(r.get_bytes(c.state.data(), c.state.size()));
  } else if (r.left() != 0) {
    return Status::error("session file: bytes after a tokens-only session");
  }
  return c;
}

}  // namespace qevict
