// The disk tier never follows a symbolic link it did not create (issue 20, items 2 and 4):
// links planted for the namespace directory, tmp/, quarantine/, reasons.log, the lock, the
// manifest, a fan-out directory or a block file are refused by name or quarantined, and
// nothing outside the store is read, written, moved or deleted.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <string>
#include <vector>

#include "nvfp4mla/error.h"
#include "nvfp4mla/offload/block_file.h"
#include "nvfp4mla/offload/disk_tier.h"
#include "nvfp4mla/offload/namespace.h"
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

// A store with blocks 0..2, and a folder "outside" next to it holding one file.
struct LinkFixture {
  ScratchDir dir;
  NamespaceParams params = small_params();
  fs::path root = dir.path() / "store";
  fs::path outside = dir.path() / "outside";
  fs::path ns;

  LinkFixture() {
    DiskTier tier(root, params);
    for (uint64_t i = 0; i < 3; ++i) tier.put(key_of(i), pattern_bytes(params.block_bytes(), i));
    ns = tier.dir();
    fs::create_directory(outside);
    write_file(outside / "important", {1, 2, 3});
  }
  // Replaces `entry` of the namespace by a link to `target`.
  void plant(const std::string& entry, const fs::path& target) const {
    fs::remove_all(ns / entry);
    fs::create_symlink(target, ns / entry);
  }
  std::vector<fs::path> outside_files() const { return files_under(outside); }
};

}  // namespace

// Item 2: remove_stale_temporaries followed a linked tmp/ and emptied its target.
TEST(OffloadLinks, LinkedTmpIsRefusedByName) {
  LinkFixture f;
  f.plant("tmp", f.outside);
  expect_error_containing([&] { DiskTier tier(f.root, f.params); }, "tmp' is a symbolic link");
  EXPECT_TRUE(fs::exists(f.outside / "important"));
}

TEST(OffloadLinks, LinkedQuarantineIsRefusedByName) {
  LinkFixture f;
  f.plant("quarantine", f.outside);
  expect_error_containing([&] { DiskTier tier(f.root, f.params); }, "quarantine' is a symbolic link");
  // A damaged block must not be moved outside either: the store does not open at all.
  EXPECT_EQ(f.outside_files().size(), 1u);
}

TEST(OffloadLinks, LinkedQuarantineLogIsRefusedByName) {
  LinkFixture f;
  fs::create_symlink(f.outside / "important", f.ns / "quarantine" / "reasons.log");
  expect_error_containing([&] { DiskTier tier(f.root, f.params); }, "reasons.log' is a symbolic link");
  EXPECT_EQ(read_file(f.outside / "important"), (std::vector<uint8_t>{1, 2, 3}));
}

TEST(OffloadLinks, DanglingLockLinkIsRefusedAndItsTargetNotCreated) {
  LinkFixture f;
  f.plant("lock", f.outside / "created-by-the-store");
  expect_error_containing([&] { DiskTier tier(f.root, f.params); }, "lock' is a symbolic link");
  EXPECT_FALSE(fs::exists(f.outside / "created-by-the-store"));
}

TEST(OffloadLinks, LinkedManifestIsRefusedByName) {
  LinkFixture f;
  fs::copy_file(f.ns / "manifest.json", f.outside / "manifest.json");
  f.plant("manifest.json", f.outside / "manifest.json");
  expect_error_containing([&] { DiskTier tier(f.root, f.params); }, "manifest.json' is a symbolic link");
  expect_error_containing([&] { DiskTier::open_existing(f.ns); }, "manifest.json' is a symbolic link");
}

TEST(OffloadLinks, LinkedNamespaceDirectoryIsRefusedAndListedAsInvalid) {
  LinkFixture f;
  const fs::path moved = f.outside / "ns";
  fs::rename(f.ns, moved);
  fs::create_directory_symlink(moved, f.ns);
  expect_error_containing([&] { DiskTier tier(f.root, f.params); }, "is a symbolic link");
  const auto listings = list_namespaces(f.root);
  ASSERT_EQ(listings.size(), 1u);
  EXPECT_FALSE(listings[0].valid);
  EXPECT_NE(listings[0].problem.find("symbolic link"), std::string::npos) << listings[0].problem;
  // gc skips it rather than deleting the blocks it points to.
  EXPECT_EQ(collect_garbage(f.root, 0), 0u);
  EXPECT_EQ(files_under(moved, ".blk").size(), 3u);
}

