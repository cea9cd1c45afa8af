// Shared prefill (see prefill_share.h).
#include "engine/prefill_share.h"

#include <fmt/format.h>

#include <algorithm>

namespace qevict {

RecordingKvCache::RecordingKvCache(SequenceKvCache* inner, const KvShape& shape)
    : inner_(inner), shape_(shape) {}

Status RecordingKvCache::begin(int64_t n_new) {
  QEVICT_RETURN_IF_ERROR(inner_->begin(n_new));
  Call c;
  c.n_new = n_new;
  const size_t per = size_t(shape_.n_layers) * size_t(n_new);
  c.q.resize(per * size_t(shape_.q_width()));
  c.k.resize(per * size_t(shape_.kv_width()));
  c.v.resize(per * size_t(shape_.kv_width()));
  calls_.push_back(std::move(c));
  open_ = true;
  return Status::ok();
}

void RecordingKvCache::attend(int layer, const float* q, const float* k, const float* v, float* out,
                              ThreadPool& pool) {
  Call& c = calls_.back();
  const size_t qn = size_t(c.n_new) * size_t(shape_.q_width());
  const size_t kvn = size_t(c.n_new) * size_t(shape_.kv_width());
  std::copy(q, q + qn, c.q.begin() + ptrdiff_t(size_t(layer) * qn));
  std::copy(k, k + kvn, c.k.begin() + ptrdiff_t(size_t(layer) * kvn));
  std::copy(v, v + kvn, c.v.begin() + ptrdiff_t(size_t(layer) * kvn));
  inner_->attend(layer, q, k, v, out, pool);
}

Status RecordingKvCache::commit() {
  open_ = false;
  n_recorded_ += calls_.back().n_new;
  return inner_->commit();
}

void RecordingKvCache::clear() {
  calls_.clear();
  n_recorded_ = 0;
  open_ = false;
  inner_->clear();
}

size_t RecordingKvCache::recorded_bytes() const {
  size_t b = 0;
  for (const Call& c : calls_) b += (c.q.size() + c.k.size() + c.v.size()) * sizeof(float);
  return b;
}

Status RecordingKvCache::replay(SequenceKvCache* dst, ThreadPool& pool) const {
  if (open_) return Status::error("shared prefill: a recorded call was not committed");
  if (dst->n_past() != 0)
    return Status::error(
        fmt::format("shared prefill: the target cache already holds {} tokens", dst->n_past()));
  if (!dst->prefill_keeps_everything())
    return Status::error(fmt::format(
        "shared prefill: {} evicts or quantizes during prefill, so its prompt state cannot be "
        "replayed from another cache (use --prefill-route end)",
        dst->describe()));
  if (wo_) dst->set_output_projection(wo_);
  std::vector<float> out;
  for (const Call& c : calls_) {
    QEVICT_RETURN_IF_ERROR(dst->begin(c.n_new));
    const size_t qn = size_t(c.n_new) * size_t(shape_.q_width());
    const size_t kvn = size_t(c.n_new) * size_t(shape_.kv_width());
    out.resize(qn);
    for (int l = 0; l < shape_.n_layers; ++l)
      dst->attend(l, c.q.data() + size_t(l) * qn, c.k.data() + size_t(l) * kvn,
                  c.v.data() + size_t(l) * kvn, out.data(), pool);
    QEVICT_RETURN_IF_ERROR(dst->commit());
  }
  return Status::ok();
}

}  // namespace qevict
