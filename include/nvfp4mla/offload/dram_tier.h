#pragma once
// DRAM tier of the offload store: whole blocks in host memory under a byte budget, least
// recently used evicted first. Blocks are immutable once inserted (a put of the same key
// replaces the block as a whole), so a reader copies out a complete block even while a writer
// replaces it. Thread safe.
#include <cstdint>
#include <memory>

#include "nvfp4mla/offload/block_file.h"

namespace nvfp4mla::offload {

struct DramTierStats {
  uint64_t blocks = 0, bytes = 0, capacity_bytes = 0;
  uint64_t hits = 0, misses = 0, puts = 0, evictions = 0;
  uint64_t rejected = 0;  // puts of a block larger than the whole budget
};

class DramTier {
 public:
  // Budget counts key and block bytes. A budget of 0 disables the tier (every get misses).
  explicit DramTier(uint64_t capacity_bytes);
  ~DramTier();
  DramTier(const DramTier&) = delete;
  DramTier& operator=(const DramTier&) = delete;

  // Copies the block in; evicts least-recently-used blocks to fit. False when the block alone
  // exceeds the budget (nothing is stored then; an older block under the key is dropped).
  bool put(ByteSpan key, ByteSpan block);
  // Counts the puts and erases of `key` so far (put_if_unchanged does not count). Keys share
  // counters through a fixed table of 4096, so a write of another key may count too.
  uint64_t write_epoch(ByteSpan key) const;
  // A reader's promotion of a block it read from a lower tier: stores it like put, but false and
  // no change when a block is stored under the key already (never replacing a newer one a writer
  // put meanwhile) or when a put or erase of the key happened since write_epoch(key) returned
  // `epoch`, read before the lower tier was (a writer may have stored a newer block here that was
  // evicted again, and the older block must not come back in its place).
  bool put_if_unchanged(ByteSpan key, ByteSpan block, uint64_t epoch);
  // Copies the block out and marks it most recently used. False on a miss or when out.size()
  // differs from the stored block's size.
  bool get(ByteSpan key, MutableByteSpan out);
  bool contains(ByteSpan key) const;
  bool erase(ByteSpan key);
  DramTierStats stats() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace nvfp4mla::offload
