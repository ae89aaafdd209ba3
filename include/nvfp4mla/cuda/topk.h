#pragma once
// Exact top-k on the GPU (CUDA builds only). Semantics: topk.h; the output equals
// topk_reference bit for bit.
//
// Radix select over order-preserving 32-bit keys (digits of 11, 11 and 10 bits) finds the key T
// of the last selected entry and how many entries equal to T to take. Split rows whose entries
// sharing the k-th entry's first digit (or first two) fit the plan's candidate buffer are then
// filtered: one more read keeps the entries above that prefix and, as candidates, those with it;
// a finisher CTA per row resolves the candidates and sorts the selected columns. Every other row
// takes all three passes and a compaction in column order (block prefix sums and per-segment
// offsets). The candidates are counted exactly before any is written, so no buffer can overflow.
// resident_rows plans run the three passes and the compaction in one cooperative launch, each CTA
// holding its segment in registers. docs/SELECTION.md describes the algorithm.
//
// All pointers are device pointers. Every buffer comes from the caller; nothing is allocated
// and nothing synchronizes, so the call can be captured in a CUDA graph (split_rows plans issue
// a cudaMemsetAsync of the workspace and up to five kernels after it, resident_rows plans the
// memset and one kernel).
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
