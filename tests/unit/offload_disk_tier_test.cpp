// Disk tier: round trips, persistence, LRU eviction that survives restarts, corruption detection
// through the real read path with quarantine, verify, the open scan, locking and gc.
#include <gtest/gtest.h>

#include <fstream>

#include "nvfp4mla/error.h"
#include "nvfp4mla/offload/block_file.h"
#include "nvfp4mla/offload/disk_tier.h"
#include "support/offload_fixtures.h"

using namespace nvfp4mla;
using namespace nvfp4mla::offload;
using nvfp4mla::testing::expect_error_containing;
using nvfp4mla::testing::files_under;
using nvfp4mla::testing::key_of;
using nvfp4mla::testing::pattern_bytes;
using nvfp4mla::testing::read_file;
using nvfp4mla::testing::ScratchDir;
using nvfp4mla::testing::small_params;
using nvfp4mla::testing::write_file;
namespace fs = std::filesystem;

namespace {

// The one block file of `key` under a namespace directory.
fs::path block_path_of(const DiskTier& tier, const std::vector<uint8_t>& key) {
  const auto files = files_under(tier.dir() / "blocks", key_to_hex(key) + ".blk");
  return files.size() == 1 ? files[0] : fs::path();
}

size_t quarantined_files(const DiskTier& tier) {
  size_t n = 0;
  for (const auto& p : files_under(tier.dir() / "quarantine")) n += p.filename() != "reasons.log";
  return n;
}

}  // namespace

TEST(OffloadDiskTier, RoundTripPersistsAcrossReopen) {
  ScratchDir dir;
  const NamespaceParams p = small_params(4, 3);
  std::vector<uint8_t> out(p.block_bytes());
  {
    DiskTier tier(dir.path(), p);
    EXPECT_EQ(tier.block_bytes(), 4u * 3u * 368u);
    for (uint64_t i = 0; i < 20; ++i) tier.put(key_of(i), pattern_bytes(p.block_bytes(), i));
    ASSERT_TRUE(tier.get(key_of(3), out));
    EXPECT_EQ(out, pattern_bytes(p.block_bytes(), 3));
    EXPECT_FALSE(tier.get(key_of(99), out));
    const auto s = tier.stats();
    EXPECT_EQ(s.blocks, 20u);
    EXPECT_EQ(s.puts, 20u);
    EXPECT_EQ(s.hits, 1u);
    EXPECT_EQ(s.misses, 1u);
    EXPECT_EQ(s.bytes, 20 * block_file_size(32, p.block_bytes()));
  }
  DiskTier tier(dir.path(), p);
  EXPECT_EQ(tier.stats().blocks, 20u);
  for (uint64_t i = 0; i < 20; ++i) {
    ASSERT_TRUE(tier.get(key_of(i), out)) << i;
    EXPECT_EQ(out, pattern_bytes(p.block_bytes(), i));
  }
  // Keys of every allowed length, and overwrite of an existing key.
  tier.put(key_of(1, 1), pattern_bytes(p.block_bytes(), 100));
  tier.put(key_of(1, kMaxKeyBytes), pattern_bytes(p.block_bytes(), 101));
  tier.put(key_of(3), pattern_bytes(p.block_bytes(), 103));
  ASSERT_TRUE(tier.get(key_of(1, 1), out));
  EXPECT_EQ(out, pattern_bytes(p.block_bytes(), 100));
  ASSERT_TRUE(tier.get(key_of(1, kMaxKeyBytes), out));
  EXPECT_EQ(out, pattern_bytes(p.block_bytes(), 101));
  ASSERT_TRUE(tier.get(key_of(3), out));
  EXPECT_EQ(out, pattern_bytes(p.block_bytes(), 103));
  EXPECT_EQ(tier.stats().blocks, 22u);
}

