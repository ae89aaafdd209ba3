// DecodeKernel::sm90_h16 for nvfp4_ds_mla records, bf16 RoPE, static_calibrated scales.
#include "ops/sparse_mla/decode/sm90/h16_kernel.cuh"

namespace nvfp4mla::cuda {
template void launch_decode_h16_sm90<Format<CacheDtype::nvfp4_ds_mla, RopeEncoding::bf16, ScaleMode::static_calibrated>>(const DecodeParams&, int, int, cudaStream_t);
}  // namespace nvfp4mla::cuda
