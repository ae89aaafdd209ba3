#include <cuda_runtime.h>

#include <map>
#include <mutex>
#include <string>

#include "device/cuda_check.h"
#include "nvfp4mla/arch.h"
#include "nvfp4mla/device.h"

namespace nvfp4mla {

bool built_with_cuda() { return true; }

int cuda_device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();  // clear the sticky "no device / no driver" error
    return 0;
  }
  return n;
}

std::string cuda_device_description(int device) {
  if (cuda_device_count() <= device) return "no CUDA device";
  cudaDeviceProp p{};
  if (cudaGetDeviceProperties(&p, device) != cudaSuccess) return "device properties unavailable";
  return std::string(p.name) + " (sm_" + std::to_string(p.major * 10 + p.minor) + ", " +
         std::to_string(p.multiProcessorCount) + " SMs)";
}

namespace {
ArchSpec read_device_arch(int dev) {
  using cuda::check;
  auto attribute = [&](cudaDeviceAttr which, const char* what) {
    int v = 0;
    check(cudaDeviceGetAttribute(&v, which, dev), what);
    return v;
  };
  ArchSpec a;
  a.cc_major = attribute(cudaDevAttrComputeCapabilityMajor, "compute capability");
  a.cc_minor = attribute(cudaDevAttrComputeCapabilityMinor, "compute capability");
  a.sm_count = attribute(cudaDevAttrMultiProcessorCount, "SM count");
  a.smem_per_block = static_cast<size_t>(attribute(cudaDevAttrMaxSharedMemoryPerBlockOptin, "shared memory per block"));
  a.smem_per_sm = static_cast<size_t>(attribute(cudaDevAttrMaxSharedMemoryPerMultiprocessor, "shared memory per SM"));
  a.smem_reserved_per_cta = static_cast<size_t>(attribute(cudaDevAttrReservedSharedMemoryPerBlock, "reserved shared memory"));
  a.clusters = attribute(cudaDevAttrClusterLaunch, "cluster launch") != 0;
  // The sm_90a kernels run on compute capability 9.0 only, and only when the library carries
  // sm_90a code (NVFP4MLA_CUDA_ARCHITECTURES includes 90a).
#if defined(NVFP4MLA_HAS_SM90A)
  a.wgmma = a.cc_major == 9 && a.cc_minor == 0;
#endif
  return a;
}
}  // namespace

// Read once per device: sparse_decode checks every plan against it, and a device's attributes do
// not change while the process runs.
ArchSpec current_device_arch() {
  int dev = 0;
  cuda::check(cudaGetDevice(&dev), "cudaGetDevice");
  static std::mutex mutex;
  static std::map<int, ArchSpec> known;
  const std::lock_guard<std::mutex> lock(mutex);
  auto it = known.find(dev);
  if (it == known.end()) it = known.emplace(dev, read_device_arch(dev)).first;
  return it->second;
}

}  // namespace nvfp4mla
