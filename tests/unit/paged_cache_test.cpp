// CPU paged cache: slot mapping, skipped padding slots, capacity errors that write nothing,
// and gather-dequantize agreeing with record::decode for every format.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <map>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "nvfp4mla/codec.h"
#include "nvfp4mla/error.h"
#include "nvfp4mla/paged_cache.h"
#include "nvfp4mla/record.h"
#include "nvfp4mla/testing/random_tokens.h"

using namespace nvfp4mla;

namespace {

constexpr uint8_t kUntouched = 0xA5;  // fill byte of slots nobody wrote

using Tokens = nvfp4mla::testing::Bf16Tokens;
using nvfp4mla::testing::as_bf16_inputs;

struct Cache {
  std::vector<uint8_t> bytes;
  PagedCacheView view;
  Cache(const FormatConfig& cfg, int64_t pages, int64_t page_size)
      : bytes(static_cast<size_t>(pages * page_size * cfg.record_bytes()), kUntouched),
        view{bytes.data(), pages, page_size, cfg.record_bytes()} {}
};

std::vector<FormatConfig> all_formats() {
  return {
      FormatConfig::create({.cache_dtype = CacheDtype::bf16}),
      FormatConfig::create({.cache_dtype = CacheDtype::fp8_ds_mla}),
      FormatConfig::create({.rope = RopeEncoding::bf16}),
      FormatConfig::create({.rope = RopeEncoding::fp8}),
      FormatConfig::create({.rope = RopeEncoding::fp8, .scale_mode = ScaleMode::dynamic}),
      FormatConfig::create({.rope = RopeEncoding::bf16, .scale_mode = ScaleMode::static_calibrated, .layer_scale = 0.0037f}),
      FormatConfig::create({.rope = RopeEncoding::fp8, .scale_mode = ScaleMode::static_calibrated, .layer_scale = 0.0021f}),
  };
}

std::vector<uint8_t> expected_record(const FormatConfig& cfg, const Tokens& t, int64_t i) {
  std::vector<uint8_t> rec(static_cast<size_t>(cfg.record_bytes()));
  record::encode(cfg.spec(), &t.kv_c[i * kLatentDim], &t.k_pe[i * kRopeDim], cfg.layer_scale(), rec.data());
  return rec;
}

bool slot_untouched(const Cache& c, int64_t s) {
  const uint8_t* p = c.view.slot(s);
  return std::all_of(p, p + c.view.record_bytes, [](uint8_t b) { return b == kUntouched; });
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "no error";
}

}  // namespace

TEST(PagedCache, WritesThroughARandomPagePermutation) {
  const Tokens tokens = as_bf16_inputs(nvfp4mla::testing::random_tokens(40, 1, -6, 4, /*non_finite=*/true));
  for (const FormatConfig& cfg : all_formats()) {
    SCOPED_TRACE(cfg.describe());
    // 40 tokens laid out as a sequence over a shuffled block table of 8 pages of 16 slots.
    constexpr int64_t kPages = 8, kPageSize = 16;
    Cache cache(cfg, kPages, kPageSize);
    std::vector<int64_t> block_table(kPages);
    std::iota(block_table.begin(), block_table.end(), 0);
    std::shuffle(block_table.begin(), block_table.end(), std::mt19937(7));
    std::vector<int64_t> slots(tokens.count);
    for (int64_t i = 0; i < tokens.count; ++i) slots[i] = block_table[i / kPageSize] * kPageSize + i % kPageSize;

    write_paged_cache(cfg, TokenBatch<Bf16Bits>{tokens.kv_c.data(), tokens.k_pe.data(), tokens.count}, slots,
                      cache.view);
    std::vector<bool> written(kPages * kPageSize, false);
    for (int64_t i = 0; i < tokens.count; ++i) {
      written[slots[i]] = true;
      const auto want = expected_record(cfg, tokens, i);
      ASSERT_EQ(0, std::memcmp(cache.view.slot(slots[i]), want.data(), want.size())) << "token " << i;
    }
    for (int64_t s = 0; s < kPages * kPageSize; ++s)
      if (!written[s]) EXPECT_TRUE(slot_untouched(cache, s)) << "slot " << s;

    // Gather in a shuffled order equals record::decode of each slot.
    std::vector<int64_t> order = slots;
    std::shuffle(order.begin(), order.end(), std::mt19937(9));
    std::vector<float> kv(order.size() * kLatentDim), pe(order.size() * kRopeDim);
    gather_dequantize(cfg, cache.view, order, kv.data(), pe.data());
    std::vector<float> want_kv(kLatentDim), want_pe(kRopeDim);
    for (size_t i = 0; i < order.size(); ++i) {
      record::decode(cfg.spec(), cache.view.slot(order[i]), cfg.layer_scale(), want_kv.data(), want_pe.data());
      ASSERT_EQ(0, std::memcmp(&kv[i * kLatentDim], want_kv.data(), sizeof(float) * kLatentDim)) << i;
      ASSERT_EQ(0, std::memcmp(&pe[i * kRopeDim], want_pe.data(), sizeof(float) * kRopeDim)) << i;
    }
  }
}

TEST(PagedCache, NegativeSlotsAreSkipped) {
  const auto cfg = FormatConfig::create({.rope = RopeEncoding::fp8, .scale_mode = ScaleMode::dynamic});
  const Tokens tokens = as_bf16_inputs(nvfp4mla::testing::random_tokens(6, 2));
  Cache cache(cfg, 2, 4);
  const std::vector<int64_t> slots = {5, -1, 0, -7, 7, -1};
  write_paged_cache(cfg, TokenBatch<Bf16Bits>{tokens.kv_c.data(), tokens.k_pe.data(), tokens.count}, slots, cache.view);
  for (int64_t s : {1, 2, 3, 4, 6}) EXPECT_TRUE(slot_untouched(cache, s)) << s;
  for (int64_t i : {0, 2, 4}) {
    const auto want = expected_record(cfg, tokens, i);
    EXPECT_EQ(0, std::memcmp(cache.view.slot(slots[i]), want.data(), want.size())) << i;
  }
}

