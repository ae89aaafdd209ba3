// DRAM tier (budget, LRU, replacement) and the tiered store (promotion, write-through,
// asynchronous batches with bounded queues, per-item failures).
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <future>
#include <thread>
#include <vector>

#include "nvfp4mla/error.h"
#include "nvfp4mla/offload/dram_tier.h"
#include "nvfp4mla/offload/store.h"
#include "lib/offload/thread_pool.h"
#include "support/offload_fixtures.h"

using namespace nvfp4mla;
using namespace nvfp4mla::offload;
using nvfp4mla::testing::expect_error_containing;
using nvfp4mla::testing::key_of;
using nvfp4mla::testing::pattern_bytes;
using nvfp4mla::testing::ScratchDir;
using nvfp4mla::testing::small_params;

TEST(OffloadDramTier, BudgetLruAndReplacement) {
  const size_t block = 100, key = 32, cost = block + key;
  DramTier dram(3 * cost);
  std::vector<uint8_t> out(block);
  for (uint64_t i = 0; i < 3; ++i) EXPECT_TRUE(dram.put(key_of(i), pattern_bytes(block, i)));
  ASSERT_TRUE(dram.get(key_of(0), out));  // promote 0; 1 is the oldest
  EXPECT_EQ(out, pattern_bytes(block, 0));
  EXPECT_TRUE(dram.put(key_of(3), pattern_bytes(block, 3)));
  EXPECT_FALSE(dram.contains(key_of(1)));
  EXPECT_TRUE(dram.contains(key_of(0)));
  // Replacement is whole: the new bytes, no change in budget use.
  EXPECT_TRUE(dram.put(key_of(0), pattern_bytes(block, 50)));
  ASSERT_TRUE(dram.get(key_of(0), out));
  EXPECT_EQ(out, pattern_bytes(block, 50));
  auto s = dram.stats();
  EXPECT_EQ(s.blocks, 3u);
  EXPECT_EQ(s.bytes, 3 * cost);
  EXPECT_EQ(s.evictions, 1u);
  // A wrong-sized output buffer is a miss, not a partial copy.
  std::vector<uint8_t> small(block - 1);
  EXPECT_FALSE(dram.get(key_of(0), small));
  // A block larger than the budget is rejected and drops the older block under its key.
  EXPECT_FALSE(dram.put(key_of(0), pattern_bytes(4 * cost, 0)));
  EXPECT_FALSE(dram.contains(key_of(0)));
  EXPECT_EQ(dram.stats().rejected, 1u);
  EXPECT_TRUE(dram.erase(key_of(2)));
  EXPECT_FALSE(dram.erase(key_of(2)));
  EXPECT_EQ(dram.stats().bytes, cost);  // only block 3 left
}

TEST(OffloadDramTier, PromotionNeverReplaces) {
  DramTier dram(1000);
  std::vector<uint8_t> out(10);
  const uint64_t epoch = dram.write_epoch(key_of(0));
  EXPECT_TRUE(dram.put_if_unchanged(key_of(0), pattern_bytes(10, 1), epoch));
  EXPECT_FALSE(dram.put_if_unchanged(key_of(0), pattern_bytes(10, 2), epoch));
  ASSERT_TRUE(dram.get(key_of(0), out));
  EXPECT_EQ(out, pattern_bytes(10, 1));
  EXPECT_FALSE(dram.put_if_unchanged(key_of(0), pattern_bytes(2000, 3), epoch));  // too large: the stored block stays
  ASSERT_TRUE(dram.get(key_of(0), out));
  EXPECT_EQ(out, pattern_bytes(10, 1));
  EXPECT_TRUE(dram.put(key_of(0), pattern_bytes(10, 4)));
  ASSERT_TRUE(dram.get(key_of(0), out));
  EXPECT_EQ(out, pattern_bytes(10, 4));
}

