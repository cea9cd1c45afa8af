// Fixed-size slots of bytes, allocated in chunks (up to kChunkSlots slots, ~kChunkBytes) and
// recycled through a free list: slot addresses never move, growth never copies, and in steady state
// nothing is allocated. bytes_allocated() is what the process really holds for the pool.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "core/byte_io.h"
#include "core/status.h"

namespace qevict {

class SlotPool {
 public:
  // A chunk holds up to kChunkSlots slots and at most about kChunkBytes (but at least one
  // slot), so that large slots (e.g. 32-token windows) do not make the pool hold far more
  // than the budget it serves: a pool holds at most one partly used chunk beyond its slots
  // in use (compact() gives whole chunks back), the per-tier constant of bytes held.
  static constexpr int kChunkSlots = 32;
  static constexpr size_t kChunkBytes = size_t(64) << 10;

  // `chunk_bytes` caps a chunk below kChunkBytes: a budgeted store passes a small share of its
  // budget, so that the partly used chunk stays a small share of what it holds.
  explicit SlotPool(size_t slot_bytes = 0, size_t chunk_bytes = kChunkBytes)
      : slot_bytes_(slot_bytes),
        chunk_slots_(slot_bytes == 0
                         ? kChunkSlots
                         : int32_t(std::clamp<size_t>(
                               std::min(chunk_bytes, kChunkBytes) / slot_bytes, 1, kChunkSlots))) {}
  size_t chunk_bytes() const { return size_t(chunk_slots_) * slot_bytes_; }
  SlotPool(SlotPool&&) = default;
  SlotPool& operator=(SlotPool&&) = default;

  size_t slot_bytes() const { return slot_bytes_; }
  // Returns a free slot id (growing by one chunk when none is free).
  int32_t acquire();
  void release(int32_t slot);
  uint8_t* at(int32_t slot) {
    return chunks_[size_t(slot / chunk_slots_)].get() + size_t(slot % chunk_slots_) * slot_bytes_;
  }
  const uint8_t* at(int32_t slot) const {
    return chunks_[size_t(slot / chunk_slots_)].get() + size_t(slot % chunk_slots_) * slot_bytes_;
  }
  int32_t chunk_slots() const { return chunk_slots_; }
  int32_t in_use() const { return in_use_; }
  size_t bytes_in_use() const { return size_t(in_use_) * slot_bytes_; }
  size_t bytes_allocated() const { return chunks_.size() * chunk_slots_ * slot_bytes_; }
  // The pool's own bookkeeping (chunk pointers, free list), outside the chunks.
  size_t overhead_bytes() const {
    return chunks_.capacity() * sizeof(void*) + free_.capacity() * sizeof(int32_t);
  }  // Frees every slot (keeps the chunks).
  void reset();
  // Gives back whole chunks when at least one chunk's worth of slots is free: slots above
  // the new end are copied into free slots below it. Returns the moves as (old, new) pairs
  // so that the owner can update its slot ids; empty when nothing was released.
  std::vector<std::pair<int32_t, int32_t>> compact();

  // Sessions: every chunk's bytes, the free list (order kept: the next acquire() is the same)
  // and the bookkeeping's room. load() needs a pool of the same slot and chunk sizes.
  void save(ByteWriter& w) const;
  Status load(ByteReader& r);

 private:
  size_t slot_bytes_;
  int32_t chunk_slots_;
  std::vector<std::unique_ptr<uint8_t[]>> chunks_;
  std::vector<int32_t> free_;
  int32_t in_use_ = 0;
};

}  // namespace qevict
