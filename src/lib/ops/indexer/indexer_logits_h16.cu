// Indexer logits kernels for rows of up to 16 heads (one translation unit per head padding, so
// the instantiations compile in parallel).
#define NVFP4MLA_INDEXER_INSTANTIATE
#include "ops/indexer/indexer_logits.cuh"

namespace nvfp4mla::cuda::indexer_kernels {
template void launch_for_heads<16>(Mma, Source, int, const Params&, dim3, cudaStream_t);
}  // namespace nvfp4mla::cuda::indexer_kernels
