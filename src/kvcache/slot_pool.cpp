// SlotPool (see slot_pool.h).
#include "kvcache/slot_pool.h"

#include <algorithm>

namespace qevict {

int32_t SlotPool::acquire() {
  if (free_.empty()) {
    const int32_t base = static_cast<int32_t>(chunks_.size() * chunk_slots_);
    chunks_.emplace_back(new uint8_t[chunk_slots_ * slot_bytes_]());
    // Hand out low ids first: push in reverse so back() is the lowest.
    for (int i = chunk_slots_ - 1; i >= 0; --i) free_.push_back(base + i);
  }
  const int32_t s = free_.back();
  free_.pop_back();
  ++in_use_;
  return s;
}

void SlotPool::release(int32_t slot) {
  free_.push_back(slot);
  --in_use_;
}

void SlotPool::reset() {
  free_.clear();
  for (int32_t s = static_cast<int32_t>(chunks_.size() * chunk_slots_) - 1; s >= 0; --s)
    free_.push_back(s);
  in_use_ = 0;
}

std::vector<std::pair<int32_t, int32_t>> SlotPool::compact() {
  std::vector<std::pair<int32_t, int32_t>> moves;
  const int32_t total = static_cast<int32_t>(chunks_.size() * chunk_slots_);
  const int32_t keep_chunks = (in_use_ + chunk_slots_ - 1) / chunk_slots_;
  if (int32_t(chunks_.size()) <= keep_chunks) return moves;
  const int32_t boundary = keep_chunks * chunk_slots_;
  std::vector<char> is_free(size_t(total), 0);
  for (int32_t f : free_) is_free[size_t(f)] = 1;
  std::vector<int32_t> low_free;
  for (int32_t s = 0; s < boundary; ++s)
    if (is_free[size_t(s)]) low_free.push_back(s);
  size_t next = 0;
  for (int32_t s = boundary; s < total; ++s) {
    if (is_free[size_t(s)]) continue;
    const int32_t to = low_free[next++];  // exists: in_use <= boundary
    std::copy(at(s), at(s) + slot_bytes_, at(to));
    moves.emplace_back(s, to);
  }
  chunks_.resize(size_t(keep_chunks));
  free_.clear();
  for (size_t i = low_free.size(); i-- > next;) free_.push_back(low_free[i]);
  // The bookkeeping follows too (with one-slot chunks it grows with every slot of a prefill
  // chunk).
  if (chunks_.capacity() > 2 * chunks_.size() + 16) chunks_.shrink_to_fit();
  if (free_.capacity() > 2 * size_t(keep_chunks * chunk_slots_) + 16) free_.shrink_to_fit();
  return moves;
}

void SlotPool::save(ByteWriter& w) const {
  w.put<uint64_t>(slot_bytes_);
  w.put<int32_t>(chunk_slots_);
  w.put<uint64_t>(chunks_.size());
  w.put<uint64_t>(chunks_.capacity());
  for (const auto& c : chunks_) w.put_bytes(c.get(), size_t(chunk_slots_) * slot_bytes_);
  w.put_vec(free_);
  w.put<uint64_t>(free_.capacity());
  w.put<int32_t>(in_use_);
}

Status SlotPool::load(ByteReader& r) {
  uint64_t slot_bytes = 0, n_chunks = 0, chunks_cap = 0, free_cap = 0;
  int32_t chunk_slots = 0, in_use = 0;
  QEVICT_RETURN_IF_ERROR(r.get(&slot_bytes));
  QEVICT_RETURN_IF_ERROR(r.get(&chunk_slots));
  if (slot_bytes != slot_bytes_ || chunk_slots != chunk_slots_)
    return Status::error("session state: a slot pool of another slot or chunk size");
  QEVICT_RETURN_IF_ERROR(r.get(&n_chunks));
  QEVICT_RETURN_IF_ERROR(r.get(&chunks_cap));
  const size_t chunk = size_t(chunk_slots_) * slot_bytes_;
  if (chunk == 0 ? n_chunks > 0 : n_chunks > r.left() / chunk)
    return Status::error("session state is truncated: a slot pool's chunks");
  if (chunks_cap < n_chunks || chunks_cap > 2 * n_chunks + 64)
    return Status::error("session state: a slot pool's chunk table room is inconsistent");
  std::vector<std::unique_ptr<uint8_t[]>> chunks;
  chunks.reserve(size_t(chunks_cap));
  for (uint64_t i = 0; i < n_chunks; ++i) {
    chunks.emplace_back(new uint8_t[chunk]);
    QEVICT_RETURN_IF_ERROR(r.get_bytes(chunks.back().get(), chunk));
  }
  const uint64_t total = n_chunks * uint64_t(chunk_slots_);
  std::vector<int32_t> free_list;
  QEVICT_RETURN_IF_ERROR(r.get_vec(&free_list, total));
  QEVICT_RETURN_IF_ERROR(r.get(&free_cap));
  QEVICT_RETURN_IF_ERROR(r.get(&in_use));
  if (free_cap < free_list.size() || free_cap > 2 * total + 64)
    return Status::error("session state: a slot pool's free list room is inconsistent");
  std::vector<char> seen(size_t(total), 0);
  for (int32_t f : free_list) {
    if (f < 0 || uint64_t(f) >= total || seen[size_t(f)])
      return Status::error("session state: a slot pool's free list is corrupt");
    seen[size_t(f)] = 1;
  }
  if (in_use < 0 || uint64_t(in_use) + free_list.size() != total)
    return Status::error("session state: a slot pool's counts do not add up");
  free_list.reserve(size_t(free_cap));
  chunks_ = std::move(chunks);
  free_ = std::move(free_list);
  in_use_ = in_use;
  return Status::ok();
}

}  // namespace qevict
