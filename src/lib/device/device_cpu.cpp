// Host fallback when the library is built without CUDA.
#include "nvfp4mla/arch.h"
#include "nvfp4mla/device.h"
#include "nvfp4mla/error.h"

#if !defined(NVFP4MLA_WITH_CUDA)
namespace nvfp4mla {
bool built_with_cuda() { return false; }
int cuda_device_count() { return 0; }
std::string cuda_device_description(int) { return "built without CUDA"; }
ArchSpec current_device_arch() {
  throw Error("current_device_arch: this nvfp4mla library was built without CUDA; describe the GPU with arch_spec()");
}
}  // namespace nvfp4mla
#endif
