#include "nvfp4mla/arch.h"

#include <string>

#include "nvfp4mla/error.h"

namespace nvfp4mla {

ArchSpec arch_spec(int cc_major, int cc_minor, int sm_count) {
  if (sm_count <= 0) throw Error("arch spec: the SM count must be positive");
  constexpr size_t kKiB = 1024;
  ArchSpec a;
  a.cc_major = cc_major;
  a.cc_minor = cc_minor;
  a.sm_count = sm_count;
  a.smem_reserved_per_cta = 1 * kKiB;
  // Shared memory per SM / opt-in maximum per CTA (CUDA C++ Programming Guide, technical
  // specifications per compute capability).
  const int cc = a.compute_capability();
  if (cc == 80 || cc == 87) {
    a.smem_per_sm = 164 * kKiB;
    a.smem_per_block = 163 * kKiB;
  } else if (cc == 86 || cc == 89 || cc == 120 || cc == 121) {
    a.smem_per_sm = 100 * kKiB;
    a.smem_per_block = 99 * kKiB;
  } else if (cc == 90 || cc == 100 || cc == 103) {
    a.smem_per_sm = 228 * kKiB;
    a.smem_per_block = 227 * kKiB;
  } else {
    throw Error("arch spec: compute capability " + std::to_string(cc_major) + "." + std::to_string(cc_minor) +
                " is not known (8.0 and later: 8.0, 8.6, 8.7, 8.9, 9.0, 10.0, 10.3, 12.0, 12.1); read it from the device "
                "with current_device_arch()");
  }
  a.wgmma = cc == 90;
  a.clusters = cc >= 90;
  return a;
}

std::string to_string(const ArchSpec& a) {
  std::string s = "sm_" + std::to_string(a.compute_capability()) + " (" + std::to_string(a.sm_count) + " SMs, " +
                  std::to_string(a.smem_per_block / 1024) + " KB shared memory per CTA";
  if (a.wgmma) s += ", wgmma";
  if (a.clusters) s += ", clusters";
  return s + ")";
}

}  // namespace nvfp4mla
