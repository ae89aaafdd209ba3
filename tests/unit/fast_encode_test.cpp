// The GPU writer's division-free encoders (src/lib/ops/cache/fast_encode.cuh) against the
// pinned recipes of record.h.
#include <gtest/gtest.h>

#include <cfloat>
#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "nvfp4mla/codec.h"
#include "nvfp4mla/record.h"
#include "lib/ops/cache/fast_encode.cuh"

namespace nc = nvfp4mla::codec;
namespace nr = nvfp4mla::record;
namespace fe = nvfp4mla::fastenc;

namespace {

float next_down(float x) { return nc::bits_float(nc::float_bits(x) - 1u); }  // x > 0

// Nibble magnitude of |x| under the recipe (y = x / s, then y / d).
uint32_t recipe_magnitude(float x, float s, float d) {
  return nr::nvfp4_nibble(nr::nvfp4_prescale(x, s), d) & 7u;
}

float random_scale(std::mt19937& rng) {
  const float m = nc::bits_float(0x3F800000u | (rng() & 0x7FFFFFu));
  return std::ldexp(m, static_cast<int>(rng() % 120) - 60);
}

// Outer scales: the implicit unit scale, the ends of the fast range, and log-uniform randoms.
std::vector<float> test_scales(std::mt19937& rng, int n) {
  std::vector<float> s = {fe::kMinFastScale, fe::kMaxFastScale, nc::bits_float(nc::float_bits(fe::kMaxFastScale) - 1u),
                          nc::bits_float(nc::float_bits(fe::kMinFastScale) + 1u), 1.0f, nvfp4mla::kInv2688,
                          nvfp4mla::kInv2688 * 0.001f, 3.0f, 0.75f};
  for (int i = 0; i < n; ++i) s.push_back(random_scale(rng));
  return s;
}

}  // namespace

// Both the recipe and the fast nibble are non-decreasing step functions of |x|; the fast one
// steps exactly at its seven bounds. Checking the recipe on both sides of every bound therefore
// proves them equal for every |x|, for every nonzero E4M3 group scale and each outer scale.
TEST(FastEncode, Nvfp4BoundsAreTheRecipeStepPoints) {
  std::mt19937 rng(7);
  const std::vector<float> scales = test_scales(rng, 40000);
  uint64_t checked = 0, bad = 0;
  for (int byte = 1; byte <= 0x7E; ++byte) {
    const float d = nc::e4m3_decode(static_cast<uint8_t>(byte));
    for (size_t si = 0; si < scales.size(); ++si) {
      const float s = scales[si];  // s = 1 is the implicit mode as well (x / 1 = x)
      const fe::Nvfp4Bounds bd = fe::nvfp4_bounds(d, s);
      for (int k = 0; k < 7; ++k) {
        ++checked;
        const bool ok = recipe_magnitude(bd.b[k], s, d) >= uint32_t(k + 1) &&
                        recipe_magnitude(next_down(bd.b[k]), s, d) <= uint32_t(k) &&
                        (k == 0 || bd.b[k] > bd.b[k - 1]);
        if (!ok && bad++ < 5) ADD_FAILURE() << "d=" << d << " s=" << s << " k=" << k << " bound=" << bd.b[k];
      }
    }
  }
  EXPECT_EQ(bad, 0u);
  EXPECT_GT(checked, 126u * 40000u * 7u);
}

