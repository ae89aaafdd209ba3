// Fused selection: the planner, the host checks and the CPU reference (the chunked composition
// of indexer_logits_reference and topk_reference that the GPU chain mirrors).
#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "nvfp4mla/error.h"
#include "nvfp4mla/fused_select.h"

namespace nvfp4mla {
namespace {

[[noreturn]] void fail(const std::string& what) { throw Error("fused select: " + what); }

size_t align_up(size_t n) { return (n + 255) / 256 * 256; }

}  // namespace

IndexerPagedArgs fused_chunk_problem(const FusedSelectArgs& a, const FusedSelectPlan& plan, int64_t c,
                                     const int32_t* chunk_context, float* logits) {
  IndexerPagedArgs s = a.keys;
  if (s.block_table) s.block_table += c * plan.chunk / s.page_size;
  s.context_lens = chunk_context;
  s.logits = logits;
  s.logits_stride = plan.logits_stride;
  return s;
}

TopkArgs fused_chunk_topk_args(const FusedSelectArgs& a, const FusedSelectPlan& plan, int64_t c, const float* logits) {
  TopkArgs t;
  t.values = logits;
  t.rows = static_cast<int>(a.keys.rows());
  t.columns = plan.chunk;
  t.stride = plan.logits_stride;
  t.position_offset = c * plan.chunk;
  t.k = a.k;
  return t;
}

TopkArgs fused_fold_args(const FusedSelectArgs& a, const FusedSelectPlan& plan, const float* candidate_values,
                         const int32_t* candidate_positions) {
  TopkArgs t;
  t.values = candidate_values;
  t.rows = static_cast<int>(a.keys.rows());
  t.columns = plan.chunks * a.k;
  t.stride = t.columns;
  t.positions = candidate_positions;
  t.k = a.k;
  if (a.slot_ids) {
    const IndexerPagedArgs& keys = a.keys;
    t.slots = {keys.block_table, keys.requests,   keys.block_table_stride, keys.block_table_stride,
               static_cast<int>(keys.page_size), keys.next_n, keys.num_pages * keys.page_size};
  }
  return t;
}

void validate_fused_select_args(const FusedSelectArgs& a, const TopkOutputs& out) {
  validate_indexer_args(a.keys);
  if (a.keys.logits || a.keys.logits_stride != 0) fail("keys.logits must be null and keys.logits_stride 0 (nothing is materialized)");
  if (a.k < 1 || a.k > kTopkMaxK) fail("k must be in 1.." + std::to_string(kTopkMaxK) + " (got " + std::to_string(a.k) + ")");
  if (a.max_context < 0 || a.max_context > INT32_MAX)
    fail("max_context must be in 0..2^31-1 (got " + std::to_string(a.max_context) + ")");
  if (a.keys.rows() > INT32_MAX) fail("requests x next_n exceeds 2^31-1 rows");
  if (a.slot_ids && a.keys.page_size > INT32_MAX) fail("page_size is too large for slot ids");
  if (a.keys.rows() > 0 && (!out.indices || !out.topk_length)) fail("indices and topk_length outputs are required");
}

FusedSelectPlan plan_fused_select(const FusedSelectArgs& a, int64_t chunk, int sm_count) {
  validate_indexer_args(a.keys);
  if (a.k < 1 || a.k > kTopkMaxK) fail("k must be in 1.." + std::to_string(kTopkMaxK) + " (got " + std::to_string(a.k) + ")");
  if (a.max_context < 0 || a.max_context > INT32_MAX)
    fail("max_context must be in 0..2^31-1 (got " + std::to_string(a.max_context) + ")");
  const int64_t page = a.keys.page_size;
  const int64_t rows = a.keys.rows();
  if (chunk == 0) {
    // One chunk when its logits fit the budget; otherwise the chunk minimizing a row's
    // workspace, 4 chunk + 8 k (context / chunk) bytes: sqrt(2 k context).
    const int64_t whole = (std::max<int64_t>(a.max_context, 1) + page - 1) / page * page;
    const int64_t least = (int64_t(a.k) + page - 1) / page * page;
    const auto balanced = static_cast<int64_t>(std::ceil(std::sqrt(2.0 * a.k * double(a.max_context))));
    chunk = 4 * std::max<int64_t>(rows, 1) * (whole + a.keys.next_n - 1) <= kFusedSelectLogitsBudget
                ? whole
                : std::min(whole, std::max(least, (balanced + page - 1) / page * page));
  } else if (chunk < 0 || chunk % page != 0 || chunk > INT32_MAX) {
    fail("chunk must be a positive multiple of page_size " + std::to_string(page) + " below 2^31 (got " +
         std::to_string(chunk) + ")");
  }
  if (rows > INT32_MAX) fail("requests x next_n exceeds 2^31-1 rows");
  FusedSelectPlan p;
  p.chunk = chunk;
  p.chunks = std::max<int64_t>(1, (a.max_context + chunk - 1) / chunk);
  p.logits_stride = (chunk + a.keys.next_n - 1 + 3) / 4 * 4;
  const int64_t candidates = p.chunks * a.k;
  if (candidates > INT32_MAX) fail("chunks x k exceeds 2^31-1 candidates per row; use a larger chunk");
  p.chunk_topk = plan_topk(static_cast<int>(rows), chunk, sm_count);
  p.fold_topk = plan_topk(static_cast<int>(rows), candidates, sm_count);
  size_t at = 0;
  auto take = [&](size_t bytes) {
    const size_t offset = at;
    at = align_up(at + bytes);
    return offset;
  };
  const size_t r = static_cast<size_t>(rows);
  p.logits_offset = take(r * p.logits_stride * 4);
  p.chunk_context_offset = take(static_cast<size_t>(a.keys.requests) * 4);
  p.counter_offset = take(8);
  p.chunk_indices_offset = take(r * a.k * 4);
  p.chunk_values_offset = take(r * a.k * 4);
  p.chunk_lengths_offset = take(r * 4);
  p.candidate_positions_offset = take(r * candidates * 4);
  p.candidate_values_offset = take(r * candidates * 4);
  p.topk_workspace_bytes = std::max(topk_workspace_bytes(p.chunk_topk, static_cast<int>(rows)),
                                    topk_workspace_bytes(p.fold_topk, static_cast<int>(rows)));
  p.topk_workspace_offset = take(p.topk_workspace_bytes);
  p.workspace_bytes = at;
  return p;
}

void fused_select_reference(const FusedSelectArgs& a, int64_t chunk, const TopkOutputs& out) {
  validate_fused_select_args(a, out);
  const FusedSelectPlan plan = plan_fused_select(a, chunk, 1);
  const IndexerPagedArgs& keys = a.keys;
  for (int64_t b = 0; b < keys.requests; ++b)
    if (keys.context_lens[b] < 0 || keys.context_lens[b] > a.max_context)
      fail("request " + std::to_string(b) + ": context_lens " + std::to_string(keys.context_lens[b]) + " is outside 0..max_context " +
           std::to_string(a.max_context));
  IndexerPagedArgs whole = keys;
  whole.logits_stride = a.max_context;
  validate_indexer_metadata(whole);

  const int rows = static_cast<int>(keys.rows());
  const int k = a.k;
  const int64_t candidates = plan.chunks * k;
  std::vector<float> logits(static_cast<size_t>(rows) * plan.logits_stride), chunk_values(static_cast<size_t>(rows) * k),
      candidate_values(static_cast<size_t>(rows) * candidates);
  std::vector<int32_t> chunk_context(keys.requests), chunk_indices(static_cast<size_t>(rows) * k), chunk_lengths(rows),
      candidate_positions(static_cast<size_t>(rows) * candidates);
  for (int64_t c = 0; c < plan.chunks; ++c) {
    const int64_t first = c * plan.chunk;
    for (int64_t b = 0; b < keys.requests; ++b)
      chunk_context[b] = static_cast<int32_t>(fused_chunk_context(keys.context_lens[b], first, plan.chunk, keys.next_n));
    indexer_logits_reference(fused_chunk_problem(a, plan, c, chunk_context.data(), logits.data()));
    topk_reference(fused_chunk_topk_args(a, plan, c, logits.data()), {chunk_indices.data(), chunk_lengths.data(), chunk_values.data()});
    for (int r = 0; r < rows; ++r) {
      std::copy_n(&chunk_indices[size_t(r) * k], k, &candidate_positions[size_t(r) * candidates + c * k]);
      std::copy_n(&chunk_values[size_t(r) * k], k, &candidate_values[size_t(r) * candidates + c * k]);
    }
  }
  topk_reference(fused_fold_args(a, plan, candidate_values.data(), candidate_positions.data()), out);
}

}  // namespace nvfp4mla
