// Fused selection on the GPU: the chain of fused_select.h on one stream. The logits and top-k
// work is the existing kernels' (cuda/indexer.h, cuda/topk.h); the kernels here only check the
// metadata, derive each chunk's context lengths and copy chunk candidates into the row's list.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <string>

#include "nvfp4mla/cuda/fused_select.h"
#include "nvfp4mla/cuda/topk.h"
#include "nvfp4mla/error.h"

namespace nvfp4mla::cuda {
namespace {

constexpr const char* kOp = "fused select";

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw Error(std::string(kOp) + ": " + what + ": " + cudaGetErrorString(e));
}

// Blocks (request, part): a context outside 0..max_context and one needing more pages than the
// table's width count as one error each (part 0), and each table entry the request needs outside
// the cache as one; the parts of a request split its entries (a 1M-token context has 16,384).
__global__ void check_requests(const int32_t* __restrict__ context_lens, const int32_t* __restrict__ table, int64_t table_stride,
                               int64_t page_size, int64_t num_pages, int64_t max_context, unsigned long long* invalid_count) {
  const int64_t b = blockIdx.x;
  const int64_t len = context_lens[b];
  const int64_t pages = len < 0 ? 0 : (len + page_size - 1) / page_size;
  if (len < 0 || len > max_context || pages > table_stride) {
    if (blockIdx.y == 0 && threadIdx.x == 0) atomicAdd(invalid_count, 1ull);
    return;
  }
  unsigned long long bad = 0;
  for (int64_t p = int64_t(blockIdx.y) * blockDim.x + threadIdx.x; p < pages; p += int64_t(gridDim.y) * blockDim.x) {
    const int32_t e = table[b * table_stride + p];
    bad += (e < 0 || e >= num_pages) ? 1 : 0;
  }
  if (bad) atomicAdd(invalid_count, bad);
}

// The chunk's context lengths; all zero (nothing scored, nothing selected) after a bad request.
__global__ void chunk_contexts(const int32_t* __restrict__ context_lens, int64_t requests, int64_t first, int64_t chunk, int next_n,
                               const unsigned long long* __restrict__ invalid_count, int32_t* __restrict__ out) {
  const int64_t b = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (b >= requests) return;
  out[b] = *invalid_count ? 0 : static_cast<int32_t>(fused_chunk_context(context_lens[b], first, chunk, next_n));
}

// One thread per row: a range outside the keys or longer than max_length is one error.
__global__ void check_ranges(const int32_t* __restrict__ starts, const int32_t* __restrict__ ends, int64_t rows, int64_t num_keys,
                             int64_t max_length, unsigned long long* invalid_count) {
  const int64_t r = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (r >= rows) return;
  const int64_t s = starts[r], e = ends[r];
  if (s < 0 || s > e || e > num_keys || e - s > max_length) atomicAdd(invalid_count, 1ull);
}

// The chunk's ranges ([starts rows][ends rows]); all empty after a bad row.
__global__ void chunk_ranges(const int32_t* __restrict__ starts, const int32_t* __restrict__ ends, int64_t rows, int64_t first,
                             int64_t chunk, const unsigned long long* __restrict__ invalid_count, int32_t* __restrict__ out) {
  const int64_t r = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (r >= rows) return;
  if (*invalid_count) {
    out[r] = out[rows + r] = 0;
    return;
  }
  fused_chunk_range(starts[r], ends[r], first, chunk, &out[r], &out[rows + r]);
}

// Chunk c's [rows, k] top-k (positions, values) into columns c*k.. of the rows' candidate lists.
__global__ void append_candidates(const int32_t* __restrict__ indices, const float* __restrict__ values, int64_t rows, int k,
                                  int64_t c, int64_t candidates, int32_t* __restrict__ positions, float* __restrict__ list) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= rows * k) return;
  const int64_t r = i / k, j = i % k;
  positions[r * candidates + c * k + j] = indices[i];
  list[r * candidates + c * k + j] = values[i];
}

