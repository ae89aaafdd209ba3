#pragma once
// Exact top-k on the GPU (CUDA builds only). Semantics: topk.h; the output equals
// topk_reference bit for bit.
//
// Three passes of radix select over order-preserving 32-bit keys (11, 11 and 10 bits) find the
// key T of the last selected entry and how many entries equal to T to take; a compaction in
// column order (block prefix sums, and per-segment offsets for split rows) then writes the
// entries above T and the first `need` entries equal to T, so the output is ascending with no
// sort and no candidate buffer that could overflow: every pass counts every entry.
//
// All pointers are device pointers. Every buffer comes from the caller; nothing is allocated
// and nothing synchronizes, so the call can be captured in a CUDA graph (split_rows plans issue
// a cudaMemsetAsync of the workspace and three more kernels after it).
//
// Data the host cannot see is checked on the device and counted in *error_count (when given;
// read it after the stream work completes): a length outside 0..columns (the row then gives
// topk_length 0 and -1s), and with a block table a selected position without a valid slot (its
// index becomes -1, topk.h). Everything else topk.h's validate_topk_args checks throws Error
// before anything is launched or written.
#include <cuda_runtime_api.h>

#include <cstddef>

#include "nvfp4mla/topk.h"

namespace nvfp4mla::cuda {

// `plan` from plan_topk (or split_topk_plan) for args.rows and args.columns; `workspace` of at
// least topk_workspace_bytes(plan, rows) bytes, 16-byte aligned (may be null when that is 0).
void topk(const TopkArgs& args, const TopkPlan& plan, void* workspace, size_t workspace_bytes, const TopkOutputs& out,
          unsigned long long* error_count, cudaStream_t stream);

}  // namespace nvfp4mla::cuda
