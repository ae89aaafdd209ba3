// Codec agreement with NVIDIA's host conversions (cuda_fp8.h / cuda_fp4.h / cuda_bf16.h):
// every BF16 bit pattern, every rounding tie and boundary, and 10 million random fp32 values
// (reported as skipped, with the reason, in a build configured without those headers).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "nvfp4mla/codec.h"

#if defined(NVFP4MLA_HAVE_NV_HOST_CONVERSIONS)
#include <cuda_bf16.h>
#include <cuda_fp4.h>
#include <cuda_fp8.h>
#endif

namespace nc = nvfp4mla::codec;

namespace {

#if defined(NVFP4MLA_HAVE_NV_HOST_CONVERSIONS)
uint8_t nv_e4m3(float x) { return __nv_cvt_float_to_fp8(x, __NV_SATFINITE, __NV_E4M3); }
uint8_t nv_e2m1(float x) { return __nv_cvt_float_to_fp4(x, __NV_E2M1, cudaRoundNearest); }
uint16_t nv_bf16(float x) {
  __nv_bfloat16 b = __float2bfloat16_rn(x);
  uint16_t u;
  std::memcpy(&u, &b, 2);
  return u;
}
#define NVFP4MLA_REQUIRE_NV_CONVERSIONS() static_cast<void>(0)
#else
// Without the toolkit's headers the agreement tests still exist and report themselves skipped;
// these are never reached (each test skips first).
[[noreturn]] uint8_t nv_e4m3(float) { std::abort(); }
[[noreturn]] uint8_t nv_e2m1(float) { std::abort(); }
[[noreturn]] uint16_t nv_bf16(float) { std::abort(); }
#define NVFP4MLA_REQUIRE_NV_CONVERSIONS()                                                                       \
  GTEST_SKIP() << "cuda_fp8.h / cuda_fp4.h / cuda_bf16.h were not found when the tests were configured: "     \
                  "install the CUDA toolkit (its headers suffice) and reconfigure to compare with NVIDIA's " \
                  "conversions"
#endif

// Check one input against all three NVIDIA conversions; count mismatches.
struct Agreement {
  uint64_t checked = 0, e4m3_bad = 0, e2m1_bad = 0, bf16_bad = 0;
  float first_bad = 0;
  void check(float x) {
    ++checked;
    bool bad = false;
    if (nc::e4m3_encode(x) != nv_e4m3(x)) { ++e4m3_bad; bad = true; }
    if (nc::e2m1_encode(x) != nv_e2m1(x)) { ++e2m1_bad; bad = true; }
    if (nc::bf16_encode_rn(x) != nv_bf16(x)) { ++bf16_bad; bad = true; }
    if (bad && first_bad == 0) first_bad = x;
  }
  void expect_clean() const {
    EXPECT_EQ(e4m3_bad, 0u) << "first mismatch at " << first_bad;
    EXPECT_EQ(e2m1_bad, 0u) << "first mismatch at " << first_bad;
    EXPECT_EQ(bf16_bad, 0u) << "first mismatch at " << first_bad;
  }
};

TEST(CodecVsNvidia, AllBf16BitPatterns) {
  NVFP4MLA_REQUIRE_NV_CONVERSIONS();
  Agreement a;
  for (uint32_t b = 0; b < 65536; ++b) a.check(nc::bf16_decode(static_cast<uint16_t>(b)));
  EXPECT_EQ(a.checked, 65536u);
  a.expect_clean();
}

TEST(CodecVsNvidia, AllRoundingTiesAndNeighbours) {
  NVFP4MLA_REQUIRE_NV_CONVERSIONS();
  // Every midpoint between adjacent representable E4M3 and E2M1 magnitudes (and the
  // saturation / underflow thresholds), with the fp32 neighbours on either side, both signs.
  Agreement a;
  auto probe = [&](float m) {
    for (float s : {1.0f, -1.0f}) {
      const float x = s * m;
      a.check(x);
      a.check(std::nextafter(x, std::numeric_limits<float>::infinity()));
      a.check(std::nextafter(x, -std::numeric_limits<float>::infinity()));
    }
  };
  std::vector<float> e4m3_values, e2m1_values;
  for (int b = 0; b < 0x7F; ++b) e4m3_values.push_back(nc::e4m3_decode(static_cast<uint8_t>(b)));
  for (int b = 0; b < 8; ++b) e2m1_values.push_back(nc::e2m1_decode(static_cast<uint8_t>(b)));
  for (auto* v : {&e4m3_values, &e2m1_values}) {
    for (size_t i = 0; i + 1 < v->size(); ++i) probe(((*v)[i] + (*v)[i + 1]) / 2);  // exact midpoints
    for (float x : *v) probe(x);
  }
  probe(464.0f);          // E4M3 saturation threshold (max + half ulp)
  probe(0x1p-10f);        // E4M3 half of the smallest subnormal
  probe(0.25f);           // E2M1 underflow threshold
  probe(6.0f); probe(7.0f);
  for (float x : {0.0f, std::numeric_limits<float>::denorm_min(), std::numeric_limits<float>::min(),
                  std::numeric_limits<float>::max(), std::numeric_limits<float>::infinity()})
    probe(x);
  EXPECT_GT(a.checked, 1000u);
  a.expect_clean();
}

TEST(CodecVsNvidia, TenMillionRandomFloats) {
  NVFP4MLA_REQUIRE_NV_CONVERSIONS();
  // Half the draws are uniform bit patterns (every exponent), half are concentrated on the
  // ranges where the formats round (|x| in [2^-12, 2^10]).
  std::mt19937_64 rng(20261129);
  Agreement a;
  std::uniform_real_distribution<float> log_mag(-12.0f, 10.0f);
  for (int i = 0; i < 5'000'000; ++i) {
    a.check(nc::bits_float(static_cast<uint32_t>(rng())));
    const float m = std::exp2(log_mag(rng));
    a.check((rng() & 1) ? m : -m);
  }
  EXPECT_EQ(a.checked, 10'000'000u);
  a.expect_clean();
}
}  // namespace

