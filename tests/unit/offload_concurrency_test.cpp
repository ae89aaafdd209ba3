// Concurrency: many readers and writers on the same and on different keys, through the
// synchronous and the batched calls, with DRAM and disk budgets small enough to evict all the
// time. Every hit must be one whole written version of its key. Run under ThreadSanitizer by
// scripts/tsan.sh.
#include <gtest/gtest.h>

#include <atomic>
#include <cstring>
#include <random>
#include <thread>

#include "nvfp4mla/offload/block_file.h"
#include "nvfp4mla/offload/store.h"
#include "support/offload_fixtures.h"

using namespace nvfp4mla;
using namespace nvfp4mla::offload;
using nvfp4mla::testing::key_of;
using nvfp4mla::testing::pattern_bytes;
using nvfp4mla::testing::ScratchDir;
using nvfp4mla::testing::small_params;

namespace {

// A block that names its key and version in its first 12 bytes; the rest follows from them.
std::vector<uint8_t> versioned_block(uint32_t key, uint64_t version, size_t bytes) {
  std::vector<uint8_t> b = pattern_bytes(bytes, (uint64_t(key) << 40) ^ version);
  std::memcpy(b.data(), &key, 4);
  std::memcpy(b.data() + 4, &version, 8);
  return b;
}

// True when `b` is exactly some version of `key`.
bool is_whole_version_of(uint32_t key, const std::vector<uint8_t>& b) {
  uint32_t k;
  uint64_t v;
  std::memcpy(&k, b.data(), 4);
  std::memcpy(&v, b.data() + 4, 8);
  return k == key && b == versioned_block(key, v, b.size());
}

}  // namespace

TEST(OffloadConcurrency, ReadersAndWritersOnSharedAndPrivateKeys) {
  ScratchDir dir;
  const NamespaceParams p = small_params(2, 2);
  const size_t bytes = p.block_bytes();
  constexpr int kThreads = 8, kOps = 250;
  constexpr uint32_t kSharedKeys = 4;  // every thread writes these; private keys are per thread
  const uint64_t file = block_file_size(32, bytes);
  Store store(dir.path(), p,
              {.dram_capacity_bytes = 6 * (bytes + 32), .disk = {.capacity_bytes = 12 * file, .durable = false},
               .io_threads = 3, .max_queued_items = 4});
  std::atomic<uint64_t> version{1};
  std::atomic<int> bad{0}, hits{0};

  auto worker = [&](int t) {
    std::mt19937 rng(1234 + t);
    std::vector<uint8_t> out(bytes);
    for (int op = 0; op < kOps; ++op) {
      const bool shared = rng() % 2 == 0;
      const uint32_t key = shared ? rng() % kSharedKeys : 100 + t * 10 + rng() % 3;
      switch (rng() % 5) {
        case 0:
          store.put(key_of(key), versioned_block(key, version++, bytes));
          break;
        case 1: {
          // A batch of two puts and two gets of nearby keys.
          std::vector<std::vector<uint8_t>> keys, blocks, outs(2, std::vector<uint8_t>(bytes));
          for (uint32_t i = 0; i < 2; ++i) {
            keys.push_back(key_of(key + i));
            blocks.push_back(versioned_block(key + i, version++, bytes));
          }
          auto put = store.put_async({{keys[0], blocks[0]}, {keys[1], blocks[1]}});
          auto get = store.get_async({{keys[1], outs[0]}, {keys[0], outs[1]}});
          if (put.get().count(OpStatus::stored) != 2) ++bad;
          const BatchResult g = get.get();
          for (uint32_t i = 0; i < 2; ++i)
            if (g.items[i].status == OpStatus::hit) {
              ++hits;
              if (!is_whole_version_of(key + 1 - i, outs[i])) ++bad;
            }
          break;
        }
        case 2:
          store.disk().erase(key_of(key));
          break;
        default:
          if (store.get(key_of(key), out)) {
            ++hits;
            if (!is_whole_version_of(key, out)) ++bad;
          }
      }
    }
  };
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) threads.emplace_back(worker, t);
  for (auto& th : threads) th.join();

  EXPECT_EQ(bad.load(), 0);
  EXPECT_GT(hits.load(), kThreads * kOps / 10);
  const StoreStats s = store.stats();
  EXPECT_EQ(s.disk.corrupt, 0u);
  EXPECT_EQ(s.disk.put_failures, 0u);
  EXPECT_GT(s.disk.evictions, 0u);
  EXPECT_GT(s.dram.evictions, 0u);
  EXPECT_LE(s.disk.bytes, 12 * file);
  // What the index holds is what is on disk, and all of it is valid.
  const VerifyReport r = store.disk().verify();
  EXPECT_EQ(r.checked, s.disk.blocks);
  EXPECT_TRUE(r.problems.empty());
}

// A get that begins after a put of the same key has returned never sees an older block, while
// other writers keep evicting that key from DRAM: a reader that read the older block from disk
// before the put must not promote it into DRAM after the put's newer block was evicted.
TEST(OffloadConcurrency, NoGetSeesABlockOlderThanACompletedPut) {
  ScratchDir dir;
  const NamespaceParams p = small_params(2, 1);
  const size_t bytes = p.block_bytes();
  const uint64_t file = block_file_size(32, bytes);
  Store store(dir.path(), p,
              {.dram_capacity_bytes = bytes + 32, .disk = {.capacity_bytes = 64 * file, .durable = false},
               .io_threads = 1, .max_queued_items = 4});  // DRAM holds one block: any other put evicts
  constexpr uint32_t kKey = 0;
  constexpr uint64_t kVersions = 10000;
  store.put(key_of(kKey), versioned_block(kKey, 1, bytes));
  std::atomic<uint64_t> completed{1};  // the newest version whose put has returned
  std::atomic<bool> stop{false};
  std::atomic<int> stale{0}, torn{0}, hits{0};

  std::thread writer([&] {
    for (uint64_t v = 2; v <= kVersions; ++v) {
      store.put(key_of(kKey), versioned_block(kKey, v, bytes));
      completed.store(v, std::memory_order_release);
    }
    stop = true;
  });
  std::vector<std::thread> others;
  for (int t = 0; t < 3; ++t)  // evict the key from DRAM all the time
    others.emplace_back([&, t] {
      for (uint64_t v = 0; !stop; ++v) store.put(key_of(1 + t), versioned_block(1 + t, v, bytes));
    });
  for (int t = 0; t < 4; ++t)
    others.emplace_back([&] {
      std::vector<uint8_t> out(bytes);
      while (!stop) {
        const uint64_t floor = completed.load(std::memory_order_acquire);
        if (!store.get(key_of(kKey), out)) continue;
        ++hits;
        if (!is_whole_version_of(kKey, out)) {
          ++torn;
          continue;
        }
        uint64_t v;
        std::memcpy(&v, out.data() + 4, 8);
        if (v < floor) ++stale;
      }
    });
  writer.join();
  for (auto& th : others) th.join();
  EXPECT_EQ(stale.load(), 0);
  EXPECT_EQ(torn.load(), 0);
  EXPECT_GT(hits.load(), 100);
  EXPECT_GT(store.stats().dram.evictions, 0u);
}
