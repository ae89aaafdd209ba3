// DecodeKernel::sm90_ws_wide for fp8_ds_mla records.
#include "ops/sparse_mla/decode/sm90/ws_kernel.cuh"

namespace nvfp4mla::cuda {
template bool launch_decode_ws<Format<CacheDtype::fp8_ds_mla, RopeEncoding::bf16, ScaleMode::implicit>, false, kWsWideTile>(const DecodeParams&, int, int, cudaStream_t);
}  // namespace nvfp4mla::cuda
