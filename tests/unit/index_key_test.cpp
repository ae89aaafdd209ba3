// Index key format and CPU cache: the recipe against the independent reference model, literal
// bytes, the paged layout's offsets, the writer's slot rules (skipped, duplicated, out-of-range
// slots that write nothing) and the gathers.
#include <gtest/gtest.h>

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstring>
#include <limits>
#include <map>
#include <numeric>
#include <random>
#include <vector>

#include "nvfp4mla/codec.h"
#include "nvfp4mla/error.h"
#include "nvfp4mla/index_cache.h"
#include "nvfp4mla/index_key.h"
#include "nvfp4mla/testing/index_data.h"
#include "unit/record_reference.h"

using namespace nvfp4mla;
namespace ref = nvfp4mla_test::ref;

namespace {

constexpr uint8_t kPoison = 0xA5;

// The reference model's recipe, from docs/SELECTION.md: values then scale.
std::vector<uint8_t> reference_record(const float* x) {
  float amax = 0.0f;
  for (int i = 0; i < 128; ++i) amax = std::max(amax, std::fabs(ref::clean(x[i])));
  const float p = ref::fp8_tile_scale(amax);
  std::vector<uint8_t> r(132);
  for (int i = 0; i < 128; ++i) r[i] = ref::e4m3(ref::div32(ref::clean(x[i]), p));
  ref::put_f32(r, 128, p);
  return r;
}

std::vector<uint8_t> record_of(const std::vector<float>& keys, int64_t t) {
  std::vector<uint8_t> r(index_key::kRecordBytes);
  index_key::encode_record(keys.data() + t * 128, r.data());
  return r;
}

TEST(IndexKey, LayoutConstants) {
  EXPECT_EQ(index_key::kRecordBytes, 132);
  EXPECT_EQ(index_key::kScaleOffset, 128);
  EXPECT_EQ(index_key::kDefaultPageSize, 64);
  // Page of 64: 8192 value bytes, then 64 scales; page p starts at p * 8448.
  EXPECT_EQ(index_key::page_bytes(64), 8448);
  EXPECT_EQ(index_key::value_offset(0, 64), 0);
  EXPECT_EQ(index_key::scale_offset(0, 64), 8192);
  EXPECT_EQ(index_key::value_offset(63, 64), 63 * 128);
  EXPECT_EQ(index_key::scale_offset(63, 64), 8192 + 63 * 4);
  EXPECT_EQ(index_key::value_offset(65, 64), 8448 + 128);
  EXPECT_EQ(index_key::scale_offset(65, 64), 8448 + 8192 + 4);
  EXPECT_EQ(index_key::value_offset(7, 3), 2 * 396 + 128);
  EXPECT_EQ(index_key::scale_offset(7, 3), 2 * 396 + 384 + 4);
  // Past 2^31 bytes the offsets stay exact (int64 arithmetic).
  EXPECT_EQ(index_key::scale_offset(int64_t(40000000) * 64 + 5, 64), int64_t(40000000) * 8448 + 8192 + 20);
}

TEST(IndexKey, LiteralRecords) {
  // amax 64 -> p = 1/4 (448/8 = 56 < 64 <= 112); 1 / p = 4 = E4M3 0x48, -64 / p = -256 = 0xF8.
  std::vector<float> x(128, 0.0f);
  x[0] = 1.0f;
  x[1] = -64.0f;
  x[2] = 0.1f;  // 0.4 -> nearest E4M3 0.40625 = 0x2D
  std::vector<uint8_t> r(132);
  index_key::encode_record(x.data(), r.data());
  EXPECT_EQ(r[0], 0x48);
  EXPECT_EQ(r[1], 0xF8);
  EXPECT_EQ(r[2], 0x2D);
  EXPECT_EQ(r[3], 0x00);
  EXPECT_EQ(record::load_f32(r.data() + 128), 0.25f);
  // All zero -> p = 1; -0 keeps its sign byte.
  std::fill(x.begin(), x.end(), 0.0f);
  x[5] = -0.0f;
  index_key::encode_record(x.data(), r.data());
  EXPECT_EQ(record::load_f32(r.data() + 128), 1.0f);
  EXPECT_EQ(r[5], 0x80);
  EXPECT_EQ(r[6], 0x00);
  // The scale's edges: amax 448 -> 1, just above -> 2; Inf -> FLT_MAX -> 2^120; NaN -> 0;
  // subnormal amax -> 2^-126.
  const std::pair<float, float> edges[] = {{448.0f, 1.0f},
                                           {std::nextafter(448.0f, 1e9f), 2.0f},
                                           {std::numeric_limits<float>::infinity(), 0x1p120f},
                                           {std::numeric_limits<float>::quiet_NaN(), 1.0f},
                                           {1e-40f, 0x1p-126f},
                                           {0x1p-120f, 0x1p-126f}};
  for (const auto& [v, p] : edges) {
    std::fill(x.begin(), x.end(), 0.0f);
    x[9] = v;
    index_key::encode_record(x.data(), r.data());
    EXPECT_EQ(record::load_f32(r.data() + 128), p) << v;
  }
  // -Inf becomes -FLT_MAX, scale 2^120: -FLT_MAX / 2^120 = -255.99998 -> -256 (0xF8), and 2^127
  // is 128 at that scale.
  std::fill(x.begin(), x.end(), 0.0f);
  x[3] = -std::numeric_limits<float>::infinity();
  x[4] = 0x1p127f;
  index_key::encode_record(x.data(), r.data());
  EXPECT_EQ(r[3], 0xF8);
  EXPECT_EQ(r[4], 0x70);  // 2^127 / 2^120 = 128
  std::fill(x.begin(), x.end(), 0.0f);
  x[0] = 449.0f;  // p = 2, 224.5 -> 224 (0x76)
  x[1] = 896.0f;  // exactly 448 p: 0x7E
  index_key::encode_record(x.data(), r.data());
  EXPECT_EQ(record::load_f32(r.data() + 128), 2.0f);
  EXPECT_EQ(r[0], 0x76);
  EXPECT_EQ(r[1], 0x7E);
}

TEST(IndexKey, RecipeMatchesReferenceModel) {
  const auto keys = nvfp4mla::testing::random_index_keys(3000, 11, /*non_finite=*/true);
  for (int64_t t = 0; t < 3000; ++t) ASSERT_EQ(record_of(keys, t), reference_record(keys.data() + t * 128)) << "key " << t;
}

TEST(IndexKey, InputTypesAgree) {
  // BF16 and FP16 inputs widen exactly: the record equals that of the widened fp32 values.
  const auto keys = nvfp4mla::testing::random_index_keys(500, 12, true);
  const auto bf = nvfp4mla::testing::to_bf16_keys(keys);
  std::mt19937_64 rng(5);
  std::vector<Fp16Bits> fp(keys.size());
  for (auto& h : fp) h.bits = static_cast<uint16_t>(rng());  // every FP16 pattern class, NaN and Inf included
  for (int64_t t = 0; t < 500; ++t) {
    std::vector<float> wb(128), wf(128);
    for (int i = 0; i < 128; ++i) {
      wb[i] = codec::bf16_decode(bf[t * 128 + i].bits);
      wf[i] = codec::fp16_decode(fp[t * 128 + i].bits);
    }
    std::vector<uint8_t> a(132), b(132);
    index_key::encode_record(bf.data() + t * 128, a.data());
    index_key::encode_record(wb.data(), b.data());
    ASSERT_EQ(a, b) << "bf16 key " << t;
    index_key::encode_record(fp.data() + t * 128, a.data());
    index_key::encode_record(wf.data(), b.data());
    ASSERT_EQ(a, b) << "fp16 key " << t;
  }
}

TEST(IndexKey, DecodeWithinHalfStep) {
  // Finite inputs round-trip within half an E4M3 step at the key's scale (relative 2^-4 for
  // normal values, absolute 2^-10 p below the normal range), saturating at 448 p.
  const auto keys = nvfp4mla::testing::random_index_keys(400, 13);
  for (int64_t t = 0; t < 400; ++t) {
    const auto r = record_of(keys, t);
    const float p = record::load_f32(r.data() + 128);
    for (int i = 0; i < 128; ++i) {
      const double x = keys[t * 128 + i], d = index_key::decode_value(r[i], p);
      ASSERT_LE(std::fabs(d - x), std::max(std::fabs(x) / 16.0, std::ldexp(double(p), -10))) << t << " " << i;
    }
  }
}

struct Cache {
  std::vector<uint8_t> bytes;
  IndexCacheView view;
  Cache(int64_t pages, int64_t page_size)
      : bytes(static_cast<size_t>(pages * page_size * 132), kPoison), view{bytes.data(), pages, page_size} {}
};

TEST(IndexCache, WriterSlotsAndLayout) {
  for (int64_t page_size : {64, 16, 5, 1}) {
    SCOPED_TRACE(page_size);
    const int64_t pages = 400 / page_size + 3, capacity = pages * page_size, n = 300;
    Cache cache(pages, page_size);
    const auto keys = nvfp4mla::testing::random_index_keys(n, 21 + page_size, true);
    std::vector<int64_t> slots(n);
    std::iota(slots.begin(), slots.end(), 0);
    std::mt19937_64 rng(page_size);
    std::vector<int64_t> perm(capacity);
    std::iota(perm.begin(), perm.end(), 0);
    std::shuffle(perm.begin(), perm.end(), rng);
    for (int64_t i = 0; i < n; ++i) slots[i] = i % 13 == 4 ? -1 : perm[i];
    slots[n - 1] = slots[10];  // duplicate: the later key wins
    write_index_cache(keys.data(), n, slots, cache.view);
    std::vector<uint8_t> expect(cache.bytes.size(), kPoison);
    for (int64_t i = 0; i < n; ++i) {
      if (slots[i] < 0) continue;
      const auto r = reference_record(keys.data() + i * 128);
      std::memcpy(&expect[index_key::value_offset(slots[i], page_size)], r.data(), 128);
      std::memcpy(&expect[index_key::scale_offset(slots[i], page_size)], r.data() + 128, 4);
    }
    ASSERT_EQ(cache.bytes, expect);

    // Gathers return the records written (the last key of each slot); the split form the same bytes.
    std::map<int64_t, int64_t> last_token;
    for (int64_t i = 0; i < n; ++i)
      if (slots[i] >= 0) last_token[slots[i]] = i;
    std::vector<int64_t> written;
    for (const auto& [slot, token] : last_token) written.push_back(slot);
    std::shuffle(written.begin(), written.end(), rng);
    std::vector<uint8_t> records(written.size() * 132), values(written.size() * 128);
    std::vector<float> scales(written.size());
    gather_index_records(cache.view, written, records.data());
    gather_index_keys(cache.view, written, values.data(), scales.data());
    for (size_t k = 0; k < written.size(); ++k) {
      const auto r = reference_record(keys.data() + last_token[written[k]] * 128);
      ASSERT_EQ(std::vector<uint8_t>(records.begin() + k * 132, records.begin() + (k + 1) * 132), r) << k;
      ASSERT_EQ(std::memcmp(values.data() + k * 128, r.data(), 128), 0) << k;
      ASSERT_EQ(scales[k], ref::get_f32(r.data(), 128)) << k;
    }
  }
}

TEST(IndexCache, InputTypesWriteTheSameCache) {
  const int64_t n = 200;
  const auto keys = nvfp4mla::testing::random_index_keys(n, 31, true);
  const auto bf = nvfp4mla::testing::to_bf16_keys(keys);
  std::vector<float> widened(keys.size());
  for (size_t i = 0; i < keys.size(); ++i) widened[i] = codec::bf16_decode(bf[i].bits);
  std::vector<int64_t> slots(n);
  std::iota(slots.begin(), slots.end(), 7);
  Cache a(4, 64), b(4, 64);
  write_index_cache(bf.data(), n, slots, a.view);
  write_index_cache(widened.data(), n, slots, b.view);
  EXPECT_EQ(a.bytes, b.bytes);
}

TEST(IndexCache, BadArgumentsWriteNothing) {
  const auto keys = nvfp4mla::testing::random_index_keys(4, 41);
  Cache cache(2, 64);
  const auto before = cache.bytes;
  auto expect_error = [&](std::vector<int64_t> slots, const IndexCacheView& view, const std::string& needle, int64_t n = 4) {
    try {
      write_index_cache(keys.data(), n, slots, view);
      ADD_FAILURE() << "no error for " << needle;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
    EXPECT_EQ(cache.bytes, before);
  };
  expect_error({0, 1, 128, 2}, cache.view, "slot_mapping entry 2 is slot 128");
  expect_error({0, 1, 2, int64_t(1) << 40}, cache.view, "slot_mapping entry 3");
  expect_error({0, 1, 2}, cache.view, "4 keys but 3 slot_mapping entries");
  expect_error({0, 1, 2, 3}, IndexCacheView{cache.bytes.data(), 2, 0}, "page_size must be at least 1");
  expect_error({0, 1, 2, 3}, IndexCacheView{cache.bytes.data(), -1, 64}, "num_pages is negative");
  expect_error({0, 1, 2, 3}, IndexCacheView{nullptr, 2, 64}, "has no memory");
  expect_error({0, 1, 2, 3}, IndexCacheView{cache.bytes.data(), int64_t(1) << 40, 64}, "too large");
  expect_error({-1, 0}, cache.view, "-1 keys", -1);

  // Gathers: negative and out-of-range slots are errors; nothing is written.
  std::vector<uint8_t> out(3 * 132, kPoison);
  const auto out_before = out;
  EXPECT_THROW(gather_index_records(cache.view, std::vector<int64_t>{0, -1, 1}, out.data()), Error);
  EXPECT_THROW(gather_index_records(cache.view, std::vector<int64_t>{0, 1, 128}, out.data()), Error);
  EXPECT_THROW(gather_index_records(cache.view, std::vector<int64_t>{0}, nullptr), Error);
  EXPECT_EQ(out, out_before);
}

}  // namespace
