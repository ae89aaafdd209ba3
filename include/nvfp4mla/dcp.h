#pragma once
// Decode context parallelism (DCP): the KV cache of every request is split over N ranks (GPUs).
//
// Placement. With `ranks` N and `interleave` I (a power of two; 1 is vLLM's default), token i of
// a request lives on rank (i / I) % N at local position (i / (I * N)) * I + i % I: blocks of I
// consecutive tokens go round-robin over the ranks, and each rank keeps its tokens in global
// order. All positions are int64.
//
// Writer slots. All ranks share one block table whose pages each hold page_size * N global
// positions (a "virtual" page, page_size a multiple of I); page b of rank r holds that rank's
// page_size tokens of virtual page b. A global slot s = b * (page_size * N) + v becomes, on the
// rank that owns virtual offset v, the local slot b * page_size + (v / (I * N)) * I + v % I, and
// -1 (skipped by the cache writers) on every other rank.
//
// Merge of partial attention. Each rank attends the selected tokens it holds and returns a
// normalized output out_r [rows, heads, 512] and its log-sum-exp lse_r [rows, heads] (the
// sparse decode kernels' outputs, sparse_mla.h). The merge gives the attention over all of them:
//   lse = log(sum_r exp(lse_r)),  out = sum_r exp(lse_r - lse) out_r
// in fp32, in the LSE base of the inputs (natural or base 2, as SparseMlaArgs::lse_base). A rank
// with lse_r = -inf (no token of the row) contributes nothing and its out_r is never read; a row
// where every rank is empty gives out = 0 and lse = -inf, as sparse decode does for an empty row.
//
// Selection. Each rank computes the top-k of its own tokens (topk.h) with the global position of
// every local entry as its position (dcp_global_positions), and so returns (value, global
// position) candidates in ascending position order, -1 / -inf padded. dcp_merge_topk_reference
// merges the gathered candidates of all ranks into the top-k of the whole row, equal to
// topk_reference of the undivided row bit for bit (same tie rule: larger value first, then the
// smaller position).
#include <cstddef>
#include <cstdint>

#include "nvfp4mla/sparse_mla.h"
#include "nvfp4mla/topk.h"

