// DecodeKernel::sm90_ws and sm90_ws_pair for nvfp4_ds_mla records, fp8 RoPE, dynamic scales.
#include "ops/sparse_mla/decode/sm90/ws_kernel.cuh"

namespace nvfp4mla::cuda {
template bool launch_decode_ws<Format<CacheDtype::nvfp4_ds_mla, RopeEncoding::fp8, ScaleMode::dynamic>, false, kWsTile>(const DecodeParams&, int, int, cudaStream_t);
template bool launch_decode_ws<Format<CacheDtype::nvfp4_ds_mla, RopeEncoding::fp8, ScaleMode::dynamic>, true, kWsTile>(const DecodeParams&, int, int, cudaStream_t);
}  // namespace nvfp4mla::cuda
