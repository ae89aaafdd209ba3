#pragma once
// Profiling builds only (CMake -DNVFP4MLA_DECODE_TRACE=ON): a per-step clock timeline of the
// sm_90 decode kernels' roles (the warp-specialized kernels' producers, scores and output
// warpgroups; sm90_h16's two warpgroups, a step being one of its tiles) for three CTAs of each
// launch (the first, middle and last row; head group 0, split 0). Each role's first thread stores
// SM-clock offsets from its CTA's start at fixed points of its first 32 steps (ws_kernel.cuh and
// h16_kernel.cuh list them) into a device buffer;
// the launcher prints them after the launch (print_step_traces). The kernel makes no call: a
// printf in a kernel makes ptxas serialize every wgmma of it (C7510), which would time a different
// kernel. In normal builds every mark compiles to nothing.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <vector>

#include "ops/sparse_mla/decode/common/step_summary.h"

#ifndef NVFP4MLA_DECODE_TRACE
#define NVFP4MLA_DECODE_TRACE 0
#endif

namespace nvfp4mla::cuda {

constexpr bool kDecodeTrace = NVFP4MLA_DECODE_TRACE != 0;

namespace step_trace {
constexpr int kCtas = 3, kRoles = 3, kSteps = 32, kMarks = 6;  // roles: the launcher names them
// Per traced CTA and role: the step count, then kSteps x kMarks clock offsets (-1: not reached).
constexpr int kRecord = 1 + kSteps * kMarks;
constexpr int kWords = kCtas * kRoles * kRecord;
// Every CTA's span (up to kSpanCtas CTAs): SM id, globaltimer at entry, latest warpgroup exit (ns),
// and thread 0's SM clock at entry and at its exit (with its globaltimer: the clock the CTA ran at).
constexpr int kSpanCtas = 1 << 16;
#if NVFP4MLA_DECODE_TRACE
// One buffer per translation unit (each kernel instantiation prints its own after its launch).
static __device__ long long g_marks[kWords];
static __device__ unsigned long long g_spans[kSpanCtas][6];
#endif
__device__ __forceinline__ unsigned long long global_ns() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}
__device__ __forceinline__ int linear_cta() {
  return static_cast<int>(blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z));
}
}  // namespace step_trace

struct StepTrace {
  long long* rec = nullptr;  // this thread's record, or null
  long long start = 0;
  int first_step = 0;  // the first of the kSteps steps recorded

  // `role`: index into the launcher's role names; `first_of_role`: the thread that records. The
  // traced CTAs are the first head group's and split's of the first, middle and last row.
  __device__ StepTrace(int role, bool first_of_role, int row, int rows, bool first_group_and_split) {
#if NVFP4MLA_DECODE_TRACE
    const int cta = row == 0 ? 0 : row == rows / 2 ? 1 : row == rows - 1 ? 2 : -1;
    if (cta >= 0 && first_group_and_split && first_of_role)
      rec = step_trace::g_marks + (cta * step_trace::kRoles + role) * step_trace::kRecord;
    start = clock64();
#else
    (void)role, (void)first_of_role, (void)row, (void)rows, (void)first_group_and_split;
#endif
  }
  // Thread 0 of the CTA, at entry: the CTA's SM and start time.
  __device__ static void cta_begin() {
#if NVFP4MLA_DECODE_TRACE
    const int c = step_trace::linear_cta();
    if (threadIdx.x == 0 && c < step_trace::kSpanCtas) {
      unsigned smid;
      asm volatile("mov.u32 %0, %%smid;" : "=r"(smid));
      step_trace::g_spans[c][0] = smid;
      step_trace::g_spans[c][1] = step_trace::global_ns();
      step_trace::g_spans[c][3] = clock64();
    }
#endif
  }
  __device__ __forceinline__ void mark(int step, int m) {
    if constexpr (kDecodeTrace)
      if (rec != nullptr && static_cast<unsigned>(step - first_step) < step_trace::kSteps)
        rec[1 + (step - first_step) * step_trace::kMarks + m] = clock64() - start;
  }
  __device__ void finish(int steps) {
    if constexpr (kDecodeTrace)
      if (rec != nullptr) rec[0] = steps;
  }
  // Every thread at the kernel's end: the first thread of each warpgroup moves the CTA's exit time.
  __device__ static void cta_end() {
#if NVFP4MLA_DECODE_TRACE
    const int c = step_trace::linear_cta();
    if (threadIdx.x % 128 == 0 && c < step_trace::kSpanCtas) atomicMax(&step_trace::g_spans[c][2], step_trace::global_ns());
    if (threadIdx.x == 0 && c < step_trace::kSpanCtas) {
      step_trace::g_spans[c][4] = clock64();
      step_trace::g_spans[c][5] = step_trace::global_ns();
    }
#endif
  }
};