// Direct comparison in windows of fp32 values around every bound, both signs (and -0).
TEST(FastEncode, Nvfp4NibbleMatchesTheRecipeAroundEveryBound) {
  std::mt19937 rng(11);
  const std::vector<float> scales = test_scales(rng, 300);
  uint64_t bad = 0;
  for (int byte = 0; byte <= 0x7E; ++byte) {
    const float d = nc::e4m3_decode(static_cast<uint8_t>(byte));
    for (float s : scales) {
      for (bool unit : {false, true}) {
        const float se = unit ? 1.0f : s;
        const fe::Nvfp4Bounds bd = fe::nvfp4_bounds(d, se);
        auto check = [&](float x) {
          const uint8_t want = nr::nvfp4_nibble(unit ? x : nr::nvfp4_prescale(x, s), d);
          if (fe::nvfp4_nibble(x, bd) != want && bad++ < 5)
            ADD_FAILURE() << "x=" << x << " d=" << d << " s=" << s << " unit=" << unit;
        };
        check(0.0f);
        check(-0.0f);
        check(FLT_MAX);
        check(-FLT_MAX);
        check(1e-45f);
        check(-1e-45f);
        for (int k = 0; k < 7; ++k) {
          if (!std::isfinite(bd.b[k])) continue;
          const uint32_t c = nc::float_bits(bd.b[k]);
          for (uint32_t u = c - 32; u <= c + 32; ++u) {
            check(nc::bits_float(u));
            check(-nc::bits_float(u));
          }
        }
      }
    }
  }
  EXPECT_EQ(bad, 0u);
}

namespace {

// The recipe's group encoding (record::encode, one group).
uint8_t recipe_group(const float (&x)[16], float s, bool unit, uint32_t (&nib)[2]) {
  float y[16], amax = 0.0f;
  for (int i = 0; i < 16; ++i) {
    y[i] = unit ? x[i] : nr::nvfp4_prescale(x[i], s);
    amax = nr::max_f(amax, nr::abs_f(y[i]));
  }
  const uint8_t byte = nr::nvfp4_group_scale_byte(amax);
  const float d = nc::e4m3_decode(byte);
  nib[0] = nib[1] = 0;
  for (int i = 0; i < 16; ++i) nib[i / 8] |= uint32_t(nr::nvfp4_nibble(y[i], d)) << (4 * (i % 8));
  return byte;
}

float random_value(std::mt19937& rng) {
  const uint32_t kind = rng() % 16;
  if (kind == 0) return nr::sanitize(nc::bits_float(rng()));  // any bit pattern, NaN/Inf sanitized
  if (kind == 1) return (rng() & 1) ? -0.0f : 0.0f;
  if (kind == 2) return nc::bits_float((rng() & 0x807FFFFFu));  // subnormal
  const int e = static_cast<int>(rng() % 24) - 12;
  return std::ldexp(static_cast<float>(static_cast<int32_t>(rng())) * 0x1p-31f, e);
}

// Outer scale of a test group, by `mode` % 4: dynamic from the group's max (times a random
// power of two), static random, 0, implicit (`unit`).
float pick_scale(std::mt19937& rng, int mode, float gmax, bool& unit) {
  unit = false;
  switch (mode % 4) {
    case 0: return nr::nvfp4_dynamic_scale(gmax * std::ldexp(1.0f, static_cast<int>(rng() % 8)));
    case 1: return random_scale(rng);
    case 2: return 0.0f;
    default: unit = true; return 1.0f;
  }
}

bool on_fast_path(float s, bool unit) {
  return unit || s == 0.0f || (s >= fe::kMinFastScale && s <= fe::kMaxFastScale);
}

}  // namespace

// Whole groups: scale byte and all 16 nibbles, in every mode, with the outer scales the writer
// can meet on its fast path (dynamic from the group, static random, 0, implicit).
TEST(FastEncode, Nvfp4GroupMatchesTheRecipe) {
  std::mt19937 rng(3);
  uint64_t bad = 0;
  for (int iter = 0; iter < 400000; ++iter) {
    float x[16], gmax = 0.0f;
    const int spread = static_cast<int>(rng() % 3);
    const float base = std::ldexp(1.0f, static_cast<int>(rng() % 80) - 40);
    for (int i = 0; i < 16; ++i) {
      x[i] = nr::sanitize(random_value(rng) * (spread == 0 ? 1.0f : base));
      if (spread == 2 && (rng() % 4) == 0) x[i] = (rng() & 1) ? FLT_MAX : -FLT_MAX;
      gmax = std::fmax(gmax, std::fabs(x[i]));
    }
    bool unit;
    const float s = pick_scale(rng, iter, gmax, unit);
    if (!on_fast_path(s, unit)) continue;
    uint32_t want[2], got[2];
    const uint8_t wb = recipe_group(x, s, unit, want);
    const uint8_t gb = fe::nvfp4_group(x, gmax, s, unit, got);
    if ((wb != gb || want[0] != got[0] || want[1] != got[1]) && bad++ < 5)
      ADD_FAILURE() << "iter " << iter << " scale byte " << int(wb) << " vs " << int(gb) << std::hex << " nib " << want[0] << "," << want[1] << " vs " << got[0] << "," << got[1] << " s=" << s << " gmax=" << gmax;
  }
  EXPECT_EQ(bad, 0u);
}

