// The warp-specialized indexer logits kernels (ragged form, sm_90a) for heads padded to 32 and 64 (17..64 heads).
#define NVFP4MLA_INDEXER_WS_INSTANTIATE
#include "ops/indexer/indexer_logits_ws.cuh"

namespace nvfp4mla::cuda::indexer_kernels {
template bool launch_ws<32>(const Params&, const CUtensorMap&, dim3, cudaStream_t);
template bool launch_ws<64>(const Params&, const CUtensorMap&, dim3, cudaStream_t);
}  // namespace nvfp4mla::cuda::indexer_kernels
