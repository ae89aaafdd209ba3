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

#include "nvfp4mla/decode_plan.h"
#include "nvfp4mla/format.h"
#include "nvfp4mla/fused_select.h"
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

// ---- the decode step under DCP ----
//
// One layer's selection and attention over N ranks (docs/DCP.md, "The DCP step"). Each rank
// holds its latent cache and either the indexer logits of its own tokens (columns = local
// positions) or its index key cache, from which the step computes them. Per rank:
//   1. the top-k of its logits over its local row lengths (dcp_local_row_lengths): given
//      logits through top-k (topk.h); or, with an indexer (index_heads > 0), fused selection
//      (fused_select.h) over the rank's index key cache, each row its own request (its table
//      row and its local length, so MTP rows see exactly their causal tokens); its local
//      positions turned into global ones (dcp_local_to_global): (value, global position)
//      candidates;
//   2. exact mode: the candidates of all ranks all-gathered and merged into the global top-k
//      (dcp_merge_topk), equal to the single-GPU top-k of the whole row bit for bit;
//      union mode: each rank keeps its own top-k (no gather; the union of N local top-k sets,
//      up to N k tokens, is attended);
//   3. the selection's positions of this rank mapped to its cache slots (dcp_local_indices) and
//      sparse decode over them: a partial (out, lse);
//   4. the partials all-gathered and merged (dcp_merge): every rank ends with the same out, lse.

enum class DcpSelection : uint8_t {
  exact = 0,       // global top-k: equals single-GPU selection
  union_local = 1  // each rank attends its own local top-k (cheaper, approximate)
};
const char* to_string(DcpSelection s);

// Local row lengths of `rank` for the paged rows of the indexer (indexer.h): row b * next_n + i
// attends global positions 0..paged_row_length(context_lens[b], next_n, i)-1, of which
// dcp_local_length(...) live on the rank. (MTP rows: the local length of row i is not the local
// context minus next_n - 1 - i, since the newest tokens may live on other ranks.) Throws Error
// naming context_lens for a negative entry, before writing.
void dcp_local_row_lengths(const DcpPlacement& p, int rank, const int32_t* context_lens, int64_t requests, int next_n,
                           int32_t* lengths);
// Local positions (>= 0; negative entries stay -1) of `rank` to global positions, in place.
// Throws Error naming positions when a global position exceeds 2^31-1, before writing.
void dcp_local_to_global(const DcpPlacement& p, int rank, int32_t* positions, int64_t n);

struct DcpStepArgs {
  DcpPlacement placement;
  DcpSelection selection = DcpSelection::exact;
  RecordSpec spec;
  int rows = 0;          // query rows (requests * next_n)
  int heads = 0;         // attention heads
  int k = 0;             // the global k (exact) and every rank's k, 1..kTopkMaxK
  int64_t columns = 0;   // local logits columns: every local row length is at most this
  int64_t logits_stride = 0;  // >= columns (given logits; unused with the indexer)
  // Local positions -> this rank's cache slots (topk.h's slot map; block_table is per rank, in
  // DcpRankStep, and must be null here). capacity: slots of each rank's latent cache.
  TopkSlotMap slots;
  float sm_scale = 0.0f;
  float layer_scale = 1.0f;
  LseBase lse_base = LseBase::natural;
  // The indexer (optional). index_heads 0: each rank passes its logits and local lengths.
  // index_heads 1..64: each rank passes its index key cache (index_pages pages of
  // slots.page_size keys, index_key.h; the pages of its latent cache), the index queries and the
  // context lengths, and the step selects with its indexer; slots.rows_per_request must be
  // next_n (rows b * next_n + i belong to request b, indexer.h's causal rows).
  int index_heads = 0;
  int64_t index_pages = 0;
  int next_n = 1;
};

