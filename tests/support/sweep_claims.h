#pragma once
// The magnitude sweep's claims, checked on the synthetic workload and on a dump: unit-scale NVFP4
// collapses at small magnitudes while calibrated and dynamic scales stay flat.
#include <gtest/gtest.h>

#include <cmath>

#include "support/eval_small.h"

namespace nvfp4mla::testing {

// Error of `m` at the sweep magnitude closest to `rms`.
inline double sweep_error_at(const eval::EvalReport& r, const eval::ModeResult& m, double rms) {
  size_t best = 0;
  for (size_t i = 0; i < r.sweep_rms.size(); ++i)
    if (std::fabs(std::log(r.sweep_rms[i] / rms)) < std::fabs(std::log(r.sweep_rms[best] / rms))) best = i;
  return m.sweep_relative_error[best];
}

inline void expect_unit_scale_rises_at_small_magnitudes(const eval::EvalReport& r) {
  for (const char* key : {"nvfp4_432_implicit", "nvfp4_368_implicit"}) {
    const eval::ModeResult& m = mode_of(r, key);
    const double unit = sweep_error_at(r, m, 1.0);
    EXPECT_LT(sweep_error_at(r, m, 0.1), 1.2 * unit) << key;   // fine at ordinary magnitudes
    EXPECT_GT(sweep_error_at(r, m, 0.01), 1.3 * unit) << key;  // degrading ...
    EXPECT_GT(sweep_error_at(r, m, 1e-3), 5.0 * unit) << key;  // ... steeply
    EXPECT_GT(sweep_error_at(r, m, 1e-4), 0.9) << key;         // nothing left
    for (size_t i = 1; i < r.sweep_rms.size() && r.sweep_rms[i] <= 0.1; ++i)
      EXPECT_LE(m.sweep_relative_error[i], m.sweep_relative_error[i - 1] * 1.02) << key << " at " << r.sweep_rms[i];
    EXPECT_GT(m.sweep_lost_scale_fraction.front(), 0.9) << key;  // group scales subnormal or zero
  }
}

inline void expect_calibrated_and_dynamic_scales_flat(const eval::EvalReport& r) {
  for (const char* key : {"nvfp4_432_static", "nvfp4_368_static", "nvfp4_368_dynamic", "fp8_ds_mla_656"}) {
    const eval::ModeResult& m = mode_of(r, key);
    const double unit = sweep_error_at(r, m, 1.0);
    ASSERT_GT(unit, 0.0) << key;
    for (size_t i = 0; i < r.sweep_rms.size(); ++i) {
      EXPECT_LT(m.sweep_relative_error[i], 1.25 * unit) << key << " at " << r.sweep_rms[i];
      EXPECT_GT(m.sweep_relative_error[i], unit / 1.25) << key << " at " << r.sweep_rms[i];
    }
    for (double f : m.sweep_lost_scale_fraction) EXPECT_EQ(f, 0.0) << key;
  }
}

}  // namespace nvfp4mla::testing