// Item 4: a linked blocks/<xx> used to be scanned, written into and evicted from.
TEST(OffloadLinks, LinkedFanoutDirectoryIsQuarantinedNotFollowed) {
  LinkFixture f;
  const auto blocks = files_under(f.ns / "blocks", ".blk");
  ASSERT_FALSE(blocks.empty());
  const fs::path fanout = blocks[0].parent_path();
  const std::string fanout_name = fanout.filename().string();
  // The link's target holds a copy of the fan-out directory: valid blocks, outside the store.
  const fs::path target = f.outside / "fanout";
  fs::create_directory(target);
  for (const auto& b : files_under(fanout)) fs::copy_file(b, target / b.filename());
  fs::remove_all(fanout);
  fs::create_directory_symlink(target, fanout);
  const size_t outside_before = f.outside_files().size();
  {
    DiskTier tier(f.root, f.params);
    EXPECT_EQ(tier.stats().quarantined_at_open, 1u);
    EXPECT_EQ(tier.stats().blocks, 3u - (outside_before - 1));
    // A put into that fan-out goes to a real directory; a full eviction deletes nothing outside.
    tier.put(key_from_hex(blocks[0].stem().string()), pattern_bytes(f.params.block_bytes(), 50));
    EXPECT_TRUE(fs::is_directory(fs::symlink_status(fanout)));
    tier.shrink_to(0);
  }
  EXPECT_EQ(f.outside_files().size(), outside_before);
  bool link_in_quarantine = false;
  for (const auto& e : fs::directory_iterator(f.ns / "quarantine")) link_in_quarantine |= e.is_symlink();
  EXPECT_TRUE(link_in_quarantine);
}

// Item 4: a block file replaced by a link to a valid copy elsewhere was served as a hit.
TEST(OffloadLinks, LinkedBlockFileIsAQuarantinedMiss) {
  LinkFixture f;
  DiskTier tier(f.root, f.params);
  const auto blocks = files_under(f.ns / "blocks", ".blk");
  ASSERT_EQ(blocks.size(), 3u);
  for (const auto& b : blocks) {
    fs::copy_file(b, f.outside / b.filename());
    fs::remove(b);
    fs::create_symlink(f.outside / b.filename(), b);
  }
  std::vector<uint8_t> out(f.params.block_bytes());
  for (uint64_t i = 0; i < 3; ++i) EXPECT_FALSE(tier.get(key_of(i), out)) << i;
  EXPECT_EQ(tier.stats().corrupt, 3u);
  EXPECT_EQ(f.outside_files().size(), 4u);  // the copies stay where they are
  for (const auto& b : blocks) EXPECT_FALSE(fs::exists(fs::symlink_status(b)));  // the links went to quarantine
}

// Item 4: a FIFO in place of a block file made a read block forever.
TEST(OffloadLinks, FifoInPlaceOfABlockIsAMiss) {
  LinkFixture f;
  DiskTier tier(f.root, f.params);
  const auto blocks = files_under(f.ns / "blocks", ".blk");
  ASSERT_FALSE(blocks.empty());
  fs::remove(blocks[0]);
  ASSERT_EQ(::mkfifo(blocks[0].c_str(), 0600), 0);
  std::vector<uint8_t> out(f.params.block_bytes());
  size_t misses = 0;
  for (uint64_t i = 0; i < 3; ++i) misses += !tier.get(key_of(i), out);
  EXPECT_EQ(misses, 1u);
  EXPECT_FALSE(fs::exists(fs::symlink_status(blocks[0])));
}

TEST(OffloadLinks, EmptyNamespaceIsRemovedOnlyWhenEmpty) {
  ScratchDir dir;
  const NamespaceParams p = small_params();
  fs::path ns;
  {
    DiskTier tier(dir.path(), p);
    ns = tier.dir();
    EXPECT_FALSE(remove_namespace_if_empty(ns));  // in use
    tier.put(key_of(0), pattern_bytes(p.block_bytes(), 0));
  }
  EXPECT_FALSE(remove_namespace_if_empty(ns));  // holds a block
  EXPECT_TRUE(fs::exists(ns / "manifest.json"));
  {
    DiskTier tier(dir.path(), p);
    tier.erase(key_of(0));
  }
  EXPECT_TRUE(remove_namespace_if_empty(ns));
  EXPECT_FALSE(fs::exists(ns));
}

// Every fan-out directory is opened per operation, not kept open: gc opens all namespaces of a
// root at once, and 256 descriptors per namespace would run into the descriptor limit.
TEST(OffloadLinks, AnOpenNamespaceHoldsAFewDescriptors) {
  ScratchDir dir;
  const NamespaceParams p = small_params();
  auto open_descriptors = [] {
    return std::distance(fs::directory_iterator("/proc/self/fd"), fs::directory_iterator());
  };
  {
    DiskTier tier(dir.path(), p, {.durable = false});
    for (uint64_t i = 0; i < 1000; ++i) tier.put(key_of(i), pattern_bytes(p.block_bytes(), i));
  }
  const auto before = open_descriptors();
  DiskTier tier(dir.path(), p);
  EXPECT_EQ(tier.stats().blocks, 1000u);
  EXPECT_LE(open_descriptors() - before, 8);
}