// BF16 bounds: for odd k the smallest BF16 magnitude the recipe takes to k + 1 or above (|x| >=
// it), for even k the largest it keeps at k or below (|x| > it), for every nonzero E4M3 group
// scale and each outer scale; the implicit-mode bounds are the same words as those for s = 1.
namespace {
bool bf16_bound_is_step(uint32_t word, int k, float s, float d) {
  const uint32_t lo = word & 0xFFFFu;
  if ((word >> 16) != lo || lo > 0x7F80u) return false;
  if (k & 1)  // |x| >= lo reaches k + 1, the BF16 below does not
    return (lo == 0x7F80u || recipe_magnitude(nc::bf16_decode(uint16_t(lo)), s, d) >= uint32_t(k + 1)) &&
           (lo == 0 || recipe_magnitude(nc::bf16_decode(uint16_t(lo - 1)), s, d) <= uint32_t(k));
  return recipe_magnitude(nc::bf16_decode(uint16_t(lo)), s, d) <= uint32_t(k) &&
         (lo >= 0x7F7Fu || recipe_magnitude(nc::bf16_decode(uint16_t(lo + 1)), s, d) >= uint32_t(k + 1));
}
}  // namespace

TEST(FastEncode, Nvfp4Bf16BoundsAreTheRecipeStepPoints) {
  std::mt19937 rng(13);
  const std::vector<float> scales = test_scales(rng, 20000);
  uint64_t bad = 0;
  for (int byte = 1; byte <= 0x7E; ++byte) {
    const float d = nc::e4m3_decode(static_cast<uint8_t>(byte));
    for (float s : scales) {
      uint32_t b[7];
      fe::nvfp4_bounds_bf16x2(d, s, b);
      for (int k = 0; k < 7; ++k) {
        const bool ok = bf16_bound_is_step(b[k], k, s, d) && (k == 0 || (b[k] & 0xFFFFu) >= (b[k - 1] & 0xFFFFu));
        if (!ok && bad++ < 5) ADD_FAILURE() << "d=" << d << " s=" << s << " k=" << k << std::hex << " bound=" << b[k];
      }
    }
    uint32_t unit[7], one[7];
    fe::nvfp4_bounds_bf16x2_unit(d, unit);
    fe::nvfp4_bounds_bf16x2(d, 1.0f, one);
    for (int k = 0; k < 7; ++k)
      if ((unit[k] != one[k] || !bf16_bound_is_step(unit[k], k, 1.0f, d)) && bad++ < 5)
        ADD_FAILURE() << "implicit d=" << d << " k=" << k << std::hex << " " << unit[k] << " vs " << one[k];
  }
  EXPECT_EQ(bad, 0u);
}