TEST(OffloadDiskTier, RejectsWrongSizesAndKeys) {
  ScratchDir dir;
  const NamespaceParams p = small_params();
  DiskTier tier(dir.path(), p);
  std::vector<uint8_t> out(p.block_bytes() + 1);
  expect_error_containing([&] { tier.put(key_of(1), pattern_bytes(p.block_bytes() - 1, 1)); }, "bytes; blocks of");
  expect_error_containing([&] { tier.get(key_of(1), out); }, "output buffer");
  expect_error_containing([&] { tier.put(key_of(1, kMaxKeyBytes + 1), pattern_bytes(p.block_bytes(), 1)); },
                          "1..64 bytes");
  EXPECT_EQ(tier.stats().blocks, 0u);
  EXPECT_TRUE(files_under(tier.dir() / "tmp").empty());
}

TEST(OffloadDiskTier, EvictsLeastRecentlyUsedWithinCapacity) {
  ScratchDir dir;
  const NamespaceParams p = small_params();
  const uint64_t file = block_file_size(32, p.block_bytes());
  DiskTier tier(dir.path(), p, {.capacity_bytes = 3 * file});
  std::vector<uint8_t> out(p.block_bytes());
  for (uint64_t i = 0; i < 3; ++i) tier.put(key_of(i), pattern_bytes(p.block_bytes(), i));
  ASSERT_TRUE(tier.get(key_of(0), out));  // 0 becomes most recent; 1 is now the oldest
  tier.put(key_of(3), pattern_bytes(p.block_bytes(), 3));
  EXPECT_TRUE(tier.contains(key_of(0)));
  EXPECT_FALSE(tier.contains(key_of(1)));
  EXPECT_TRUE(tier.contains(key_of(2)));
  EXPECT_TRUE(tier.contains(key_of(3)));
  EXPECT_EQ(tier.stats().evictions, 1u);
  EXPECT_LE(tier.stats().bytes, 3 * file);
  EXPECT_EQ(files_under(tier.dir() / "blocks").size(), 3u);
  DiskTier tiny(dir.path() / "tiny", p, {.capacity_bytes = file - 1});
  expect_error_containing([&] { tiny.put(key_of(0), out); }, "exceeds the disk tier capacity");
}

// A block replaced while the tier is full takes its own older file's place: nothing else is
// evicted, whichever block is replaced (the oldest or not).
TEST(OffloadDiskTier, ReplacingABlockAtCapacityEvictsNothingElse) {
  ScratchDir dir;
  const NamespaceParams p = small_params();
  const uint64_t file = block_file_size(32, p.block_bytes());
  DiskTier tier(dir.path(), p, {.capacity_bytes = 3 * file});
  for (uint64_t i = 0; i < 3; ++i) tier.put(key_of(i), pattern_bytes(p.block_bytes(), i));
  tier.put(key_of(1), pattern_bytes(p.block_bytes(), 11));  // not the oldest
  tier.put(key_of(0), pattern_bytes(p.block_bytes(), 10));  // the oldest
  std::vector<uint8_t> out(p.block_bytes());
  for (const auto& [i, v] : std::vector<std::pair<uint64_t, uint64_t>>{{0, 10}, {1, 11}, {2, 2}}) {
    ASSERT_TRUE(tier.get(key_of(i), out)) << "block " << i << " was evicted";
    EXPECT_EQ(out, pattern_bytes(p.block_bytes(), v)) << "block " << i;
  }
  EXPECT_EQ(tier.stats().evictions, 0u);
  EXPECT_EQ(tier.stats().bytes, 3 * file);
}