TEST(PagedCache, SlotBeyondCapacityIsAnErrorAndWritesNothing) {
  const auto cfg = FormatConfig::create({});
  const Tokens tokens = as_bf16_inputs(nvfp4mla::testing::random_tokens(3, 3));
  Cache cache(cfg, 2, 4);  // capacity 8
  const std::vector<uint8_t> before = cache.bytes;
  // The bad slot comes last: the valid ones before it must not have been written either.
  const std::vector<int64_t> slots = {0, 3, 8};
  const std::string msg = error_of([&] {
    write_paged_cache(cfg, TokenBatch<Bf16Bits>{tokens.kv_c.data(), tokens.k_pe.data(), tokens.count}, slots,
                      cache.view);
  });
  EXPECT_NE(msg.find("slot 8"), std::string::npos) << msg;
  EXPECT_NE(msg.find("capacity of 8"), std::string::npos) << msg;
  EXPECT_EQ(cache.bytes, before);
}

TEST(PagedCache, RejectsMismatchedInputs) {
  const auto cfg = FormatConfig::create({});
  const Tokens tokens = as_bf16_inputs(nvfp4mla::testing::random_tokens(2, 4));
  Cache cache(cfg, 1, 4);
  const TokenBatch<Bf16Bits> batch{tokens.kv_c.data(), tokens.k_pe.data(), tokens.count};
  const std::vector<int64_t> one_slot = {0};
  EXPECT_NE(error_of([&] { write_paged_cache(cfg, batch, one_slot, cache.view); }).find("2 tokens but 1 slot"),
            std::string::npos);
  // A cache laid out for another record width.
  const auto fp8 = FormatConfig::create({.cache_dtype = CacheDtype::fp8_ds_mla});
  const std::vector<int64_t> slots = {0, 1};
  EXPECT_NE(error_of([&] { write_paged_cache(fp8, batch, slots, cache.view); }).find("432-byte records"),
            std::string::npos);
  std::vector<float> kv(kLatentDim), pe(kRopeDim);
  for (int64_t bad : {int64_t{-1}, int64_t{4}}) {
    const std::vector<int64_t> s = {bad};
    const std::string msg = error_of([&] { gather_dequantize(cfg, cache.view, s, kv.data(), pe.data()); });
    EXPECT_NE(msg.find("slot " + std::to_string(bad)), std::string::npos) << msg;
    EXPECT_NE(msg.find("capacity of 4"), std::string::npos) << msg;
  }
}

TEST(PagedCache, EveryInputTypeMatchesTheRecordWriter) {
  // The same values given as BF16, FP16 and fp32 (all exactly representable in each).
  const auto cfg = FormatConfig::create({.rope = RopeEncoding::fp8, .scale_mode = ScaleMode::dynamic});
  std::vector<float> kv_f(kLatentDim), pe_f(kRopeDim);
  for (int j = 0; j < kLatentDim; ++j) kv_f[j] = static_cast<float>((j % 37) - 18) * 0.125f;
  for (int j = 0; j < kRopeDim; ++j) pe_f[j] = static_cast<float>(j - 32) * 0.25f;
  std::vector<Bf16Bits> kv_b(kLatentDim), pe_b(kRopeDim);
  std::vector<Fp16Bits> kv_h(kLatentDim), pe_h(kRopeDim);
  std::map<float, uint16_t> fp16_of;  // every finite FP16 value (+0 for zero)
  for (uint32_t h = 0x10000; h-- > 0;)
    if (std::isfinite(codec::fp16_decode(static_cast<uint16_t>(h)))) fp16_of[codec::fp16_decode(static_cast<uint16_t>(h))] = static_cast<uint16_t>(h);
  auto to_fp16 = [&](float x) { return Fp16Bits{fp16_of.at(x)}; };
  for (int j = 0; j < kLatentDim; ++j) kv_b[j] = {codec::bf16_encode_rn(kv_f[j])}, kv_h[j] = to_fp16(kv_f[j]);
  for (int j = 0; j < kRopeDim; ++j) pe_b[j] = {codec::bf16_encode_rn(pe_f[j])}, pe_h[j] = to_fp16(pe_f[j]);

  const std::vector<int64_t> slot = {1};
  Cache c_f(cfg, 1, 2), c_b(cfg, 1, 2), c_h(cfg, 1, 2);
  write_paged_cache(cfg, TokenBatch<float>{kv_f.data(), pe_f.data(), 1}, slot, c_f.view);
  write_paged_cache(cfg, TokenBatch<Bf16Bits>{kv_b.data(), pe_b.data(), 1}, slot, c_b.view);
  write_paged_cache(cfg, TokenBatch<Fp16Bits>{kv_h.data(), pe_h.data(), 1}, slot, c_h.view);
  std::vector<uint8_t> want(cfg.record_bytes());
  record::encode(cfg.spec(), kv_f.data(), pe_f.data(), 1.0f, want.data());
  EXPECT_EQ(0, std::memcmp(c_f.view.slot(1), want.data(), want.size()));
  EXPECT_EQ(c_b.bytes, c_f.bytes);
  EXPECT_EQ(c_h.bytes, c_f.bytes);
  EXPECT_TRUE(slot_untouched(c_f, 0));
}
