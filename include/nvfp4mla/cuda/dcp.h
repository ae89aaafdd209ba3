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

// dcp_local_slot_mapping on the device (n slots; negative n throws Error).
void dcp_local_slot_mapping(const DcpPlacement& p, int page_size, int rank, const int64_t* global_slots, int64_t n,
                            int64_t* local_slots, cudaStream_t stream);

// dcp_local_indices_reference on the device; a position of this rank without a valid slot gives
// -1 and is counted in *error_count (when given).
void dcp_local_indices(const DcpPlacement& p, int rank, const int32_t* positions, int rows, int k,
                       const TopkSlotMap& slots, int32_t* local_indices, unsigned long long* error_count,
                       cudaStream_t stream);

// The global top-k from the ranks' gathered candidates (dcp.h), equal to dcp_merge_topk_reference
// (and so to topk_reference of the whole row) bit for bit. `plan` from plan_topk(rows, ranks *
// k_rank, sm_count); `workspace` of at least dcp_merge_topk_workspace(args, plan).total_bytes bytes,
// 256-byte aligned. A topk_length outside 0..k_rank is counted in *error_count (when given) and
// that rank contributes nothing to the row; the ranks' positions must be strictly increasing and
// disjoint (as the placement makes them): the device does not check it.
void dcp_merge_topk(const DcpTopkMergeArgs& args, const TopkPlan& plan, void* workspace, size_t workspace_bytes,
                    const TopkOutputs& out, unsigned long long* error_count, cudaStream_t stream);

// dcp_local_row_lengths on the device; a negative context length gives 0 for its rows and is
// counted in *error_count (when given).
void dcp_local_row_lengths(const DcpPlacement& p, int rank, const int32_t* context_lens, int64_t requests, int next_n,
                           int32_t* lengths, unsigned long long* error_count, cudaStream_t stream);

// dcp_local_to_global on the device, in place. The caller keeps the global positions within
// int32 (validate_dcp_step_args checks it for the step's columns); larger ones are not checked.
void dcp_local_to_global(const DcpPlacement& p, int rank, int32_t* positions, int64_t n, cudaStream_t stream);

}  // namespace nvfp4mla::cuda
