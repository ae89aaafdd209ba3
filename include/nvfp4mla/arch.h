#pragma once
// What a kernel planner needs to know about a GPU: its compute capability, SM count, shared
// memory limits and the architecture-specific features the kernels use. Host-only and CUDA-free:
// planners can plan for a GPU that is not present (serving estimates, the C API).
#include <cstddef>
#include <string>

namespace nvfp4mla {

struct ArchSpec {
  int cc_major = 0, cc_minor = 0;  // compute capability
  int sm_count = 0;
  size_t smem_per_block = 0;         // largest dynamic shared memory a CTA may opt into
  size_t smem_per_sm = 0;            // shared memory of one SM
  size_t smem_reserved_per_cta = 0;  // what the runtime reserves per resident CTA
  bool wgmma = false;     // sm_90a: warpgroup MMA and setmaxnreg (and the library carries sm_90a code)
  bool clusters = false;  // thread block clusters with distributed shared memory

  int compute_capability() const { return 10 * cc_major + cc_minor; }
};

// The spec of a GPU of compute capability major.minor with `sm_count` SMs, from the CUDA
// programming guide's per-architecture limits (8.0 and later; throws for older or unknown ones).
ArchSpec arch_spec(int cc_major, int cc_minor, int sm_count);
// The spec of the current CUDA device, read from its attributes (throws without CUDA or a device).
ArchSpec current_device_arch();
// "sm_90 (132 SMs, 227 KB shared memory per CTA, wgmma, clusters)".
std::string to_string(const ArchSpec& arch);

}  // namespace nvfp4mla
