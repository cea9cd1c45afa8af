// SlotPool (see slot_pool.h).
#include "kvcache/slot_pool.h"

namespace qevict {

int32_t SlotPool::acquire() {
  if (free_.empty()) {
    const int32_t base = static_cast<int32_t>(chunks_.size() * kChunkSlots);
    chunks_.emplace_back(new uint8_t[kChunkSlots * slot_bytes_]());
    // Hand out low ids first: push in reverse so back() is the lowest.
    for (int i = kChunkSlots - 1; i >= 0; --i) free_.push_back(base + i);
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
  for (int32_t s = static_cast<int32_t>(chunks_.size() * kChunkSlots) - 1; s >= 0; --s) free_.push_back(s);
  in_use_ = 0;
}

}  // namespace qevict
