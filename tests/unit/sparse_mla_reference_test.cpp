// The CPU attention reference (sparse_mla_reference, sparse_mla_scores_reference) against what it
// must compute, independently of its own code: small problems worked out by hand (outputs and
// LSE in closed form, records built byte by byte from docs/FORMAT.md), and the fp64 oracle of
// support/attention_oracle.h on random problems in every record format and scale mode. The
// reference is the oracle of every GPU attention test, so it is checked here first.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "nvfp4mla/format.h"
#include "nvfp4mla/sparse_mla.h"
#include "support/attention_oracle.h"
#include "support/attention_problem.h"
#include "support/record_specs.h"

using namespace nvfp4mla;
namespace oracle = nvfp4mla::testing::oracle;

namespace {

constexpr int32_t kMin = std::numeric_limits<int32_t>::min(), kMax = std::numeric_limits<int32_t>::max();
constexpr double kInf = std::numeric_limits<double>::infinity();

// Bits of a value that BF16 holds exactly.
uint16_t bf16_bits(float v) {
  uint32_t b;
  std::memcpy(&b, &v, 4);
  EXPECT_EQ(b & 0xFFFFu, 0u) << v << " is not a BF16 value";
  return static_cast<uint16_t>(b >> 16);
}
void put_bf16(uint8_t* p, float v) {
  const uint16_t b = bf16_bits(v);
  p[0] = static_cast<uint8_t>(b);
  p[1] = static_cast<uint8_t>(b >> 8);
}
void put_fp32(uint8_t* p, float v) {
  uint32_t b;
  std::memcpy(&b, &v, 4);
  for (int i = 0; i < 4; ++i) p[i] = static_cast<uint8_t>(b >> (8 * i));
}

// Out, LSE and scores of the reference on a problem.
struct Outputs {
  std::vector<float> out, lse, scores;
};
Outputs run_reference(const nvfp4mla::testing::AttentionProblem& p, LseBase base = LseBase::natural, bool bf16_operands = false) {
  SparseMlaArgs a = p.host_args();
  a.lse_base = base;
  const size_t pairs = static_cast<size_t>(p.rows) * p.heads;
  Outputs o{std::vector<float>(pairs * kLatentDim), std::vector<float>(pairs), std::vector<float>(pairs * p.topk)};
  sparse_mla_reference(p.spec, a, o.out.data(), o.lse.data(), {.bf16_operands = bf16_operands});
  sparse_mla_scores_reference(p.spec, a, o.scores.data(), {.bf16_operands = bf16_operands});
  return o;
}

// Values of three bf16 slots (small integers and halves: exact everywhere below).
float va(int d) { return static_cast<float>(d % 7 - 3); }
float vb(int d) { return 0.5f * static_cast<float>(d % 5 - 2); }
float vc(int d) { return d % 3 == 0 ? 4.0f : -0.25f; }

// A hand-built problem over bf16 records: slots 0..2 hold V = va, vb, vc and RoPE dim 0 =
// rope[slot], which drives the score (q of every row is the unit vector there), so scores and
// values are independent. Slot 3 is NaN (never read), and so is the guard past the end (slot 4
// = capacity).
nvfp4mla::testing::AttentionProblem hand_problem(const float (&rope)[3], int rows, int topk) {
  nvfp4mla::testing::AttentionProblem p;
  p.spec = kSpecBf16;
  p.rows = rows;
  p.heads = 1;
  p.topk = topk;
  p.capacity = 4;
  p.sm_scale = 1.0f;
  const int rb = kSpecBf16.record_bytes();
  p.cache.assign(5 * rb, 0xFF);
  float (*value[3])(int) = {va, vb, vc};
  for (int s = 0; s < 3; ++s) {
    uint8_t* r = &p.cache[static_cast<size_t>(s) * rb];
    std::memset(r, 0, rb);
    for (int d = 0; d < kLatentDim; ++d) put_bf16(r + 2 * d, value[s](d));
    put_bf16(r + 2 * kLatentDim, rope[s]);
    put_bf16(r + 2 * kLatentDim + 2, 100.0f);  // RoPE dim 1: q is 0 there
  }
  p.q.assign(static_cast<size_t>(rows) * p.heads * kQkDim, 0);
  for (int r = 0; r < rows; ++r) p.q[static_cast<size_t>(r) * kQkDim + kLatentDim] = bf16_bits(1.0f);
  p.indices.assign(static_cast<size_t>(rows) * topk, -1);
  return p;
}

void expect_row(const Outputs& o, int row, const std::vector<double>& want_out, double want_lse) {
  SCOPED_TRACE("row " + std::to_string(row));
  for (int d = 0; d < kLatentDim; ++d)
    EXPECT_NEAR(o.out[static_cast<size_t>(row) * kLatentDim + d], want_out[d], 1e-6 * (1.0 + std::fabs(want_out[d]))) << "dim " << d;
  if (std::isinf(want_lse)) EXPECT_EQ(o.lse[row], -std::numeric_limits<float>::infinity());
  else EXPECT_NEAR(o.lse[row], want_lse, 1e-6 * (1.0 + std::fabs(want_lse)));
}

std::vector<double> mix(double wa, double wb, double wc) {
  std::vector<double> v(kLatentDim);
  for (int d = 0; d < kLatentDim; ++d) v[d] = wa * va(d) + wb * vb(d) + wc * vc(d);
  return v;
}

}  // namespace

