// Randomized properties of the record formats over tokens of every magnitude (1e-6 .. 1e4,
// heavy-tailed channels): agreement with the independent reference model, per-element
// reconstruction error bounds derived from the formats, determinism, the dynamic-scale
// guarantee (and its one exception), static == dynamic at the calibrated magnitude, the
// fp8_ds_mla tile-scale rules, and input-type independence.
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "nvfp4mla/record.h"
#include "unit/record_reference.h"
#include "unit/record_test_configs.h"

namespace {

using namespace nvfp4mla;
using namespace nvfp4mla_test;
using namespace nvfp4mla_test::configs;

// ---- token generator -------------------------------------------------------------------------

// Tokens shaped like MLA latents: a per-channel profile (log-normal, with a few outlier
// channels 30x larger) times Student-t(3) noise, scaled to a token magnitude drawn
// log-uniformly from 1e-6 .. 1e4. RoPE gets its own magnitude. Some tokens have exact zeros.
class TokenSource {
 public:
  explicit TokenSource(uint64_t seed) : rng_(seed), channel_(kLatentDim) {
    std::lognormal_distribution<double> lognormal(0.0, 1.0);
    for (double& w : channel_) w = lognormal(rng_);
    for (int k = 0; k < 8; ++k) channel_[rng_() % kLatentDim] *= 30.0;
  }
  double magnitude(double lo_log10 = -6, double hi_log10 = 4) {
    return std::pow(10.0, std::uniform_real_distribution<double>(lo_log10, hi_log10)(rng_));
  }
  Token next() { return next(magnitude(), magnitude()); }
  Token next(double kv_magnitude, double pe_magnitude) {
    Token t;
    std::student_t_distribution<double> heavy(3.0);
    const bool sparse = rng_() % 8 == 0;
    for (int j = 0; j < kLatentDim; ++j)
      t.kv[j] = (sparse && rng_() % 3 == 0) ? 0.0f : static_cast<float>(kv_magnitude * channel_[j] * heavy(rng_) / 8);
    for (int i = 0; i < kRopeDim; ++i) t.pe[i] = static_cast<float>(pe_magnitude * heavy(rng_));
    return t;
  }
  // Values on a coarse lattice, with group maxima at 6 * 2^e, so E2M1 ties (0.25, 0.75, ..., 5)
  // and E4M3 ties are frequent.
  Token lattice() {
    Token t;
    for (int g = 0; g < 32; ++g) {
      const int e = static_cast<int>(rng_() % 40) - 30;
      for (int i = 0; i < 16; ++i)
        t.kv[16 * g + i] = std::ldexp(static_cast<float>(static_cast<int>(rng_() % 49) - 24) * 0.25f, e);
      if (rng_() % 2) t.kv[16 * g + rng_() % 16] = std::ldexp(6.0f, e);
    }
    for (int i = 0; i < kRopeDim; ++i)
      t.pe[i] = std::ldexp(static_cast<float>(static_cast<int>(rng_() % 33) - 16) * 0.0625f, static_cast<int>(rng_() % 20) - 10);
    return t;
  }
  std::mt19937_64& rng() { return rng_; }

