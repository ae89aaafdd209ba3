// Golden records: hand-worked bytes for every format and scale mode, checked against
// record::encode / record::decode, plus a byte-for-byte comparison with the independent
// reference model of record_reference.h. The expected bytes in this file were worked out by
// hand from the recipes in docs/FORMAT.md (the working is in the comments); none of them is
// produced by the code under test.
#include <gtest/gtest.h>

#include <bit>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <initializer_list>
#include <limits>
#include <string>
#include <vector>

#include "nvfp4mla/record.h"
#include "unit/record_reference.h"
#include "unit/record_test_configs.h"

namespace {

using namespace nvfp4mla;
using namespace nvfp4mla_test;
using namespace nvfp4mla_test::configs;

constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

void expect_bytes(const std::vector<uint8_t>& rec, int at, std::initializer_list<int> want, const std::string& what) {
  int i = at;
  for (int b : want) {
    EXPECT_EQ(rec.at(i), b) << what << ": byte " << i;
    ++i;
  }
}
// fp32 little-endian as stored: the four bytes of the bit pattern, low byte first.
void expect_f32_at(const std::vector<uint8_t>& rec, int at, uint32_t want_bits, const std::string& what) {
  expect_bytes(rec, at, {int(want_bits & 0xFF), int((want_bits >> 8) & 0xFF), int((want_bits >> 16) & 0xFF),
                         int(want_bits >> 24)}, what);
}
void expect_zero(const std::vector<uint8_t>& rec, int from, int to, const std::string& what) {
  for (int i = from; i < to; ++i) EXPECT_EQ(rec.at(i), 0) << what << ": byte " << i << " must be zero";
}
// Bitwise float equality (so -0 and +0 differ).
void expect_same_float(float got, float want, const std::string& what) {
  EXPECT_EQ(bits(got), bits(want)) << what << ": got " << got << " want " << want;
}

// The record must equal the reference model's bytes, and both decoders must agree bitwise.
void expect_matches_reference(const Config& c, const Token& t, float layer_scale = 1.0f) {
  SCOPED_TRACE(c.name);
  const auto rec = encode(c, t, layer_scale);
  const auto want = ref::encode(c.kind, c.outer, t.kv.data(), t.pe.data(), layer_scale);
  ASSERT_EQ(rec.size(), want.size());
  for (size_t i = 0; i < rec.size(); ++i) EXPECT_EQ(rec[i], want[i]) << "byte " << i;
  const auto got = decode(c, rec, layer_scale);
  const auto exp = ref::decode(c.kind, c.outer, want.data(), layer_scale);
  for (int j = 0; j < kLatentDim; ++j) expect_same_float(got.kv[j], exp.kv[j], "kv_c[" + std::to_string(j) + "]");
  for (int i = 0; i < kRopeDim; ++i) expect_same_float(got.pe[i], exp.pe[i], "k_pe[" + std::to_string(i) + "]");
}

// ---- the hand token G --------------------------------------------------------------------
// Latent groups (16 dims each) chosen to exercise one rule each; everything else is zero.
Token hand_token() {
  Token t;
  const float g0[16] = {6, -4, 3, -2, 1.5f, -1, 0.5f, -0.0f, 0, 5, -6, 2.5f, 0.75f, -0.25f, 1.25f, 3.5f};
  for (int i = 0; i < 16; ++i) t.kv[i] = g0[i];  // E2M1 grid values and every E2M1 tie
  t.kv[16] = 6.375f;  // group 1: a/6 = 1.0625, an E4M3 tie between 1 and 1.125 -> 1 (even)
  t.kv[17] = 1.75f;   //   E2M1 tie 1.5 | 2 -> 2
  t.kv[18] = -5.5f;
  t.kv[19] = 0.3f;
  t.kv[32] = 7.125f;  // group 2: a/6 = 1.1875, tie between 1.125 and 1.25 -> 1.25 (even)
  t.kv[33] = 2.5f;
  t.kv[34] = -1.875f;
  t.kv[35] = 0.3125f;
  t.kv[48] = 0x1.2p-6f;    // group 3: 9 * 2^-9; a/6 = 1.5 * 2^-9: subnormal E4M3 tie -> 2 * 2^-9
  t.kv[49] = -0x1.8p-8f;   //   -3 * 2^-9
  t.kv[64] = 0.01f;        // group 4: a/6 = 0.853 * 2^-9 -> subnormal scale 0x01 = 2^-9
  t.kv[65] = -0.001f;
  t.kv[96] = 1e-4f;        // group 6: a/6 < 2^-10 -> scale 0, the group is lost in implicit mode
  t.kv[97] = -1e-4f;
  t.kv[98] = 5e-5f;
  t.kv[112] = 5376.0f;     // group 7: a/6 = 896 saturates the scale at 448
  t.kv[113] = 448.0f;
  t.kv[114] = -100.0f;
  t.kv[511] = -3.0f;       // group 31, odd element: high nibble of the last latent byte
  const float pe[10] = {448, -1, 1.0625f, 17, -0x1p-10f, 0x1.8p-9f, 0.3f, 1.00390625f, 1.01171875f, -0.0f};
  for (int i = 0; i < 10; ++i) t.pe[i] = pe[i];
  t.pe[63] = -2.5f;
  return t;
}

// ---- layouts ------------------------------------------------------------------------------

TEST(RecordLayout, OffsetsMatchTheSpecificationTables) {
  // Literal numbers from the byte tables of docs/FORMAT.md, as a cross-check of format.h.
  namespace N = layout::nvfp4;
  EXPECT_EQ(N::kLatentOffset, 0);
  EXPECT_EQ(N::kLatentBytes, 256);
  EXPECT_EQ(N::kGroupSize, 16);
  EXPECT_EQ(N::kNumGroups, 32);
  EXPECT_EQ(N::kGroupScaleOffset, 256);
  EXPECT_EQ(N::kRopeScaleOffset, 288);
  EXPECT_EQ(N::kTokenScaleOffset, 292);
  EXPECT_EQ(N::kRopeOffset, 304);
  EXPECT_EQ(N::kRecordBytesFp8Rope, 368);
  EXPECT_EQ(N::kRecordBytesBf16Rope, 432);
  namespace F = layout::fp8;
  EXPECT_EQ(F::kLatentOffset, 0);
  EXPECT_EQ(F::kTileDim, 128);
  EXPECT_EQ(F::kNumTiles, 4);
  EXPECT_EQ(F::kTileScaleOffset, 512);
  EXPECT_EQ(F::kRopeOffset, 528);
  EXPECT_EQ(F::kRecordBytes, 656);
  EXPECT_EQ(F::kMinScaleLog2, -126);
  EXPECT_EQ(layout::bf16::kLatentOffset, 0);
  EXPECT_EQ(layout::bf16::kRopeOffset, 1024);
  EXPECT_EQ(layout::bf16::kRecordBytes, 1152);
  EXPECT_EQ(kLatentDim, 512);
  EXPECT_EQ(kRopeDim, 64);
  // The reference model's own copy of the tables.
  EXPECT_EQ(ref::kNvfp4ScalesAt, N::kGroupScaleOffset);
  EXPECT_EQ(ref::kNvfp4RopeScaleAt, N::kRopeScaleOffset);
  EXPECT_EQ(ref::kNvfp4TokenScaleAt, N::kTokenScaleOffset);
  EXPECT_EQ(ref::kNvfp4RopeAt, N::kRopeOffset);
  EXPECT_EQ(ref::kFp8TileScalesAt, F::kTileScaleOffset);
  EXPECT_EQ(ref::kFp8RopeAt, F::kRopeOffset);
  EXPECT_EQ(ref::kBf16RopeAt, layout::bf16::kRopeOffset);
  // Widths by configuration; every width is a multiple of 16 bytes.
  for (const Config* c : kAll) {
    EXPECT_EQ(c->spec.record_bytes(), ref::width(c->kind)) << c->name;
    EXPECT_EQ(c->spec.record_bytes() % 16, 0) << c->name;
  }
}

TEST(RecordConstants, C448AndC2688AreTheNearestFloats) {
  EXPECT_EQ(bits(kInv448), ref::kC448Bits);
  EXPECT_EQ(bits(kInv2688), ref::kC2688Bits);
  EXPECT_EQ(kCalibrationDenominator, 2688.0f);
  // |c * n - 1| < n * ulp(c) / 2 proves c is the fp32 nearest to 1/n (all products exact in double).
  for (auto [c, n] : {std::pair{kInv448, 448.0}, std::pair{kInv2688, 2688.0}}) {
    const double ulp = std::nextafter(c, 1.0f) - static_cast<double>(c);
    EXPECT_LT(std::fabs(static_cast<double>(c) * n - 1.0), n * ulp / 2) << n;
  }
}

// ---- zero token ----------------------------------------------------------------------------

TEST(RecordGolden, ZeroTokenEveryFormat) {
  const Token zero;
  for (const Config* c : kAll) {
    SCOPED_TRACE(c->name);
    const auto rec = encode(*c, zero, 0.5f);
    if (c->kind == ref::Kind::fp8_656) {
      // Zero tiles get scale 1.0 (0x3F800000); everything else is zero.
      expect_zero(rec, 0, 512, "latent");
      for (int t = 0; t < 4; ++t) expect_f32_at(rec, 512 + 4 * t, 0x3F800000u, "tile scale");
      expect_zero(rec, 528, 656, "rope");
    } else {
      expect_zero(rec, 0, static_cast<int>(rec.size()), "record");  // incl. s_t = 0 in dynamic mode
    }
    const auto d = decode(*c, rec, 0.5f);
    for (float v : d.kv) expect_same_float(v, 0.0f, "kv_c");
    for (float v : d.pe) expect_same_float(v, 0.0f, "k_pe");
    expect_matches_reference(*c, zero, 0.5f);
  }
}

TEST(RecordGolden, NegativeZeroTokenKeepsSignsWhereAFormatCan) {
  Token t;
  for (float& v : t.kv) v = -0.0f;
  for (float& v : t.pe) v = -0.0f;
  // bf16 record: 0x8000 everywhere.
  auto rec = encode(kBf16, t);
  for (int i = 0; i < 1152; i += 2) expect_bytes(rec, i, {0x00, 0x80}, "bf16 -0");
  // fp8_ds_mla: zero tiles (scale 1), -0 / 1 = -0 -> E4M3 0x80; RoPE BF16 0x8000.
  rec = encode(kFp8, t);
  for (int j = 0; j < 512; ++j) EXPECT_EQ(rec[j], 0x80) << j;
  for (int i = 528; i < 656; i += 2) expect_bytes(rec, i, {0x00, 0x80}, "fp8 rope -0");
  // nvfp4: every group scale is 0, so every nibble is 0 (the sign cannot be kept); 368 RoPE:
  // rs = 0 -> bytes 0.
  rec = encode(k368, t);
  expect_zero(rec, 0, 368, "368");
  rec = encode(k432, t);
  expect_zero(rec, 0, 304, "432 latent");
  for (int i = 304; i < 432; i += 2) expect_bytes(rec, i, {0x00, 0x80}, "432 rope -0");
  for (const Config* c : kAll) expect_matches_reference(*c, t, 0.25f);
}

// ---- nvfp4, implicit (unit outer scale) --------------------------------------------------

// Latent bytes of G in implicit mode (d = decoded group scale; nibble = E2M1(x / d); byte =
// even element | odd element << 4).
void expect_hand_latent_implicit(const std::vector<uint8_t>& rec) {
  // Group 0, d = 1: 6->7, -4->E | 3->5, -2->C | 1.5->3, -1->A | 0.5->1, -0->8 | 0->0,
  // 5 (tie 4|6)->6 | -6->F, 2.5 (tie 2|3)->4 | 0.75 (tie 0.5|1)->2, -0.25 (tie 0|0.5)->8 (-0) |
  // 1.25 (tie 1|1.5)->2, 3.5 (tie 3|4)->6.
  expect_bytes(rec, 0, {0xE7, 0xC5, 0xA3, 0x81, 0x60, 0x4F, 0x82, 0x62}, "group 0");
  // Group 1, d = 1: 6.375 -> 6 (7), 1.75 -> 2 (4) | -5.5 -> -6 (F), 0.3 -> 0.5 (1).
  expect_bytes(rec, 8, {0x47, 0x1F, 0, 0, 0, 0, 0, 0}, "group 1");
  // Group 2, d = 1.25: 5.7 -> 7, 2 -> 4 | -1.5 -> B, 0.25 (tie 0|0.5) -> 0.
  expect_bytes(rec, 16, {0x47, 0x0B}, "group 2");
  // Group 3, d = 2^-8: 4.5 -> 4 (6), -1.5 -> B.
  expect_bytes(rec, 24, {0xB6}, "group 3");
  // Group 4, d = 2^-9: 5.12 -> 6 (7), -0.512 -> -0.5 (9).
  expect_bytes(rec, 32, {0x97}, "group 4");
  expect_zero(rec, 48, 56, "group 6 (scale 0)");
  // Group 7, d = 448: 12 -> 6 (7), 1 -> 2 | -0.223 -> -0 (8), 0 -> 0.
  expect_bytes(rec, 56, {0x27, 0x08}, "group 7");
  expect_zero(rec, 64, 255, "groups 8..30 and group 31's first 14 values");
  expect_bytes(rec, 255, {0xF0}, "group 31: element 511 = -3 / 0.5 -> F in the high nibble");
  // Group scales: 1 (0x38), 1.0625 tie -> 0x38, 1.1875 tie -> 0x3A, 1.5*2^-9 tie -> 0x02,
  // 0.853*2^-9 -> 0x01, 0, 1.7e-5 -> 0, 896 -> 448 (0x7E), zeros, 0.5 (0x30).
  expect_bytes(rec, 256, {0x38, 0x38, 0x3A, 0x02, 0x01, 0x00, 0x00, 0x7E}, "scales 0..7");
  expect_zero(rec, 264, 287, "scales 8..30");
  expect_bytes(rec, 287, {0x30}, "scale 31");
}

void expect_hand_rope_fp8(const std::vector<uint8_t>& rec) {
  // rope_amax = 448 -> rs = RN(448 * C448) = RN(1 + 3*2^-26) = 1.0 exactly, so byte = E4M3(r):
  // 448, -1, 1.0625 (tie 1|1.125 -> 1), 17 (tie 16|18 -> 16), -2^-10 (tie 0|2^-9 -> -0),
  // 1.5*2^-9 (tie -> 2*2^-9), 0.3 -> 0.3125, 1+2^-8 -> 1, 1+3*2^-8 -> 1, -0, ..., -2.5.
  expect_f32_at(rec, 288, 0x3F800000u, "rope scale");
  expect_bytes(rec, 304, {0x7E, 0xB8, 0x38, 0x58, 0x80, 0x02, 0x2A, 0x38, 0x38, 0x80}, "fp8 rope");
  expect_zero(rec, 314, 367, "fp8 rope zeros");
  expect_bytes(rec, 367, {0xC2}, "fp8 rope 63");
}

void expect_hand_rope_bf16(const std::vector<uint8_t>& rec, int at) {
  // Raw BF16, little-endian; 0.3 rounds up to 0x3E9A, 1+2^-8 ties to 0x3F80, 1+3*2^-8 to 0x3F82.
  expect_bytes(rec, at, {0xE0, 0x43, 0x80, 0xBF, 0x88, 0x3F, 0x88, 0x41, 0x80, 0xBA, 0x40, 0x3B, 0x9A, 0x3E,
                         0x80, 0x3F, 0x82, 0x3F, 0x00, 0x80}, "bf16 rope");
  expect_zero(rec, at + 20, at + 126, "bf16 rope zeros");
  expect_bytes(rec, at + 126, {0x20, 0xC0}, "bf16 rope 63");
}

TEST(RecordGolden, Nvfp4ImplicitHandToken) {
  const Token t = hand_token();
  for (const Config* c : {&k368, &k432}) {
    SCOPED_TRACE(c->name);
    const auto rec = encode(*c, t);
    expect_hand_latent_implicit(rec);
    if (c == &k368) {
      expect_hand_rope_fp8(rec);
      expect_zero(rec, 292, 304, "token scale (implicit) and padding");
    } else {
      expect_zero(rec, 288, 304, "padding");
      expect_hand_rope_bf16(rec, 304);
    }
    // Reader: (e2m1 * d) * 1.
    const auto d = decode(*c, rec);
    const float want0[16] = {6, -4, 3, -2, 1.5f, -1, 0.5f, -0.0f, 0, 4, -6, 2, 1, -0.0f, 1, 4};
    for (int j = 0; j < 16; ++j) expect_same_float(d.kv[j], want0[j], "g0[" + std::to_string(j) + "]");
    expect_same_float(d.kv[16], 6.0f, "saturated 6.375");
    expect_same_float(d.kv[17], 2.0f, "1.75");
    expect_same_float(d.kv[19], 0.5f, "0.3");
    expect_same_float(d.kv[32], 7.5f, "6 * 1.25");
    expect_same_float(d.kv[34], -1.875f, "-1.5 * 1.25");
    expect_same_float(d.kv[35], 0.0f, "0.3125");
    expect_same_float(d.kv[48], 0.015625f, "4 * 2^-8");
    expect_same_float(d.kv[49], -0.005859375f, "-1.5 * 2^-8");
    expect_same_float(d.kv[64], 0.01171875f, "6 * 2^-9 (subnormal scale 0x01)");
    expect_same_float(d.kv[65], -0.0009765625f, "-0.5 * 2^-9");
    expect_same_float(d.kv[96], 0.0f, "1e-4 lost with scale 0");
    expect_same_float(d.kv[112], 2688.0f, "5376 saturates at 6 * 448");
    expect_same_float(d.kv[113], 448.0f, "448");
    expect_same_float(d.kv[114], -0.0f, "-100 -> -0");
    expect_same_float(d.kv[511], -3.0f, "-3");
    if (c == &k368) {
      const float want_pe[10] = {448, -1, 1, 16, -0.0f, 0.00390625f, 0.3125f, 1, 1, -0.0f};
      for (int i = 0; i < 10; ++i) expect_same_float(d.pe[i], want_pe[i], "pe[" + std::to_string(i) + "]");
      expect_same_float(d.pe[63], -2.5f, "pe[63]");
    } else {
      const float want_pe[10] = {448, -1, 1.0625f, 17, -0x1p-10f, 0x1.8p-9f, 0.30078125f, 1, 1.015625f, -0.0f};
      for (int i = 0; i < 10; ++i) expect_same_float(d.pe[i], want_pe[i], "pe[" + std::to_string(i) + "]");
    }
    expect_matches_reference(*c, t);
  }
}

// ---- nvfp4, dynamic per-token scale ------------------------------------------------------

TEST(RecordGolden, Nvfp4DynamicHandToken) {
  // token_amax = 5376 -> s_t = RN(5376 * C2688) = RN(2 + 5*2^-27) = 2.0 exactly; y = x / 2.
  const Token t = hand_token();
  const auto rec = encode(k368Dynamic, t);
  expect_f32_at(rec, 292, 0x40000000u, "s_t = 2.0");
  expect_zero(rec, 296, 304, "padding");
  // Scales of y: 0.5 (0x30); 0.53125 tie 0.5|0.5625 -> 0x30; 0.59375 tie 0.5625|0.625 -> 0x32;
  // 0.75*2^-9 -> 0x01; 0.43*2^-9 -> 0 (group 4 is lost); 0; 0; 448 (0x7E); ...; 0.25 (0x28).
  expect_bytes(rec, 256, {0x30, 0x30, 0x32, 0x01, 0x00, 0x00, 0x00, 0x7E}, "scales 0..7");
  expect_zero(rec, 264, 287, "scales 8..30");
  expect_bytes(rec, 287, {0x28}, "scale 31");
  // Groups 0-3 have the same y/d as in implicit mode, so the same nibbles.
  expect_bytes(rec, 0, {0xE7, 0xC5, 0xA3, 0x81, 0x60, 0x4F, 0x82, 0x62, 0x47, 0x1F}, "groups 0-1");
  expect_bytes(rec, 16, {0x47, 0x0B}, "group 2");
  expect_bytes(rec, 24, {0xB6}, "group 3");
  expect_zero(rec, 32, 40, "group 4 (scale 0)");
  // Group 7: y = 2688, 224, -50 over d = 448 -> 6 (7), 0.5 (1), -0.11 (8).
  expect_bytes(rec, 56, {0x17, 0x08}, "group 7");
  expect_bytes(rec, 255, {0xF0}, "group 31");
  expect_hand_rope_fp8(rec);
  // Reader: (e2m1 * d) * s_t, s_t read from the record.
  const auto d = decode(k368Dynamic, rec);
  expect_same_float(d.kv[0], 6.0f, "6 * 0.5 * 2");
  expect_same_float(d.kv[9], 4.0f, "4 * 0.5 * 2");
  expect_same_float(d.kv[32], 7.5f, "6 * 0.625 * 2");
  expect_same_float(d.kv[48], 0.015625f, "4 * 2^-9 * 2");
  expect_same_float(d.kv[49], -0.005859375f, "-1.5 * 2^-9 * 2");
  expect_same_float(d.kv[64], 0.0f, "group 4 lost");
  expect_same_float(d.kv[112], 5376.0f, "6 * 448 * 2: exact, unlike implicit mode");
  expect_same_float(d.kv[113], 448.0f, "0.5 * 448 * 2");
  expect_same_float(d.kv[511], -3.0f, "-6 * 0.25 * 2");
  expect_matches_reference(k368Dynamic, t);
}

// ---- nvfp4, static per-layer scale -------------------------------------------------------

TEST(RecordGolden, Nvfp4StaticHandToken) {
  // s_l = 0.5: y = 2x exactly; nothing is stored at [292,296).
  const Token t = hand_token();
  for (const Config* c : {&k368Static, &k432Static}) {
    SCOPED_TRACE(c->name);
    const auto rec = encode(*c, t, 0.5f);
    // Scales of y: 2 (0x40); 2.125 tie 2|2.25 -> 0x40; 2.375 tie 2.25|2.5 -> 0x42; 3*2^-9 (0x03);
    // 1.71*2^-9 -> 0x02; 0; 3.3e-5 -> 0; 1792 -> 448 (0x7E); ...; 1 (0x38).
    expect_bytes(rec, 256, {0x40, 0x40, 0x42, 0x03, 0x02, 0x00, 0x00, 0x7E}, "scales 0..7");
    expect_zero(rec, 264, 287, "scales 8..30");
    expect_bytes(rec, 287, {0x38}, "scale 31");
    expect_bytes(rec, 0, {0xE7, 0xC5, 0xA3, 0x81, 0x60, 0x4F, 0x82, 0x62, 0x47, 0x1F}, "groups 0-1");
    expect_bytes(rec, 16, {0x47, 0x0B}, "group 2");
    // Group 3, d = 3*2^-9: 9*2^-8 / d = 6 (7), -3*2^-8 / d = -2 (C).
    expect_bytes(rec, 24, {0xC7}, "group 3");
    // Group 4, d = 2^-8: 5.12 -> 7, -0.512 -> 9.
    expect_bytes(rec, 32, {0x97}, "group 4");
    expect_zero(rec, 48, 56, "group 6");
    // Group 7: y = 10752, 896, -200 over d = 448 -> 24 (7), 2 (4), -0.45 (9).
    expect_bytes(rec, 56, {0x47, 0x09}, "group 7");
    expect_bytes(rec, 255, {0xF0}, "group 31");
    if (c == &k368Static) {
      expect_hand_rope_fp8(rec);  // RoPE never sees the latent outer scale
      expect_zero(rec, 292, 304, "token scale field and padding");
    } else {
      expect_zero(rec, 288, 304, "padding");
      expect_hand_rope_bf16(rec, 304);
    }
    // Reader: (e2m1 * d) * s_l.
    const auto d = decode(*c, rec, 0.5f);
    expect_same_float(d.kv[0], 6.0f, "6 * 2 * 0.5");
    expect_same_float(d.kv[48], 0.017578125f, "6 * 3*2^-9 * 0.5: exact");
    expect_same_float(d.kv[49], -0.005859375f, "-2 * 3*2^-9 * 0.5");
    expect_same_float(d.kv[64], 0.01171875f, "6 * 2^-8 * 0.5");
    expect_same_float(d.kv[112], 1344.0f, "6 * 448 * 0.5 (saturated)");
    expect_same_float(d.kv[113], 448.0f, "2 * 448 * 0.5");
    expect_same_float(d.kv[114], -112.0f, "-0.5 * 448 * 0.5");
    expect_same_float(d.kv[511], -3.0f, "-6 * 1 * 0.5");
    expect_matches_reference(*c, t, 0.5f);
  }
}

// ---- fp8_ds_mla ------------------------------------------------------------------------------

TEST(RecordGolden, Fp8HandTokens) {
  {
    // Tile scale edge cases: tile 0 amax 448 -> p = 1; tile 1 amax 449 -> p = 2 (the smallest
    // power of two with amax <= 448 p); tile 2 amax 2^-120 -> 2^-128 is below the floor, p = 2^-126;
    // tile 3 amax 1.5*2^-130 (an fp32 subnormal) -> p = 2^-126.
    Token t;
    const float tile0[7] = {448, 1.0625f, 17, -0x1p-10f, 0x1.8p-9f, -1, 0.3f};
    for (int i = 0; i < 7; ++i) t.kv[i] = tile0[i];
    t.kv[128] = 449.0f;
    t.kv[129] = 3.0f;
    t.kv[256] = 0x1p-120f;
    t.kv[257] = -0x1p-121f;
    t.kv[384] = 0x1p-130f;
    t.kv[385] = -0x1.8p-130f;
    const auto rec = encode(kFp8, t);
    // 448, 1.0625 (tie -> 1), 17 (tie 16|18 -> 16), -2^-10 (tie -> -0), 1.5*2^-9 (tie -> 2*2^-9), -1, 0.3125.
    expect_bytes(rec, 0, {0x7E, 0x38, 0x58, 0x80, 0x02, 0xB8, 0x2A}, "tile 0");
    expect_bytes(rec, 128, {0x76, 0x3C}, "tile 1: 224.5 -> 224, 1.5");
    expect_bytes(rec, 256, {0x68, 0xE0}, "tile 2: 64, -32");
    expect_bytes(rec, 384, {0x18, 0x9C}, "tile 3: 2^-4, -1.5*2^-4");
    expect_f32_at(rec, 512, 0x3F800000u, "p0 = 1");
    expect_f32_at(rec, 516, 0x40000000u, "p1 = 2");
    expect_f32_at(rec, 520, 0x00800000u, "p2 = 2^-126");
    expect_f32_at(rec, 524, 0x00800000u, "p3 = 2^-126");
    expect_zero(rec, 528, 656, "rope");
    const auto d = decode(kFp8, rec);
    const float want[7] = {448, 1, 16, -0.0f, 0.00390625f, -1, 0.3125f};
    for (int i = 0; i < 7; ++i) expect_same_float(d.kv[i], want[i], "tile 0 value " + std::to_string(i));
    expect_same_float(d.kv[128], 448.0f, "224 * 2");
    expect_same_float(d.kv[256], 0x1p-120f, "64 * 2^-126");
    expect_same_float(d.kv[257], -0x1p-121f, "-32 * 2^-126");
    expect_same_float(d.kv[384], 0x1p-130f, "2^-4 * 2^-126");
    expect_same_float(d.kv[385], -0x1.8p-130f, "-1.5*2^-4 * 2^-126");
    expect_matches_reference(kFp8, t);
  }
  {
    // The hand token G: tile 0 amax 5376 -> p = 16; tiles 1-2 zero -> p = 1; tile 3 amax 3 -> 2^-7.
    const Token t = hand_token();
    const auto rec = encode(kFp8, t);
    expect_f32_at(rec, 512, 0x41800000u, "p0 = 16");
    expect_f32_at(rec, 516, 0x3F800000u, "p1 = 1");
    expect_f32_at(rec, 520, 0x3F800000u, "p2 = 1");
    expect_f32_at(rec, 524, 0x3C000000u, "p3 = 2^-7");
    // 6/16 = 0.375, -4/16 = -0.25; 9*2^-13 -> 2^-9 (subnormal), -3*2^-13 -> -0;
    // 336 (tie 320|352 -> 320), 28, -6.25 (tie 6|6.5 -> 6); -3 * 128 = -384.
    expect_bytes(rec, 0, {0x2C, 0xA8}, "tile 0 start");
    expect_bytes(rec, 7, {0x80}, "-0 input");
    expect_bytes(rec, 48, {0x01, 0x80}, "subnormal E4M3 bytes");
    expect_bytes(rec, 96, {0x00, 0x80}, "1e-4 / 16 underflows, keeping the sign");
    expect_bytes(rec, 112, {0x7A, 0x5E, 0xCC}, "E4M3 ties");
    expect_bytes(rec, 511, {0xFC}, "-384");
    expect_hand_rope_bf16(rec, 528);
    const auto d = decode(kFp8, rec);
    expect_same_float(d.kv[112], 5120.0f, "320 * 16");
    expect_same_float(d.kv[114], -96.0f, "-6 * 16");
    expect_same_float(d.kv[48], 0x1p-9f * 16, "2^-9 * 16");
    expect_same_float(d.kv[511], -3.0f, "-384 * 2^-7");
    expect_matches_reference(kFp8, t);
  }
}

// ---- bf16 reference record -------------------------------------------------------------------

TEST(RecordGolden, Bf16HandToken) {
  const Token t = hand_token();
  const auto rec = encode(kBf16, t);
  // 6 = 0x40C0, -4 = 0xC080, 6.375 = 0x40CC, 0.3 -> 0x3E9A (rounded up), 0.01 -> 0x3C24 (0x3C23D70A
  // rounds up), 5376 = 0x45A8, -3 = 0xC040.
  expect_bytes(rec, 0, {0xC0, 0x40, 0x80, 0xC0}, "kv_c[0..1]");
  expect_bytes(rec, 14, {0x00, 0x80}, "kv_c[7] = -0");
  expect_bytes(rec, 32, {0xCC, 0x40}, "kv_c[16]");
  expect_bytes(rec, 38, {0x9A, 0x3E}, "kv_c[19]");
  expect_bytes(rec, 128, {0x24, 0x3C}, "kv_c[64]");
  expect_bytes(rec, 224, {0xA8, 0x45}, "kv_c[112]");
  expect_bytes(rec, 1022, {0x40, 0xC0}, "kv_c[511]");
  expect_hand_rope_bf16(rec, 1024);
  // BF16 inputs are stored unchanged, NaN payloads included.
  std::vector<Bf16Bits> kv(kLatentDim, Bf16Bits{0}), pe(kRopeDim, Bf16Bits{0});
  kv[0] = {0x7FC1};
  kv[1] = {0xFF80};
  kv[2] = {0x0001};
  pe[5] = {0x8001};
  std::vector<uint8_t> raw(1152, 0xA5);
  record::encode(kSpecBf16, kv.data(), pe.data(), 1.0f, raw.data());
  expect_bytes(raw, 0, {0xC1, 0x7F, 0x80, 0xFF, 0x01, 0x00}, "raw bf16 latent");
  expect_bytes(raw, 1024 + 10, {0x01, 0x80}, "raw bf16 rope");
  expect_zero(raw, 6, 1024, "rest of latent");
  expect_matches_reference(kBf16, t);
}

// ---- magnitude edge cases --------------------------------------------------------------------

Token alternating(float m) {
  Token t;
  for (int j = 0; j < kLatentDim; ++j) t.kv[j] = j % 2 ? -m : m;
  for (int i = 0; i < kRopeDim; ++i) t.pe[i] = i % 2 ? -m : m;
  return t;
}

TEST(RecordGolden, TokenAt1em4) {
  const Token t = alternating(1e-4f);  // 0x38D1B717
  // Implicit: a/6 = 1.7e-5 is below half the smallest E4M3 subnormal (2^-10): every group
  // scale and every nibble is 0 and the whole latent decodes to zero.
  for (const Config* c : {&k368, &k432}) {
    const auto rec = encode(*c, t);
    expect_zero(rec, 0, 288, std::string(c->name) + " latent");
    for (float v : decode(*c, rec).kv) expect_same_float(v, 0.0f, "lost latent");
  }
  // 368 RoPE: rs = RN(1e-4 * C448); r / rs = 448 (1 - 1e-7) -> 448 (0x7E), alternating sign.
  auto rec = encode(k368, t);
  expect_f32_at(rec, 288, bits(ref::mul32(1e-4f, ref::c448())), "rope scale");
  for (int i = 0; i < 64; ++i) EXPECT_EQ(rec[304 + i], i % 2 ? 0xFE : 0x7E) << i;
  // 432 RoPE: 1e-4 rounds up to BF16 0x38D2.
  rec = encode(k432, t);
  for (int i = 0; i < 64; ++i) expect_bytes(rec, 304 + 2 * i, {0xD2, i % 2 ? 0xB8 : 0x38}, "bf16 rope");
  // Dynamic: s_t = RN(1e-4 * C2688); y = +-2688 (1 - 1e-7): every scale 448 (0x7E), every
  // nibble +-6, so every latent byte is 7 | F << 4 = 0xF7.
  const float s_t = ref::mul32(1e-4f, ref::c2688());
  rec = encode(k368Dynamic, t);
  expect_f32_at(rec, 292, bits(s_t), "s_t");
  for (int i = 0; i < 256; ++i) EXPECT_EQ(rec[i], 0xF7) << i;
  for (int g = 0; g < 32; ++g) EXPECT_EQ(rec[256 + g], 0x7E) << g;
  auto d = decode(k368Dynamic, rec);
  expect_same_float(d.kv[0], ref::mul32(2688.0f, s_t), "6 * 448 * s_t");
  EXPECT_NEAR(d.kv[0], 1e-4, 1e-4 * 1e-6);
  // Static, calibrated at this magnitude (s_l = max_abs * C2688): same latent as dynamic,
  // nothing stored at [292,296).
  rec = encode(k368Static, t, s_t);
  for (int i = 0; i < 256; ++i) EXPECT_EQ(rec[i], 0xF7) << i;
  for (int g = 0; g < 32; ++g) EXPECT_EQ(rec[256 + g], 0x7E) << g;
  expect_zero(rec, 292, 304, "no token scale in static mode");
  // fp8_ds_mla: p = 2^-22 (1e-4/448 = 2.2e-7 <= 2^-22); 1e-4 / p = 419.4 -> 416 (0x7D).
  rec = encode(kFp8, t);
  for (int j = 0; j < 512; ++j) EXPECT_EQ(rec[j], j % 2 ? 0xFD : 0x7D) << j;
  for (int k = 0; k < 4; ++k) expect_f32_at(rec, 512 + 4 * k, 0x34800000u, "p = 2^-22");
  d = decode(kFp8, rec);
  expect_same_float(d.kv[1], -416.0f * 0x1p-22f, "-416 * 2^-22");
  // bf16: 0x38D2 / 0xB8D2.
  rec = encode(kBf16, t);
  expect_bytes(rec, 0, {0xD2, 0x38, 0xD2, 0xB8}, "bf16");
  for (const Config* c : kAll) expect_matches_reference(*c, t, s_t);
}

TEST(RecordGolden, TokenAt1em2HasSubnormalGroupScalesInImplicitMode) {
  const Token t = alternating(0.01f);
  // a/6 = 0.00167 = 0.853 * 2^-9 -> E4M3 0x01 (2^-9); 0.01 / 2^-9 = 5.12 -> 6: latent bytes 0xF7.
  const auto rec = encode(k432, t);
  for (int g = 0; g < 32; ++g) EXPECT_EQ(rec[256 + g], 0x01) << g;
  for (int i = 0; i < 256; ++i) EXPECT_EQ(rec[i], 0xF7) << i;
  const auto d = decode(k432, rec);
  expect_same_float(d.kv[0], 0.01171875f, "6 * 2^-9: a 17% error");
  expect_same_float(d.kv[1], -0.01171875f, "-6 * 2^-9");
  for (const Config* c : kAll) expect_matches_reference(*c, t, 0.01f / 2688);
}

TEST(RecordGolden, GroupScaleUsesATrueDivisionBySix) {
  // a = 1.78125 - 2^-23 sits one ulp below 6 * 0.296875, where 0.296875 is the E4M3 midpoint
  // between 0.28125 (0x29) and 0.3125 (0x2A). a / 6 = 0.296875 - 0.67 ulp rounds to the float
  // below the midpoint -> 0x29. A writer that multiplies by fp32(1/6) (= (1/6)(1 + 2^-25)) gets
  // 0.296875 - 0.37 ulp, which rounds onto the midpoint and then ties to 0x2A.
  Token t;
  t.kv[0] = 0x1.c7fffep+0f;
  const auto rec = encode(k368, t);
  expect_bytes(rec, 256, {0x29}, "group 0 scale");
  expect_bytes(rec, 0, {0x07}, "a / 0.28125 = 6.33 -> 6");
  expect_matches_reference(k368, t);
}

// ---- non-finite inputs ------------------------------------------------------------------------

Token non_finite_token() {
  Token t;
  t.kv[0] = kNaN;
  t.kv[1] = kInf;
  t.kv[2] = -kInf;
  t.kv[3] = -1e-30f;  // rounds to zero next to FLT_MAX: keeps its sign
  t.kv[16] = 1.0f;
  t.kv[130] = 2.0f;
  t.pe[0] = kNaN;
  t.pe[1] = kInf;
  t.pe[2] = -kInf;
  t.pe[3] = 1.0f;
  t.pe[4] = FLT_MAX;  // finite, but rounds past the largest BF16
  t.pe[5] = -1e-30f;
  return t;
}

TEST(RecordGolden, NonFiniteInputs) {
  const Token t = non_finite_token();
  // NaN -> 0, +-Inf -> +-FLT_MAX before quantizing.
  {  // nvfp4 implicit. Group 0: a = FLT_MAX, scale 448 (0x7E); 0 | FLT_MAX/448 -> 6 (7);
     // -6 (F) | -1e-30/448 -> -0 (8). Group 1: a/6 = 0.1667 -> 0.171875 (0x23), 1/0.171875 = 5.8 -> 7.
     // Group 8 (element 130): a/6 = 0.333 -> 0.34375 (0x2B), 2/0.34375 = 5.8 -> 7.
    const auto rec = encode(k432, t);
    expect_bytes(rec, 0, {0x70, 0x8F}, "group 0");
    expect_bytes(rec, 8, {0x07}, "group 1");
    expect_bytes(rec, 65, {0x07}, "group 8");
    expect_bytes(rec, 256, {0x7E, 0x23}, "scales 0-1");
    expect_bytes(rec, 264, {0x2B}, "scale 8");
    // Raw BF16 RoPE: NaN -> 0x0000, +Inf -> 0x7F7F, -Inf -> 0xFF7F, 1, FLT_MAX -> 0x7F7F
    // (saturated, where plain rounding would give infinity).
    expect_bytes(rec, 304, {0x00, 0x00, 0x7F, 0x7F, 0x7F, 0xFF, 0x80, 0x3F, 0x7F, 0x7F}, "bf16 rope");
    const auto d = decode(k432, rec);
    expect_same_float(d.kv[0], 0.0f, "NaN -> 0");
    expect_same_float(d.kv[1], 2688.0f, "+Inf -> 6 * 448");
    expect_same_float(d.kv[2], -2688.0f, "-Inf -> -6 * 448");
    expect_same_float(d.kv[3], -0.0f, "-1e-30 -> -0");
    expect_same_float(d.kv[16], 1.03125f, "6 * 0.171875");
    expect_same_float(d.pe[1], 0x1.FEp127f, "saturated BF16");
    expect_same_float(d.pe[2], -0x1.FEp127f, "saturated BF16");
  }
  {  // nvfp4 368 RoPE: rope_amax = FLT_MAX, rs = RN(FLT_MAX * C448); +-FLT_MAX / rs -> +-448.
    const auto rec = encode(k368, t);
    expect_f32_at(rec, 288, bits(ref::mul32(FLT_MAX, ref::c448())), "rope scale");
    expect_bytes(rec, 304, {0x00, 0x7E, 0xFE, 0x00, 0x7E, 0x80}, "fp8 rope");
    const auto d = decode(k368, rec);
    EXPECT_TRUE(std::isfinite(d.pe[1])) << "448 * rs stays finite";
    EXPECT_EQ(d.pe[1], -d.pe[2]);
  }
  {  // Dynamic: token_amax = FLT_MAX -> s_t = RN(FLT_MAX * C2688); y = FLT_MAX / s_t = 2688 exactly
     // here, so group 0 gets 448 and +-6; groups 1 and 8 (y ~ 1e-35) get scale 0.
    const auto rec = encode(k368Dynamic, t);
    const float s_t = ref::mul32(FLT_MAX, ref::c2688());
    expect_f32_at(rec, 292, bits(s_t), "s_t");
    expect_same_float(ref::div32(FLT_MAX, s_t), 2688.0f, "y of the infinite element");
    expect_bytes(rec, 0, {0x70, 0x8F}, "group 0");
    expect_bytes(rec, 256, {0x7E, 0x00}, "scales 0-1");
    const auto d = decode(k368Dynamic, rec);
    EXPECT_TRUE(std::isfinite(d.kv[1]));
    expect_same_float(d.kv[16], 0.0f, "1.0 lost next to FLT_MAX");
  }
  {  // Static s_l = 0.5: y = FLT_MAX / 0.5 overflows to +Inf in fp32; E4M3 and E2M1 saturate,
     // so group 0 is still 448 and +-6 and reads back as +-1344.
    const auto rec = encode(k368Static, t, 0.5f);
    expect_bytes(rec, 0, {0x70, 0x8F}, "group 0");
    expect_bytes(rec, 256, {0x7E}, "scale 0");
    const auto d = decode(k368Static, rec, 0.5f);
    expect_same_float(d.kv[1], 1344.0f, "6 * 448 * 0.5");
  }
  {  // fp8_ds_mla: tile 0 amax FLT_MAX -> p = 2^120 (0x7B800000); FLT_MAX / 2^120 = 255.99998 -> 256
     // (0x78); NaN -> 0; -1e-30 / 2^120 -> -0. Tile 1: amax 2 -> p = 2^-7, 2 / 2^-7 = 256.
    const auto rec = encode(kFp8, t);
    expect_bytes(rec, 0, {0x00, 0x78, 0xF8, 0x80}, "tile 0");
    expect_bytes(rec, 16, {0x00}, "1.0 / 2^120 -> 0");
    expect_bytes(rec, 130, {0x78}, "tile 1");
    expect_f32_at(rec, 512, 0x7B800000u, "p0 = 2^120");
    expect_f32_at(rec, 516, 0x3C000000u, "p1 = 2^-7");
    expect_bytes(rec, 528, {0x00, 0x00, 0x7F, 0x7F, 0x7F, 0xFF, 0x80, 0x3F, 0x7F, 0x7F}, "bf16 rope");
    // The reader overflows: 256 * 2^120 = 2^128 is +Inf in fp32. Every tile value of magnitude
    // >= 248 * 2^120 (about 3.3e38), a sanitized infinity included, reads back as +-Inf.
    const auto d = decode(kFp8, rec);
    EXPECT_EQ(d.kv[1], kInf);
    EXPECT_EQ(d.kv[2], -kInf);
    expect_same_float(d.kv[130], 2.0f, "256 * 2^-7");
  }
  {  // bf16 record of fp32 inputs: plain round-to-nearest-even, no sanitizing: NaN -> 0x7FFF,
     // +-Inf -> 0x7F80/0xFF80, FLT_MAX -> 0x7F80 (overflow), 1 -> 0x3F80.
    const auto rec = encode(kBf16, t);
    expect_bytes(rec, 0, {0xFF, 0x7F, 0x80, 0x7F, 0x80, 0xFF}, "latent");
    expect_bytes(rec, 1024, {0xFF, 0x7F, 0x80, 0x7F, 0x80, 0xFF, 0x80, 0x3F, 0x80, 0x7F}, "rope");
  }
  for (const Config* c : kAll) expect_matches_reference(*c, t, 0.5f);
}

// ---- readers on hand-built records ---------------------------------------------------------

TEST(RecordReader, HandBuiltRecords) {
  {  // nvfp4: scale 0x01 must read as 2^-9 (not 0.0088), 0x08 as 2^-6, 0x7E as 448.
    std::vector<uint8_t> rec(368, 0);
    rec[0] = 0x97;    // element 0: 6 (nibble 7), element 1: -0.5 (nibble 9)
    rec[256] = 0x01;  // group 0: d = 2^-9
    rec[8] = 0x0F;    // element 16: -6
    rec[257] = 0x08;  // group 1: d = 2^-6
    rec[16] = 0x50;   // element 33: 3 (nibble 5, high)
    rec[258] = 0x7E;  // group 2: d = 448
    rec[511 / 2] = 0xB0;  // element 511: -1.5
    rec[287] = 0x07;      // group 31: d = 7 * 2^-9
    ref::put_f32(rec, 292, 0.25f);  // s_t (dynamic)
    ref::put_f32(rec, 288, 2.0f);   // rope scale
    rec[304] = 0x01;                // 2^-9 * 2
    rec[305] = 0xFE;                // -448 * 2
    Token d = decode(k368, rec);  // implicit: s = 1, the stored s_t is not read
    expect_same_float(d.kv[0], 6 * 0x1p-9f, "6 * 2^-9");
    expect_same_float(d.kv[1], -0.5f * 0x1p-9f, "-0.5 * 2^-9");
    expect_same_float(d.kv[16], -6 * 0x1p-6f, "-6 * 2^-6");
    expect_same_float(d.kv[33], 3 * 448.0f, "3 * 448");
    expect_same_float(d.kv[511], -1.5f * 7 * 0x1p-9f, "-1.5 * 7 * 2^-9");
    expect_same_float(d.pe[0], 0x1p-8f, "2^-9 * 2");
    expect_same_float(d.pe[1], -896.0f, "-448 * 2");
    d = decode(k368Dynamic, rec);  // s_t = 0.25 from the record
    expect_same_float(d.kv[0], 6 * 0x1p-9f * 0.25f, "dynamic");
    expect_same_float(d.kv[33], 336.0f, "3 * 448 * 0.25");
    d = decode(k368Static, rec, 3.0f);  // s_l = 3, given by the caller
    expect_same_float(d.kv[16], -6 * 0x1p-6f * 3, "static");
    // One rounding: (6 * 7*2^-9) * 0.1 rounds once in fp32.
    d = decode(k368Static, rec, 0.1f);
    expect_same_float(d.kv[511], static_cast<float>(-1.5 * 7 * 0x1p-9 * static_cast<double>(0.1f)), "static 0.1");
  }
  {  // fp8_ds_mla: e4m3 * p per 128-dim tile, subnormal bytes exact.
    std::vector<uint8_t> rec(656, 0);
    rec[0] = 0x01;
    rec[127] = 0x87;
    rec[128] = 0x7E;
    rec[511] = 0x38;
    ref::put_f32(rec, 512, 0.5f);
    ref::put_f32(rec, 516, 0x1p-126f);
    ref::put_f32(rec, 524, 3.0f);  // not a power of two: the reader still multiplies
    ref::put_u16(rec, 528, 0x7F7F);
    ref::put_u16(rec, 654, 0x8001);
    const Token d = decode(kFp8, rec);
    expect_same_float(d.kv[0], 0x1p-10f, "2^-9 * 0.5");
    expect_same_float(d.kv[127], -7 * 0x1p-10f, "-7 * 2^-9 * 0.5");
    expect_same_float(d.kv[128], 448 * 0x1p-126f, "448 * 2^-126");
    expect_same_float(d.kv[511], 3.0f, "1 * 3");
    expect_same_float(d.pe[0], 0x1.FEp127f, "0x7F7F");
    expect_same_float(d.pe[63], -0x1p-133f, "0x8001: a BF16 subnormal");
  }
  {  // 432: raw BF16 RoPE at 304.
    std::vector<uint8_t> rec(432, 0);
    ref::put_u16(rec, 304, 0x3FC0);
    ref::put_u16(rec, 430, 0xC2F7);
    const Token d = decode(k432, rec);
    expect_same_float(d.pe[0], 1.5f, "0x3FC0");
    expect_same_float(d.pe[63], -123.5f, "0xC2F7");
  }
}

}  // namespace
