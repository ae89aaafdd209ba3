#pragma once
// Fused DSA selection (decode/paged form): each row's exact top-k of its indexer logits
// (indexer.h, paged form) over a long context, without a [rows, context] logits buffer.
//
// The context is cut into chunks of `chunk` positions (a multiple of page_size). For each chunk
// the logits of every row go into a workspace of [rows, chunk + next_n - 1] floats, the chunk is
// reduced to its top-k (values and positions, topk.h), and the chunks' candidates, concatenated
// in position order, are selected again with the same total order (value descending, position
// ascending). That fold equals the top-k of the whole row (topk.h, docs/SELECTION.md), so the
// result is exactly
//   indexer_logits_reference(paged) followed by topk_reference(k)
// on the same inputs, for every chunk size: the outputs of topk.h (indices ascending, -1
// padded; topk_length; optional values), and with slot_ids the selected positions mapped to
// cache slots through the request's block table (topk.h's slot transform, capacity
// num_pages * page_size, rows_per_request next_n).
#include <cstddef>
#include <cstdint>

#include "nvfp4mla/hd.h"
#include "nvfp4mla/indexer.h"
#include "nvfp4mla/topk.h"

namespace nvfp4mla {

struct FusedSelectArgs {
  // The paged indexer problem; its logits must be null and logits_stride 0 (nothing is
  // materialized).
  IndexerPagedArgs keys;
  int64_t max_context = 0;  // the largest context_lens entry allowed; sizes the work (chunks)
  int k = 0;                // 1..kTopkMaxK
  bool slot_ids = false;    // write cache slots instead of positions
};

// Ragged (prefill) form: row r scores keys row_starts[r] .. row_ends[r]-1 of a contiguous key
// buffer (indexer.h, ragged form); its positions are the row's columns 0 .. length-1 and the
// result equals indexer_logits_reference(ragged) followed by topk_reference(k), chunk after
// chunk of `chunk` columns (any positive chunk). No slot transform.
struct FusedSelectRaggedArgs {
  IndexerRaggedArgs keys;  // logits null and logits_stride 0
  int64_t max_length = 0;  // the longest row_ends - row_starts allowed; sizes the work
  int k = 0;
};

// Chunk [first, first + chunk) of a row scoring keys [start, end): its keys [*s, *e).
NVFP4MLA_HD void fused_chunk_range(int64_t start, int64_t end, int64_t first, int64_t chunk, int32_t* s, int32_t* e) {
  const int64_t len = end - start;
  const int64_t lo = first < len ? first : len, hi = first + chunk < len ? first + chunk : len;
  *s = static_cast<int32_t>(start + lo);
  *e = static_cast<int32_t>(start + hi);
}

// Up to this many bytes of logits the planner takes the whole context as one chunk.
inline constexpr int64_t kFusedSelectLogitsBudget = int64_t(64) << 20;

// Workspace layout and launch plan (host-only, CUDA-free: callers size the workspace with what
// the kernels use). Every region starts at a 256-byte boundary.
struct FusedSelectPlan {
  int64_t chunk = 0;         // positions per chunk
  int64_t chunks = 0;        // ceil(max_context / chunk), at least 1
  int64_t logits_stride = 0; // chunk + next_n - 1 rounded up to 4 (see fused_chunk_context)
  TopkPlan chunk_topk, fold_topk;
  // Byte offsets into the workspace.
  size_t logits_offset = 0;         // f32 [rows, logits_stride]
  size_t chunk_context_offset = 0;  // i32 [requests]: the chunk's context lengths (ragged: the
                                    // chunk's ranges, i32 [2, rows])
  size_t counter_offset = 0;        // u64: the indexer's own invalid counter
  size_t chunk_indices_offset = 0;  // i32 [rows, k]
  size_t chunk_values_offset = 0;   // f32 [rows, k]
  size_t chunk_lengths_offset = 0;  // i32 [rows]
  size_t candidate_positions_offset = 0;  // i32 [rows, chunks * k]
  size_t candidate_values_offset = 0;     // f32 [rows, chunks * k]
  size_t topk_workspace_offset = 0;
  size_t topk_workspace_bytes = 0;
  size_t workspace_bytes = 0;  // total
};

// The context length handed to the paged indexer for the chunk starting at position `first`
// (its block table shifted by first / page_size pages): the request's remaining context, capped
// at chunk + next_n - 1. Row i then scores min(its remaining length, chunk + i) >= its first
// min(remaining, chunk) positions, the chunk's share, so the chunk's top-k reads columns
// 0..chunk-1 (the indexer's -inf past each row's length) with no per-row lengths.
NVFP4MLA_HD int64_t fused_chunk_context(int64_t context_len, int64_t first, int64_t chunk, int next_n) {
  const int64_t rest = context_len - first;
  const int64_t cap = chunk + next_n - 1;
  return rest < 0 ? 0 : (rest < cap ? rest : cap);
}

// The planner. `chunk` 0 picks the whole context (rounded up to a page) when its logits,
// rows x (chunk + next_n - 1) floats, fit kFusedSelectLogitsBudget: one chunk, the fold a top-k
// of k candidates. Otherwise the chunk that minimizes a row's workspace (4 chunk bytes of logits
// plus 8 k bytes of candidates per chunk): sqrt(2 k max_context) rounded up to a page, at least
// k. A non-zero `chunk` must be a positive multiple of keys.page_size. The top-k plans come from
// plan_topk for `sm_count` SMs. Throws Error naming the argument for bad shapes, k or chunk.
FusedSelectPlan plan_fused_select(const FusedSelectArgs& args, int64_t chunk, int sm_count);
// Ragged: the same rule with max_length for the context and pages of one position.
FusedSelectPlan plan_fused_select(const FusedSelectRaggedArgs& args, int64_t chunk, int sm_count);

// The pieces both implementations compose (so the CPU and GPU chains are the same chain):
// chunk c's paged indexer problem (block table shifted to the chunk's first page, context
// lengths from fused_chunk_context in `chunk_context`, logits into `logits`), the chunk's top-k
// (columns 0..chunk-1 at position offset c * chunk) and the fold over the candidate lists.
IndexerPagedArgs fused_chunk_problem(const FusedSelectArgs& args, const FusedSelectPlan& plan, int64_t c,
                                     const int32_t* chunk_context, float* logits);
TopkArgs fused_chunk_topk_args(const FusedSelectArgs& args, const FusedSelectPlan& plan, int64_t c, const float* logits);
TopkArgs fused_fold_args(const FusedSelectArgs& args, const FusedSelectPlan& plan, const float* candidate_values,
                         const int32_t* candidate_positions);
// Ragged: chunk c's problem reads the chunk's ranges from chunk_ranges ([starts rows][ends rows]).
IndexerRaggedArgs fused_chunk_problem(const FusedSelectRaggedArgs& args, const FusedSelectPlan& plan,
                                      const int32_t* chunk_ranges, float* logits);
TopkArgs fused_chunk_topk_args(const FusedSelectRaggedArgs& args, const FusedSelectPlan& plan, int64_t c, const float* logits);
TopkArgs fused_fold_args(const FusedSelectRaggedArgs& args, const FusedSelectPlan& plan, const float* candidate_values,
                         const int32_t* candidate_positions);

// Checks what every implementation checks on the host (the indexer's argument checks, k,
// max_context, logits unset, the outputs); throws Error naming the argument.
void validate_fused_select_args(const FusedSelectArgs& args, const TopkOutputs& out);
void validate_fused_select_args(const FusedSelectRaggedArgs& args, const TopkOutputs& out);

// The metadata checks of the paged CPU reference (host memory): context lengths in
// 0..max_context, and the block table entries each context needs (validate_indexer_metadata).
// Throws Error naming the request and the argument.
void validate_fused_select_metadata(const FusedSelectArgs& args);

// CPU reference: the same chunked composition on the host (indexer_logits_reference on each
// chunk, topk_reference on the chunk and on the fold), for `chunk` as plan_fused_select takes
// it. Host pointers. Validates everything (context_lens <= max_context, the block table) first
// and writes nothing when it throws.
void fused_select_reference(const FusedSelectArgs& args, int64_t chunk, const TopkOutputs& out);
// Ragged: validates the ranges (inside the keys, lengths <= max_length) first.
void fused_select_reference(const FusedSelectRaggedArgs& args, int64_t chunk, const TopkOutputs& out);

}  // namespace nvfp4mla
