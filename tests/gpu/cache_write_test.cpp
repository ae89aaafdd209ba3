// GPU cache writer == CPU writer, bit for bit; gather/scatter; slot rules and error counter.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <numeric>
#include <random>
#include <stdexcept>
#include <vector>

#include "gpu/gpu_support.h"
#include "nvfp4mla/codec.h"
#include "nvfp4mla/cuda/cache_write.h"
#include "nvfp4mla/error.h"
#include "support/record_specs.h"
#include "nvfp4mla/record.h"
#include "nvfp4mla/testing/random_tokens.h"

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

// Writes `kv`/`pe` (n tokens) on the GPU and compares every slot of the cache with the CPU
// writer's records (poison where nothing is written) and the error counter. `fused_stride` > 0
// passes the inputs as slices of one row per token (latent, RoPE, poisoned padding; vLLM's
// [kv_c | k_pe] projection output), each with that row stride.
template <class In>
void check_writer(const RecordSpec& spec, const std::vector<In>& kv, const std::vector<In>& pe, float layer_scale,
                  uint64_t seed, int64_t fused_stride = 0) {
  SCOPED_TRACE(nvfp4mla::testing::spec_name(spec) + " layer scale " + std::to_string(layer_scale) +
               " fused row stride " + std::to_string(fused_stride));
  const int64_t n = static_cast<int64_t>(pe.size()) / kRopeDim, capacity = n + 1096;
  std::mt19937_64 rng(seed + 1);
  // Slot mapping: a random permutation of slots, with padded (negative) and out-of-range entries.
  std::vector<int64_t> perm(capacity);
  std::iota(perm.begin(), perm.end(), 0);
  std::shuffle(perm.begin(), perm.end(), rng);
  std::vector<int64_t> slots(n);
  int64_t out_of_range = 0;
  const int64_t kPadded[] = {-1, -2, std::numeric_limits<int64_t>::min()};
  const int64_t kOutOfRange[] = {capacity, capacity + 1000, std::numeric_limits<int64_t>::max()};
  for (int64_t i = 0; i < n; ++i) {
    slots[i] = perm[i];
    if (i % 37 == 3) slots[i] = kPadded[i % 3];
    if (i % 53 == 7) { slots[i] = kOutOfRange[i % 3]; ++out_of_range; }
  }
  const int rb = spec.record_bytes();
  // Expected cache: poison everywhere, CPU records in the written slots.
  std::vector<uint8_t> expect(capacity * rb, 0xA5);
  for (int64_t i = 0; i < n; ++i)
    if (slots[i] >= 0 && slots[i] < capacity)
      record::encode(spec, &kv[i * kLatentDim], &pe[i * kRopeDim], layer_scale, &expect[slots[i] * rb]);

  std::vector<In> fused;
  if (fused_stride > 0) {
    fused.assign(n * fused_stride, In{});
    std::memset(fused.data(), 0xFF, fused.size() * sizeof(In));  // NaN padding: must not be read
    for (int64_t i = 0; i < n; ++i) {
      std::copy_n(&kv[i * kLatentDim], kLatentDim, &fused[i * fused_stride]);
      std::copy_n(&pe[i * kRopeDim], kRopeDim, &fused[i * fused_stride + kLatentDim]);
    }
  }
  DeviceBuffer<In> d_kv(fused_stride > 0 ? fused : kv), d_pe(pe);
  DeviceBuffer<int64_t> d_slots(slots);
  DeviceBuffer<uint8_t> d_cache(capacity * rb);
  d_cache.fill_bytes(0xA5);
  DeviceBuffer<unsigned long long> d_err(std::vector<unsigned long long>{0});
  cuda::CacheWriteArgs a;
  a.kv_c = d_kv.get();
  a.k_pe = d_pe.get();
  if (fused_stride > 0) {
    a.k_pe = d_kv.get() + kLatentDim;
    a.kv_c_stride = a.k_pe_stride = fused_stride;
  }
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

// 3001 tokens: BF16 warps take 4 or 8 consecutive tokens, so the last warp has a single one.
template <class In>
void check_writer(const RecordSpec& spec, uint64_t seed, int64_t fused_stride = 0) {
  const auto tokens = nvfp4mla::testing::random_tokens(3001, seed, -6, 4, /*non_finite=*/true);
  std::mt19937_64 rng(seed + 1);
  const auto kv = as_input<In>(tokens.kv_c, rng);
  const auto pe = as_input<In>(tokens.k_pe, rng);
  check_writer(spec, kv, pe, 0.0123f, seed, fused_stride);
}

// Adversarial BF16 tokens: each 16-value latent group, and each token's RoPE, of one kind:
// zeros of both signs, E2M1 rounding ties (t d exactly, and one BF16 step either side, with the
// group maximum 6 d fixing the scale d), E4M3 ties of the group scale (maximum 6 m, m an E4M3
// midpoint), BF16 subnormals, NaN/Inf among finite values, saturating maxima near the BF16
// limit, a single nonzero value, and random values over many decades.
nvfp4mla::testing::TokenSet adversarial_tokens(int64_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  auto bf16 = [](float v) { return codec::bf16_encode_rn(v); };
  auto sign = [&](uint16_t b) { return static_cast<uint16_t>(b | ((rng() & 1) ? 0x8000u : 0u)); };
  auto e4m3_value = [&]() { return codec::e4m3_decode(static_cast<uint8_t>(1 + rng() % 0x7E)); };
  auto fill = [&](uint16_t* v, int count) {
    const int kind = static_cast<int>(rng() % 8);
    const float scale = std::ldexp(1.0f, static_cast<int>(rng() % 40) - 20);
    for (int i = 0; i < count; ++i) {
      switch (kind) {
        case 0: v[i] = (rng() & 1) ? 0x8000u : 0u; break;
        case 1: {  // E2M1 ties against d = an E4M3 value (times a power of two)
          const float d = e4m3_value() * scale;
          const uint16_t tie = bf16(codec::e2m1_rounding_bound(static_cast<int>(rng() % 7)) * d);
          const int step = static_cast<int>(rng() % 3) - 1;  // one BF16 step below, on, above
          v[i] = sign(static_cast<uint16_t>(i == 0 ? bf16(6.0f * d) : tie + step));
          break;
        }
        case 2: {  // group maximum at 6 x an E4M3 midpoint
          const uint8_t b = static_cast<uint8_t>(rng() % 0x7E);
          const float mid = 0.5f * (codec::e4m3_decode(b) + codec::e4m3_decode(static_cast<uint8_t>(b + 1)));
          v[i] = sign(i == 0 ? bf16(6.0f * mid * scale) : bf16(std::ldexp(float(rng() % 1000) / 1000.0f, -2) * mid * scale));
          break;
        }
        case 3: v[i] = sign(static_cast<uint16_t>(rng() % 0x80u + ((rng() % 4) == 0 ? 0x80u : 0u))); break;  // subnormal
        case 4: {
          const uint16_t special[] = {0x7F80u, 0xFF80u, 0x7FC0u, 0xFFC1u, 0x7F81u};
          v[i] = (rng() % 4) == 0 ? special[rng() % 5] : sign(bf16(float(rng() % 1000) * scale));
          break;
        }
        case 5: v[i] = sign(static_cast<uint16_t>(0x7F7Fu - rng() % 0x200u)); break;  // near the BF16 maximum
        case 6: v[i] = i == 3 ? sign(bf16(float(1 + rng() % 200) * scale)) : 0u; break;
        default: v[i] = sign(bf16(float(rng() % 100000) * std::ldexp(1.0f, static_cast<int>(rng() % 60) - 40))); break;
      }
    }
  };
  nvfp4mla::testing::TokenSet t;
  t.n = n;
  t.kv_c.resize(n * kLatentDim);
  t.k_pe.resize(n * kRopeDim);
  for (int64_t i = 0; i < n; ++i) {
    for (int g = 0; g < kLatentDim / 16; ++g) fill(&t.kv_c[i * kLatentDim + 16 * g], 16);
    fill(&t.k_pe[i * kRopeDim], kRopeDim);
  }
  return t;
}

// Dynamic-mode ties: each token's largest value m = 2688 2^k makes the token scale s_t = m C2688
// exactly 2^k (checked), so y = x / s_t stays exact and the E2M1 ties (t d 2^k, and one BF16
// step either side, against each group's maximum 6 d 2^k) and E4M3 group scales survive into
// the packed dynamic path. (The random and adversarial tokens above, with s_t not a power of two,
// never reach an exact tie there.)
nvfp4mla::testing::TokenSet dynamic_tie_tokens(int64_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  auto bf16 = [](float v) { return codec::bf16_encode_rn(v); };
  auto sign = [&](uint16_t b) { return static_cast<uint16_t>(b | ((rng() & 1) ? 0x8000u : 0u)); };
  nvfp4mla::testing::TokenSet t;
  t.n = n;
  t.kv_c.resize(n * kLatentDim);
  t.k_pe.resize(n * kRopeDim);
  for (int64_t i = 0; i < n; ++i) {
    const int k = static_cast<int>(rng() % 15) - 10;  // FP16 inputs hold 2688 2^4
    const float m = std::ldexp(2688.0f, k), s = std::ldexp(1.0f, k);
    if (record::nvfp4_dynamic_scale(m) != s) throw std::logic_error("the dynamic scale of 2688 2^k is not 2^k");
    for (int g = 0; g < kLatentDim / 16; ++g) {
      // Group 0 holds m itself (d = 448 = 2688 / 6); the others an E4M3 d up to 448.
      const float d = g == 0 ? 448.0f : codec::e4m3_decode(static_cast<uint8_t>(1 + rng() % 0x7D));
      uint16_t* v = &t.kv_c[i * kLatentDim + 16 * g];
      for (int j = 0; j < 16; ++j) {
        const uint16_t tie = bf16(codec::e2m1_rounding_bound(static_cast<int>(rng() % 7)) * d * s);
        const int step = static_cast<int>(rng() % 3) - 1;
        v[j] = sign(j == 0 ? bf16(6.0f * d * s) : static_cast<uint16_t>(tie + step));
      }
    }
    for (int j = 0; j < kRopeDim; ++j) t.k_pe[i * kRopeDim + j] = sign(bf16(float(rng() % 1000) * s));
  }
  return t;
}

// The same values as FP16 (rounded; out of range to +/-Inf) and exactly as fp32.
template <class In>
std::vector<In> exact_input(const std::vector<uint16_t>& b);
template <>
std::vector<Bf16Bits> exact_input(const std::vector<uint16_t>& b) {
  std::mt19937_64 unused;
  return as_input<Bf16Bits>(b, unused);
}
template <>
std::vector<float> exact_input(const std::vector<uint16_t>& b) {
  std::vector<float> v(b.size());
  for (size_t i = 0; i < b.size(); ++i) v[i] = codec::bf16_decode(b[i]);
  return v;
}
template <>
std::vector<Fp16Bits> exact_input(const std::vector<uint16_t>& b) {
  std::vector<Fp16Bits> v(b.size());
  for (size_t i = 0; i < b.size(); ++i) {
    const _Float16 h = static_cast<_Float16>(codec::bf16_decode(b[i]));
    std::memcpy(&v[i].bits, &h, 2);
  }
  return v;
}

// `n` not a multiple of 4 (8 for 368-byte records) leaves the last BF16 warp a partial set of
// tokens (2 or 3 here).
template <class In>
void check_adversarial(uint64_t seed, int64_t n) {
  const auto tokens = adversarial_tokens(n, seed);
  const auto kv = exact_input<In>(tokens.kv_c);
  const auto pe = exact_input<In>(tokens.k_pe);
  // Static scales: a calibrated-looking one, a power of two (exact ties in y = x / s too), and
  // ones outside the fast range (the recipe's divisions).
  for (float layer_scale : {0.0123f, 0.25f, 1e-30f, 1e30f})
    for (const auto& spec : kAllSpecs) {
      if (layer_scale != 0.0123f && spec.scale_mode != ScaleMode::static_calibrated) continue;
      check_writer(spec, kv, pe, layer_scale, seed);
    }
  const auto ties = dynamic_tie_tokens(n, seed + 7);
  for (const auto& spec : kAllSpecs)
    if (spec.scale_mode == ScaleMode::dynamic) check_writer(spec, exact_input<In>(ties.kv_c), exact_input<In>(ties.k_pe), 1.0f, seed);
}

}  // namespace

