#pragma once
// Fused DSA selection on the GPU (CUDA builds only): fused_select.h's semantics, as a chain of
// kernels on `stream` (a metadata check, then per chunk: chunk context lengths or ranges, indexer logits,
// top-k with values, a copy into the candidate list; then the top-k fold). The result equals
// cuda::indexer_logits followed by cuda::topk on the same inputs bit for bit (the indexer
// kernels compute each logit the same way whatever the chunk), and fused_select_reference
// wherever the GPU logits equal the CPU logits.
//
// All pointers are device pointers; the workspace (plan.workspace_bytes, 256-byte aligned)
// comes from the caller. Nothing is allocated and nothing synchronizes; the launches depend only
// on the host arguments and the plan, so the call can be captured in a CUDA graph.
//
// *invalid_count (required, a device word) is set to the number of bad requests and block table
// entries: context_lens outside 0..max_context, a context needing more pages than
// block_table_stride, a table entry it needs outside [0, num_pages). When it is not zero every
// row selects nothing (topk_length 0, indices -1). Selected slots past 2^31 (slot_ids) also add
// to it and read -1 (topk.h).
#include <cuda_runtime_api.h>

#include <cstddef>

#include "nvfp4mla/cuda/indexer.h"
#include "nvfp4mla/fused_select.h"

namespace nvfp4mla::cuda {

void fused_select(const FusedSelectArgs& args, const FusedSelectPlan& plan, void* workspace, size_t workspace_bytes,
                  const TopkOutputs& out, unsigned long long* invalid_count, cudaStream_t stream,
                  IndexerMma mma = IndexerMma::automatic);
// Ragged form (fused_select.h): *invalid_count counts rows whose range is outside the keys or
// longer than max_length; when it is not zero every row selects nothing.
void fused_select(const FusedSelectRaggedArgs& args, const FusedSelectPlan& plan, void* workspace, size_t workspace_bytes,
                  const TopkOutputs& out, unsigned long long* invalid_count, cudaStream_t stream,
                  IndexerMma mma = IndexerMma::automatic);

}  // namespace nvfp4mla::cuda
