// DecodeKernel::sm80_mma for fp8_ds_mla records.
#include "ops/sparse_mla/decode/sm80/mma_kernel.cuh"

namespace nvfp4mla::cuda {
template void launch_sm80_mma<Format<CacheDtype::fp8_ds_mla, RopeEncoding::bf16, ScaleMode::implicit>>(const DecodeParams&, int, int, int, cudaStream_t);
}  // namespace nvfp4mla::cuda
