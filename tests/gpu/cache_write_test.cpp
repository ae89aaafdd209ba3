// GPU cache writer == CPU writer, bit for bit; gather/scatter; slot rules and error counter.
#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>
#include <random>
#include <vector>

#include "gpu/gpu_support.h"
#include "nvfp4mla/codec.h"
#include "nvfp4mla/cuda/cache_write.h"
#include "nvfp4mla/error.h"
#include "support/record_specs.h"
#include "nvfp4mla/record.h"
#include "support/random_tokens.h"

using namespace nvfp4mla;
using nvfp4mla::testing::DeviceBuffer;

namespace {

const auto& kAllSpecs = nvfp4mla::testing::kAllRecordSpecs;


// Inputs of one type, converted from the BF16 token set (F16 and F32 inputs carry other values).
template <class In>
std::vector<In> as_input(const std::vector<uint16_t>& bf16, std::mt19937_64& rng);
template <>
std::vector<Bf16Bits> as_input(const std::vector<uint16_t>& b, std::mt19937_64&) {
  std::vector<Bf16Bits> v(b.size());
  for (size_t i = 0; i < b.size(); ++i) v[i].bits = b[i];
  return v;
}
template <>
std::vector<float> as_input(const std::vector<uint16_t>& b, std::mt19937_64& rng) {
  std::vector<float> v(b.size());
  std::uniform_real_distribution<float> jitter(0.99f, 1.01f);  // values off the BF16 grid
  for (size_t i = 0; i < b.size(); ++i) v[i] = codec::bf16_decode(b[i]) * jitter(rng);
  return v;
}
template <>
std::vector<Fp16Bits> as_input(const std::vector<uint16_t>& b, std::mt19937_64& rng) {
  // Random FP16 bit patterns cover subnormals, infinities and NaN.
  std::vector<Fp16Bits> v(b.size());
  for (size_t i = 0; i < b.size(); ++i) v[i].bits = static_cast<uint16_t>(rng());
  return v;
}

using nvfp4mla::testing::input_type;

template <class In>
void check_writer(const RecordSpec& spec, uint64_t seed) {
  SCOPED_TRACE(nvfp4mla::testing::spec_name(spec));
  const int64_t n = 3000, capacity = 4096;
  const float layer_scale = 0.0123f;
  const auto tokens = nvfp4mla::testing::random_tokens(n, seed, -6, 4, /*non_finite=*/true);
  std::mt19937_64 rng(seed + 1);
  const auto kv = as_input<In>(tokens.kv_c, rng);
  const auto pe = as_input<In>(tokens.k_pe, rng);
  // Slot mapping: a random permutation of slots, with padded (-1) and out-of-range entries.
  std::vector<int64_t> perm(capacity);
  std::iota(perm.begin(), perm.end(), 0);
  std::shuffle(perm.begin(), perm.end(), rng);
  std::vector<int64_t> slots(n);
  int64_t out_of_range = 0;
  for (int64_t i = 0; i < n; ++i) {
    slots[i] = perm[i];
    if (i % 37 == 3) slots[i] = -1;
    if (i % 53 == 7) { slots[i] = capacity + (i % 3) * 1000; ++out_of_range; }
  }
  const int rb = spec.record_bytes();
  // Expected cache: poison everywhere, CPU records in the written slots.
  std::vector<uint8_t> expect(capacity * rb, 0xA5);
  for (int64_t i = 0; i < n; ++i)
    if (slots[i] >= 0 && slots[i] < capacity)
      record::encode(spec, &kv[i * kLatentDim], &pe[i * kRopeDim], layer_scale, &expect[slots[i] * rb]);

  DeviceBuffer<In> d_kv(kv), d_pe(pe);
  DeviceBuffer<int64_t> d_slots(slots);
  DeviceBuffer<uint8_t> d_cache(capacity * rb);
  d_cache.fill_bytes(0xA5);
  DeviceBuffer<unsigned long long> d_err(std::vector<unsigned long long>{0});
  cuda::CacheWriteArgs a;
  a.kv_c = d_kv.get();
  a.k_pe = d_pe.get();
  a.input_type = input_type<In>();
  a.num_tokens = n;
  a.slot_mapping = d_slots.get();
  a.cache = d_cache.get();
  a.capacity = capacity;
  a.layer_scale = layer_scale;
  a.error_count = d_err.get();
  cuda::write_cache(spec, a, nullptr);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  const auto got = d_cache.download();
  int64_t bad_records = 0;
  for (int64_t s = 0; s < capacity; ++s)
    if (std::memcmp(&got[s * rb], &expect[s * rb], rb) != 0 && bad_records++ < 3)
      ADD_FAILURE() << "slot " << s << " differs from the CPU writer";
  EXPECT_EQ(bad_records, 0);
  EXPECT_EQ(d_err.download()[0], static_cast<unsigned long long>(out_of_range));
}

}  // namespace

