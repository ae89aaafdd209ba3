// The synthetic workload: deterministic, independent samples, the GLM-5.2 magnitude span.
#include <gtest/gtest.h>

#include <cmath>

#include "nvfp4mla/codec.h"
#include "nvfp4mla/error.h"
#include "nvfp4mla/eval/random.h"
#include "nvfp4mla/eval/workload.h"

using namespace nvfp4mla;
using namespace nvfp4mla::eval;

TEST(EvalWorkload, SameSeedSameTokensOtherSampleOtherTokens) {
  const SyntheticWorkload a(7), b(7), c(8);
  const TokenBlock x = a.tokens(3, Sample::evaluation, 0, 100, 16);
  EXPECT_EQ(x.kv_c, b.tokens(3, Sample::evaluation, 0, 100, 16).kv_c);
  EXPECT_EQ(x.k_pe, b.tokens(3, Sample::evaluation, 0, 100, 16).k_pe);
  EXPECT_NE(x.kv_c, a.tokens(3, Sample::calibration, 0, 100, 16).kv_c);
  EXPECT_NE(x.kv_c, c.tokens(3, Sample::evaluation, 0, 100, 16).kv_c);
  // A longer draw from the same stream starts with the same tokens.
  const TokenBlock longer = a.tokens(3, Sample::evaluation, 0, 100, 32);
  EXPECT_TRUE(std::equal(x.kv_c.begin(), x.kv_c.end(), longer.kv_c.begin()));
}

TEST(EvalWorkload, LayerMagnitudesSpanShallowToDeep) {
  const SyntheticWorkload w(52);
  ASSERT_EQ(w.num_layers(), 78);
  EXPECT_NEAR(w.nominal_max_abs(0), 0.02, 1e-12);
  EXPECT_NEAR(w.nominal_max_abs(77), 5.2, 1e-9);
  for (int l : {0, 20, 40, 77}) {
    const double measured = w.tokens(l, Sample::evaluation, 0, 0, 512).max_abs_kv_c();
    EXPECT_GT(measured, 0.4 * w.nominal_max_abs(l)) << "layer " << l;
    EXPECT_LT(measured, 3.0 * w.nominal_max_abs(l)) << "layer " << l;
  }
  EXPECT_THROW(w.tokens(78, Sample::evaluation, 0, 0, 1), Error);
}

TEST(EvalWorkload, RopeKeysAreRotationsOfTheBase) {
  const SyntheticWorkload w(1);
  double base[kRopeDim], r0[kRopeDim], r1[kRopeDim];
  for (int i = 0; i < kRopeDim; ++i) base[i] = 0.1 * (i + 1);
  w.apply_rope(base, 0, r0);
  w.apply_rope(base, 12345, r1);
  double n0 = 0, n1 = 0, nb = 0;
  for (int i = 0; i < kRopeDim; ++i) {
    EXPECT_NEAR(r0[i], base[i], 1e-12);  // position 0 is the identity
    n0 += r0[i] * r0[i];
    n1 += r1[i] * r1[i];
    nb += base[i] * base[i];
  }
  EXPECT_NEAR(n1, nb, 1e-9);  // rotations keep the norm
}

TEST(EvalWorkload, NormalDrawsHaveUnitVariance) {
  Rng r(stream_key(1, 2, 3));
  double s = 0, s2 = 0;
  int tail = 0;
  const int n = 200000;
  for (int i = 0; i < n; ++i) {
    const double x = r.normal();
    s += x;
    s2 += x * x;
    tail += std::fabs(x) > 3.0;
  }
  EXPECT_NEAR(s / n, 0.0, 0.01);
  EXPECT_NEAR(s2 / n, 1.0, 0.02);
  EXPECT_NEAR(tail / double(n), 2.7e-3, 0.6e-3);  // P(|x| > 3) of a standard normal
}

TEST(EvalWorkload, BranchFreeBf16RoundingMatchesTheCodec) {
  Rng r(stream_key(4, 5));
  for (int i = 0; i < 1000000; ++i) {
    uint32_t u = static_cast<uint32_t>(r.next());
    if ((u & 0x7F800000u) == 0x7F800000u) continue;  // finite inputs only
    const float x = codec::bits_float(u);
    ASSERT_EQ(bf16_bits_finite(x), codec::bf16_encode_rn(x)) << std::hex << u;
  }
  for (uint32_t u : {0x3F808000u, 0x3F818000u, 0x7F7FFFFFu, 0x00008000u, 0x80018000u})  // ties, overflow, subnormals
    EXPECT_EQ(bf16_bits_finite(codec::bits_float(u)), codec::bf16_encode_rn(codec::bits_float(u))) << std::hex << u;
}
