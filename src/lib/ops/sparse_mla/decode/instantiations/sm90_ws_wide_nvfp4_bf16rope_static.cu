// DecodeKernel::sm90_ws_wide for nvfp4_ds_mla records, bf16 RoPE, static_calibrated scales.
#include "ops/sparse_mla/decode/sm90/ws_kernel.cuh"

namespace nvfp4mla::cuda {
template bool launch_decode_ws<Format<CacheDtype::nvfp4_ds_mla, RopeEncoding::bf16, ScaleMode::static_calibrated>, false, kWsWideTile>(const DecodeParams&, int, int, cudaStream_t);
}  // namespace nvfp4mla::cuda
