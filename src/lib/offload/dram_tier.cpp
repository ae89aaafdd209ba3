#include "nvfp4mla/offload/dram_tier.h"

#include <array>
#include <cstring>
#include <functional>
#include <list>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

namespace nvfp4mla::offload {

namespace {
std::string as_key_string(ByteSpan key) { return {reinterpret_cast<const char*>(key.data()), key.size()}; }
}  // namespace

struct DramTier::Impl {
  using Block = std::shared_ptr<const std::vector<uint8_t>>;
  struct Entry {
    Block block;
    std::list<std::string>::iterator lru;
  };
  uint64_t capacity = 0;
  mutable std::mutex mu;
  std::unordered_map<std::string, Entry> index;
  std::list<std::string> lru;  // most recently used first
  uint64_t bytes = 0;
  // Puts and erases per key hash: bounded memory, and a write of one key rarely holds back
  // another key's promotion (only when their hashes share a counter).
  static constexpr size_t kEpochSlots = 4096;
  std::array<uint64_t, kEpochSlots> write_epochs{};
  DramTierStats counters;

  static size_t epoch_slot(const std::string& key) { return std::hash<std::string>{}(key) % kEpochSlots; }

  static uint64_t cost(const std::string& key, const Block& block) { return key.size() + block->size(); }
  // put (no epoch: replaces) and put_if_unchanged (the reader's epoch).
  bool insert(ByteSpan key, ByteSpan block, std::optional<uint64_t> promotion_epoch);
  void drop_locked(std::unordered_map<std::string, Entry>::iterator it) {
    bytes -= cost(it->first, it->second.block);
    lru.erase(it->second.lru);
    index.erase(it);
  }
};

DramTier::DramTier(uint64_t capacity_bytes) : impl_(std::make_unique<Impl>()) {
  impl_->capacity = capacity_bytes;
  impl_->counters.capacity_bytes = capacity_bytes;
}

DramTier::~DramTier() = default;

bool DramTier::put(ByteSpan key, ByteSpan block) { return impl_->insert(key, block, std::nullopt); }
bool DramTier::put_if_unchanged(ByteSpan key, ByteSpan block, uint64_t epoch) { return impl_->insert(key, block, epoch); }

uint64_t DramTier::write_epoch(ByteSpan key) const {
  std::lock_guard lock(impl_->mu);
  return impl_->write_epochs[Impl::epoch_slot(as_key_string(key))];
}

bool DramTier::Impl::insert(ByteSpan key, ByteSpan block, std::optional<uint64_t> promotion_epoch) {
  Impl& m = *this;
  const std::string k = as_key_string(key);
  const bool replace = !promotion_epoch;
  uint64_t& epoch = m.write_epochs[epoch_slot(k)];  // read and written under the lock only
  if (k.size() + block.size() > m.capacity) {
    std::lock_guard lock(m.mu);
    if (replace) {
      ++epoch;
      if (auto it = m.index.find(k); it != m.index.end()) m.drop_locked(it);  // never serve the older block
    }
    ++m.counters.rejected;
    return false;
  }
  // Copy outside the lock; the block is published whole.
  auto copy = std::make_shared<const std::vector<uint8_t>>(block.begin(), block.end());
  std::lock_guard lock(m.mu);
  if (promotion_epoch && *promotion_epoch != epoch) return false;
  if (replace) ++epoch;
  if (auto it = m.index.find(k); it != m.index.end()) {
    if (!replace) return false;
    m.drop_locked(it);
  }
  while (m.bytes + Impl::cost(k, copy) > m.capacity && !m.lru.empty()) {
    m.drop_locked(m.index.find(m.lru.back()));
    ++m.counters.evictions;
  }
  m.lru.push_front(k);
  m.bytes += Impl::cost(k, copy);
  m.index.emplace(k, Impl::Entry{std::move(copy), m.lru.begin()});
  ++m.counters.puts;
  return true;
}

bool DramTier::get(ByteSpan key, MutableByteSpan out) {
  Impl& m = *impl_;
  Impl::Block block;
  {
    std::lock_guard lock(m.mu);
    const auto it = m.index.find(as_key_string(key));
    if (it == m.index.end() || it->second.block->size() != out.size()) {
      ++m.counters.misses;
      return false;
    }
    m.lru.splice(m.lru.begin(), m.lru, it->second.lru);
    block = it->second.block;
    ++m.counters.hits;
  }
  // The shared pointer keeps the block alive even if it is evicted or replaced meanwhile.
  std::memcpy(out.data(), block->data(), out.size());
  return true;
}

bool DramTier::contains(ByteSpan key) const {
  std::lock_guard lock(impl_->mu);
  return impl_->index.count(as_key_string(key)) != 0;
}

bool DramTier::erase(ByteSpan key) {
  std::lock_guard lock(impl_->mu);
  const std::string k = as_key_string(key);
  ++impl_->write_epochs[Impl::epoch_slot(k)];
  const auto it = impl_->index.find(k);
  if (it == impl_->index.end()) return false;
  impl_->drop_locked(it);
  return true;
}

DramTierStats DramTier::stats() const {
  std::lock_guard lock(impl_->mu);
  DramTierStats s = impl_->counters;
  s.blocks = impl_->index.size();
  s.bytes = impl_->bytes;
  return s;
}

}  // namespace nvfp4mla::offload