TEST(Codec, E4M3DecodeIsExactIncludingSubnormals) {
  EXPECT_EQ(nc::e4m3_decode(0x01), 0x1p-9f);  // smallest subnormal, not 0.0088
  EXPECT_EQ(nc::e4m3_decode(0x07), 7 * 0x1p-9f);
  EXPECT_EQ(nc::e4m3_decode(0x08), 0x1p-6f);  // smallest normal
  EXPECT_EQ(nc::e4m3_decode(0x7E), 448.0f);
  EXPECT_EQ(nc::e4m3_decode(0x38), 1.0f);
  EXPECT_EQ(nc::e4m3_decode(0xB8), -1.0f);
  EXPECT_TRUE(std::isnan(nc::e4m3_decode(0x7F)));
  EXPECT_TRUE(std::isnan(nc::e4m3_decode(0xFF)));
  EXPECT_TRUE(std::signbit(nc::e4m3_decode(0x80)));
  for (int b = 0; b < 256; ++b) {
    if ((b & 0x7F) == 0x7F) continue;
    EXPECT_EQ(nc::e4m3_encode(nc::e4m3_decode(static_cast<uint8_t>(b))), b) << b;  // round trip
  }
}

TEST(Codec, E2M1DecodeTable) {
  const float expect[8] = {0, 0.5f, 1, 1.5f, 2, 3, 4, 6};
  for (int n = 0; n < 8; ++n) {
    EXPECT_EQ(nc::e2m1_decode(static_cast<uint8_t>(n)), expect[n]);
    EXPECT_EQ(nc::e2m1_decode(static_cast<uint8_t>(n | 8)), -expect[n]);
    EXPECT_EQ(nc::e2m1_encode(expect[n]), n);
  }
  // Thresholds from FORMATS.md.
  EXPECT_EQ(nc::e2m1_encode(0.25f), 0);
  EXPECT_EQ(nc::e2m1_encode(0.2500001f), 1);
  EXPECT_EQ(nc::e2m1_encode(0.75f), 2);  // tie -> even (1.0)
  EXPECT_EQ(nc::e2m1_encode(1.25f), 2);
  EXPECT_EQ(nc::e2m1_encode(1.75f), 4);
  EXPECT_EQ(nc::e2m1_encode(2.5f), 4);
  EXPECT_EQ(nc::e2m1_encode(3.5f), 6);
  EXPECT_EQ(nc::e2m1_encode(5.0f), 6);
  EXPECT_EQ(nc::e2m1_encode(5.0001f), 7);
  EXPECT_EQ(nc::e2m1_encode(-0.1f), 8);  // negative zero keeps its sign
  EXPECT_EQ(nc::e2m1_encode(1e30f), 7);
}

