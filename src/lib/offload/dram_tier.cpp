#include "nvfp4mla/offload/dram_tier.h"

#include <array>
#include <cstring>
#include <functional>
#include <list>
#include <mutex>
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
  std::array<uint64_t, 4096> write_epochs{};
  DramTierStats counters;

  uint64_t& epoch_of(const std::string& key) { return write_epochs[std::hash<std::string>{}(key) % write_epochs.size()]; }
  uint64_t epoch_of(const std::string& key) const { return write_epochs[std::hash<std::string>{}(key) % write_epochs.size()]; }

  static uint64_t cost(const std::string& key, const Block& block) { return key.size() + block->size(); }
  // put (replace), put_if_absent, and put_if_unchanged (epoch given).
  bool insert(ByteSpan key, ByteSpan block, bool replace, const uint64_t* epoch = nullptr);
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

bool DramTier::put(ByteSpan key, ByteSpan block) { return impl_->insert(key, block, true); }
bool DramTier::put_if_absent(ByteSpan key, ByteSpan block) { return impl_->insert(key, block, false); }
bool DramTier::put_if_unchanged(ByteSpan key, ByteSpan block, uint64_t epoch) { return impl_->insert(key, block, false, &epoch); }

uint64_t DramTier::write_epoch(ByteSpan key) const {
  std::lock_guard lock(impl_->mu);
  return impl_->epoch_of(as_key_string(key));
}

bool DramTier::Impl::insert(ByteSpan key, ByteSpan block, bool replace, const uint64_t* epoch) {
  Impl& m = *this;
  const std::string k = as_key_string(key);
  if (k.size() + block.size() > m.capacity) {
    std::lock_guard lock(m.mu);
    if (replace) {
      ++m.epoch_of(k);
      if (auto it = m.index.find(k); it != m.index.end()) m.drop_locked(it);  // never serve the older block
    }
    ++m.counters.rejected;
    return false;
  }
  // Copy outside the lock; the block is published whole.
  auto copy = std::make_shared<const std::vector<uint8_t>>(block.begin(), block.end());
  std::lock_guard lock(m.mu);
  if (epoch && *epoch != m.epoch_of(k)) return false;
  if (replace) ++m.epoch_of(k);
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
  ++impl_->epoch_of(k);
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