// Whole BF16 groups through the packed path (nibble placement, signs, -0, d = 0) against the
// recipe, in every mode; also every BF16 bit pattern in every position of a group.
TEST(FastEncode, Nvfp4Bf16GroupMatchesTheRecipe) {
  std::mt19937 rng(17);
  uint64_t bad = 0;
  auto check = [&](const uint16_t (&h)[16], float s, bool unit) {
    uint32_t w[8];
    float x[16];
    for (int i = 0; i < 16; ++i) x[i] = nc::bf16_decode(h[i]);
    for (int i = 0; i < 8; ++i) w[i] = h[2 * i] | (uint32_t(h[2 * i + 1]) << 16);
    const uint32_t gbits = fe::bf16_abs_max_bits(w);
    if (gbits >= 0x7F80u) return;  // not finite: the fp32 path
    uint32_t want[2], got[2];
    const uint8_t wb = recipe_group(x, s, unit, want);
    const float gmax = nc::bf16_decode(static_cast<uint16_t>(gbits));
    // ymax as the writer's dynamic (division) and static (reciprocal) modes compute it.
    const float ymax_div = unit ? gmax : nr::nvfp4_prescale(gmax, s);
    const float ymax_rcp = unit ? gmax : fe::nvfp4_prescale_by_rcp(gmax, s, fe::nvfp4_inverse_scale(s));
    for (float ymax : {ymax_div, ymax_rcp}) {
      const uint8_t gb = unit ? fe::nvfp4_group_bf16<true>(w, ymax, s, got) : fe::nvfp4_group_bf16<false>(w, ymax, s, got);
      if ((wb != gb || want[0] != got[0] || want[1] != got[1]) && bad++ < 5)
        ADD_FAILURE() << "scale byte " << int(wb) << " vs " << int(gb) << std::hex << " nib " << want[0] << ","
                      << want[1] << " vs " << got[0] << "," << got[1] << " s=" << s;
    }
  };
  for (int iter = 0; iter < 400000; ++iter) {
    uint16_t h[16];
    float gmax = 0.0f;
    const int e = static_cast<int>(rng() % 200) - 100;
    for (int i = 0; i < 16; ++i) {
      const uint32_t kind = rng() % 8;
      if (kind == 0) h[i] = static_cast<uint16_t>(rng());
      else if (kind == 1) h[i] = (rng() & 1) ? 0x8000u : 0u;
      else h[i] = nc::bf16_encode_satfinite(std::ldexp(static_cast<float>(static_cast<int32_t>(rng())) * 0x1p-31f, e));
      if ((h[i] & 0x7FFFu) >= 0x7F80u) h[i] = 0x3F80u;
      gmax = std::fmax(gmax, std::fabs(nc::bf16_decode(h[i])));
    }
    bool unit;
    const float s = pick_scale(rng, iter, gmax, unit);
    if (!on_fast_path(s, unit)) continue;
    check(h, s, unit);
  }
  for (uint32_t v = 0; v < 0x10000u; ++v) {
    if ((v & 0x7FFFu) >= 0x7F80u) continue;
    uint16_t h[16];
    for (int i = 0; i < 16; ++i) h[i] = static_cast<uint16_t>(0x3E00u + (rng() % 0x200));  // ~0.125 .. 0.5
    h[v % 16] = static_cast<uint16_t>(v);
    float gmax = 0.0f;
    for (uint16_t b : h) gmax = std::fmax(gmax, std::fabs(nc::bf16_decode(b)));
    for (int mode = 0; mode < 4; ++mode) {
      bool unit;
      const float s = pick_scale(rng, mode, gmax, unit);
      if (!on_fast_path(s, unit)) continue;
      check(h, s, unit);
    }
  }
  EXPECT_EQ(bad, 0u);
}

// fp8_ds_mla: x * (1 / p) then E4M3 equals the recipe's E4M3(x / p), for every BF16 value and
// every tile scale, and for random fp32 values.
TEST(FastEncode, Fp8BytesMatchTheRecipe) {
  uint64_t bad = 0;
  std::mt19937 rng(5);
  for (int k = nvfp4mla::layout::fp8::kMinScaleLog2; k <= 120; ++k) {
    const float p = std::ldexp(1.0f, k);
    ASSERT_EQ(nr::fp8_tile_scale(p * 448.0f), p);
    const float inv = fe::fp8_inverse_scale(p);
    ASSERT_EQ(inv, 1.0f / p);
    auto check = [&](float x0, float x1, float x2, float x3) {
      const uint32_t want = nc::e4m3_encode(x0 / p) | (nc::e4m3_encode(x1 / p) << 8) |
                            (nc::e4m3_encode(x2 / p) << 16) | (uint32_t(nc::e4m3_encode(x3 / p)) << 24);
      if (fe::fp8_word(x0, x1, x2, x3, inv) != want && bad++ < 5) ADD_FAILURE() << "p=" << p << " x0=" << x0;
    };
    for (uint32_t b = 0; b < 65536; b += 4) {
      float v[4];
      for (int i = 0; i < 4; ++i) v[i] = nr::sanitize(nc::bf16_decode(static_cast<uint16_t>(b + i)));
      check(v[0], v[1], v[2], v[3]);
    }
    for (int i = 0; i < 20000; ++i) {
      float v[4];
      for (float& x : v) x = nr::sanitize(nc::bits_float(rng()));
      check(v[0], v[1], v[2], v[3]);
    }
  }
  EXPECT_EQ(bad, 0u);
}

