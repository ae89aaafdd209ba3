// DecodeKernel::sm80_mma for bf16 records.
#include "ops/sparse_mla/decode/sm80/mma_kernel.cuh"

namespace nvfp4mla::cuda {
template void launch_sm80_mma<Format<CacheDtype::bf16, RopeEncoding::bf16, ScaleMode::implicit>>(const DecodeParams&, int, int, int, cudaStream_t);
}  // namespace nvfp4mla::cuda