TEST(SparseMlaReference, HandWorkedSoftmaxes) {
  const float rope[3] = {1.0f, 0.0f, 0.0f};
  auto p = hand_problem(rope, 6, 3);
  auto set_row = [&](int r, std::vector<int32_t> idx) {
    for (int k = 0; k < 3; ++k) p.indices[static_cast<size_t>(r) * 3 + k] = idx[k];
  };
  set_row(0, {0, 1, 2});        // scores 1, 0, 0: P = e, 1, 1 over e + 2
  set_row(1, {1, 2, -1});       // two equal scores: the plain mean, lse = 0 + ln 2
  set_row(2, {1, 1, 2});        // a duplicate counts twice: (2 vb + vc) / 3, lse = ln 3
  set_row(3, {4, kMin, 2});     // capacity and INT32_MIN are masked: vc alone, lse = 0
  set_row(4, {kMax, 4, -1});    // nothing valid: 0 and -inf
  set_row(5, {3, 0, 1});        // topk_length 0: nothing, not even slot 3 (NaN), is read
  p.topk_length = {3, 3, 3, 3, 3, 0};
  const auto o = run_reference(p);
  const double e = std::exp(1.0);
  expect_row(o, 0, mix(e / (e + 2), 1 / (e + 2), 1 / (e + 2)), std::log(e + 2));
  expect_row(o, 1, mix(0, 0.5, 0.5), std::log(2.0));
  expect_row(o, 2, mix(0, 2.0 / 3, 1.0 / 3), std::log(3.0));
  expect_row(o, 3, mix(0, 0, 1), 0.0);
  expect_row(o, 4, mix(0, 0, 0), -kInf);
  expect_row(o, 5, mix(0, 0, 0), -kInf);
  // Scores: sm_scale q.K per position, -inf where masked.
  const std::vector<float> want_scores = {1, 0, 0, 0, 0, -INFINITY, 0, 0, 0, -INFINITY, -INFINITY, 0,
                                          -INFINITY, -INFINITY, -INFINITY, -INFINITY, -INFINITY, -INFINITY};
  EXPECT_EQ(o.scores, want_scores);
}

TEST(SparseMlaReference, HandWorkedOneHotScaleBase2AndHeads) {
  // Slot 1's score is 511 below slot 0's: its weight e^-511 vanishes next to fp32's precision.
  const float rope[3] = {2.0f, -1020.0f, 0.0f};
  auto p = hand_problem(rope, 2, 2);
  p.heads = 2;
  p.q.assign(2 * 2 * kQkDim, 0);
  p.sm_scale = 0.5f;
  for (int r = 0; r < 2; ++r) {
    p.q[(r * 2 + 0) * kQkDim + kLatentDim] = bf16_bits(1.0f);   // head 0: RoPE dim 0
    p.q[(r * 2 + 1) * kQkDim + kLatentDim] = bf16_bits(-2.0f);  // head 1: -2 x RoPE dim 0
  }
  p.indices = {0, 1, 0, 2};
  const auto o = run_reference(p, LseBase::base2);
  auto expect = [&](int rh, const std::vector<double>& out, double lse_nat) {
    SCOPED_TRACE("row/head " + std::to_string(rh));
    for (int d = 0; d < kLatentDim; ++d) EXPECT_NEAR(o.out[static_cast<size_t>(rh) * kLatentDim + d], out[d], 1e-6 * (1 + std::fabs(out[d])));
    EXPECT_NEAR(o.lse[rh], lse_nat / std::log(2.0), 1e-6 * (1 + std::fabs(lse_nat)));
  };
  // Row 0: scores head 0 {1, -510}, head 1 {-2, 1020}. Row 1: head 0 {1, 0}, head 1 {-2, 0}.
  expect(0, mix(1, 0, 0), 1.0);
  expect(1, mix(0, 1, 0), 1020.0);
  const double e = std::exp(1.0), e2 = std::exp(-2.0);
  expect(2, mix(e / (e + 1), 0, 1 / (e + 1)), std::log(e + 1));
  expect(3, mix(e2 / (e2 + 1), 0, 1 / (e2 + 1)), std::log(e2 + 1));
  EXPECT_EQ(o.scores, (std::vector<float>{1, -510, -2, 1020, 1, 0, -2, 0}));
}

