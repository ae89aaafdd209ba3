// The magnitude sweep: unit-scale NVFP4 collapses at small magnitudes while static and dynamic
// scales stay flat.
#include <gtest/gtest.h>

#include <cmath>

#include "support/eval_small.h"

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

// Error of `m` at the sweep magnitude closest to `rms`.
double at(const EvalReport& r, const ModeResult& m, double rms) {
  size_t best = 0;
  for (size_t i = 0; i < r.sweep_rms.size(); ++i)
    if (std::fabs(std::log(r.sweep_rms[i] / rms)) < std::fabs(std::log(r.sweep_rms[best] / rms))) best = i;
  return m.sweep_relative_error[best];
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
  const EvalReport& r = sweep_report();
  for (const char* key : {"nvfp4_432_implicit", "nvfp4_368_implicit"}) {
    const ModeResult& m = mode_of(r, key);
    const double unit = at(r, m, 1.0);
    EXPECT_LT(at(r, m, 0.1), 1.2 * unit) << key;   // fine at ordinary magnitudes
    EXPECT_GT(at(r, m, 0.01), 1.3 * unit) << key;  // degrading ...
    EXPECT_GT(at(r, m, 1e-3), 5.0 * unit) << key;  // ... steeply
    EXPECT_GT(at(r, m, 1e-4), 0.9) << key;         // nothing left
    for (size_t i = 1; i < r.sweep_rms.size() && r.sweep_rms[i] <= 0.1; ++i)
      EXPECT_LE(m.sweep_relative_error[i], m.sweep_relative_error[i - 1] * 1.02) << key << " at " << r.sweep_rms[i];
    EXPECT_GT(m.sweep_lost_scale_fraction.front(), 0.9) << key;  // group scales subnormal or zero
  }
}

TEST(EvalSweep, CalibratedAndDynamicScalesStayFlat) {
  const EvalReport& r = sweep_report();
  for (const char* key : {"nvfp4_432_static", "nvfp4_368_static", "nvfp4_368_dynamic", "fp8_ds_mla_656"}) {
    const ModeResult& m = mode_of(r, key);
    const double unit = at(r, m, 1.0);
    ASSERT_GT(unit, 0.0) << key;
    for (size_t i = 0; i < r.sweep_rms.size(); ++i) {
      EXPECT_LT(m.sweep_relative_error[i], 1.25 * unit) << key << " at " << r.sweep_rms[i];
      EXPECT_GT(m.sweep_relative_error[i], unit / 1.25) << key << " at " << r.sweep_rms[i];
    }
    for (double f : m.sweep_lost_scale_fraction) EXPECT_EQ(f, 0.0) << key;
  }
}
