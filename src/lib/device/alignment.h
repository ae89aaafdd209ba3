#pragma once
// Host-side pointer alignment, for the checks the kernels' vector loads and stores need.
#include <cstdint>

namespace nvfp4mla::cuda {

// Whether `p` is a multiple of `bytes` (a power of two); null is aligned.
inline bool aligned(const void* p, uintptr_t bytes) { return (reinterpret_cast<uintptr_t>(p) & (bytes - 1)) == 0; }

}  // namespace nvfp4mla::cuda
