#pragma once
// Profiling builds only (CMake -DNVFP4MLA_DECODE_TRACE=ON): a per-step clock timeline of the
// warp-specialized decode kernel's roles, printed at the end of three CTAs of each launch (the
// first, middle and last row; head group 0, split 0). Each role's first thread records SM-clock
// offsets from its CTA's start at fixed points of its first 32 steps (ws_kernel.cuh lists them),
// so the differences show where a step's time goes: barrier waits, MMAs, softmax, hand-offs. In
// normal builds every mark and the print compile to nothing.
#include <cuda_runtime.h>

#include <cstdio>

#ifndef NVFP4MLA_DECODE_TRACE
#define NVFP4MLA_DECODE_TRACE 0
#endif

namespace nvfp4mla::cuda {

constexpr bool kDecodeTrace = NVFP4MLA_DECODE_TRACE != 0;

struct StepTrace {
  static constexpr int kSteps = 32, kMarks = 6;
  bool on;
  long long start;
  long long at[kSteps][kMarks];

  // `first_of_role`: the thread that records (one per role).
  __device__ explicit StepTrace(bool first_of_role) : on(false), start(0) {
    if constexpr (kDecodeTrace) {
      const bool traced_cta = blockIdx.y == 0 && blockIdx.z == 0 &&
                              (blockIdx.x == 0 || blockIdx.x == gridDim.x / 2 || blockIdx.x == gridDim.x - 1);
      on = traced_cta && first_of_role;
      start = clock64();
    }
  }
  __device__ __forceinline__ void mark(int step, int m) {
    if constexpr (kDecodeTrace)
      if (on && step < kSteps) at[step][m] = clock64() - start;
  }
  // One line per step: "trace <role> row <r> step <i>" and the role's marks in clocks.
  __device__ void print(const char* role, int steps, int marks) const {
    if constexpr (kDecodeTrace) {
      if (!on) return;
      for (int i = 0; i < steps && i < kSteps; ++i) {
        long long v[kMarks];
        for (int m = 0; m < kMarks; ++m) v[m] = m < marks ? at[i][m] : 0;
        printf("trace %s row %d step %d %lld %lld %lld %lld %lld %lld\n", role, static_cast<int>(blockIdx.x), i, v[0], v[1],
               v[2], v[3], v[4], v[5]);
      }
    }
  }
};

}  // namespace nvfp4mla::cuda