// One entry per problem: out is its V and lse its score, so each format's reader is checked on
// a record built byte by byte, with values worked out from FORMAT.md by hand.
TEST(SparseMlaReference, HandBuiltRecordOfEveryFormat) {
  struct Case {
    RecordSpec spec;
    float layer_scale;
    std::vector<uint8_t> record;
    std::vector<std::pair<int, float>> v;  // (dim, value); every other latent dim is 0
    float rope0;                           // dequantized RoPE dim 0
  };
  std::vector<Case> cases;
  {  // fp8_ds_mla: E4M3 bytes times power-of-two tile scales; BF16 RoPE at 528.
    Case c{kSpecFp8, 1.0f, std::vector<uint8_t>(656, 0), {}, 3.0f};
    const float tile[4] = {0.125f, 1.0f, 4.0f, 0.5f};
    for (int t = 0; t < 4; ++t) put_fp32(&c.record[512 + 4 * t], tile[t]);
    c.record[0] = 0x38;    // 1.0 x 1/8
    c.record[1] = 0x3C;    // 1.5 x 1/8
    c.record[130] = 0x40;  // 2.0 x 1
    c.record[300] = 0xB8;  // -1.0 x 4
    c.record[400] = 0x01;  // 2^-9 x 1/2 (subnormal)
    c.record[511] = 0x7E;  // 448 x 1/2
    c.v = {{0, 0.125f}, {1, 0.1875f}, {130, 2.0f}, {300, -4.0f}, {400, 0x1p-10f}, {511, 224.0f}};
    put_bf16(&c.record[528], 3.0f);
    cases.push_back(c);
  }
  // NVFP4: element j's nibble in byte j/2 (even j low), E4M3 group scale at 256 + j/16.
  auto nvfp4_latent = [](std::vector<uint8_t>& r) {
    r[0] = 0x2B;    // element 0: code 0xB = -1.5; element 1: code 2 = 1.0
    r[256] = 0x48;  // group 0 scale 4.0
    r[8] = 0x07;    // element 16: code 7 = 6.0
    r[257] = 0x01;  // group 1 scale 2^-9
    r[255] = 0xC0;  // element 511: code 0xC = -2.0
    r[287] = 0x30;  // group 31 scale 0.5
  };
  const std::vector<std::pair<int, float>> nvfp4_unit = {{0, -6.0f}, {1, 4.0f}, {16, 6 * 0x1p-9f}, {511, -1.0f}};
  auto scaled = [&](float s) {
    std::vector<std::pair<int, float>> v = nvfp4_unit;
    for (auto& [d, x] : v) x *= s;
    return v;
  };
  for (ScaleMode mode : {ScaleMode::implicit, ScaleMode::static_calibrated, ScaleMode::dynamic}) {
    // 368 bytes: fp32 RoPE scale at 288, token scale at 292 (read in dynamic mode only), E4M3 RoPE at 304.
    Case c{{CacheDtype::nvfp4_ds_mla, RopeEncoding::fp8, mode}, 0.125f, std::vector<uint8_t>(368, 0), {}, 1.5f};
    nvfp4_latent(c.record);
    put_fp32(&c.record[288], 0.5f);
    put_fp32(&c.record[292], 0.25f);
    c.record[304] = 0x44;  // 3.0 x 0.5
    c.v = scaled(mode == ScaleMode::implicit ? 1.0f : mode == ScaleMode::dynamic ? 0.25f : 0.125f);
    cases.push_back(c);
    if (mode == ScaleMode::dynamic) continue;
    // 432 bytes: BF16 RoPE at 304; bytes [288, 304) are zero.
    Case w{{CacheDtype::nvfp4_ds_mla, RopeEncoding::bf16, mode}, 0.125f, std::vector<uint8_t>(432, 0), {}, -0.75f};
    nvfp4_latent(w.record);
    put_bf16(&w.record[304], -0.75f);
    w.v = scaled(mode == ScaleMode::implicit ? 1.0f : 0.125f);
    cases.push_back(w);
  }
  {  // bf16: 512 + 64 BF16 values.
    Case c{kSpecBf16, 1.0f, std::vector<uint8_t>(1152, 0), {{5, -2.5f}, {511, 0.0078125f}}, 7.0f};
    put_bf16(&c.record[10], -2.5f);
    put_bf16(&c.record[1022], 0.0078125f);
    put_bf16(&c.record[1024], 7.0f);
    cases.push_back(c);
  }
  for (const Case& c : cases) {
    SCOPED_TRACE(nvfp4mla::testing::spec_name(c.spec));
    ASSERT_EQ(static_cast<int>(c.record.size()), c.spec.record_bytes());
    nvfp4mla::testing::AttentionProblem p;
    p.spec = c.spec;
    p.rows = p.heads = 1;
    p.topk = 4;
    p.capacity = 1;
    p.sm_scale = 0.25f;
    p.layer_scale = c.layer_scale;
    p.cache = c.record;
    p.cache.resize(2 * c.record.size(), 0xFF);  // a NaN guard record past the end
    p.q.assign(kQkDim, 0);
    p.q[kLatentDim] = bf16_bits(2.0f);
    p.indices = {0, 1, -1, kMin};  // 1 = capacity
    const auto [out, lse, scores] = run_reference(p);
    std::vector<float> want(kLatentDim, 0.0f);
    for (const auto& [d, x] : c.v) want[d] = x;
    EXPECT_EQ(out, want);
    EXPECT_EQ(lse[0], 0.5f * c.rope0);  // one entry: lse = its score = 0.25 x 2 x RoPE dim 0
    EXPECT_EQ(scores, (std::vector<float>{0.5f * c.rope0, -INFINITY, -INFINITY, -INFINITY}));
  }
}