// The group scale byte without a division: E4M3(RN(y / 6)) for every y the writer can pass. The
// byte changes only where y / 6 crosses an E4M3 midpoint, so every fp32 within 4096 ulps of 6 m
// (m an E4M3 value or midpoint) is checked, plus a stride over all non-negative floats, the
// ends, +Inf and the NaN a static-mode overflow produces.
TEST(FastEncode, E4m3ByteDiv6MatchesTheRecipe) {
  uint64_t bad = 0;
  auto check = [&](float y) {
    const uint8_t want = nr::nvfp4_group_scale_byte(std::isnan(y) ? INFINITY : y);
    if (fe::e4m3_byte_div6(y) != want && bad++ < 5) ADD_FAILURE() << "y=" << y << " want " << int(want);
  };
  for (int b = 0; b < 0x7F; ++b) {
    const float v = nc::e4m3_decode(static_cast<uint8_t>(b));
    const float next = b < 0x7E ? nc::e4m3_decode(static_cast<uint8_t>(b + 1)) : 480.0f;  // saturation at 464
    for (float m : {v, 0.5f * (v + next)}) {
      const uint32_t c = nc::float_bits(6.0f * m);
      for (uint32_t u = c > 4096 ? c - 4096 : 0; u <= c + 4096; ++u) check(nc::bits_float(u));
    }
  }
  for (uint32_t u = 0; u < 0x7F800000u; u += 251) check(nc::bits_float(u));
  for (float y : {0.0f, FLT_MIN, 1e-45f, 2784.0f, 2784.0001f, FLT_MAX, INFINITY, NAN}) check(y);
  EXPECT_EQ(bad, 0u);
}

// Static mode's RN(gmax / s) through the reciprocal equals the recipe's division for every
// finite BF16 gmax >= 2^-100 (the residual of smaller ones can underflow) and each outer scale
// of the fast range (and s = 0), where the quotient is a normal fp32; for every gmax the scale
// byte is the recipe's.
TEST(FastEncode, PrescaleByReciprocalMatchesTheDivision) {
  std::mt19937 rng(19);
  std::vector<float> scales = test_scales(rng, 300);
  scales.push_back(0.0f);
  uint64_t bad = 0;
  for (float s : scales) {
    const float inv = fe::nvfp4_inverse_scale(s);
    for (uint32_t h = 0; h < 0x7F80u; ++h) {
      const float gmax = nc::bf16_decode(static_cast<uint16_t>(h));
      const float want = nr::nvfp4_prescale(gmax, s);
      const float got = fe::nvfp4_prescale_by_rcp(gmax, s, inv);
      const bool same_value =
          gmax < 0x1p-100f || !(std::fabs(want) >= FLT_MIN && std::fabs(want) <= FLT_MAX) || got == want;
      if ((!same_value || fe::e4m3_byte_div6(got) != nr::nvfp4_group_scale_byte(want)) && bad++ < 5)
        ADD_FAILURE() << "gmax=" << gmax << " s=" << s << " want " << want << " got " << got;
    }
  }
  EXPECT_EQ(bad, 0u);
}

