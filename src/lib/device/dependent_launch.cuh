#pragma once
// Programmatic dependent launch (compute capability 9.0 on). A kernel launched as a programmatic
// dependent of the kernel before it in its stream may have its CTAs scheduled while that one
// still runs (once every CTA of it has called allow_dependent_grids, or exited); it must call
// wait_for_primary_grid before it touches memory the primary writes, or writes memory the
// primary reads: the wait returns once the primary has completed and its writes are visible, so
// correctness never depends on where the primary calls allow_dependent_grids. Work before the
// wait (index arithmetic, shared-memory setup) overlaps the primary's tail and the launch.
// Device side a no-op below sm_90; host side the attribute is set only where the device has it.
// Stream capture records the dependency as a programmatic graph edge, so graphs replay it.
#include <cuda_runtime.h>

#include "device/cuda_check.h"

namespace nvfp4mla::cuda {

// Blocks until the primary grid has completed and its memory operations are visible.
__device__ __forceinline__ void wait_for_primary_grid() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

// This CTA no longer holds back the launch of a programmatic dependent grid (which still waits for
// this grid's completion before reading its results).
__device__ __forceinline__ void allow_dependent_grids() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

// Whether the current device can launch programmatic dependents (compute capability 9.0 on).
inline bool device_has_dependent_launch() {
  int device = 0, major = 0;
  check(cudaGetDevice(&device), "cudaGetDevice");
  check(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device), "compute capability");
  return major >= 9;
}

// Whether `kernel`, as the current device runs it, was compiled with wait_for_primary_grid in it
// (PTX for compute capability 9.0 on; PTX for an older one, JIT-compiled for a newer device, has
// the wait compiled out and must not be launched as a dependent). False on devices before sm_90.
template <class... Params>
bool waits_for_primary_grid(void (*kernel)(Params...)) {
  cudaFuncAttributes attributes{};
  check(cudaFuncGetAttributes(&attributes, kernel), "kernel attributes");
  return attributes.ptxVersion >= 90;
}

// Launches `kernel` on `stream`, as a programmatic dependent of the stream's previous kernel when
// `dependent` (which callers set only where the device has it and the kernel waits).
template <class... Params, class... Args>
void launch_kernel(void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem, cudaStream_t stream, bool dependent,
                   const char* what, Args... args) {
  cudaLaunchConfig_t config{};
  config.gridDim = grid;
  config.blockDim = block;
  config.dynamicSmemBytes = smem;
  config.stream = stream;
  cudaLaunchAttribute attribute{};
  attribute.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attribute.val.programmaticStreamSerializationAllowed = 1;
  config.attrs = dependent ? &attribute : nullptr;
  config.numAttrs = dependent ? 1 : 0;
  check(cudaLaunchKernelEx(&config, kernel, static_cast<Params>(args)...), what);
}

}  // namespace nvfp4mla::cuda