TEST(GpuCacheWriter, BitIdenticalToCpuWriterBf16Input) {
  NVFP4MLA_REQUIRE_GPU();
  uint64_t seed = 100;
  for (const auto& spec : kAllSpecs) check_writer<Bf16Bits>(spec, seed++);
}

// Latent and RoPE as slices of one row per token (row strides other than 512 and 64).
TEST(GpuCacheWriter, BitIdenticalToCpuWriterOnFusedRows) {
  NVFP4MLA_REQUIRE_GPU();
  uint64_t seed = 150;
  for (const auto& spec : kAllSpecs) {
    check_writer<Bf16Bits>(spec, seed++, kLatentDim + kRopeDim);
    check_writer<Bf16Bits>(spec, seed++, 640);
    check_writer<float>(spec, seed++, 640);
  }
}

TEST(GpuCacheWriter, BitIdenticalToCpuWriterFp16AndF32Input) {
  NVFP4MLA_REQUIRE_GPU();
  uint64_t seed = 200;
  for (const auto& spec : kAllSpecs) {
    check_writer<Fp16Bits>(spec, seed++);
    check_writer<float>(spec, seed++);
  }
}

// Ties, zeros, subnormals, non-finite values and saturation in every format, scale mode and
// input type (dynamic mode's ties from tokens whose scale is a power of two).
TEST(GpuCacheWriter, BitIdenticalToCpuWriterOnAdversarialInputs) {
  NVFP4MLA_REQUIRE_GPU();
  check_adversarial<Bf16Bits>(300, 2003);
  check_adversarial<Bf16Bits>(303, 1002);
  check_adversarial<Fp16Bits>(301, 2003);
  check_adversarial<float>(302, 2003);
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
  // Not a record format (dynamic scales need the 368-byte record): an error, nothing written.
  a.kv_c_stride = kLatentDim;
  cache.fill_bytes(0xA5);
  const RecordSpec dynamic_bf16_rope{CacheDtype::nvfp4_ds_mla, RopeEncoding::bf16, ScaleMode::dynamic};
  EXPECT_THROW(cuda::write_cache(dynamic_bf16_rope, a, nullptr), Error);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  for (uint8_t b : cache.download()) ASSERT_EQ(b, 0xA5);
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
  // Scatter the gathered records into a poisoned cache, the entries without a valid slot
  // poisoned differently: every valid slot gets its bytes back, and no other slot is written.
  std::vector<uint8_t> source = got;
  std::vector<bool> written(capacity, false);
  for (int64_t i = 0; i < n; ++i) {
    const bool valid = slots[i] >= 0 && slots[i] < capacity;
    if (valid) written[slots[i]] = true;
    else std::fill(&source[i * rb], &source[(i + 1) * rb], uint8_t{0x5A});
  }
  d_dst.upload(source);
  DeviceBuffer<uint8_t> d_cache2(capacity * rb);
  d_cache2.fill_bytes(0xA5);
  cuda::scatter_records(rb, d_dst.get(), d_slots.get(), n, d_cache2.get(), capacity, d_err.get(), nullptr);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  const auto back = d_cache2.download();
  for (int64_t s = 0; s < capacity; ++s) {
    if (written[s]) {
      ASSERT_EQ(std::memcmp(&back[s * rb], &cache[s * rb], rb), 0) << "slot " << s;
    } else {
      for (int b = 0; b < rb; ++b) ASSERT_EQ(back[s * rb + b], 0xA5) << "slot " << s << " was written";
    }
  }
  EXPECT_EQ(d_err.download()[0], static_cast<unsigned long long>(2 * bad));
}