// One rank's inputs and outputs (device pointers on the GPU, host pointers in the reference).
template <class Out>
struct DcpRankStepOf {
  const float* logits = nullptr;        // [rows, logits_stride]: indexer logits of the local positions
  const int32_t* lengths = nullptr;     // [rows]: local row lengths (dcp_local_row_lengths)
  const uint16_t* q = nullptr;          // [rows, heads, 576] BF16 (the same on every rank)
  const uint8_t* cache = nullptr;       // the rank's latent cache [slots.capacity, record_bytes]
  const int32_t* block_table = nullptr; // the rank's block table (slots' layout)
  Out* out = nullptr;                   // [rows, heads, 512]: the merged attention (BF16 bits on the GPU)
  float* lse = nullptr;                 // [rows, heads] or null
  int32_t* indices = nullptr;           // [rows, k]: exact: the global top-k's positions (the same on
                                        // every rank); union: this rank's own top-k, as global positions
  int32_t* topk_length = nullptr;       // [rows]
  float* values = nullptr;              // [rows, k] their logits, or null
  unsigned long long* errors = nullptr; // GPU only, optional: a device word set to the count of
                                        // device-side errors (local lengths outside 0..columns,
                                        // selected positions without a slot, bad context lengths or
                                        // index block table entries); unused by the reference
  // With the indexer (DcpStepArgs::index_heads > 0), instead of logits and lengths:
  const uint8_t* index_cache = nullptr;  // the rank's index key cache [index_pages, page_size * 132]
  const uint8_t* index_q = nullptr;      // E4M3 [rows, index_heads, 128] (the same on every rank)
  const float* index_w = nullptr;        // fp32 [rows, index_heads]
  const int32_t* context_lens = nullptr; // [requests]: global context lengths
};
using DcpRankStep = DcpRankStepOf<uint16_t>;
using DcpRankStepReference = DcpRankStepOf<float>;

// Checks shapes, k, the placement, that the last global position of `columns` local positions
// fits int32, and the pointers of `rank_steps` (`count` entries); throws Error naming the argument.
template <class Out>
void validate_dcp_step_args(const DcpStepArgs& a, const DcpRankStepOf<Out>* rank_steps, int count);

// The GPU step's plan and the per-rank workspace layout (host only; offsets 256-byte aligned).
// The gathered regions hold every rank's block (rank r's at r times the block), so each rank's
// local results are written into its own block and gathered in place.
struct DcpStepPlan {
  TopkPlan local_topk;           // plan_topk(rows, columns) (given logits)
  FusedSelectPlan select;        // plan_fused_select of dcp_fused_select_args (with the indexer)
  TopkPlan merge_topk;           // plan_topk(rows, ranks * k)
  DecodePlan decode;             // plan_sparse_decode(spec, rows, heads, k)
  size_t candidate_indices_offset = 0;  // i32 [ranks, rows, k]
  size_t candidate_values_offset = 0;   // f32 [ranks, rows, k]
  size_t candidate_lengths_offset = 0;  // i32 [ranks, rows]
  size_t local_indices_offset = 0;      // i32 [rows, k]
  size_t row_lengths_offset = 0;        // i32 [rows] (with the indexer): local row lengths
  size_t row_table_offset = 0;          // i32 [rows, slots.table_stride] (with the indexer): each
                                        // row's copy of its request's block table row
  size_t select_errors_offset = 0;      // u64 (with the indexer): fused selection's invalid count
  size_t partial_out_offset = 0;        // bf16 [ranks, rows, heads, 512]
  size_t partial_lse_offset = 0;        // f32 [ranks, rows, heads]
  size_t scratch_offset = 0;            // the top-k, merge and decode workspaces, one after the other
  size_t scratch_bytes = 0;
  size_t workspace_bytes = 0;           // per rank
  size_t gathered_bytes_per_layer = 0;  // bytes each rank receives from the others in one step
};
// Throws Error (validate_dcp_step_args' shape checks) for bad arguments.
DcpStepPlan plan_dcp_step(const DcpStepArgs& a, int sm_count);
// Throws Error unless `plan`'s workspace regions are the ones plan_dcp_step makes for `a`'s sizes
// (a plan made for other rows, heads, k, ranks or block table stride would send the gathers past
// the workspace).
void validate_dcp_step_plan(const DcpStepArgs& a, const DcpStepPlan& plan);

// The top-k one rank runs over logits it was given ([rows, logits_stride] over its local
// positions, row lengths `lengths`), as local positions.
TopkArgs dcp_local_topk_args(const DcpStepArgs& a, const float* logits, const int32_t* lengths);

// The fused selection one rank runs with the indexer: rows as requests of one row each, over
// row_table ([rows, slots.table_stride]: row r holds its request's table row) and row_lengths
// (the local row lengths), max_context = columns, positions (not slots) out.
FusedSelectArgs dcp_fused_select_args(const DcpStepArgs& a, const uint8_t* index_cache, const uint8_t* index_q,
                                      const float* index_w, const int32_t* row_lengths, const int32_t* row_table);

// CPU reference of the whole step over all N ranks (rank_steps[r] for r = 0..N-1, host pointers;
// the reference's decode is sparse_mla_reference with `options`, out fp32). Validates everything
// first and writes nothing when it throws (topk_reference's and the merges' checks).
void dcp_decode_step_reference(const DcpStepArgs& a, const DcpRankStepReference* rank_steps,
                               const ReferenceOptions& options = {});

}  // namespace nvfp4mla
