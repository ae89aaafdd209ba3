// DecodeKernel::sm80_h16 for nvfp4_ds_mla records, fp8 RoPE, static_calibrated scales.
#include "ops/sparse_mla/decode/sm80/h16_kernel.cuh"

namespace nvfp4mla::cuda {
template void launch_decode_h16<Format<CacheDtype::nvfp4_ds_mla, RopeEncoding::fp8, ScaleMode::static_calibrated>>(const DecodeParams&, int, int, cudaStream_t);
}  // namespace nvfp4mla::cuda
