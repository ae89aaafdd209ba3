// Evaluation metrics: latent error, group-scale classification, KL divergence, summaries,
// capacity arithmetic.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

#include "nvfp4mla/eval/metrics.h"
#include "nvfp4mla/record.h"

using namespace nvfp4mla;
using namespace nvfp4mla::eval;

TEST(EvalMetrics, LatentErrorExactIsInfiniteSnr) {
  LatentError e;
  const float x[4] = {1, -2, 3, 0};
  e.add_token(x, x, 4);
  EXPECT_EQ(e.mean_relative_error(), 0.0);
  EXPECT_TRUE(std::isinf(e.snr_db()) && e.snr_db() > 0);
}

TEST(EvalMetrics, LatentErrorPerTokenMeanAndPooledSnr) {
  LatentError e;
  const float big[2] = {10, 0}, big_hat[2] = {10, 1};    // rel 0.1
  const float small[2] = {1, 0}, small_hat[2] = {0, 0};  // rel 1.0 (destroyed)
  e.add_token(big, big_hat, 2);
  e.add_token(small, small_hat, 2);
  // Every token counts the same in the mean ...
  EXPECT_NEAR(e.mean_relative_error(), 0.55, 1e-12);
  // ... while the SNR pools signal (101) and error (2) power.
  EXPECT_NEAR(e.snr_db(), 10.0 * std::log10(101.0 / 2.0), 1e-9);
  LatentError f;
  f.merge(e);
  EXPECT_EQ(f.tokens(), 2);
  EXPECT_DOUBLE_EQ(f.mean_relative_error(), e.mean_relative_error());
}

TEST(EvalMetrics, GroupScalesOfTinyTokenAreZeroOrSubnormalInImplicitMode) {
  // A token at magnitude ~1e-3: group amax / 6 falls below E4M3's smallest subnormal for most
  // groups (zero) and into the subnormal range for the largest one.
  std::vector<float> kv(kLatentDim, 1e-4f), pe(kRopeDim, 0.5f);
  kv[0] = 6e-3f;   // group 0: amax / 6 = 1e-3 -> subnormal 2^-9
  kv[16] = 0.6f;   // group 1: amax / 6 = 0.1 -> normal
  std::vector<uint8_t> rec(kSpecNvfp4Fp8Rope.record_bytes());
  record::encode(kSpecNvfp4Fp8Rope, kv.data(), pe.data(), 1.0f, rec.data());
  GroupScaleCounts c;
  count_group_scales(rec.data(), kv.data(), 1.0f, c);
  EXPECT_EQ(c.groups, 32);
  EXPECT_EQ(c.subnormal, 1);
  EXPECT_EQ(c.zero, 30);
  EXPECT_EQ(c.saturated, 0);
}

TEST(EvalMetrics, GroupScalesSaturatedWhenStaticScaleIsTooSmall) {
  RecordSpec spec = kSpecNvfp4Fp8Rope;
  spec.scale_mode = ScaleMode::static_calibrated;
  std::vector<float> kv(kLatentDim, 0.5f), pe(kRopeDim, 0.0f);
  const float s = 1.0f / 2688.0f;  // calibrated for max |kv_c| = 1
  kv[3] = 2.0f;                    // beyond the calibrated range: clipped
  std::vector<uint8_t> rec(spec.record_bytes());
  record::encode(spec, kv.data(), pe.data(), s, rec.data());
  GroupScaleCounts c;
  count_group_scales(rec.data(), kv.data(), s, c);
  EXPECT_EQ(c.saturated, 1);
  EXPECT_EQ(c.zero + c.subnormal, 0);
}

TEST(EvalMetrics, KlDivergence) {
  const float s[3] = {0.0f, 1.0f, -std::numeric_limits<float>::infinity()};
  const float lse = static_cast<float>(std::log(1.0 + std::exp(1.0)));
  EXPECT_NEAR(attention_kl_divergence(s, lse, s, lse, 3), 0.0, 1e-7);
  // P = (1/2, 1/2), Q = (1/(1+e), e/(1+e)): KL = sum p log(p/q).
  const float u[2] = {0.0f, 0.0f};
  const float lu = static_cast<float>(std::log(2.0));
  const double p = 0.5, q0 = 1.0 / (1.0 + std::exp(1.0)), q1 = 1.0 - q0;
  EXPECT_NEAR(attention_kl_divergence(u, lu, s, lse, 2), p * std::log(p / q0) + p * std::log(p / q1), 1e-6);
}

TEST(EvalMetrics, SummaryMeanAndWorst) {
  const Summary a = summarize({0.1, 0.5, 0.2});
  EXPECT_NEAR(a.mean, 0.8 / 3, 1e-12);
  EXPECT_EQ(a.worst, 0.5);
  EXPECT_EQ(a.worst_layer, 1);
  const Summary b = summarize({30.0, 12.0, 40.0}, /*lower_is_worse=*/true);
  EXPECT_EQ(b.worst, 12.0);
  EXPECT_EQ(b.worst_layer, 1);
  const double inf = std::numeric_limits<double>::infinity();
  const Summary c = summarize({inf, inf}, true);
  EXPECT_TRUE(std::isinf(c.mean));
  EXPECT_EQ(c.worst_layer, 0);
}

TEST(EvalMetrics, CapacityIsPerLayerStackInDecimalGigabytes) {
  EXPECT_EQ(tokens_per_cache(80e9, 368, 78), 2787068);  // 80e9 / 28704
  EXPECT_EQ(tokens_per_cache(141e9, 1152, 78), 1569177);
  EXPECT_EQ(tokens_per_cache(80e9, 656, 78), 1563477);
  EXPECT_EQ(relative_l2_error(std::vector<float>{1, 1}.data(), std::vector<float>{1, 1}.data(), 2), 0.0);
}
