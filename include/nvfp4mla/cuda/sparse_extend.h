#pragma once
// Sparse MLA extend/prefill on the GPU (CUDA builds only): many query rows (prefill chunks,
// MTP verifier tokens, draft extends), each with its own top-k row and length, one online
// softmax over the whole row (no split workspace, no merge). Same semantics and reference as
// decode (sparse_mla.h).
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "nvfp4mla/arch.h"
#include "nvfp4mla/decode_plan.h"
#include "nvfp4mla/format.h"
#include "nvfp4mla/sparse_mla.h"

namespace nvfp4mla::cuda {

// The decode kernel run with one split per row. out: BF16 [rows, heads, 512]; lse: fp32
// [rows, heads]. No allocation, no synchronization.
void sparse_extend(const RecordSpec& spec, const SparseMlaArgs& args, uint16_t* out, float* lse, cudaStream_t stream);

// ---- Staged extend ----------------------------------------------------------------------------
// A prefill chunk reads the same records many times (4096 rows x 2048 entries over a 65,536-slot
// cache attend each record ~128 times), and the direct kernels dequantize every read. The staged
// extend dequantizes each attended record once, into a bf16-1152 record holding exactly the BF16
// operands the direct kernels compute (stage_records_reference), rewrites the indices to the
// staged records, then attends over those with the 64-entry kernels copying records straight into
// their K buffers (plan_extend_staged). Outputs equal sparse_extend's where both run the same
// 64-entry kernel (bit for bit; a plan's tail rows within its split plan's bounds), and otherwise
// agree to the kernels' BF16 operands.

// Workspace of the staged extend (one buffer, 256-byte aligned pieces). Two ways to stage:
//  - every slot (when capacity <= rows x topk: most slots are attended anyway): the whole cache
//    dequantized by one streaming kernel into `capacity` bf16 records, indices kept as they are;
//  - the attended slots only: a mark and a position per slot (+1: the scan's last position is
//    the staged count), CUB's scan storage, room for min(capacity, rows x topk) records and the
//    rewritten indices [rows, topk].
struct ExtendStagingLayout {
  bool every_slot = false;
  int64_t record_capacity = 0;
  size_t marks_offset = 0, positions_offset = 0, scan_offset = 0, scan_bytes = 0, records_offset = 0,
         indices_offset = 0, total_bytes = 0;
};
ExtendStagingLayout extend_staging_layout(int64_t capacity, int rows, int topk);

// What staging leaves in the workspace (device pointers).
struct StagedRecords {
  bool every_slot = false;
  const uint8_t* records = nullptr;  // bf16-1152 records: of every slot, or of the attended slots in slot order
  const int32_t* indices = nullptr;  // [rows, topk]: the caller's (every slot), or each entry's staged record (-1 where masked)
  const int32_t* count = nullptr;    // attended slots only: one int32, the number of staged records
  int64_t record_capacity = 0;
};
// Stages the records `args` attends (no attention). Throws Error for a short or misaligned
// workspace and for arguments sparse_extend would refuse.
StagedRecords stage_records(const RecordSpec& spec, const SparseMlaArgs& args, void* workspace, size_t workspace_bytes,
                            cudaStream_t stream);

// The attention plan over staged bf16 records: the planner's bf16 kernel (sm90_ws_wide on
// sm_90a), one split per row, its CTAs walking the rows (DecodePlan::row_ctas: one CTA per SM and
// head group). When the rows do not divide among the walking CTAs, the few left over would keep
// a few SMs busy for a whole row after the others finish; if a split launch over every SM takes
// at most half a row's tiles (the planner's estimate), those rows are the `tail`: they run first,
// split, their fp32 partials held in `out` of the walked rows (which the walk then writes).
struct ExtendStagedPlan {
  DecodePlan walk;    // rows [0, walk_rows)
  int walk_rows = 0;
  DecodePlan tail;    // rows [walk_rows, walk_rows + tail_rows), when tail_rows > 0
  int tail_rows = 0;
};
ExtendStagedPlan plan_extend_staged(int rows, int heads, int topk, const ArchSpec& arch);

// Staging, then attention over the staged records. workspace: extend_staging_layout(...).total_bytes,
// 256-byte aligned. No allocation, no synchronization.
void sparse_extend_staged(const RecordSpec& spec, const SparseMlaArgs& args, void* workspace, size_t workspace_bytes,
                          uint16_t* out, float* lse, cudaStream_t stream);
// The same with a plan of plan_extend_staged's for these rows (one made for another SM count, say);
// throws Error for a plan whose rows do not add up or whose tail's partials do not fit `out`.
void sparse_extend_staged(const RecordSpec& spec, const SparseMlaArgs& args, const ExtendStagedPlan& plan, void* workspace,
                          size_t workspace_bytes, uint16_t* out, float* lse, cudaStream_t stream);

}  // namespace nvfp4mla::cuda
