// The magnitude sweep: unit-scale NVFP4 collapses at small magnitudes while static and dynamic
// scales stay flat.
#include <gtest/gtest.h>

#include "support/sweep_claims.h"

using namespace nvfp4mla;
using namespace nvfp4mla::eval;
using nvfp4mla::testing::mode_of;

namespace {

const EvalReport& sweep_report() {
  static const EvalReport r = [] {
    EvalOptions o = nvfp4mla::testing::small_eval_options();
    o.latent = o.attention.enabled = o.needle.enabled = false;
    o.sweep.tokens = 64;
    o.sweep.points_per_decade = 4;
    return run_evaluation(o);
  }();
  return r;
}

}  // namespace

TEST(EvalSweep, CoversTheRange) {
  const EvalReport& r = sweep_report();
  ASSERT_EQ(r.sweep_rms.size(), 25u);  // 1e-4 .. 1e2, four points per decade
  EXPECT_NEAR(r.sweep_rms.front(), 1e-4, 1e-16);
  EXPECT_NEAR(r.sweep_rms.back(), 1e2, 1e-9);
  for (double e : mode_of(r, "bf16_1152").sweep_relative_error) EXPECT_EQ(e, 0.0);
}

TEST(EvalSweep, UnitScaleRisesSteeplyBelowSmallMagnitudes) {
  nvfp4mla::testing::expect_unit_scale_rises_at_small_magnitudes(sweep_report());
}

TEST(EvalSweep, CalibratedAndDynamicScalesStayFlat) {
  nvfp4mla::testing::expect_calibrated_and_dynamic_scales_flat(sweep_report());
}