// The 368-byte record's RoPE bytes through the reciprocal of the RoPE scale: every BF16 value
// (both signs, -0, subnormals) against RoPE scales from maxima over the whole BF16 range and the
// ends of the reciprocal range, as the writer uses it (|r| <= the maximum the scale comes from).
TEST(FastEncode, RopeFp8PairMatchesTheRecipe) {
  std::mt19937 rng(23);
  std::vector<float> maxima = {0.0f, 1e-45f, FLT_MIN, 1.0f, 448.0f, 3.0e38f, FLT_MAX,
                               nc::bits_float(0x00800000u) * 448.0f, 0x1p-125f * 448.0f, 0x1p125f * 448.0f};
  for (int i = 0; i < 120; ++i) maxima.push_back(nc::bf16_decode(static_cast<uint16_t>(rng() % 0x7F80u)));
  uint64_t bad = 0;
  for (float amax : maxima) {
    const float rs = nr::rope_fp8_scale(amax);
    for (uint32_t h = 0; h < 0x10000u; h += 2) {
      const float r0 = nr::sanitize(nc::bf16_decode(static_cast<uint16_t>(h)));
      const float r1 = nr::sanitize(nc::bf16_decode(static_cast<uint16_t>(h + 1)));
      if (std::fabs(r0) > amax || std::fabs(r1) > amax) continue;
      const uint32_t want = nr::rope_fp8_byte(r0, rs) | (uint32_t(nr::rope_fp8_byte(r1, rs)) << 8);
      if (fe::rope_fp8_pair(r0, r1, rs) != want && bad++ < 5)
        ADD_FAILURE() << "r0=" << r0 << " r1=" << r1 << " rs=" << rs << std::hex << " want " << want;
    }
    // Each value beside a zero as well: the only pairs within a zero maximum (a zero RoPE scale).
    for (uint32_t h = 0; h < 0x10000u; ++h) {
      const float r = nr::sanitize(nc::bf16_decode(static_cast<uint16_t>(h)));
      if (!(std::fabs(r) <= amax)) continue;
      const uint32_t want = nr::rope_fp8_byte(r, rs) | (uint32_t(nr::rope_fp8_byte(0.0f, rs)) << 8);
      if (fe::rope_fp8_pair(r, 0.0f, rs) != want && bad++ < 5)
        ADD_FAILURE() << "r=" << r << " beside 0, rs=" << rs << std::hex << " want " << want;
    }
  }
  EXPECT_EQ(fe::rope_fp8_pair(-0.0f, 0.0f, 1.0f), 0x0080u);  // -0 keeps its sign bit
  EXPECT_EQ(bad, 0u);
}

// FP32 RoPE inputs far below BF16's usual range: tiny scales and values whose quotient lies next
// to an E4M3 rounding boundary (the reciprocal method's residual is inexact below 2^-100, so the
// writer divides there). The first pair is one where it gave 0x20 for the recipe's 0x1F.
TEST(FastEncode, RopeFp8PairOfTinyFp32ValuesMatchesTheRecipe) {
  const float rs = nr::rope_fp8_scale(0x1.94478ap-112f), r0 = 0x1.bf985ap-124f;
  EXPECT_EQ(fe::rope_fp8_pair(r0, 0.0f, rs), uint32_t(nr::rope_fp8_byte(r0, rs)) | (uint32_t(nr::rope_fp8_byte(0.0f, rs)) << 8));
  std::mt19937 rng(41);
  std::uniform_real_distribution<float> fraction(0.0f, 1.0f);
  uint64_t bad = 0;
  for (int i = 0; i < 400000; ++i) {
    const float amax = std::ldexp(1.0f + fraction(rng), -static_cast<int>(rng() % 40) - 90);  // 2^-130 .. 2^-89
    const float scale = nr::rope_fp8_scale(amax);
    const float r = (rng() & 1 ? -1.0f : 1.0f) * amax * fraction(rng);
    const uint32_t want = nr::rope_fp8_byte(r, scale) | (uint32_t(nr::rope_fp8_byte(amax, scale)) << 8);
    if (fe::rope_fp8_pair(r, amax, scale) != want && bad++ < 5)
      ADD_FAILURE() << std::hexfloat << "r=" << r << " amax=" << amax << " rs=" << scale;
  }
  EXPECT_EQ(bad, 0u);
}