TEST(OffloadDiskTier, LruOrderSurvivesRestart) {
  ScratchDir dir;
  const NamespaceParams p = small_params();
  const uint64_t file = block_file_size(32, p.block_bytes());
  std::vector<uint8_t> out(p.block_bytes());
  {
    DiskTier tier(dir.path(), p);
    for (uint64_t i = 0; i < 5; ++i) tier.put(key_of(i), pattern_bytes(p.block_bytes(), i));
    // Access order now (oldest first): 1 3 4 0 2
    ASSERT_TRUE(tier.get(key_of(0), out));
    ASSERT_TRUE(tier.get(key_of(2), out));
  }
  {
    // Reopening with room for 3 evicts the two least recently used: 1 and 3.
    DiskTier tier(dir.path(), p, {.capacity_bytes = 3 * file});
    EXPECT_FALSE(tier.contains(key_of(1)));
    EXPECT_FALSE(tier.contains(key_of(3)));
    EXPECT_TRUE(tier.contains(key_of(4)));
    EXPECT_TRUE(tier.contains(key_of(0)));
    EXPECT_TRUE(tier.contains(key_of(2)));
    const auto order = tier.lru_snapshot();
    ASSERT_EQ(order.size(), 3u);
    EXPECT_EQ(order[0].key, key_of(4));
    EXPECT_EQ(order[1].key, key_of(0));
    EXPECT_EQ(order[2].key, key_of(2));
    ASSERT_TRUE(tier.get(key_of(4), out));
  }
  DiskTier tier(dir.path(), p, {.capacity_bytes = 3 * file});
  tier.put(key_of(5), pattern_bytes(p.block_bytes(), 5));  // evicts 0, now the oldest
  EXPECT_FALSE(tier.contains(key_of(0)));
  EXPECT_TRUE(tier.contains(key_of(4)));
}

TEST(OffloadDiskTier, BitFlipsOfASmallBlockFileAreMissesAndQuarantined) {
  ScratchDir dir;
  const NamespaceParams p = small_params(1, 1);  // 368-byte payload
  const auto key = key_of(1, 8);
  const auto payload = pattern_bytes(p.block_bytes(), 1);
  DiskTier tier(dir.path(), p, {.durable = false});
  tier.put(key, payload);
  const fs::path path = block_path_of(tier, key);
  ASSERT_FALSE(path.empty());
  const std::vector<uint8_t> good = read_file(path);
  ASSERT_EQ(good.size(), block_file_size(key.size(), payload.size()));
  std::vector<uint8_t> out(p.block_bytes());
  // Every bit of the header, the key and the checksum, and every 5th bit of the payload (the
  // in-memory test flips all bits of a whole file; this one goes through the read path).
  const size_t payload_begin = (kBlockHeaderFixedBytes + key.size()) * 8;
  const size_t payload_end = payload_begin + payload.size() * 8;
  std::vector<size_t> flips;
  for (size_t bit = 0; bit < good.size() * 8; ++bit)
    if (bit < payload_begin || bit >= payload_end || bit % 5 == 0) flips.push_back(bit);
  size_t round = 0;
  for (size_t bit : flips) {
    std::vector<uint8_t> bad = good;
    bad[bit / 8] ^= static_cast<uint8_t>(1u << (bit % 8));
    write_file(path, bad);
    ASSERT_FALSE(tier.get(key, out)) << "bit " << bit << " not detected";
    ASSERT_TRUE(std::all_of(out.begin(), out.end(), [](uint8_t b) { return b == 0; }));
    ASSERT_FALSE(fs::exists(path)) << "bit " << bit << ": defective file left in place";
    if (round++ % 97 == 0) {
      // The evidence is kept byte for byte.
      bool found = false;
      for (const auto& q : files_under(tier.dir() / "quarantine", ""))
        if (q.filename().string().starts_with(path.filename().string()) && read_file(q) == bad) found = true;
      ASSERT_TRUE(found) << "bit " << bit;
    }
    tier.put(key, payload);  // restore (index and file) for the next flip
  }
  EXPECT_EQ(tier.stats().corrupt, flips.size());
  EXPECT_EQ(quarantined_files(tier), flips.size());
  const std::string log = [&] {
    std::ifstream in(tier.dir() / "quarantine" / "reasons.log");
    return std::string(std::istreambuf_iterator<char>(in), {});
  }();
  EXPECT_NE(log.find("checksum mismatch"), std::string::npos);
  EXPECT_NE(log.find("bad magic"), std::string::npos);
  // After all that, the good block still reads back.
  ASSERT_TRUE(tier.get(key, out));
  EXPECT_EQ(out, payload);
}

