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

}  // namespace qevict