// A reader promoting a block it read from disk passes the key's epoch it saw before the read. A
// writer that stored a newer block under the key meanwhile, which DRAM evicted again, must keep
// the older block out; writes of other keys must not.
TEST(OffloadDramTier, PutIfUnchangedRefusesAfterAWriteOfTheKey) {
  const size_t block = 100, key = 32, cost = block + key;
  DramTier dram(2 * cost);
  std::vector<uint8_t> out(block);
  const uint64_t quiet = dram.write_epoch(key_of(0));
  EXPECT_TRUE(dram.put_if_unchanged(key_of(0), pattern_bytes(block, 1), quiet));  // nothing written since
  EXPECT_EQ(dram.write_epoch(key_of(0)), quiet);                                 // promotions do not count
  EXPECT_TRUE(dram.erase(key_of(0)));
  EXPECT_GT(dram.write_epoch(key_of(0)), quiet);

  const uint64_t seen = dram.write_epoch(key_of(0));  // the reader's snapshot, then its disk read of block 1
  EXPECT_TRUE(dram.put(key_of(0), pattern_bytes(block, 2)));  // the writer's newer block ...
  EXPECT_TRUE(dram.put(key_of(1), pattern_bytes(block, 0)));
  EXPECT_TRUE(dram.put(key_of(2), pattern_bytes(block, 0)));  // ... evicted again
  ASSERT_FALSE(dram.contains(key_of(0)));
  EXPECT_FALSE(dram.put_if_unchanged(key_of(0), pattern_bytes(block, 1), seen));
  EXPECT_FALSE(dram.contains(key_of(0)));

  // Writes of other keys leave a promotion alone.
  const uint64_t before_others = dram.write_epoch(key_of(9));
  for (uint64_t other = 10; other < 20; ++other) EXPECT_TRUE(dram.put(key_of(other), pattern_bytes(block, 0)));
  ASSERT_EQ(dram.write_epoch(key_of(9)), before_others) << "keys 10-19 share key 9's counter here: pick others";
  EXPECT_TRUE(dram.put_if_unchanged(key_of(9), pattern_bytes(block, 9), before_others));
  ASSERT_TRUE(dram.get(key_of(9), out));
  EXPECT_EQ(out, pattern_bytes(block, 9));

  // A rejected put and an erase of an absent key count as writes of that key.
  const uint64_t before_rejected = dram.write_epoch(key_of(5));
  EXPECT_FALSE(dram.put(key_of(5), pattern_bytes(4 * cost, 0)));
  EXPECT_FALSE(dram.put_if_unchanged(key_of(5), pattern_bytes(block, 0), before_rejected));
  const uint64_t before_erase = dram.write_epoch(key_of(7));
  EXPECT_FALSE(dram.erase(key_of(7)));
  EXPECT_FALSE(dram.put_if_unchanged(key_of(7), pattern_bytes(block, 0), before_erase));
  EXPECT_TRUE(dram.put_if_unchanged(key_of(7), pattern_bytes(block, 0), dram.write_epoch(key_of(7))));
  EXPECT_TRUE(dram.contains(key_of(7)));
}

TEST(OffloadDramTier, ZeroBudgetDisablesTheTier) {
  DramTier dram(0);
  std::vector<uint8_t> out(10);
  EXPECT_FALSE(dram.put(key_of(0), pattern_bytes(10, 0)));
  EXPECT_FALSE(dram.get(key_of(0), out));
}

TEST(OffloadStore, WriteThroughAndPromotion) {
  ScratchDir dir;
  const NamespaceParams p = small_params(4, 2);
  const uint64_t block = p.block_bytes();
  std::vector<uint8_t> out(block);
  {
    Store store(dir.path(), p, {.dram_capacity_bytes = 2 * (block + 32)});
    for (uint64_t i = 0; i < 4; ++i) store.put(key_of(i), pattern_bytes(block, i));
    const auto s = store.stats();
    EXPECT_EQ(s.disk.blocks, 4u);  // write-through: every block is on disk
    EXPECT_EQ(s.dram.blocks, 2u);  // DRAM keeps the two most recent
    ASSERT_TRUE(store.get(key_of(3), out));
    EXPECT_EQ(store.stats().dram.hits, 1u);
    ASSERT_TRUE(store.get(key_of(0), out));  // from disk, promoted
    EXPECT_EQ(out, pattern_bytes(block, 0));
    EXPECT_EQ(store.stats().disk.hits, 1u);
    ASSERT_TRUE(store.get(key_of(0), out));
    EXPECT_EQ(store.stats().dram.hits, 2u);
    EXPECT_EQ(store.stats().disk.hits, 1u);
    EXPECT_FALSE(store.get(key_of(9), out));
    expect_error_containing([&] { store.put(key_of(5), pattern_bytes(block + 1, 5)); }, "blocks of this namespace");
  }
  // Durable: a new store (empty DRAM) finds everything on disk.
  Store store(dir.path(), p);
  for (uint64_t i = 0; i < 4; ++i) {
    ASSERT_TRUE(store.get(key_of(i), out));
    EXPECT_EQ(out, pattern_bytes(block, i));
  }
}