 private:
  std::mt19937_64 rng_;
  std::vector<double> channel_;
};

float latent_amax(const Token& t) { return ref::max_abs(t.kv.data(), kLatentDim); }

// ---- agreement with the reference model ------------------------------------------------------

TEST(RecordProperties, EveryFormatMatchesTheReferenceModel) {
  TokenSource src(1);
  int checked = 0;
  for (int n = 0; n < 160; ++n) {
    const Token t = n % 4 == 3 ? src.lattice() : src.next();
    // Static scale: sometimes calibrated at this token's magnitude, sometimes arbitrary.
    const float s_l = n % 2 ? ref::mul32(latent_amax(t), ref::c2688()) : static_cast<float>(src.magnitude(-8, 2));
    for (const Config* c : kAll) {
      const auto rec = encode(*c, t, s_l);
      const auto want = ref::encode(c->kind, c->outer, t.kv.data(), t.pe.data(), s_l);
      ASSERT_EQ(rec, want) << c->name << " token " << n;
      const Token got = decode(*c, rec, s_l);
      const auto exp = ref::decode(c->kind, c->outer, want.data(), s_l);
      for (int j = 0; j < kLatentDim; ++j) ASSERT_EQ(bits(got.kv[j]), bits(exp.kv[j])) << c->name << " kv " << j;
      for (int i = 0; i < kRopeDim; ++i) ASSERT_EQ(bits(got.pe[i]), bits(exp.pe[i])) << c->name << " pe " << i;
      ++checked;
    }
  }
  EXPECT_EQ(checked, 160 * 7);
}

// ---- reconstruction error bounds -------------------------------------------------------------

// Half the E2M1 step at |z| (z = y / d): the most that rounding to the E2M1 grid can move a
// value, or the distance to 6 once |z| is past the grid (saturation).
double e2m1_half_step(double z) {
  if (z <= 2) return 0.25;
  if (z <= 4) return 0.5;
  if (z <= 6) return 1.0;
  return z - 6;
}
// The bound must hold for z a few ulps either way (z itself is computed in fp32).
double e2m1_error_bound(double z) {
  const double a = std::fabs(z);
  return std::max({e2m1_half_step(a * (1 - 0x1p-20)), e2m1_half_step(a), e2m1_half_step(a * (1 + 0x1p-20))});
}
// Half the E4M3 step at |v|: 2^-10 among subnormals, 2^(floor(log2 v) - 4) among normals.
double e4m3_half_step(double v) {
  v = std::fabs(v);
  if (v < 0x1p-6) return 0x1p-10;
  return std::ldexp(1.0, static_cast<int>(std::floor(std::log2(v))) - 4);
}

// NVFP4 latent, any outer scale s: with d the group's decoded E4M3 scale and z = x / (s d),
//   |x - x^| <= s d * halfstep_E2M1(|z|) (+ fp32 rounding of y, z and x^),
// and a group whose scale byte is 0 holds only values |x| <= s * 6 * 2^-10.
void expect_nvfp4_latent_bound(const Config& c, const Token& t, const Token& got, float s, const std::string& what) {
  for (int g = 0; g < 32; ++g) {
    float y[16];
    for (int i = 0; i < 16; ++i) {
      const float x = ref::clean(t.kv[16 * g + i]);
      y[i] = c.outer == ref::Outer::unit ? x : (s == 0 ? 0.0f : ref::div32(x, s));
    }
    float a = 0;
    for (float v : y) a = std::max(a, std::fabs(v));
    const double d = ref::e4m3_value(ref::e4m3(ref::div32(a, 6.0f)));
    for (int i = 0; i < 16; ++i) {
      const int j = 16 * g + i;
      const double x = ref::clean(t.kv[j]), xh = got.kv[j];
      const double err = std::fabs(x - xh);
      if (d == 0) {
        ASSERT_EQ(xh, 0.0) << what << " j=" << j;
        ASSERT_LE(std::fabs(x), s * 6 * 0x1p-10 * (1 + 0x1p-20) + 0x1p-149) << what << " j=" << j;
        continue;
      }
      const double z = x / s / d;
      const double bound = s * d * (e2m1_error_bound(z) + std::fabs(z) * 0x1p-21) + std::fabs(xh) * 0x1p-23 + 0x1p-149;
      ASSERT_LE(err, bound) << what << " j=" << j << " x=" << x << " x^=" << xh << " d=" << d << " s=" << s;
    }
  }
}

// fp8_ds_mla latent: x / p and e4m3 * p are exact (p is a power of two and never saturates),
// so |x - x^| <= p * halfstep_E4M3(|x| / p): relative 2^-4 for normal E4M3 values.
void expect_fp8_latent_bound(const Token& t, const Token& got, const std::string& what) {
  for (int tile = 0; tile < 4; ++tile) {
    const double p = ref::fp8_tile_scale(ref::max_abs(t.kv.data() + 128 * tile, 128));
    for (int i = 0; i < 128; ++i) {
      const int j = 128 * tile + i;
      const double x = ref::clean(t.kv[j]), err = std::fabs(x - got.kv[j]);
      ASSERT_LE(err, p * e4m3_half_step(x / p)) << what << " j=" << j << " x=" << x;
      if (std::fabs(x) / p >= 0x1p-6) {
        ASSERT_LE(err, std::fabs(x) * 0x1p-4) << what << " j=" << j;
      }
    }
  }
}

// RoPE: raw BF16 is within half a BF16 step (relative 2^-8; 2^-134 among BF16 subnormals);
// FP8 RoPE (368) is within rs * halfstep_E4M3(|r| / rs) plus fp32 rounding.
void expect_rope_bound(const Config& c, const Token& t, const Token& got, const std::string& what) {
  const double rs = ref::mul32(ref::max_abs(t.pe.data(), kRopeDim), ref::c448());
  for (int i = 0; i < kRopeDim; ++i) {
    const double r = ref::clean(t.pe[i]), err = std::fabs(r - got.pe[i]);
    if (c.kind == ref::Kind::nvfp4_368) {
      if (rs == 0) {
        ASSERT_EQ(got.pe[i], 0.0f) << what;
        continue;
      }
      const double bound = rs * e4m3_half_step(r / rs) * (1 + 0x1p-20) + std::fabs(got.pe[i]) * 0x1p-23 + 0x1p-149;
      ASSERT_LE(err, bound) << what << " rope " << i << " r=" << r;
    } else {
      const double half_step = r == 0 ? 0 : std::max(std::ldexp(1.0, static_cast<int>(std::floor(std::log2(std::fabs(r)))) - 8), 0x1p-134);
      ASSERT_LE(err, half_step) << what << " rope " << i << " r=" << r;
    }
  }
}

TEST(RecordProperties, ReconstructionErrorBounds) {
  TokenSource src(2);
  for (int n = 0; n < 300; ++n) {
    const Token t = n % 5 == 4 ? src.lattice() : src.next();
    const float amax = latent_amax(t);
    const float s_l = n % 2 ? ref::mul32(amax, ref::c2688()) : static_cast<float>(src.magnitude(-8, 2));
    for (const Config* c : kAll) {
      const std::string what = std::string(c->name) + " token " + std::to_string(n);
      const auto rec = encode(*c, t, s_l);
      const Token got = decode(*c, rec, s_l);
      if (c->kind == ref::Kind::bf16_1152) {
        for (int j = 0; j < kLatentDim; ++j)
          ASSERT_EQ(bits(got.kv[j]), bits(ref::bf16_value(ref::bf16(t.kv[j], false)))) << what;
      } else if (c->kind == ref::Kind::fp8_656) {
        expect_fp8_latent_bound(t, got, what);
      } else {
        const float s = c->outer == ref::Outer::unit ? 1.0f
                        : c->outer == ref::Outer::layer ? s_l
                                                        : ref::mul32(amax, ref::c2688());
        expect_nvfp4_latent_bound(*c, t, got, s, what);
      }
      expect_rope_bound(*c, t, got, what);
    }
  }
}

TEST(RecordProperties, DynamicModeRelativeErrorIsBoundedAtEveryMagnitude) {
  // With s_t = amax * C2688 the group holding the maximum has scale 448 and |z| <= 6, so its
  // error is at most s_t * 448 = amax / 6; every other group has a smaller d and (normal d:
  // |z| <= 6.4; subnormal d = k 2^-9: |z| <= 9) an error of at most 3 * 7 * 2^-9 * s_t. So the
  // worst element error of a token is amax / 6 at every magnitude, whereas implicit mode
  // loses whole tokens below ~0.006.
  TokenSource src(3);
  for (int n = 0; n < 200; ++n) {
    const Token t = src.next(src.magnitude(-6, 4), 1.0);
    const float amax = latent_amax(t);
    const Token dyn = decode(k368Dynamic, encode(k368Dynamic, t, 1.0f), 1.0f);
    double worst = 0;
    for (int j = 0; j < kLatentDim; ++j) worst = std::max(worst, std::fabs(double(t.kv[j]) - dyn.kv[j]));
    ASSERT_LE(worst, amax / 6.0 * (1 + 0x1p-20)) << "token " << n << " amax " << amax;
  }
  // Implicit mode at ~1e-4: everything is lost (this is the failure dynamic mode fixes).
  const Token small = src.next(1e-6, 1.0);
  ASSERT_LT(latent_amax(small), 6 * 0x1p-10);
  for (float v : decode(k368, encode(k368, small, 1.0f), 1.0f).kv) ASSERT_EQ(v, 0.0f);
}

// ---- determinism and the bf16 record ----------------------------------------------------------

TEST(RecordProperties, EncodeIsDeterministicAndWritesEveryByte) {
  TokenSource src(4);
  for (int n = 0; n < 40; ++n) {
    const Token t = src.next();
    for (const Config* c : kAll) {
      const auto a = encode(*c, t.kv.data(), t.pe.data(), 0.01f, 0x00);
      const auto b = encode(*c, t.kv.data(), t.pe.data(), 0.01f, 0xFF);
      ASSERT_EQ(a, b) << c->name << ": output depends on the buffer's previous contents or is not deterministic";
    }
  }
}

TEST(RecordProperties, Bf16RecordRoundTripsBf16InputsExactly) {
  std::mt19937_64 rng(5);
  for (int n = 0; n < 64; ++n) {
    std::vector<Bf16Bits> kv(kLatentDim), pe(kRopeDim);
    for (auto& v : kv) v.bits = static_cast<uint16_t>(rng());  // any pattern, NaN and Inf included
    for (auto& v : pe) v.bits = static_cast<uint16_t>(rng());
    const auto rec = encode(kBf16, kv.data(), pe.data(), 1.0f);
    for (int j = 0; j < kLatentDim; ++j) ASSERT_EQ(ref::get_u16(rec.data(), 2 * j), kv[j].bits);
    for (int i = 0; i < kRopeDim; ++i) ASSERT_EQ(ref::get_u16(rec.data(), 1024 + 2 * i), pe[i].bits);
    const Token d = decode(kBf16, rec, 1.0f);
    for (int j = 0; j < kLatentDim; ++j) ASSERT_EQ(bits(d.kv[j]), uint32_t(kv[j].bits) << 16);
    for (int i = 0; i < kRopeDim; ++i) ASSERT_EQ(bits(d.pe[i]), uint32_t(pe[i].bits) << 16);
  }
}

// ---- the dynamic-scale guarantee ----------------------------------------------------------------

// Largest group-scale byte of a dynamic record.
uint8_t largest_scale_byte(const std::vector<uint8_t>& rec) {
  return *std::max_element(rec.begin() + ref::kNvfp4ScalesAt, rec.begin() + ref::kNvfp4ScalesAt + 32);
}
constexpr uint8_t kE4M3Of256 = 0x78;  // 256 = 2^8: exponent field 8 + 7 = 15, mantissa 0
constexpr uint8_t kE4M3Of448 = 0x7E;

// The scale byte the dynamic recipe gives the group holding the token's maximum a:
// E4M3((a / (a * C2688)) / 6), computed with the step functions the writers call.
uint8_t dynamic_top_scale(float a) {
  const float s = record::nvfp4_dynamic_scale(a);
  return record::nvfp4_group_scale_byte(record::nvfp4_prescale(a, s));
}

TEST(RecordProperties, DynamicLargestGroupScaleIsNeverBelow256ForNormalTokens) {
  EXPECT_EQ(ref::e4m3(256.0f), kE4M3Of256);
  EXPECT_EQ(ref::e4m3(448.0f), kE4M3Of448);
  std::mt19937_64 rng(6);
  // Every fp32-normal token maximum, all exponents, sampled mantissas (extremes included):
  // the largest scale is exactly 448.
  for (int e = -126; e <= 127; ++e) {
    for (int k = 0; k < 66; ++k) {
      const uint32_t mant = k == 0 ? 0u : k == 1 ? 0x7FFFFFu : static_cast<uint32_t>(rng() & 0x7FFFFF);
      const float a = std::bit_cast<float>((static_cast<uint32_t>(e + 127) << 23) | mant);
      ASSERT_EQ(dynamic_top_scale(a), kE4M3Of448) << "amax " << a;
    }
  }
  // Whole records, tokens of every magnitude: the largest scale byte is 448 and sits in the
  // group that holds the token maximum.
  TokenSource src(7);
  for (int n = 0; n < 200; ++n) {
    Token t = src.next(std::pow(10.0, -37.0 + 75.0 * n / 199), 1.0);  // 1e-37 .. 1e38
    const auto rec = encode(k368Dynamic, t, 1.0f);
    ASSERT_EQ(largest_scale_byte(rec), kE4M3Of448) << "token " << n;
    int top = 0;
    for (int j = 0; j < kLatentDim; ++j)
      if (std::fabs(t.kv[j]) > std::fabs(t.kv[top])) top = j;
    ASSERT_EQ(rec[ref::kNvfp4ScalesAt + top / 16], kE4M3Of448) << "token " << n;
  }
}

TEST(RecordProperties, DynamicScaleExceptionForSubnormalTokens) {
  // For a subnormal token maximum a = m * 2^-149, s_t = RN(m * C2688) * 2^-149 is itself a
  // subnormal with almost no precision:
  //  - m <= 1343: m * C2688 < 1/2 (C2688 is just above 1/2688), s_t = 0, and the whole latent
  //    is stored as zero (scales, nibbles and s_t);
  //  - 1344 <= m <= 1487: s_t = 2^-149, y_max = m, and E4M3(m / 6) is 224 or 240 (0x76/0x77),
  //    below 256 (m / 6 reaches the 240|256 midpoint 248 only at m = 1488);
  //  - every other token maximum, subnormal or normal, gets a largest scale >= 256.
  std::mt19937_64 rng(8);
  auto check = [](uint32_t m) {
    const float a = std::bit_cast<float>(m);
    const uint8_t top = dynamic_top_scale(a);
    if (m <= 1343) {
      ASSERT_EQ(record::nvfp4_dynamic_scale(a), 0.0f) << m;
      ASSERT_EQ(top, 0) << m;
    } else if (m <= 1487) {
      ASSERT_EQ(record::nvfp4_dynamic_scale(a), std::numeric_limits<float>::denorm_min()) << m;
      ASSERT_TRUE(top == 0x76 || top == 0x77) << m << " " << int(top);
    } else {
      ASSERT_GE(top, kE4M3Of256) << m;
    }
  };
  for (uint32_t m = 1; m < 8192; ++m) check(m);
  for (int k = 0; k < 100000; ++k) check(8192 + static_cast<uint32_t>(rng() % (0x800000u - 8192)));
  // The same through whole records.
  for (uint32_t m : {1u, 1343u, 1344u, 1400u, 1487u, 1488u, 5000u, 0x7FFFFFu}) {
    Token t;
    t.kv[37] = -std::bit_cast<float>(m);
    const auto rec = encode(k368Dynamic, t, 1.0f);
    if (m <= 1343) {
      for (int i = 0; i < 296; ++i) ASSERT_EQ(rec[i], 0) << m;
    } else {
      ASSERT_EQ(largest_scale_byte(rec), rec[ref::kNvfp4ScalesAt + 2]) << m;
      ASSERT_EQ(rec[ref::kNvfp4ScalesAt + 2] >= kE4M3Of256, m >= 1488) << m;
    }
  }
}

TEST(RecordProperties, StaticModeCalibratedAtTheTokenMagnitudeEqualsDynamic) {
  // With s_l = max_abs * C2688 and max_abs = the token's own maximum, s_l is bit-identical to
  // s_t, so the 368-byte records differ only in [292,296) (s_t is stored by dynamic mode only)
  // and read back identically.
  TokenSource src(9);
  for (int n = 0; n < 120; ++n) {
    const Token t = src.next();
    const float s_l = ref::mul32(latent_amax(t), ref::c2688());
    auto stat = encode(k368Static, t, s_l);
    auto dyn = encode(k368Dynamic, t, 1.0f);
    ASSERT_EQ(ref::get_f32(dyn.data(), ref::kNvfp4TokenScaleAt), s_l);
    for (int i = 0; i < 4; ++i) ASSERT_EQ(stat[ref::kNvfp4TokenScaleAt + i], 0);
    std::fill_n(dyn.begin() + ref::kNvfp4TokenScaleAt, 4, uint8_t{0});
    ASSERT_EQ(stat, dyn) << "token " << n;
    const Token a = decode(k368Static, stat, s_l);
    dyn = encode(k368Dynamic, t, 1.0f);
    const Token b = decode(k368Dynamic, dyn, 1.0f);
    for (int j = 0; j < kLatentDim; ++j) ASSERT_EQ(bits(a.kv[j]), bits(b.kv[j]));
    // A token 100x below the calibrated magnitude no longer reaches the top of the E4M3 range.
    Token quiet = t;
    for (float& v : quiet.kv) v /= 128;
    ASSERT_LT(largest_scale_byte(encode(k368Static, quiet, s_l)), kE4M3Of448);
  }
}

// ---- fp8_ds_mla tile scales ---------------------------------------------------------------------

TEST(RecordProperties, Fp8TileScalesArePowersOfTwoFlooredAndMinimal) {
  TokenSource src(10);
  std::vector<Token> tokens;
  for (int n = 0; n < 150; ++n) tokens.push_back(src.next(std::pow(10.0, -44.0 + 82.0 * n / 149), 1.0));
  Token boundary;  // tile maxima exactly at 448 * 2^k and just past it
  boundary.kv[0] = 448.0f;
  boundary.kv[128] = std::nextafter(448.0f * 0x1p-20f, 1.0f);
  boundary.kv[256] = 448.0f * 0x1p-126f;
  boundary.kv[384] = 0x1p-149f;
  tokens.push_back(boundary);
  tokens.push_back(Token{});  // all tiles zero
  for (size_t n = 0; n < tokens.size(); ++n) {
    const Token& t = tokens[n];
    const auto rec = encode(kFp8, t, 1.0f);
    for (int tile = 0; tile < 4; ++tile) {
      const float p = ref::get_f32(rec.data(), ref::kFp8TileScalesAt + 4 * tile);
      const double amax = ref::max_abs(t.kv.data() + 128 * tile, 128);
      const std::string what = "token " + std::to_string(n) + " tile " + std::to_string(tile);
      ASSERT_EQ(bits(p) & 0x807FFFFFu, 0u) << what << ": not a positive power of two: " << p;
      ASSERT_GE(p, 0x1p-126f) << what;
      if (amax == 0) {
        ASSERT_EQ(p, 1.0f) << what;
        continue;
      }
      ASSERT_LE(amax, 448.0 * p) << what;
      ASSERT_TRUE(p == 0x1p-126f || amax > 448.0 * p / 2) << what << ": p/2 would do, p=" << p;
    }
  }
  const auto rec = encode(kFp8, boundary, 1.0f);
  EXPECT_EQ(ref::get_f32(rec.data(), 512), 1.0f);
  EXPECT_EQ(ref::get_f32(rec.data(), 516), 0x1p-19f);
  EXPECT_EQ(ref::get_f32(rec.data(), 520), 0x1p-126f);
  EXPECT_EQ(ref::get_f32(rec.data(), 524), 0x1p-126f);
}

// ---- input types ---------------------------------------------------------------------------------

// FP16 bits of a value that is exact in FP16 (built from its fp32 fields, not by conversion).
uint16_t fp16_bits_of_exact(float v) {
  const uint32_t u = bits(v);
  const uint16_t sign = static_cast<uint16_t>((u >> 16) & 0x8000u);
  const float a = std::fabs(v);
  if (std::isinf(a)) return sign | 0x7C00;
  if (a == 0) return sign;
  if (a < 0x1p-14f) return static_cast<uint16_t>(sign | static_cast<uint16_t>(a * 0x1p24f));  // k * 2^-24
  const int e = static_cast<int>((u >> 23) & 0xFF) - 127;
  return static_cast<uint16_t>(sign | ((e + 15) << 10) | ((u & 0x7FFFFFu) >> 13));
}

TEST(RecordProperties, Bf16Fp16AndF32InputsOfTheSameValuesGiveTheSameRecords) {
  // Values exact in all three types: BF16 values with FP16-normal exponents, FP16 subnormals
  // k * 2^-24 with k < 256, zeros of both signs, infinities; NaN for the quantized formats.
  std::mt19937_64 rng(11);
  auto value = [&](bool allow_nan) -> float {
    switch (rng() % 24) {
      case 0: return 0.0f;
      case 1: return -0.0f;
      case 2: return (rng() & 1) ? std::numeric_limits<float>::infinity() : -std::numeric_limits<float>::infinity();
      case 3: return std::ldexp(static_cast<float>(rng() % 256), -24) * ((rng() & 1) ? 1 : -1);
      case 4: if (allow_nan) return std::numeric_limits<float>::quiet_NaN(); [[fallthrough]];
      default: {
        const float m = std::ldexp(1.0f + static_cast<float>(rng() % 128) / 128, static_cast<int>(rng() % 30) - 14);
        return (rng() & 1) ? m : -m;  // 8 significant bits, exponent -14 .. 15
      }
    }
  };
  for (int n = 0; n < 60; ++n) {
    for (const Config* c : kAll) {
      // The bf16 record keeps BF16 NaN payloads, which F32/FP16 NaNs cannot reproduce.
      const bool allow_nan = c->kind != ref::Kind::bf16_1152;
      std::vector<float> kv(kLatentDim), pe(kRopeDim);
      for (float& v : kv) v = value(allow_nan);
      for (float& v : pe) v = value(allow_nan);
      std::vector<Bf16Bits> kv16(kLatentDim), pe16(kRopeDim);
      std::vector<Fp16Bits> kvh(kLatentDim), peh(kRopeDim);
      for (int j = 0; j < kLatentDim; ++j) {
        kv16[j].bits = std::isnan(kv[j]) ? 0x7FC0 : static_cast<uint16_t>(bits(kv[j]) >> 16);
        kvh[j].bits = std::isnan(kv[j]) ? 0x7E00 : fp16_bits_of_exact(kv[j]);
      }
      for (int i = 0; i < kRopeDim; ++i) {
        pe16[i].bits = std::isnan(pe[i]) ? 0x7FC0 : static_cast<uint16_t>(bits(pe[i]) >> 16);
        peh[i].bits = std::isnan(pe[i]) ? 0x7E00 : fp16_bits_of_exact(pe[i]);
      }
      for (int j = 0; j < kLatentDim; ++j) {
        if (std::isnan(kv[j])) continue;
        ASSERT_EQ(bits(codec::fp16_decode(kvh[j].bits)), bits(kv[j])) << "generator";
      }
      const float s_l = 0.003f;
      const auto from_f32 = encode(*c, kv.data(), pe.data(), s_l);
      ASSERT_EQ(encode(*c, kv16.data(), pe16.data(), s_l), from_f32) << c->name << " BF16 vs F32, token " << n;
      ASSERT_EQ(encode(*c, kvh.data(), peh.data(), s_l), from_f32) << c->name << " FP16 vs F32, token " << n;
    }
  }
}

}  // namespace