// The table-free E2M1 -> BF16 unpacking of the 16-head decode kernel: every nibble at every
// position, among random neighbours, lands in its pair as e2m1 * 2^-126, and its product with
// d * kE2m1PairScale is e2m1 * d * 2^-kE2m1PairShift exactly and exactly a BF16 value, for every
// finite E4M3 group scale d.
TEST(Codec, E2M1PairsWithoutTablesAreExact) {
  std::mt19937 rng(7);
  for (int pos = 0; pos < 8; ++pos)
    for (uint32_t v = 0; v < 16; ++v)
      for (int trial = 0; trial < 16; ++trial) {
        const uint32_t nib = (rng() & ~(0xFu << (4 * pos))) | (v << (4 * pos));
        uint32_t pair[4];
        nc::e2m1x8_to_bf16_pairs(nib, pair);
        const uint16_t half = static_cast<uint16_t>(pair[pos % 4] >> (16 * (pos / 4)));
        const float e2m1 = nc::e2m1_decode(static_cast<uint8_t>(v));
        ASSERT_EQ(nc::bf16_decode(half), e2m1 * 0x1p-126f) << "nibble " << v << " at " << pos;
        for (int b = 0; b < 256; ++b) {
          const float d = nc::e4m3_decode(static_cast<uint8_t>(b));
          if (!std::isfinite(d) || d < 0) continue;
          const float scale = d * nc::kE2m1PairScale;
          ASSERT_EQ(nc::bf16_decode(nc::bf16_encode_rn(scale)), scale);  // the scale is a BF16 value
          const float product = nc::bf16_decode(half) * scale;
          ASSERT_EQ(product, e2m1 * d * std::ldexp(1.0f, -nc::kE2m1PairShift));
          ASSERT_EQ(nc::bf16_decode(nc::bf16_encode_rn(product)), product);  // exact in BF16
        }
      }
}

TEST(Codec, Bf16AndFp16) {
  EXPECT_EQ(nc::bf16_encode_satfinite(std::numeric_limits<float>::infinity()), 0x7F7F);
  EXPECT_EQ(nc::bf16_encode_satfinite(-std::numeric_limits<float>::max()), 0xFF7F);
  EXPECT_EQ(nc::bf16_encode_rn(std::numeric_limits<float>::max()), 0x7F80);
  EXPECT_EQ(nc::bf16_encode_satfinite(1.0f), 0x3F80);
  EXPECT_EQ(nc::fp16_decode(0x3C00), 1.0f);
  EXPECT_EQ(nc::fp16_decode(0x0001), 0x1p-24f);
  EXPECT_EQ(nc::fp16_decode(0xFBFF), -65504.0f);
  EXPECT_TRUE(std::isinf(nc::fp16_decode(0x7C00)));
}

TEST(CodecE2M1, RoundingBoundsAreTheMidpointsWithTiesToEven) {
  for (int k = 0; k < 7; ++k) {
    const float lo = nc::e2m1_decode(static_cast<uint8_t>(k)), hi = nc::e2m1_decode(static_cast<uint8_t>(k + 1));
    const float b = nc::e2m1_rounding_bound(k);
    EXPECT_EQ(b, 0.5f * (lo + hi)) << k;
    // On the bound: the even code (k odd -> k + 1); just above it: k + 1; just below: k.
    EXPECT_EQ(nc::e2m1_encode(b), (k & 1) ? k + 1 : k) << k;
    EXPECT_EQ(nc::e2m1_encode(std::nextafter(b, 10.0f)), k + 1) << k;
    EXPECT_EQ(nc::e2m1_encode(std::nextafter(b, 0.0f)), k) << k;
  }
}
