// DecodeKernel::sm80_mma for nvfp4_ds_mla records, fp8 RoPE, static_calibrated scales.
#include "ops/sparse_mla/decode/sm80/mma_kernel.cuh"

namespace nvfp4mla::cuda {
template void launch_sm80_mma<Format<CacheDtype::nvfp4_ds_mla, RopeEncoding::fp8, ScaleMode::static_calibrated>>(const DecodeParams&, int, int, int, cudaStream_t);
}  // namespace nvfp4mla::cuda