template <class T>
T* at(void* base, size_t offset) {
  return reinterpret_cast<T*>(static_cast<char*>(base) + offset);
}

unsigned blocks_for(int64_t n) { return static_cast<unsigned>((n + 255) / 256); }

// The plan and workspace checks both forms make. `expected` is the plan recomputed for the
// arguments: the layout up to the top-k workspace does not depend on the SM count, and cuda::topk
// checks its own plans against the workspace it is given.
void check_plan(const FusedSelectPlan& plan, const FusedSelectPlan& expected, const void* workspace, size_t workspace_bytes,
                const unsigned long long* invalid_count) {
  if (!invalid_count) throw Error(std::string(kOp) + ": invalid_count (a device word) is required");
  if (plan.chunks != expected.chunks || plan.logits_stride != expected.logits_stride ||
      plan.topk_workspace_offset != expected.topk_workspace_offset ||
      plan.workspace_bytes < plan.topk_workspace_offset + plan.topk_workspace_bytes)
    throw Error(std::string(kOp) + ": plan does not match the arguments (use plan_fused_select)");
  if (workspace_bytes < plan.workspace_bytes)
    throw Error(std::string(kOp) + ": workspace_bytes " + std::to_string(workspace_bytes) + " is below the plan's " +
                std::to_string(plan.workspace_bytes));
  if (plan.workspace_bytes > 0 && (!workspace || reinterpret_cast<uintptr_t>(workspace) % 256 != 0))
    throw Error(std::string(kOp) + ": workspace must be non-null and 256-byte aligned");
}

// Both forms' device chain after the metadata check: per chunk `score(c, logits, counter)`
// (chunk metadata and logits), the chunk's top-k, the candidates appended; then the fold.
template <class Args, class Score>
void chain(const Args& args, int64_t rows, const FusedSelectPlan& plan, void* workspace, const TopkOutputs& out,
           unsigned long long* invalid_count, cudaStream_t stream, Score score) {
  auto* logits = at<float>(workspace, plan.logits_offset);
  auto* counter = at<unsigned long long>(workspace, plan.counter_offset);
  auto* chunk_indices = at<int32_t>(workspace, plan.chunk_indices_offset);
  auto* chunk_values = at<float>(workspace, plan.chunk_values_offset);
  auto* chunk_lengths = at<int32_t>(workspace, plan.chunk_lengths_offset);
  auto* positions = at<int32_t>(workspace, plan.candidate_positions_offset);
  auto* list = at<float>(workspace, plan.candidate_values_offset);
  void* topk_ws = plan.topk_workspace_bytes ? at<void>(workspace, plan.topk_workspace_offset) : nullptr;
  const int64_t candidates = plan.chunks * args.k;
  if (plan.chunks == 1) {
    // The fold of a single chunk's list returns that list unchanged (same k, same tie rule and
    // order), so the chunk's top-k goes straight to the outputs, slot transform included.
    score(0, logits, counter);
    TopkArgs t = fused_chunk_topk_args(args, plan, 0, logits);
    t.slots = fused_fold_args(args, plan, list, positions).slots;
    // The chunk may reach past the block table's pages (max_context rounded up, or above what the
    // table covers): those columns hold -inf, since a context needing them is flagged invalid and
    // zeroed, so the top-k reads only the positions the table covers.
    if (t.slots.block_table) t.columns = std::min<int64_t>(t.columns, t.slots.pages * int64_t(t.slots.page_size));
    topk(t, plan.chunk_topk, topk_ws, plan.topk_workspace_bytes, out, invalid_count, stream);
    return;
  }
  for (int64_t c = 0; c < plan.chunks; ++c) {
    score(c, logits, counter);
    topk(fused_chunk_topk_args(args, plan, c, logits), plan.chunk_topk, topk_ws, plan.topk_workspace_bytes,
         {chunk_indices, chunk_lengths, chunk_values}, nullptr, stream);
    append_candidates<<<blocks_for(rows * args.k), 256, 0, stream>>>(chunk_indices, chunk_values, rows, args.k, c, candidates,
                                                                     positions, list);
    check(cudaGetLastError(), "append_candidates launch");
  }
  topk(fused_fold_args(args, plan, list, positions), plan.fold_topk, topk_ws, plan.topk_workspace_bytes, out, invalid_count,
       stream);
}

}  // namespace

