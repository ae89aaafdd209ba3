#pragma once
// Device buffers of the evaluation's CUDA paths (CUDA builds only): one allocation each,
// optionally filled from the host on a stream; every CUDA call checked.
#if defined(NVFP4MLA_WITH_CUDA)
#include <cuda_runtime_api.h>

#include <cstddef>
#include <string>

#include "nvfp4mla/error.h"

namespace nvfp4mla::eval::detail {

inline void cuda_ok(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw Error(std::string("evaluation on CUDA: ") + what + ": " + cudaGetErrorString(e));
}

class DeviceBytes {
 public:
  explicit DeviceBytes(size_t n) : n_(n) {
    if (n) cuda_ok(cudaMalloc(&p_, n), "cudaMalloc");
  }
  DeviceBytes(const void* host, size_t n, cudaStream_t stream) : DeviceBytes(host ? n : 0) {
    if (n_) cuda_ok(cudaMemcpyAsync(p_, host, n_, cudaMemcpyHostToDevice, stream), "copy to the GPU");
  }
  ~DeviceBytes() {
    if (p_) cudaFree(p_);
  }
  DeviceBytes(const DeviceBytes&) = delete;
  DeviceBytes& operator=(const DeviceBytes&) = delete;
  template <class T> T* as() const { return static_cast<T*>(p_); }
  size_t size() const { return n_; }
  void download(void* host, cudaStream_t stream) const {
    if (n_) cuda_ok(cudaMemcpyAsync(host, p_, n_, cudaMemcpyDeviceToHost, stream), "copy from the GPU");
  }

 private:
  void* p_ = nullptr;
  size_t n_ = 0;
};

}  // namespace nvfp4mla::eval::detail
#endif