namespace nvfp4mla {

struct DcpPlacement {
  int ranks = 1;       // N >= 1
  int interleave = 1;  // I: a power of two (1, 2, 4, ... up to 2^30)
};

struct DcpLocation {
  int rank = 0;
  int64_t local = 0;  // position among the rank's tokens of the request
};

// Throws Error naming `ranks` or `interleave` when the placement is invalid.
void validate_dcp_placement(const DcpPlacement& p);

// global -> (rank, local). Throws Error (naming `global`) for a negative position.
DcpLocation dcp_locate(const DcpPlacement& p, int64_t global);
// (rank, local) -> global. Throws Error naming `rank` (outside 0..N-1) or `local` (negative, or
// its global position past INT64_MAX).
int64_t dcp_global_position(const DcpPlacement& p, int rank, int64_t local);
// How many of the positions 0..context_length-1 live on `rank`.
int64_t dcp_local_length(const DcpPlacement& p, int rank, int64_t context_length);
// out[i] = the global position of local position i of `rank`, i < n (for the per-rank top-k:
// TopkArgs::positions; strictly increasing). Throws Error naming `out` when the last one
// exceeds 2^31-1, before writing anything.
void dcp_global_positions(const DcpPlacement& p, int rank, int32_t* out, int64_t n);

// Writer slots of `rank` from n global slots (see above); negative global slots give -1. Throws
// Error naming `page_size` unless it is a positive multiple of the interleave, `rank`, or `n`
// when negative.
void dcp_local_slot_mapping(const DcpPlacement& p, int page_size, int rank, const int64_t* global_slots, int64_t n,
                            int64_t* local_slots);

// Attention indices of `rank` for the global selection: positions [rows, k] int32 global
// positions (a top-k's indices, -1 padded) become the rank's cache slots through its block
// table (`slots`, over local positions: local position l of row i sits at
// topk_slot(slots, i, l), topk.h), and -1 (masked by sparse decode, never read) for positions
// of other ranks and for the padding. With the writer slots above, `slots` is the shared block
// table with page_size. A position of this rank without a valid slot is an error: the CPU
// throws Error naming block_table before writing; the GPU (cuda/dcp.h) writes -1 and counts it.
// In-place (local_indices == positions) is allowed.
void dcp_local_indices_reference(const DcpPlacement& p, int rank, const int32_t* positions, int rows, int k,
                                 const TopkSlotMap& slots, int32_t* local_indices);

// The checks every implementation of the two mappings above makes; throw Error naming the argument.
void validate_dcp_slot_mapping_args(const DcpPlacement& p, int page_size, int rank, int64_t n);
void validate_dcp_local_indices_args(const DcpPlacement& p, int rank, const int32_t* positions, int rows, int k,
                                     const TopkSlotMap& slots, const int32_t* local_indices);

// ---- merge of partial attention ----

enum class DcpPartialType : uint8_t { f32 = 0, bf16 = 1 };

inline constexpr int kDcpLatentDim = 512;

struct DcpMergeArgs {
  int ranks = 0;
  int rows = 0;
  int heads = 0;
  const void* partial_out = nullptr;  // [ranks, rows, heads, 512] of partial_type
  DcpPartialType partial_type = DcpPartialType::f32;
  const float* partial_lse = nullptr;  // [ranks, rows, heads]
  LseBase lse_base = LseBase::natural;
};

struct DcpMergeOutputs {
  void* out = nullptr;  // [rows, heads, 512] of out_type
  DcpPartialType out_type = DcpPartialType::f32;
  float* lse = nullptr;  // [rows, heads], or null
};

// Shapes and pointers; throws Error naming the argument.
void validate_dcp_merge_args(const DcpMergeArgs& args, const DcpMergeOutputs& out);
// CPU reference (fp64 accumulation, rounded once to the output type). Host pointers.
void dcp_merge_reference(const DcpMergeArgs& args, const DcpMergeOutputs& out);

// ---- selection ----

struct DcpTopkMergeArgs {
  int ranks = 0;
  int rows = 0;
  int k_rank = 0;                  // candidates per rank and row (the ranks' top-k k), 1..kTopkMaxK
  const int32_t* indices = nullptr;  // [ranks, rows, k_rank] global positions, ascending, -1 padded
  const float* values = nullptr;     // [ranks, rows, k_rank] their values, -inf in the padding
  const int32_t* topk_length = nullptr;  // [ranks, rows]: valid candidates of each rank and row
  int k = 0;                       // the global k, 1..k_rank (the ranks' top-k must cover it)
};

// Merges the ranks' candidates of each row into the row's global top-k (TopkOutputs: ascending
// positions, -1 padding, topk_length, optional values). Host pointers. Throws Error naming the
// argument for bad shapes, a topk_length outside 0..k_rank, or a rank's positions that are not
// strictly increasing or are claimed by two ranks.
void dcp_merge_topk_reference(const DcpTopkMergeArgs& args, const TopkOutputs& out);

// The GPU merge (cuda/dcp.h) places the candidates of each row in position order into the
// workspace (values, positions, lengths) and runs the exact top-k on them with `plan`, which
// must come from plan_topk(rows, ranks * k_rank, sm_count). The workspace it needs (offsets
// 256-byte aligned):
struct DcpMergeTopkWorkspace {
  size_t values_offset = 0;     // fp32 [rows, ranks * k_rank]
  size_t positions_offset = 0;  // int32 [rows, ranks * k_rank]
  size_t lengths_offset = 0;    // int32 [rows]
  size_t topk_offset = 0;       // the top-k's workspace (topk_workspace_bytes)
  size_t total_bytes = 0;
};
DcpMergeTopkWorkspace dcp_merge_topk_workspace(const DcpTopkMergeArgs& args, const TopkPlan& plan);
// Checks on what the host can see (shapes, k, k_rank, pointers); throws Error naming the argument.
void validate_dcp_merge_topk_args(const DcpTopkMergeArgs& args, const TopkOutputs& out);

}  // namespace nvfp4mla
