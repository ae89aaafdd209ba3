#pragma once
// Device buffers for the CLI's --device cuda paths (CUDA builds only).
#if defined(NVFP4MLA_WITH_CUDA)
#include <cuda_runtime_api.h>

#include <cstddef>
#include <string>

#include "nvfp4mla/error.h"

namespace nvfp4mla::cli {

// Owns one device allocation; every CUDA call is checked.
class DeviceBytes {
 public:
  explicit DeviceBytes(size_t n) : n_(n) {
    if (n && cudaMalloc(&p_, n) != cudaSuccess) throw Error("cudaMalloc of " + std::to_string(n) + " bytes failed");
  }
  DeviceBytes(const void* host, size_t n) : DeviceBytes(n) {
    if (n && cudaMemcpy(p_, host, n, cudaMemcpyHostToDevice) != cudaSuccess) throw Error("copy to the GPU failed");
  }
  ~DeviceBytes() { if (p_) cudaFree(p_); }
  DeviceBytes(const DeviceBytes&) = delete;
  DeviceBytes& operator=(const DeviceBytes&) = delete;
  template <class T> T* as() const { return static_cast<T*>(p_); }
  void download(void* host) const {
    if (n_ && cudaMemcpy(host, p_, n_, cudaMemcpyDeviceToHost) != cudaSuccess) throw Error("copy from the GPU failed");
  }

 private:
  void* p_ = nullptr;
  size_t n_ = 0;
};

}  // namespace nvfp4mla::cli
#endif