// The bound itself, on the store's worker pool: one worker held in a task, a queue of 2; a
// producer submitting four more tasks gets two of them into the queue and then has to wait.
// (A FIFO in place of a block file no longer holds a store worker: the store refuses to open
// anything but a regular file, so the pool is held directly.)
TEST(OffloadStore, WorkerPoolQueueIsBounded) {
  std::promise<void> release;
  std::shared_future<void> released = release.get_future().share();
  std::atomic<int> ran{0}, submitted{0};
  {
    nvfp4mla::offload::ThreadPool pool(1, 2);
    std::promise<void> started;
    pool.submit([&, released] {
      started.set_value();
      released.wait();
      ++ran;
    });
    started.get_future().wait();  // the only worker is now held
    std::thread producer([&] {
      for (int i = 0; i < 4; ++i) {
        pool.submit([&] { ++ran; });
        ++submitted;
      }
    });
    // Wait (on a loaded machine the producer may start late) until the queue is full, then give
    // it time to push past the bound.
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
    while (submitted.load() < 2 && std::chrono::steady_clock::now() < deadline)
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    EXPECT_EQ(submitted.load(), 2) << "a queue of 2 behind a held worker took " << submitted.load() << " tasks";
    release.set_value();
    producer.join();
    EXPECT_EQ(submitted.load(), 4);
  }  // the pool runs every queued task before it is destroyed
  EXPECT_EQ(ran.load(), 5);
}

TEST(OffloadStore, AsyncBatchesThroughABoundedQueue) {
  ScratchDir dir;
  const NamespaceParams p = small_params(2, 1);
  const uint64_t block = p.block_bytes();
  // A queue of 2 items and 200-item batches: submission has to wait for the workers.
  Store store(dir.path(), p, {.dram_capacity_bytes = 50 * block, .io_threads = 3, .max_queued_items = 2});
  const size_t n = 200;
  std::vector<std::vector<uint8_t>> keys, blocks, outs(n, std::vector<uint8_t>(block, 0xEE));
  std::vector<PutRequest> puts;
  std::vector<GetRequest> gets;
  for (size_t i = 0; i < n; ++i) {
    keys.push_back(key_of(i));
    blocks.push_back(pattern_bytes(block, i));
  }
  for (size_t i = 0; i < n; ++i) puts.push_back({keys[i], blocks[i]});
  // One bad item (wrong size) fails alone.
  const std::vector<uint8_t> short_block(block - 1);
  puts[17].block = short_block;
  const BatchResult put_result = store.put_async(puts).get();
  ASSERT_EQ(put_result.items.size(), n);
  EXPECT_EQ(put_result.count(OpStatus::stored), n - 1);
  EXPECT_EQ(put_result.items[17].status, OpStatus::failed);
  EXPECT_NE(put_result.items[17].error.find("blocks of this namespace"), std::string::npos);

  for (size_t i = 0; i < n; ++i) gets.push_back({keys[i], outs[i]});
  const std::vector<uint8_t> absent = key_of(1000);
  gets.push_back({absent, outs[0]});
  const BatchResult get_result = store.get_async(gets).get();
  ASSERT_EQ(get_result.items.size(), n + 1);
  EXPECT_EQ(get_result.items[17].status, OpStatus::miss);
  EXPECT_EQ(get_result.items[n].status, OpStatus::miss);
  for (size_t i = 0; i < n; ++i) {
    if (i == 17) continue;
    ASSERT_EQ(get_result.items[i].status, OpStatus::hit) << i;
    EXPECT_EQ(outs[i], blocks[i]) << i;
  }
  EXPECT_TRUE(store.put_async({}).get().items.empty());
}

TEST(OffloadStore, DestructionFinishesQueuedWork) {
  ScratchDir dir;
  const NamespaceParams p = small_params(2, 1);
  const uint64_t block = p.block_bytes();
  std::vector<std::vector<uint8_t>> keys, blocks;
  std::vector<PutRequest> puts;
  for (size_t i = 0; i < 64; ++i) {
    keys.push_back(key_of(i));
    blocks.push_back(pattern_bytes(block, i));
  }
  for (size_t i = 0; i < 64; ++i) puts.push_back({keys[i], blocks[i]});
  std::future<BatchResult> pending;
  {
    Store store(dir.path(), p, {.io_threads = 2, .max_queued_items = 8});
    pending = store.put_async(puts);
  }
  EXPECT_EQ(pending.get().count(OpStatus::stored), 64u);
  DiskTier disk(dir.path(), p);
  EXPECT_EQ(disk.stats().blocks, 64u);
}
