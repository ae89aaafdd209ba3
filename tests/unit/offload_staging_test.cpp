// Host staging: gather records of given slots from per-layer paged caches into block buffers
// and scatter them back, with padding slots and validation.
#include <gtest/gtest.h>

#include "nvfp4mla/error.h"
#include "nvfp4mla/offload/staging.h"
#include "support/offload_fixtures.h"

using namespace nvfp4mla;
using namespace nvfp4mla::offload;
using nvfp4mla::testing::expect_error_containing;
using nvfp4mla::testing::pattern_bytes;

namespace {
struct Caches {
  int layers, num_pages, page_size, record_bytes;
  std::vector<std::vector<uint8_t>> storage;
  std::vector<PagedCacheView> views;
  Caches(int l, int pages, int page, int record, uint64_t seed) : layers(l), num_pages(pages), page_size(page), record_bytes(record) {
    for (int i = 0; i < l; ++i) storage.push_back(pattern_bytes(size_t(pages) * page * record, seed + i));
    for (auto& s : storage) views.push_back({s.data(), pages, page, record});
  }
};
}  // namespace

TEST(OffloadStaging, GatherThenScatterRestoresTheRecords) {
  const int record = kSpecNvfp4Fp8Rope.record_bytes();
  Caches src(3, 8, 4, record, 1);
  // Two blocks of 4 tokens: page 5 whole, then page 2's first three slots and a padding slot.
  const std::vector<int64_t> slots = {20, 21, 22, 23, 8, 9, 10, -1};
  const int tokens = 4;
  std::vector<uint8_t> host(slots.size() * 3 * record, 0xAB);
  auto stager = make_host_stager();
  stager->gather({src.views, slots, tokens, host});
  stager->synchronize();
  for (size_t b = 0; b < 2; ++b)
    for (int l = 0; l < 3; ++l)
      for (int t = 0; t < tokens; ++t) {
        const int64_t slot = slots[b * tokens + t];
        const uint8_t* got = host.data() + ((b * 3 + l) * tokens + t) * record;
        if (slot < 0) {
          EXPECT_TRUE(std::all_of(got, got + record, [](uint8_t x) { return x == 0; }));
        } else {
          EXPECT_TRUE(std::equal(got, got + record, src.views[l].slot(slot))) << b << " " << l << " " << t;
        }
      }
  // Scatter into a different cache at other slots; padding leaves the cache untouched.
  Caches dst(3, 8, 4, record, 100);
  const auto before = dst.storage;
  const std::vector<int64_t> to = {0, 1, 2, 3, 28, 29, 30, -5};
  stager->scatter({dst.views, to, tokens, host});
  for (size_t i = 0; i < to.size(); ++i)
    for (int l = 0; l < 3; ++l) {
      if (to[i] < 0) continue;
      EXPECT_TRUE(std::equal(dst.views[l].slot(to[i]), dst.views[l].slot(to[i]) + record, src.views[l].slot(slots[i])));
    }
  // Slot 31 (the padding target's neighbour) and every other slot kept their bytes.
  for (int l = 0; l < 3; ++l)
    for (int64_t s : {4, 27, 31})
      EXPECT_TRUE(std::equal(dst.views[l].slot(s), dst.views[l].slot(s) + record, before[l].data() + s * record));
}

TEST(OffloadStaging, InvalidRequestsAreErrorsBeforeAnyCopy) {
  const int record = kSpecNvfp4Fp8Rope.record_bytes();
  Caches c(2, 2, 4, record, 1);
  auto stager = make_host_stager();
  std::vector<int64_t> slots = {0, 1, 2, 3};
  std::vector<uint8_t> host(slots.size() * 2 * record);
  const auto original = host;
  slots[2] = 8;  // capacity is 8
  expect_error_containing([&] { stager->gather({c.views, slots, 4, host}); }, "slot 8 (index 2)");
  EXPECT_EQ(host, original);
  slots[2] = 2;
  expect_error_containing([&] { stager->gather({c.views, slots, 3, host}); }, "whole number");
  expect_error_containing([&] { stager->gather({c.views, slots, 4, std::span<uint8_t>(host).first(10)}); },
                          "host buffer");
  expect_error_containing([&] { stager->gather({{}, slots, 4, host}); }, "no layers");
  Caches other(1, 2, 4, kSpecBf16.record_bytes(), 2);
  std::vector<PagedCacheView> mixed = {c.views[0], other.views[0]};
  expect_error_containing([&] { stager->scatter({mixed, slots, 4, host}); }, "1152-byte records");
}
