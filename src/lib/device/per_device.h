#pragma once
// Host state kept per CUDA device of the process. Function attributes (the shared-memory opt-in)
// and occupancy belong to a device's context, so "once per process" is wrong as soon as a process
// drives two GPUs (the C API's per-call device, the in-process DCP communicator's local ranks).
#include <cuda_runtime_api.h>

#include <array>
#include <mutex>
#include <string>

#include "device/cuda_check.h"
#include "nvfp4mla/error.h"

namespace nvfp4mla::cuda {

template <class T>
class PerDevice {
 public:
  static constexpr int kMaxDevices = 64;
  // The current device's value, made by `make()` on the first call on that device (later calls,
  // CUDA-graph captures included, make no runtime call beyond cudaGetDevice).
  template <class F>
  const T& get(F&& make) {
    int device = 0;
    check(cudaGetDevice(&device), "cudaGetDevice");
    if (device < 0 || device >= kMaxDevices)
      throw Error("device " + std::to_string(device) + ": nvfp4mla keeps state for devices 0.." + std::to_string(kMaxDevices - 1));
    std::call_once(once_[device], [&] { values_[device] = make(); });
    return values_[device];
  }

 private:
  std::array<std::once_flag, kMaxDevices> once_;
  std::array<T, kMaxDevices> values_{};
};

// Sets a kernel's dynamic shared-memory limit once per device.
template <class Kernel>
void opt_in_shared_memory(PerDevice<bool>& done, Kernel kernel, int bytes, const char* what) {
  done.get([&] {
    check(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes), what);
    return true;
  });
}

}  // namespace nvfp4mla::cuda
