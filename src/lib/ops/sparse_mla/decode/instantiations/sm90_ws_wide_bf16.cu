// DecodeKernel::sm90_ws_wide for bf16 records (copied into the K buffers; the staged extend).
#include "ops/sparse_mla/decode/sm90/ws_kernel.cuh"

namespace nvfp4mla::cuda {
template bool launch_decode_ws<Format<CacheDtype::bf16, RopeEncoding::bf16, ScaleMode::implicit>, false, kWsWideTile>(const DecodeParams&, int, int, cudaStream_t);
}  // namespace nvfp4mla::cuda
