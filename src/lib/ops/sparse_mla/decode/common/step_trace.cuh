#pragma once
// Profiling builds only (CMake -DNVFP4MLA_DECODE_TRACE=ON): a per-step clock timeline of the
// warp-specialized decode kernel's roles for three CTAs of each launch (the first, middle and last
// row; head group 0, split 0). Each role's first thread stores SM-clock offsets from its CTA's
// start at fixed points of its first 32 steps (ws_kernel.cuh lists them) into a device buffer;
// the launcher prints them after the launch (print_step_traces). The kernel makes no call: a
// printf in a kernel makes ptxas serialize every wgmma of it (C7510), which would time a different
// kernel. In normal builds every mark compiles to nothing.
#include <cuda_runtime.h>

#include <cstdio>

#ifndef NVFP4MLA_DECODE_TRACE
#define NVFP4MLA_DECODE_TRACE 0
#endif

namespace nvfp4mla::cuda {

constexpr bool kDecodeTrace = NVFP4MLA_DECODE_TRACE != 0;

namespace step_trace {
constexpr int kCtas = 3, kRoles = 4, kSteps = 32, kMarks = 6;
// Per traced CTA and role: the step count, then kSteps x kMarks clock offsets (-1: not reached).
constexpr int kRecord = 1 + kSteps * kMarks;
constexpr int kWords = kCtas * kRoles * kRecord;
#if NVFP4MLA_DECODE_TRACE
// One buffer per translation unit (each kernel instantiation prints its own after its launch).
static __device__ long long g_marks[kWords];
#endif
}  // namespace step_trace

struct StepTrace {
  long long* rec = nullptr;  // this thread's record, or null
  long long start = 0;

  // `role`: index into the launcher's role names; `first_of_role`: the thread that records.
  __device__ StepTrace(int role, bool first_of_role) {
#if NVFP4MLA_DECODE_TRACE
    const int cta = blockIdx.x == 0 ? 0 : blockIdx.x == gridDim.x / 2 ? 1 : blockIdx.x == gridDim.x - 1 ? 2 : -1;
    if (cta >= 0 && blockIdx.y == 0 && blockIdx.z == 0 && first_of_role)
      rec = step_trace::g_marks + (cta * step_trace::kRoles + role) * step_trace::kRecord;
    start = clock64();
#else
    (void)role, (void)first_of_role;
#endif
  }
  __device__ __forceinline__ void mark(int step, int m) {
    if constexpr (kDecodeTrace)
      if (rec != nullptr && step < step_trace::kSteps) rec[1 + step * step_trace::kMarks + m] = clock64() - start;
  }
  __device__ void finish(int steps) {
    if constexpr (kDecodeTrace)
      if (rec != nullptr) rec[0] = steps;
  }
};

// Host, profiling builds: clears the buffer before a launch and prints it after ("trace <role> row
// <r> step <i> <marks>"), one line per recorded step. `roles` names the kernel's role indices.
inline void clear_step_traces(cudaStream_t stream) {
#if NVFP4MLA_DECODE_TRACE
  void* buf = nullptr;
  cudaGetSymbolAddress(&buf, step_trace::g_marks);
  cudaMemsetAsync(buf, 0xFF, sizeof(step_trace::g_marks), stream);
#else
  (void)stream;
#endif
}
inline void print_step_traces(cudaStream_t stream, int rows, const char* const (&roles)[step_trace::kRoles]) {
#if NVFP4MLA_DECODE_TRACE
  static long long host[step_trace::kWords];
  cudaStreamSynchronize(stream);
  cudaMemcpyFromSymbol(host, step_trace::g_marks, sizeof(host));
  const int row_of[step_trace::kCtas] = {0, rows / 2, rows - 1};
  for (int c = 0; c < step_trace::kCtas; ++c)
    for (int r = 0; r < step_trace::kRoles; ++r) {
      const long long* rec = host + (c * step_trace::kRoles + r) * step_trace::kRecord;
      for (long long i = 0; i < rec[0] && i < step_trace::kSteps; ++i) {
        std::printf("trace %s row %d step %lld", roles[r], row_of[c], i);
        for (int m = 0; m < step_trace::kMarks; ++m) std::printf(" %lld", rec[1 + i * step_trace::kMarks + m]);
        std::printf("\n");
      }
    }
#else
  (void)stream, (void)rows, (void)roles;
#endif
}

}  // namespace nvfp4mla::cuda
