// Isolation: the same key stored under every pair of distinct namespaces (record identities,
// calibration files, page sizes, layers, model, ranks) never reads across, even when a block
// file is moved into another namespace's place.
#include <gtest/gtest.h>

#include <memory>

#include "nvfp4mla/calibration.h"
#include "nvfp4mla/offload/block_file.h"
#include "nvfp4mla/offload/disk_tier.h"
#include "support/offload_fixtures.h"

using namespace nvfp4mla;
using namespace nvfp4mla::offload;
using nvfp4mla::testing::files_under;
using nvfp4mla::testing::key_of;
using nvfp4mla::testing::pattern_bytes;
using nvfp4mla::testing::read_file;
using nvfp4mla::testing::ScratchDir;
using nvfp4mla::testing::write_file;
namespace fs = std::filesystem;

namespace {

std::vector<NamespaceParams> distinct_namespaces(const fs::path& scratch) {
  auto calibration_file = [&](const char* name, float max_abs) {
    const fs::path path = scratch / name;
    std::ofstream(path) << Calibration::from_max_abs(std::vector<float>(4, max_abs)).to_json();
    return path.string();
  };
  const std::string calib_a = calibration_file("a.json", 1.5f), calib_b = calibration_file("b.json", 2.5f);
  const FormatOptions formats[] = {
      {.rope = RopeEncoding::fp8, .scale_mode = ScaleMode::dynamic},                         // dynamic 368
      {.rope = RopeEncoding::fp8, .scale_mode = ScaleMode::static_calibrated, .scales_file = calib_a},  // static 368 A
      {.rope = RopeEncoding::fp8, .scale_mode = ScaleMode::static_calibrated, .scales_file = calib_b},  // static 368 B
      {.rope = RopeEncoding::bf16, .scale_mode = ScaleMode::static_calibrated, .scales_file = calib_a},  // static 432 A
      {.rope = RopeEncoding::fp8, .scale_mode = ScaleMode::implicit},                        // implicit 368
      {.rope = RopeEncoding::bf16, .scale_mode = ScaleMode::implicit},                       // implicit 432
      {.cache_dtype = CacheDtype::fp8_ds_mla},
      {.cache_dtype = CacheDtype::bf16},
  };
  std::vector<NamespaceParams> out;
  for (const auto& f : formats) out.push_back(NamespaceParams::for_format(FormatConfig::create(f), 2, 1, "model-a"));
  const NamespaceParams base = out.front();
  auto vary = [&](auto change) {
    NamespaceParams p = base;
    change(p);
    p.validate();
    out.push_back(p);
  };
  vary([](NamespaceParams& p) { p.tokens_per_block = 4; });
  vary([](NamespaceParams& p) { p.layers_in_block = 2; });
  vary([](NamespaceParams& p) { p.model_identity = "model-b"; });
  vary([](NamespaceParams& p) { p.parallel = {.tp_rank = 0, .tp_size = 2}; });
  vary([](NamespaceParams& p) { p.parallel = {.tp_rank = 1, .tp_size = 2}; });
  vary([](NamespaceParams& p) { p.parallel = {.dcp_rank = 1, .dcp_size = 2}; });
  // Same page bytes, other geometry: 1 token x 2 layers vs 2 tokens x 1 layer.
  vary([](NamespaceParams& p) {
    p.tokens_per_block = 1;
    p.layers_in_block = 2;
  });
  return out;
}

}  // namespace