TEST(GpuCacheWriter, BitIdenticalToCpuWriterBf16Input) {
  NVFP4MLA_REQUIRE_GPU();
  uint64_t seed = 100;
  for (const auto& spec : kAllSpecs) check_writer<Bf16Bits>(spec, seed++);
}

TEST(GpuCacheWriter, BitIdenticalToCpuWriterFp16AndF32Input) {
  NVFP4MLA_REQUIRE_GPU();
  uint64_t seed = 200;
  for (const auto& spec : kAllSpecs) {
    check_writer<Fp16Bits>(spec, seed++);
    check_writer<float>(spec, seed++);
  }
}

TEST(GpuCacheWriter, RejectsBadArguments) {
  NVFP4MLA_REQUIRE_GPU();
  cuda::CacheWriteArgs a;
  a.num_tokens = 4;
  EXPECT_THROW(cuda::write_cache(kSpecNvfp4Fp8Rope, a, nullptr), Error);  // null pointers
  DeviceBuffer<uint16_t> buf(4096);
  DeviceBuffer<int64_t> slots(4);
  DeviceBuffer<uint8_t> cache(4 * 368);
  a.kv_c = buf.get() + 1;  // misaligned rows
  a.k_pe = buf.get();
  a.slot_mapping = slots.get();
  a.cache = cache.get();
  a.capacity = 4;
  EXPECT_THROW(cuda::write_cache(kSpecNvfp4Fp8Rope, a, nullptr), Error);
  a.kv_c = buf.get();
  a.kv_c_stride = 100;  // shorter than a latent row
  EXPECT_THROW(cuda::write_cache(kSpecNvfp4Fp8Rope, a, nullptr), Error);
}

TEST(GpuRecordCopy, GatherAndScatterRoundTrip) {
  NVFP4MLA_REQUIRE_GPU();
  const int rb = 368;
  const int64_t capacity = 1000, n = 300;
  std::mt19937_64 rng(7);
  std::vector<uint8_t> cache(capacity * rb);
  for (auto& b : cache) b = static_cast<uint8_t>(rng());
  std::vector<int64_t> slots(n);
  int64_t bad = 0;
  for (int64_t i = 0; i < n; ++i) {
    slots[i] = static_cast<int64_t>(rng() % capacity);
    if (i % 17 == 0) slots[i] = -1;
    if (i % 29 == 0) { slots[i] = capacity + 5; ++bad; }
  }
  DeviceBuffer<uint8_t> d_cache(cache), d_dst(n * rb);
  d_dst.fill_bytes(0x77);
  DeviceBuffer<int64_t> d_slots(slots);
  DeviceBuffer<unsigned long long> d_err(std::vector<unsigned long long>{0});
  cuda::gather_records(rb, d_cache.get(), capacity, d_slots.get(), n, d_dst.get(), d_err.get(), nullptr);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  const auto got = d_dst.download();
  for (int64_t i = 0; i < n; ++i) {
    const bool valid = slots[i] >= 0 && slots[i] < capacity;
    for (int b = 0; b < rb; ++b)
      ASSERT_EQ(got[i * rb + b], valid ? cache[slots[i] * rb + b] : 0) << "entry " << i << " byte " << b;
  }
  EXPECT_EQ(d_err.download()[0], static_cast<unsigned long long>(bad));
  // Scatter the gathered records into a fresh cache: every valid slot gets its bytes back.
  DeviceBuffer<uint8_t> d_cache2(capacity * rb);
  d_cache2.fill_bytes(0);
  cuda::scatter_records(rb, d_dst.get(), d_slots.get(), n, d_cache2.get(), capacity, d_err.get(), nullptr);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  const auto back = d_cache2.download();
  for (int64_t i = 0; i < n; ++i)
    if (slots[i] >= 0 && slots[i] < capacity)
      ASSERT_EQ(std::memcmp(&back[slots[i] * rb], &cache[slots[i] * rb], rb), 0) << i;
  EXPECT_EQ(d_err.download()[0], static_cast<unsigned long long>(2 * bad));
}
