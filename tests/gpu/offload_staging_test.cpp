// GPU offload staging: gather records from paged device caches into pinned host blocks and
// scatter them back; the host stager is the reference.
#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <span>
#include <stdexcept>
#include <vector>

#include "gpu/gpu_support.h"
#include "nvfp4mla/error.h"
#include "nvfp4mla/offload/cuda_staging.h"

using namespace nvfp4mla;
using nvfp4mla::testing::DeviceBuffer;

namespace {

struct PinnedBytes {
  uint8_t* p = nullptr;
  size_t n = 0;
  explicit PinnedBytes(size_t bytes) : n(bytes) {
    if (cudaHostAlloc(reinterpret_cast<void**>(&p), bytes, cudaHostAllocMapped) != cudaSuccess)
      throw std::runtime_error("cudaHostAlloc failed");
  }
  ~PinnedBytes() { cudaFreeHost(p); }
  std::span<uint8_t> span() { return {p, n}; }
};

}  // namespace

TEST(GpuOffloadStaging, GatherAndScatterMatchTheHostStager) {
  NVFP4MLA_REQUIRE_GPU();
  const int rb = 368, layers = 3, page = 64, pages = 40, tokens_per_block = 64, blocks = 5;
  const int64_t capacity = int64_t(page) * pages;
  std::mt19937_64 rng(42);
  std::vector<std::vector<uint8_t>> host_caches(layers, std::vector<uint8_t>(capacity * rb));
  std::vector<DeviceBuffer<uint8_t>> dev_caches;
  for (auto& c : host_caches) {
    for (auto& b : c) b = static_cast<uint8_t>(rng());
    dev_caches.emplace_back(c);
  }
  // Blocks made of random pages' slots, with padding slots.
  std::vector<int64_t> slots;
  for (int b = 0; b < blocks; ++b) {
    const int64_t pg = static_cast<int64_t>(rng() % pages);
    for (int t = 0; t < tokens_per_block; ++t) slots.push_back((t % 13 == 12) ? -1 : pg * page + t);
  }
  std::vector<PagedCacheView> host_views, dev_views;
  for (int l = 0; l < layers; ++l) {
    host_views.push_back({host_caches[l].data(), pages, page, rb});
    dev_views.push_back({dev_caches[l].get(), pages, page, rb});
  }
  const size_t bytes = slots.size() * layers * rb;
  std::vector<uint8_t> expect(bytes, 0xEE);
  offload::make_host_stager()->gather({host_views, slots, tokens_per_block, expect});

  PinnedBytes pinned(bytes);
  std::memset(pinned.p, 0xEE, bytes);
  cudaStream_t stream;
  ASSERT_EQ(cudaStreamCreate(&stream), cudaSuccess);
  {
    auto stager = offload::make_cuda_stager(stream);
    stager->gather({dev_views, slots, tokens_per_block, pinned.span()});
    stager->synchronize();
    EXPECT_EQ(std::memcmp(pinned.p, expect.data(), bytes), 0);

    // Scatter into poisoned caches, the padding entries' staged records poisoned differently
    // (block b, layer l, token t at ((b layers + l) tokens_per_block + t) records): every
    // non-padding slot gets its record back, and no other slot is written.
    std::vector<bool> written(capacity, false);
    for (size_t i = 0; i < slots.size(); ++i) {
      if (slots[i] >= 0) {
        written[slots[i]] = true;
        continue;
      }
      const size_t b = i / tokens_per_block, t = i % tokens_per_block;
      for (int l = 0; l < layers; ++l) std::memset(pinned.p + ((b * layers + l) * tokens_per_block + t) * rb, 0x5A, rb);
    }
    for (auto& c : dev_caches) c.fill_bytes(0xA5);
    stager->scatter({dev_views, slots, tokens_per_block, pinned.span()});
    stager->synchronize();
    for (int l = 0; l < layers; ++l) {
      const auto back = dev_caches[l].download();
      for (int64_t s = 0; s < capacity; ++s) {
        if (written[s]) {
          ASSERT_EQ(std::memcmp(&back[s * rb], &host_caches[l][s * rb], rb), 0) << "layer " << l << " slot " << s;
        } else {
          for (int k = 0; k < rb; ++k) ASSERT_EQ(back[s * rb + k], 0xA5) << "layer " << l << " slot " << s << " was written";
        }
      }
    }
    // Bad requests fail before any copy: a pageable host buffer, a slot beyond capacity.
    std::vector<uint8_t> pageable(bytes);
    EXPECT_THROW(stager->gather({dev_views, slots, tokens_per_block, pageable}), Error);
    auto bad = slots;
    bad[3] = capacity;
    EXPECT_THROW(stager->gather({dev_views, bad, tokens_per_block, pinned.span()}), Error);
  }
  cudaStreamDestroy(stream);
}