namespace {

// Reference against oracle on one problem: out and LSE within the reference's fp32 rounding
// (plus fp64 summation-order noise), scores within one fp32 rounding.
void expect_reference_matches_oracle(const nvfp4mla::testing::AttentionProblem& p, LseBase base, bool bf16_operands) {
  const auto [out, lse, scores] = run_reference(p, base, bf16_operands);
  SparseMlaArgs a = p.host_args();
  a.lse_base = base;
  const oracle::Result o = oracle::attention(p.spec, a, {.bf16_operands = bf16_operands, .bounds = true});
  int bad = 0;
  for (size_t i = 0; i < out.size(); ++i) {
    const double tol = 0x1p-23 * std::fabs(o.out[i]) + 1e-9 * o.element_bound[i];
    if (!(std::fabs(out[i] - o.out[i]) <= tol) && bad++ < 5)
      ADD_FAILURE() << "out " << i / kLatentDim << " dim " << i % kLatentDim << ": reference " << out[i] << ", oracle " << o.out[i];
  }
  for (size_t i = 0; i < lse.size(); ++i) {
    const bool ok = std::isinf(o.lse[i]) ? lse[i] == -INFINITY : std::fabs(lse[i] - o.lse[i]) <= 0x1p-23 * std::fabs(o.lse[i]) + 1e-12;
    if (!ok && bad++ < 10) ADD_FAILURE() << "lse " << i << ": reference " << lse[i] << ", oracle " << o.lse[i];
  }
  for (size_t i = 0; i < scores.size(); ++i) {
    const bool ok = std::isinf(o.scores[i]) ? scores[i] == -INFINITY : std::fabs(scores[i] - o.scores[i]) <= 0x1p-23 * std::fabs(o.scores[i]) + 1e-9;
    if (!ok && bad++ < 15) ADD_FAILURE() << "score " << i << ": reference " << scores[i] << ", oracle " << o.scores[i];
  }
  EXPECT_EQ(bad, 0);
}

}  // namespace

TEST(SparseMlaReference, MatchesTheOracleInEveryFormatAndScaleMode) {
  nvfp4mla::testing::ProblemOptions lengths;
  lengths.lengths = true;
  nvfp4mla::testing::ProblemOptions degenerate;
  degenerate.degenerate = true;
  const nvfp4mla::testing::ProblemOptions wide = nvfp4mla::testing::ProblemOptions::wide_magnitudes();
  uint64_t seed = 2800;
  for (const RecordSpec& spec : nvfp4mla::testing::kAllRecordSpecs) {
    SCOPED_TRACE(nvfp4mla::testing::spec_name(spec));
    {
      SCOPED_TRACE("lengths");
      const auto p = nvfp4mla::testing::make_problem(spec, 6, 4, 96, seed++, lengths);
      expect_reference_matches_oracle(p, LseBase::natural, false);
      expect_reference_matches_oracle(p, LseBase::base2, true);
    }
    {
      SCOPED_TRACE("degenerate tokens");
      expect_reference_matches_oracle(nvfp4mla::testing::make_problem(spec, 3, 4, 64, seed++, degenerate), LseBase::natural, true);
    }
    {
      SCOPED_TRACE("wide magnitudes");
      expect_reference_matches_oracle(nvfp4mla::testing::make_problem(spec, 3, 2, 64, seed++, wide), LseBase::base2, false);
    }
    {
      SCOPED_TRACE("topk 3");
      expect_reference_matches_oracle(nvfp4mla::testing::make_problem(spec, 7, 2, 3, seed++), LseBase::natural, false);
    }
  }
}