TEST(OffloadDiskTier, TruncatedExtendedAndSwappedFilesAreMisses) {
  ScratchDir dir;
  const NamespaceParams p = small_params(2, 1);
  DiskTier tier(dir.path(), p, {.durable = false});
  std::vector<uint8_t> out(p.block_bytes());
  for (uint64_t i = 0; i < 3; ++i) tier.put(key_of(i), pattern_bytes(p.block_bytes(), i));
  auto good = read_file(block_path_of(tier, key_of(0)));
  for (size_t n : {size_t(0), size_t(1), size_t(71), good.size() / 2, good.size() - 1}) {
    write_file(block_path_of(tier, key_of(0)), std::vector<uint8_t>(good.begin(), good.begin() + n));
    EXPECT_FALSE(tier.get(key_of(0), out)) << n;
    tier.put(key_of(0), pattern_bytes(p.block_bytes(), 0));
  }
  good.push_back(0);
  write_file(block_path_of(tier, key_of(0)), good);
  EXPECT_FALSE(tier.get(key_of(0), out));
  // Key 1's (valid) file under key 2's name: right namespace, wrong key.
  fs::copy_file(block_path_of(tier, key_of(1)), block_path_of(tier, key_of(2)), fs::copy_options::overwrite_existing);
  EXPECT_FALSE(tier.get(key_of(2), out));
  ASSERT_TRUE(tier.get(key_of(1), out));
  EXPECT_EQ(out, pattern_bytes(p.block_bytes(), 1));
  EXPECT_EQ(tier.stats().corrupt, 7u);
  EXPECT_EQ(quarantined_files(tier), 7u);
}

TEST(OffloadDiskTier, VerifyReportsAndQuarantinesBadFiles) {
  ScratchDir dir;
  const NamespaceParams p = small_params(2, 2);
  DiskTier tier(dir.path(), p);
  for (uint64_t i = 0; i < 6; ++i) tier.put(key_of(i), pattern_bytes(p.block_bytes(), i));
  auto bytes = read_file(block_path_of(tier, key_of(2)));
  bytes[500] ^= 0x10;
  write_file(block_path_of(tier, key_of(2)), bytes);
  bytes = read_file(block_path_of(tier, key_of(4)));
  bytes[20] ^= 0x01;  // namespace digest
  write_file(block_path_of(tier, key_of(4)), bytes);
  const VerifyReport r = tier.verify();
  EXPECT_EQ(r.checked, 6u);
  EXPECT_EQ(r.ok, 4u);
  ASSERT_EQ(r.problems.size(), 2u);
  const std::string all = r.problems[0] + r.problems[1];
  EXPECT_NE(all.find("checksum mismatch"), std::string::npos) << all;
  EXPECT_NE(all.find("namespace digest of another namespace"), std::string::npos) << all;
  EXPECT_FALSE(tier.contains(key_of(2)));
  EXPECT_FALSE(tier.contains(key_of(4)));
  EXPECT_EQ(quarantined_files(tier), 2u);
  EXPECT_EQ(tier.verify().problems.size(), 0u);
}

