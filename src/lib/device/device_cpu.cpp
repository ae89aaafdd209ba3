// Host fallback when the library is built without CUDA.
#include "nvfp4mla/device.h"

#if !defined(NVFP4MLA_WITH_CUDA)
namespace nvfp4mla {
bool built_with_cuda() { return false; }
int cuda_device_count() { return 0; }
std::string cuda_device_description(int) { return "built without CUDA"; }
}  // namespace nvfp4mla
#endif