TEST(OffloadIsolation, SameKeyUnderDistinctNamespacesNeverReadsAcross) {
  ScratchDir dir;
  const auto spaces = distinct_namespaces(dir.path());
  const size_t n = spaces.size();
  std::vector<std::unique_ptr<DiskTier>> tiers;
  for (const auto& p : spaces) tiers.push_back(std::make_unique<DiskTier>(dir.path() / "store", p,
                                                                        DiskTierOptions{.durable = false}));
  // Every namespace has its own directory.
  EXPECT_EQ(list_namespaces(dir.path() / "store").size(), n);
  const auto shared_key = key_of(7);
  for (size_t i = 0; i < n; ++i) {
    tiers[i]->put(shared_key, pattern_bytes(spaces[i].block_bytes(), 1000 + i));
    tiers[i]->put(key_of(100 + i), pattern_bytes(spaces[i].block_bytes(), 2000 + i));
  }
  for (size_t j = 0; j < n; ++j) {
    std::vector<uint8_t> out(spaces[j].block_bytes());
    ASSERT_TRUE(tiers[j]->get(shared_key, out));
    EXPECT_EQ(out, pattern_bytes(spaces[j].block_bytes(), 1000 + j)) << spaces[j].record_identity;
  }
  // Reopened one at a time from disk (a tier indexes what its scan finds, so two namespaces
  // sharing a directory would show each other's files here): each holds its own two blocks.
  tiers.clear();
  for (size_t j = 0; j < n; ++j) {
    DiskTier tier(dir.path() / "store", spaces[j], DiskTierOptions{.durable = false});
    EXPECT_EQ(tier.stats().blocks, 2u) << spaces[j].record_identity;
    EXPECT_EQ(tier.stats().quarantined_at_open, 0u) << spaces[j].record_identity;
    std::vector<uint8_t> out(spaces[j].block_bytes());
    ASSERT_TRUE(tier.get(shared_key, out));
    EXPECT_EQ(out, pattern_bytes(spaces[j].block_bytes(), 1000 + j));
    for (size_t i = 0; i < n; ++i) EXPECT_EQ(tier.contains(key_of(100 + i)), i == j) << i << " under " << j;
  }
}

TEST(OffloadIsolation, ABlockFileMovedIntoAnotherNamespaceIsNeverServed) {
  ScratchDir dir;
  const auto spaces = distinct_namespaces(dir.path());
  const size_t n = spaces.size();
  std::vector<std::unique_ptr<DiskTier>> tiers;
  const auto key = key_of(7);
  std::vector<fs::path> paths;
  for (size_t i = 0; i < n; ++i) {
    tiers.push_back(std::make_unique<DiskTier>(dir.path() / "store", spaces[i], DiskTierOptions{.durable = false}));
    tiers[i]->put(key, pattern_bytes(spaces[i].block_bytes(), 1000 + i));
    const auto found = files_under(tiers[i]->dir() / "blocks", ".blk");
    ASSERT_EQ(found.size(), 1u);
    paths.push_back(found[0]);
  }
  std::vector<std::vector<uint8_t>> files;
  for (const auto& p : paths) files.push_back(read_file(p));
  size_t same_size_pairs = 0;
  for (size_t i = 0; i < n; ++i)
    for (size_t j = 0; j < n; ++j) {
      if (i == j) continue;
      // What the validator says about i's file read as j's block, and that j's store agrees.
      const BlockDefect defect = check_block_file(files[i], BlockExpectation::of(spaces[j]), key);
      ASSERT_NE(defect, BlockDefect::none) << i << " -> " << j;
      if (files[i].size() == files[j].size()) {
        ++same_size_pairs;
        // The digest covers the geometry too, and is checked first.
        EXPECT_EQ(defect, BlockDefect::wrong_namespace) << i << " -> " << j;
      }
      write_file(paths[j], files[i]);
      std::vector<uint8_t> out(spaces[j].block_bytes());
      ASSERT_FALSE(tiers[j]->get(key, out)) << spaces[i].record_identity << " served as " << spaces[j].record_identity;
      tiers[j]->put(key, pattern_bytes(spaces[j].block_bytes(), 1000 + j));
    }
  EXPECT_GT(same_size_pairs, 50u);  // most pairs share a size: the digest is what separates them
  uint64_t corrupt = 0;
  for (const auto& t : tiers) corrupt += t->stats().corrupt;
  EXPECT_EQ(corrupt, n * (n - 1));
}