TEST(OffloadDiskTier, OpenScanQuarantinesStraysAndRemovesTemporaries) {
  ScratchDir dir;
  const NamespaceParams p = small_params();
  fs::path ns, truncated, misplaced;
  {
    DiskTier tier(dir.path(), p);
    for (uint64_t i = 0; i < 4; ++i) tier.put(key_of(i), pattern_bytes(p.block_bytes(), i));
    ns = tier.dir();
    truncated = block_path_of(tier, key_of(1));
    misplaced = block_path_of(tier, key_of(3));
  }
  fs::resize_file(truncated, 10);
  write_file(ns / "tmp" / "abandoned.0.tmp", {1, 2, 3});
  write_file(ns / "blocks" / "stray", {1});
  write_file(truncated.parent_path() / "not-a-key.blk", {1});
  fs::create_directories(ns / "blocks" / "zz");  // not a fan-out directory name
  // A valid block file in a fan-out directory other than its key's could not be found by key.
  const fs::path other_fanout = ns / "blocks" / (misplaced.parent_path().filename() == "00" ? "01" : "00");
  fs::create_directories(other_fanout);
  fs::rename(misplaced, other_fanout / misplaced.filename());
  DiskTier tier(dir.path(), p);
  const auto s = tier.stats();
  EXPECT_EQ(s.quarantined_at_open, 5u);  // truncated block, stray, not-a-key.blk, zz/, the misplaced block
  EXPECT_EQ(s.blocks, 2u);
  EXPECT_TRUE(files_under(ns / "tmp").empty());
  std::vector<uint8_t> out(p.block_bytes());
  EXPECT_FALSE(tier.get(key_of(1), out));
  EXPECT_FALSE(tier.contains(key_of(3)));
  ASSERT_TRUE(tier.get(key_of(2), out));
  EXPECT_EQ(out, pattern_bytes(p.block_bytes(), 2));
  std::ifstream log(ns / "quarantine" / "reasons.log");
  const std::string reasons((std::istreambuf_iterator<char>(log)), std::istreambuf_iterator<char>());
  EXPECT_NE(reasons.find("file in the wrong fan-out directory"), std::string::npos) << reasons;
  const DiskUsage u = disk_usage(ns);
  EXPECT_EQ(u.blocks, 2u);
  EXPECT_EQ(u.quarantined, 4u);  // files; the zz directory is not a file
  EXPECT_EQ(u.temporaries, 0u);
  EXPECT_GT(u.newest_access_ns, 0);
  EXPECT_LE(u.oldest_access_ns, u.newest_access_ns);
}

TEST(OffloadDiskTier, ANamespaceHasOneOwnerAtATime) {
  ScratchDir dir;
  const NamespaceParams p = small_params();
  auto first = std::make_unique<DiskTier>(dir.path(), p);
  expect_error_containing([&] { DiskTier second(dir.path(), p); }, "in use by another store");
  first.reset();
  DiskTier third(dir.path(), p);
  EXPECT_EQ(third.stats().blocks, 0u);
}

TEST(OffloadDiskTier, EraseAndShrink) {
  ScratchDir dir;
  const NamespaceParams p = small_params();
  const uint64_t file = block_file_size(32, p.block_bytes());
  DiskTier tier(dir.path(), p);
  for (uint64_t i = 0; i < 5; ++i) tier.put(key_of(i), pattern_bytes(p.block_bytes(), i));
  EXPECT_TRUE(tier.erase(key_of(2)));
  EXPECT_FALSE(tier.erase(key_of(2)));
  EXPECT_EQ(tier.shrink_to(2 * file), 2 * file);
  EXPECT_FALSE(tier.contains(key_of(0)));
  EXPECT_FALSE(tier.contains(key_of(1)));
  EXPECT_TRUE(tier.contains(key_of(3)));
  EXPECT_EQ(files_under(tier.dir() / "blocks").size(), 2u);
}

TEST(OffloadDiskTier, GarbageCollectionEvictsOldestAcrossNamespaces) {
  ScratchDir dir;
  const NamespaceParams a = small_params(2, 1, "model-a"), b = small_params(2, 1, "model-b");
  const uint64_t file = block_file_size(32, a.block_bytes());
  {
    DiskTier ta(dir.path(), a), tb(dir.path(), b);
    // Interleaved: a0 b0 a1 b1 a2 b2 (oldest first)
    for (uint64_t i = 0; i < 3; ++i) {
      ta.put(key_of(i), pattern_bytes(a.block_bytes(), i));
      tb.put(key_of(i), pattern_bytes(b.block_bytes(), i));
    }
  }
  EXPECT_EQ(collect_garbage(dir.path(), 3 * file), 3 * file);
  DiskTier ta(dir.path(), a), tb(dir.path(), b);
  EXPECT_FALSE(ta.contains(key_of(0)));
  EXPECT_FALSE(tb.contains(key_of(0)));
  EXPECT_FALSE(ta.contains(key_of(1)));
  EXPECT_TRUE(tb.contains(key_of(1)));
  EXPECT_TRUE(ta.contains(key_of(2)));
  EXPECT_TRUE(tb.contains(key_of(2)));
  // In use: gc refuses rather than deleting under a live store.
  expect_error_containing([&] { collect_garbage(dir.path(), 0); }, "in use");
}
