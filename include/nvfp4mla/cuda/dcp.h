#pragma once
// Decode context parallelism on the GPU (CUDA builds only). Semantics: dcp.h.
// All pointers are device pointers. Every buffer comes from the caller: nothing is allocated and
// nothing synchronizes, so the calls can be captured in a CUDA graph.
#include <cuda_runtime_api.h>

#include "nvfp4mla/dcp.h"

namespace nvfp4mla::cuda {

// Merges the gathered partial attention of the ranks (dcp.h): one warp per (row, head), fp32
// arithmetic. Throws Error (validate_dcp_merge_args) before launching anything.
void dcp_merge(const DcpMergeArgs& args, const DcpMergeOutputs& out, cudaStream_t stream);

}  // namespace nvfp4mla::cuda
