// GPU index key cache: writer == CPU writer bit for bit (BF16, FP16, fp32 inputs, NaN/Inf,
// page sizes, padded rows), skipped slots, out-of-range slots that write nothing, gathers, and
// host-side argument errors.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <numeric>
#include <random>
#include <vector>

#include "gpu/gpu_support.h"
#include "nvfp4mla/codec.h"
#include "nvfp4mla/cuda/index_cache.h"
#include "nvfp4mla/error.h"
#include "nvfp4mla/index_cache.h"
#include "nvfp4mla/testing/index_data.h"

using namespace nvfp4mla;
using nvfp4mla::testing::DeviceBuffer;
using nvfp4mla::testing::input_type;

namespace {

constexpr uint8_t kPoison = 0xA5;

// Keys of one input type with `stride` elements per row (the padding holds NaN-like junk).
template <class In>
std::vector<In> typed_keys(const std::vector<float>& k, int64_t n, int64_t stride, uint64_t seed);
template <>
std::vector<float> typed_keys(const std::vector<float>& k, int64_t n, int64_t stride, uint64_t) {
  std::vector<float> v(n * stride, std::numeric_limits<float>::quiet_NaN());
  for (int64_t t = 0; t < n; ++t) std::copy_n(&k[t * 128], 128, &v[t * stride]);
  return v;
}
template <>
std::vector<Bf16Bits> typed_keys(const std::vector<float>& k, int64_t n, int64_t stride, uint64_t) {
  std::vector<Bf16Bits> v(n * stride, Bf16Bits{0x7FC1});
  for (int64_t t = 0; t < n; ++t)
    for (int i = 0; i < 128; ++i) v[t * stride + i].bits = codec::bf16_encode_rn(k[t * 128 + i]);
  return v;
}
template <>
std::vector<Fp16Bits> typed_keys(const std::vector<float>&, int64_t n, int64_t stride, uint64_t seed) {
  std::mt19937_64 rng(seed);  // random FP16 patterns: subnormals, Inf and NaN included
  std::vector<Fp16Bits> v(n * stride);
  for (auto& h : v) h.bits = static_cast<uint16_t>(rng());
  return v;
}

// CPU writer on a row-compacted copy (it takes [T, 128]).
template <class In>
std::vector<In> compact(const std::vector<In>& v, int64_t n, int64_t stride) {
  std::vector<In> out(n * 128);
  for (int64_t t = 0; t < n; ++t) std::copy_n(&v[t * stride], 128, &out[t * 128]);
  return out;
}

template <class In>
void check_writer(int64_t page_size, int64_t stride, uint64_t seed) {
  SCOPED_TRACE(::testing::Message() << "page_size " << page_size << " stride " << stride);
  const int64_t n = 3000, pages = 4096 / page_size + 2, capacity = pages * page_size;
  const auto values = nvfp4mla::testing::random_index_keys(n, seed, /*non_finite=*/true);
  const auto keys = typed_keys<In>(values, n, stride, seed + 1);
  std::mt19937_64 rng(seed + 2);
  std::vector<int64_t> perm(capacity);
  std::iota(perm.begin(), perm.end(), 0);
  std::shuffle(perm.begin(), perm.end(), rng);
  std::vector<int64_t> slots(perm.begin(), perm.begin() + n);
  for (int64_t i = 0; i < n; i += 29) slots[i] = -1 - (i % 3);  // padded slots
  std::vector<uint8_t> expect(capacity * 132, kPoison);
  write_index_cache(compact(keys, n, stride).data(), n, slots, IndexCacheView{expect.data(), pages, page_size});

  DeviceBuffer<In> d_keys(keys);
  DeviceBuffer<int64_t> d_slots(slots);
  DeviceBuffer<uint8_t> d_cache(expect.size());
  d_cache.fill_bytes(kPoison);
  DeviceBuffer<unsigned long long> d_invalid(1);
  d_invalid.fill_bytes(0xFF);
  cuda::IndexCacheWriteArgs a;
  a.keys = d_keys.get();
  a.input_type = input_type<In>();
  a.num_tokens = n;
  a.key_stride = stride;
  a.slot_mapping = d_slots.get();
  a.cache = {d_cache.get(), pages, page_size};
  a.invalid_count = d_invalid.get();
  cuda::write_index_cache(a, nullptr);
  CUDA_OK(cudaDeviceSynchronize());
  EXPECT_EQ(d_invalid.download()[0], 0u);
  const auto got = d_cache.download();
  for (size_t i = 0; i < got.size(); ++i) ASSERT_EQ(got[i], expect[i]) << "byte " << i;

  // Gathers of every written slot, shuffled, as records and split.
  std::vector<int64_t> written;
  for (int64_t s : slots)
    if (s >= 0) written.push_back(s);
  std::shuffle(written.begin(), written.end(), rng);
  const int64_t m = static_cast<int64_t>(written.size());
  std::vector<uint8_t> want_rec(m * 132), want_val(m * 128);
  std::vector<float> want_sc(m);
  const IndexCacheView view{expect.data(), pages, page_size};
  gather_index_records(view, written, want_rec.data());
  gather_index_keys(view, written, want_val.data(), want_sc.data());
  DeviceBuffer<int64_t> d_written(written);
  DeviceBuffer<uint8_t> d_rec(m * 132), d_val(m * 128);
  DeviceBuffer<float> d_sc(m);
  cuda::gather_index_records(a.cache, d_written.get(), m, d_rec.get(), d_invalid.get(), nullptr);
  cuda::gather_index_keys(a.cache, d_written.get(), m, d_val.get(), d_sc.get(), d_invalid.get(), nullptr);
  CUDA_OK(cudaDeviceSynchronize());
  EXPECT_EQ(d_invalid.download()[0], 0u);
  EXPECT_EQ(d_rec.download(), want_rec);
  EXPECT_EQ(d_val.download(), want_val);
  const auto sc = d_sc.download();
  EXPECT_EQ(std::memcmp(sc.data(), want_sc.data(), m * 4), 0);
}

TEST(IndexCacheGpu, WriterMatchesCpuBf16) {
  NVFP4MLA_REQUIRE_GPU();
  check_writer<Bf16Bits>(64, 128, 1);
  check_writer<Bf16Bits>(16, 136, 2);
  check_writer<Bf16Bits>(5, 128, 3);
}
TEST(IndexCacheGpu, WriterMatchesCpuFp16) {
  NVFP4MLA_REQUIRE_GPU();
  check_writer<Fp16Bits>(64, 128, 4);
  check_writer<Fp16Bits>(1, 192, 5);
}
TEST(IndexCacheGpu, WriterMatchesCpuF32) {
  NVFP4MLA_REQUIRE_GPU();
  check_writer<float>(64, 128, 6);
  check_writer<float>(12, 132, 7);
}

TEST(IndexCacheGpu, OutOfRangeSlotWritesNothing) {
  NVFP4MLA_REQUIRE_GPU();
  const int64_t n = 500, pages = 10, page_size = 64;
  const auto values = nvfp4mla::testing::random_index_keys(n, 9);
  const auto keys = nvfp4mla::testing::to_bf16_keys(values);
  std::vector<int64_t> slots(n);
  std::iota(slots.begin(), slots.end(), 0);
  slots[123] = pages * page_size;  // one past the end
  slots[400] = int64_t(1) << 40;
  DeviceBuffer<Bf16Bits> d_keys(keys);
  DeviceBuffer<int64_t> d_slots(slots);
  DeviceBuffer<uint8_t> d_cache(pages * page_size * 132);
  d_cache.fill_bytes(kPoison);
  DeviceBuffer<unsigned long long> d_invalid(1);
  cuda::IndexCacheWriteArgs a;
  a.keys = d_keys.get();
  a.num_tokens = n;
  a.slot_mapping = d_slots.get();
  a.cache = {d_cache.get(), pages, page_size};
  a.invalid_count = d_invalid.get();
  cuda::write_index_cache(a, nullptr);
  CUDA_OK(cudaDeviceSynchronize());
  EXPECT_EQ(d_invalid.download()[0], 2u);
  const auto got = d_cache.download();
  EXPECT_TRUE(std::all_of(got.begin(), got.end(), [](uint8_t b) { return b == kPoison; }));

  // A later good call clears the count and writes.
  slots[123] = 123;
  slots[400] = 400;
  d_slots.upload(slots);
  cuda::write_index_cache(a, nullptr);
  CUDA_OK(cudaDeviceSynchronize());
  EXPECT_EQ(d_invalid.download()[0], 0u);
  std::vector<uint8_t> expect(pages * page_size * 132, kPoison);
  write_index_cache(keys.data(), n, slots, IndexCacheView{expect.data(), pages, page_size});
  EXPECT_EQ(d_cache.download(), expect);

  // Gathers from the written cache: a negative or out-of-range slot is an error too, counted,
  // and the call writes nothing at all, not even the valid slots' records.
  const uint8_t kOutPoison = 0x3C;
  std::vector<int64_t> bad = {0, 5, -1, pages * page_size};
  DeviceBuffer<int64_t> d_bad(bad);
  DeviceBuffer<uint8_t> d_rec(4 * 132);
  d_rec.fill_bytes(kOutPoison);
  cuda::gather_index_records(a.cache, d_bad.get(), 4, d_rec.get(), d_invalid.get(), nullptr);
  CUDA_OK(cudaDeviceSynchronize());
  EXPECT_EQ(d_invalid.download()[0], 2u);
  const auto rec = d_rec.download();
  EXPECT_TRUE(std::all_of(rec.begin(), rec.end(), [&](uint8_t b) { return b == kOutPoison; }));
}

TEST(IndexCacheGpu, HostErrors) {
  NVFP4MLA_REQUIRE_GPU();
  DeviceBuffer<uint16_t> d_keys(4 * 128 + 8);
  DeviceBuffer<int64_t> d_slots(4);
  DeviceBuffer<uint8_t> d_cache(64 * 132 + 16);
  DeviceBuffer<unsigned long long> d_invalid(1);
  cuda::IndexCacheWriteArgs good;
  good.keys = d_keys.get();
  good.num_tokens = 4;
  good.slot_mapping = d_slots.get();
  good.cache = {d_cache.get(), 1, 64};
  good.invalid_count = d_invalid.get();
  auto expect_error = [](const cuda::IndexCacheWriteArgs& a, const char* needle) {
    try {
      cuda::write_index_cache(a, nullptr);
      ADD_FAILURE() << "no error for " << needle;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  auto a = good;
  a.invalid_count = nullptr;
  expect_error(a, "invalid_count");
  a = good, a.keys = reinterpret_cast<const uint8_t*>(d_keys.get()) + 2;
  expect_error(a, "16-byte aligned");
  a = good, a.key_stride = 130;
  expect_error(a, "16-byte aligned");
  a = good, a.key_stride = 64;
  expect_error(a, "key_stride must be at least 128");
  a = good, a.cache.page_size = 0;
  expect_error(a, "page_size must be at least 1");
  a = good, a.cache.data = d_cache.get() + 1;
  expect_error(a, "4-byte aligned");
  a = good, a.num_tokens = -1;
  expect_error(a, "negative token count");
  EXPECT_THROW(cuda::gather_index_keys(good.cache, d_slots.get(), 4, d_cache.get() + 4, reinterpret_cast<float*>(d_cache.get()),
                                       d_invalid.get(), nullptr),
               Error);
}

}  // namespace