void fused_select(const FusedSelectArgs& args, const FusedSelectPlan& plan, void* workspace, size_t workspace_bytes,
                  const TopkOutputs& out, unsigned long long* invalid_count, cudaStream_t stream, IndexerMma mma) {
  validate_fused_select_args(args, out);
  check_plan(plan, plan_fused_select(args, plan.chunk, 1), workspace, workspace_bytes, invalid_count);
  const IndexerPagedArgs& keys = args.keys;
  check(cudaMemsetAsync(invalid_count, 0, sizeof *invalid_count, stream), "cudaMemsetAsync");
  if (keys.rows() == 0) return;
  constexpr int64_t kCheckThreads = 128, kMaxCheckParts = 64;
  const int64_t max_pages = (args.max_context + keys.page_size - 1) / keys.page_size;
  const dim3 check_grid(static_cast<unsigned>(keys.requests),
                        static_cast<unsigned>(std::clamp<int64_t>((max_pages + kCheckThreads - 1) / kCheckThreads, 1, kMaxCheckParts)));
  check_requests<<<check_grid, kCheckThreads, 0, stream>>>(keys.context_lens, keys.block_table,
                                                                           keys.block_table_stride, keys.page_size,
                                                                           keys.num_pages, args.max_context, invalid_count);
  check(cudaGetLastError(), "check_requests launch");
  auto* chunk_context = at<int32_t>(workspace, plan.chunk_context_offset);
  chain(args, keys.rows(), plan, workspace, out, invalid_count, stream, [&](int64_t c, float* logits, unsigned long long* counter) {
    chunk_contexts<<<blocks_for(keys.requests), 256, 0, stream>>>(keys.context_lens, keys.requests, c * plan.chunk, plan.chunk,
                                                                  keys.next_n, invalid_count, chunk_context);
    check(cudaGetLastError(), "chunk_contexts launch");
    indexer_logits(fused_chunk_problem(args, plan, c, chunk_context, logits), counter, stream, mma);
  });
}

void fused_select(const FusedSelectRaggedArgs& args, const FusedSelectPlan& plan, void* workspace, size_t workspace_bytes,
                  const TopkOutputs& out, unsigned long long* invalid_count, cudaStream_t stream, IndexerMma mma) {
  validate_fused_select_args(args, out);
  check_plan(plan, plan_fused_select(args, plan.chunk, 1), workspace, workspace_bytes, invalid_count);
  const IndexerRaggedArgs& keys = args.keys;
  check(cudaMemsetAsync(invalid_count, 0, sizeof *invalid_count, stream), "cudaMemsetAsync");
  if (keys.rows == 0) return;
  check_ranges<<<blocks_for(keys.rows), 256, 0, stream>>>(keys.row_starts, keys.row_ends, keys.rows, keys.num_keys,
                                                          args.max_length, invalid_count);
  check(cudaGetLastError(), "check_ranges launch");
  auto* ranges = at<int32_t>(workspace, plan.chunk_context_offset);
  chain(args, keys.rows, plan, workspace, out, invalid_count, stream, [&](int64_t c, float* logits, unsigned long long* counter) {
    chunk_ranges<<<blocks_for(keys.rows), 256, 0, stream>>>(keys.row_starts, keys.row_ends, keys.rows, c * plan.chunk,
                                                            plan.chunk, invalid_count, ranges);
    check(cudaGetLastError(), "chunk_ranges launch");
    indexer_logits(fused_chunk_problem(args, plan, ranges, logits), counter, stream, mma);
  });
}

}  // namespace nvfp4mla::cuda
