#pragma once
// Helpers for the GPU suites: skip without a device, device buffers, checked calls.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <ostream>
#include <cstring>
#include <stdexcept>
#include <utility>
#include <vector>

#include "nvfp4mla/cuda/cache_write.h"
#include "nvfp4mla/decode_plan.h"
#include "nvfp4mla/device.h"
#include "nvfp4mla/record.h"

namespace nvfp4mla {
// Test parameters print as the kernel's name.
inline void PrintTo(DecodeKernel k, std::ostream* os) { *os << to_string(k); }
}  // namespace nvfp4mla

#define NVFP4MLA_REQUIRE_GPU()                                         \
  do {                                                                 \
    if (nvfp4mla::cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device"; \
  } while (0)

#define CUDA_OK(call) ASSERT_EQ((call), cudaSuccess) << #call << ": " << cudaGetErrorString(cudaGetLastError())

namespace nvfp4mla::testing {

// The writer input type of a host value type.
template <class In>
cuda::InputType input_type();
template <> inline cuda::InputType input_type<Bf16Bits>() { return cuda::InputType::bf16; }
template <> inline cuda::InputType input_type<Fp16Bits>() { return cuda::InputType::fp16; }
template <> inline cuda::InputType input_type<float>() { return cuda::InputType::f32; }

template <class T>
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  explicit DeviceBuffer(size_t n) : n_(n) {
    if (n && cudaMalloc(reinterpret_cast<void**>(&p_), n * sizeof(T)) != cudaSuccess) throw std::runtime_error("cudaMalloc failed");
  }
  explicit DeviceBuffer(const std::vector<T>& host) : DeviceBuffer(host.size()) { upload(host); }
  ~DeviceBuffer() { if (p_) cudaFree(p_); }
  DeviceBuffer(DeviceBuffer&& o) noexcept : p_(o.p_), n_(o.n_) { o.p_ = nullptr; o.n_ = 0; }
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept { std::swap(p_, o.p_); std::swap(n_, o.n_); return *this; }
  T* get() const { return p_; }
  size_t size() const { return n_; }
  void upload(const std::vector<T>& host) {
    if (cudaMemcpy(p_, host.data(), n_ * sizeof(T), cudaMemcpyHostToDevice) != cudaSuccess) throw std::runtime_error("upload failed");
  }
  std::vector<T> download() const {
    std::vector<T> h(n_);
    if (n_ && cudaMemcpy(h.data(), p_, n_ * sizeof(T), cudaMemcpyDeviceToHost) != cudaSuccess) throw std::runtime_error("download failed");
    return h;
  }
  void fill_bytes(int byte) {
    if (n_ && cudaMemset(p_, byte, n_ * sizeof(T)) != cudaSuccess) throw std::runtime_error("memset failed");
  }

 private:
  T* p_ = nullptr;
  size_t n_ = 0;
};

}  // namespace nvfp4mla::testing
