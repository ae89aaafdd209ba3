// The steady-state summary of traced decode timelines (profiling builds print it per role).
#include <gtest/gtest.h>

#include <vector>

#include "lib/ops/sparse_mla/decode/common/step_summary.h"

namespace {
using nvfp4mla::cuda::step_trace::kSteadyEnd;
using nvfp4mla::cuda::step_trace::kSteadyFirst;
using nvfp4mla::cuda::step_trace::median_or_none;
using nvfp4mla::cuda::step_trace::steady_state;

constexpr int kMarks = 6;
constexpr long long kOffsets[kMarks] = {0, 100, 300, 600, 650, 900};

// A timeline of `steps` steps of 1,000 clocks, whose first steps (the pipeline's fill) and last
// steps take far longer and whose step 10 is an outlier.
std::vector<long long> timeline(long long steps) {
  std::vector<long long> t(steps * kMarks);
  long long start = 0;
  for (long long i = 0; i < steps; ++i) {
    const long long scale = i < kSteadyFirst || i >= kSteadyEnd ? 7 : i == 10 ? 3 : 1;
    for (int m = 0; m < kMarks; ++m) t[i * kMarks + m] = start + scale * kOffsets[m];
    start += scale * 1000;
  }
  return t;
}

TEST(StepSummary, MediansOverTheSteadyStepsOnly) {
  const auto t = timeline(32);
  const auto s = steady_state(32, kMarks, [&](long long i, int m) { return t[i * kMarks + m]; });
  EXPECT_EQ(s.period, 1000.0);
  ASSERT_EQ(s.phases.size(), size_t(kMarks - 1));
  for (int m = 1; m < kMarks; ++m) EXPECT_EQ(s.phases[m - 1], double(kOffsets[m] - kOffsets[m - 1])) << m;

  // Step i lasting 1000 + i clocks, its first phase 100 + i: the medians of steps [4, 28) are
  // 1016 and 116 (all 31 periods would give 1015).
  std::vector<long long> ramp(32 * kMarks);
  for (long long i = 0, start = 0; i < 32; start += 1000 + i, ++i)
    for (int m = 0; m < kMarks; ++m) ramp[i * kMarks + m] = start + (m == 0 ? 0 : 100 + i + kOffsets[m] - kOffsets[1]);
  const auto r = steady_state(32, kMarks, [&](long long i, int m) { return ramp[i * kMarks + m]; });
  EXPECT_EQ(r.period, 1016.0);
  EXPECT_EQ(r.phases[0], 116.0);
  EXPECT_EQ(r.phases[1], 200.0);
}

TEST(StepSummary, UnreachedMarksAndShortTimelines) {
  auto t = timeline(32);
  for (long long i = 0; i < 32; ++i) t[i * kMarks + 4] = -1;  // mark 4 never reached
  const auto s = steady_state(32, kMarks, [&](long long i, int m) { return t[i * kMarks + m]; });
  EXPECT_EQ(s.phases[2], 300.0);
  EXPECT_EQ(s.phases[3], -1.0);
  EXPECT_EQ(s.phases[4], -1.0);

  // Five steps: only step 4 is steady, and it has no next step to give a period.
  const auto u = timeline(5);
  const auto v = steady_state(5, kMarks, [&](long long i, int m) { return u[i * kMarks + m]; });
  EXPECT_EQ(v.period, -1.0);
  EXPECT_EQ(v.phases[0], 100.0);
  const auto none = steady_state(kSteadyFirst, kMarks, [&](long long i, int m) { return u[i * kMarks + m]; });
  EXPECT_EQ(none.period, -1.0);
  for (double d : none.phases) EXPECT_EQ(d, -1.0);
}

TEST(StepSummary, MedianIsTheUpperMiddleAndNoneIsMinusOne) {
  EXPECT_EQ(median_or_none({}), -1.0);
  EXPECT_EQ(median_or_none({5.0}), 5.0);
  EXPECT_EQ(median_or_none({4.0, 1.0, 3.0, 2.0}), 3.0);
  EXPECT_EQ(median_or_none({9.0, 1.0, 5.0}), 5.0);
}
}  // namespace
