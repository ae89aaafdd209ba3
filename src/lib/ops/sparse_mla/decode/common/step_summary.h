#pragma once
// The steady state of a traced decode timeline (step_trace.cuh, profiling builds): medians over
// steps [kSteadyFirst, kSteadyEnd), past the pipeline's fill, of the step period (mark 0 to the
// next step's mark 0) and of each interval between consecutive marks of a step. Host code.
#include <algorithm>
#include <vector>

namespace nvfp4mla::cuda::step_trace {

inline constexpr long long kSteadyFirst = 4, kSteadyEnd = 28;

// The median (the upper one of an even count); -1 for none.
inline double median_or_none(std::vector<double> v) {
  if (v.empty()) return -1.0;
  std::nth_element(v.begin(), v.begin() + v.size() / 2, v.end());
  return v[v.size() / 2];
}

struct SteadyState {
  double period = -1.0;          // SM clocks; -1: too few steps
  std::vector<double> phases;    // phases[m - 1]: mark m - 1 to mark m; -1: never both reached
};

// `mark(i, m)`: mark m of step i (negative: not reached), for i < steps and m < marks.
template <class Mark>
SteadyState steady_state(long long steps, int marks, Mark mark) {
  SteadyState s;
  std::vector<double> period;
  std::vector<std::vector<double>> phase(marks > 1 ? marks - 1 : 0);
  for (long long i = kSteadyFirst; i < std::min(steps, kSteadyEnd); ++i) {
    if (i + 1 < steps && mark(i, 0) >= 0 && mark(i + 1, 0) >= 0) period.push_back(double(mark(i + 1, 0) - mark(i, 0)));
    for (int m = 1; m < marks; ++m)
      if (mark(i, m) >= 0 && mark(i, m - 1) >= 0) phase[m - 1].push_back(double(mark(i, m) - mark(i, m - 1)));
  }
  s.period = median_or_none(period);
  for (auto& v : phase) s.phases.push_back(median_or_none(std::move(v)));
  return s;
}

}  // namespace nvfp4mla::cuda::step_trace