// Host, profiling builds: clears the buffers before a launch and prints them after: one line per
// recorded step ("trace <role> row <r> step <i> <marks>"; `roles` names the kernel's role
// indices; a role that recorded nothing, such as a kernel's unused third, prints nothing), one
// steady-state line per traced CTA and role ("trace steady <role> row <r> steps <n>
// period <clocks> phases <mark 0 to 1> <1 to 2> ...": step_summary.h), then one line on the
// launch's CTAs ("trace ctas ..."): how long each ran and how long each SM sat idle between two of
// its CTAs.
inline void clear_step_traces(cudaStream_t stream) {
#if NVFP4MLA_DECODE_TRACE
  void* buf = nullptr;
  cudaGetSymbolAddress(&buf, step_trace::g_marks);
  cudaMemsetAsync(buf, 0xFF, sizeof(step_trace::g_marks), stream);
  cudaGetSymbolAddress(&buf, step_trace::g_spans);
  cudaMemsetAsync(buf, 0, sizeof(step_trace::g_spans), stream);
#else
  (void)stream;
#endif
}
inline void print_step_traces(cudaStream_t stream, int rows, int ctas_launched, const char* const (&roles)[step_trace::kRoles]) {
#if NVFP4MLA_DECODE_TRACE
  static long long host[step_trace::kWords];
  cudaStreamSynchronize(stream);
  cudaMemcpyFromSymbol(host, step_trace::g_marks, sizeof(host));
  const int row_of[step_trace::kCtas] = {0, rows / 2, rows - 1};
  for (int c = 0; c < step_trace::kCtas; ++c)
    for (int r = 0; r < step_trace::kRoles; ++r) {
      const long long* rec = host + (c * step_trace::kRoles + r) * step_trace::kRecord;
      if (rec[0] < 0) continue;  // a role the kernel does not have
      const long long steps = std::min<long long>(rec[0], step_trace::kSteps);
      auto at = [&](long long i, int m) { return rec[1 + i * step_trace::kMarks + m]; };
      for (long long i = 0; i < steps; ++i) {
        std::printf("trace %s row %d step %lld", roles[r], row_of[c], i);
        for (int m = 0; m < step_trace::kMarks; ++m) std::printf(" %lld", at(i, m));
        std::printf("\n");
      }
      const step_trace::SteadyState st = step_trace::steady_state(steps, step_trace::kMarks, at);
      std::printf("trace steady %s row %d steps %lld period %.0f phases", roles[r], row_of[c], rec[0], st.period);
      for (double d : st.phases) std::printf(" %.0f", d);
      std::printf("\n");
    }
  // CTA spans: the launch's span, CTA durations, and the idle gaps between consecutive CTAs of an SM.
  static unsigned long long spans[step_trace::kSpanCtas][6];
  cudaMemcpyFromSymbol(spans, step_trace::g_spans, sizeof(spans));
  const int ctas = std::min(ctas_launched, step_trace::kSpanCtas);
  std::vector<std::vector<std::pair<unsigned long long, unsigned long long>>> per_sm(1024);
  unsigned long long first = ~0ull, last = 0;
  std::vector<double> dur, gap, mhz;
  for (int c = 0; c < ctas; ++c) {
    if (spans[c][1] == 0 || spans[c][2] < spans[c][1] || spans[c][0] >= per_sm.size()) continue;
    per_sm[spans[c][0]].push_back({spans[c][1], spans[c][2]});
    first = std::min(first, spans[c][1]);
    last = std::max(last, spans[c][2]);
    dur.push_back(1e-3 * double(spans[c][2] - spans[c][1]));
    if (spans[c][5] > spans[c][1]) mhz.push_back(1e3 * double(spans[c][4] - spans[c][3]) / double(spans[c][5] - spans[c][1]));
  }
  int sms = 0;
  size_t most = 0;
  for (auto& v : per_sm) {
    if (v.empty()) continue;
    ++sms;
    most = std::max(most, v.size());
    std::sort(v.begin(), v.end());
    for (size_t i = 1; i < v.size(); ++i) gap.push_back(1e-3 * (double(v[i].first) - double(v[i - 1].second)));
  }
  std::printf(
      "trace ctas %zu sms %d most_per_sm %zu span_us %.1f cta_us_median %.2f gap_us_median %.2f gap_us_max %.2f "
      "sm_mhz_median %.0f\n",
      dur.size(), sms, most, dur.empty() ? 0.0 : 1e-3 * double(last - first), step_trace::median_or_none(dur), step_trace::median_or_none(gap),
      gap.empty() ? 0.0 : *std::max_element(gap.begin(), gap.end()), step_trace::median_or_none(mhz));
#else
  (void)stream, (void)rows, (void)roles, (void)ctas_launched;
#endif
}

}  // namespace nvfp4mla::cuda
