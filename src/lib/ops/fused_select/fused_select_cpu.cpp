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


void check_k_and_length(int k, int64_t max_length, const char* name) {
  if (k < 1 || k > kTopkMaxK) fail("k must be in 1.." + std::to_string(kTopkMaxK) + " (got " + std::to_string(k) + ")");
  if (max_length < 0 || max_length > INT32_MAX)
    fail(std::string(name) + " must be in 0..2^31-1 (got " + std::to_string(max_length) + ")");
}

// The plan of either form: `rows` rows of up to `max_length` positions in pages of `page`,
// `extra` logits columns per row past the chunk, `meta_bytes` of chunk metadata.
FusedSelectPlan make_plan(int64_t rows, int64_t max_length, int k, int64_t page, int64_t extra, size_t meta_bytes, int64_t chunk,
                          int sm_count) {
  if (rows > INT32_MAX) fail("rows exceed 2^31-1");
  if (chunk == 0) {
    // One chunk when its logits fit the budget; otherwise the chunk minimizing a row's
    // workspace, 4 chunk + 8 k (length / chunk) bytes: sqrt(2 k length).
    const int64_t whole = (std::max<int64_t>(max_length, 1) + page - 1) / page * page;
    const int64_t least = (int64_t(k) + page - 1) / page * page;
    const auto balanced = static_cast<int64_t>(std::ceil(std::sqrt(2.0 * k * double(max_length))));
    chunk = 4 * std::max<int64_t>(rows, 1) * (whole + extra) <= kFusedSelectLogitsBudget
                ? whole
                : std::min(whole, std::max(least, (balanced + page - 1) / page * page));
  } else if (chunk < 0 || chunk % page != 0 || chunk > INT32_MAX) {
    fail("chunk must be a positive multiple of page_size " + std::to_string(page) + " below 2^31 (got " +
         std::to_string(chunk) + ")");
  }
  FusedSelectPlan p;
  p.chunk = chunk;
  p.chunks = std::max<int64_t>(1, (max_length + chunk - 1) / chunk);
  p.logits_stride = (chunk + extra + 3) / 4 * 4;
  const int64_t candidates = p.chunks * k;
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
  p.chunk_context_offset = take(meta_bytes);
  p.counter_offset = take(8);
  p.chunk_indices_offset = take(r * k * 4);
  p.chunk_values_offset = take(r * k * 4);
  p.chunk_lengths_offset = take(r * 4);
  p.candidate_positions_offset = take(r * candidates * 4);
  p.candidate_values_offset = take(r * candidates * 4);
  p.topk_workspace_bytes = std::max(topk_workspace_bytes(p.chunk_topk, static_cast<int>(rows)),
                                    topk_workspace_bytes(p.fold_topk, static_cast<int>(rows)));
  p.topk_workspace_offset = take(p.topk_workspace_bytes);
  p.workspace_bytes = at;
  return p;
}

TopkArgs chunk_topk(int64_t rows, int k, const FusedSelectPlan& plan, int64_t c, const float* logits) {
  TopkArgs t;
  t.values = logits;
  t.rows = static_cast<int>(rows);
  t.columns = plan.chunk;
  t.stride = plan.logits_stride;
  t.position_offset = c * plan.chunk;
  t.k = k;
  return t;
}

TopkArgs fold(int64_t rows, int k, const FusedSelectPlan& plan, const float* values, const int32_t* positions) {
  TopkArgs t;
  t.values = values;
  t.rows = static_cast<int>(rows);
  t.columns = plan.chunks * k;
  t.stride = t.columns;
  t.positions = positions;
  t.k = k;
  return t;
}

// Both forms' host chain: per chunk `score` (metadata, then logits into `logits`), the chunk's
// top-k, the candidates appended; then the fold.
template <class Score>
void reference_chain(int64_t rows64, int k, const FusedSelectPlan& plan, std::vector<float>& logits, Score score,
                     TopkArgs fold_args, const TopkOutputs& out) {
  const int rows = static_cast<int>(rows64);
  const int64_t candidates = plan.chunks * k;
  std::vector<float> chunk_values(static_cast<size_t>(rows) * k), candidate_values(static_cast<size_t>(rows) * candidates);
  std::vector<int32_t> chunk_indices(static_cast<size_t>(rows) * k), chunk_lengths(rows),
      candidate_positions(static_cast<size_t>(rows) * candidates);
  for (int64_t c = 0; c < plan.chunks; ++c) {
    score(c);
    topk_reference(chunk_topk(rows, k, plan, c, logits.data()), {chunk_indices.data(), chunk_lengths.data(), chunk_values.data()});
    for (int r = 0; r < rows; ++r) {
      std::copy_n(&chunk_indices[size_t(r) * k], k, &candidate_positions[size_t(r) * candidates + c * k]);
      std::copy_n(&chunk_values[size_t(r) * k], k, &candidate_values[size_t(r) * candidates + c * k]);
    }
  }
  fold_args.values = candidate_values.data();
  fold_args.positions = candidate_positions.data();
  topk_reference(fold_args, out);
}

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
  return chunk_topk(a.keys.rows(), a.k, plan, c, logits);
}

TopkArgs fused_fold_args(const FusedSelectArgs& a, const FusedSelectPlan& plan, const float* candidate_values,
                         const int32_t* candidate_positions) {
  TopkArgs t = fold(a.keys.rows(), a.k, plan, candidate_values, candidate_positions);
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
  check_k_and_length(a.k, a.max_context, "max_context");
  if (a.keys.rows() > INT32_MAX) fail("requests x next_n exceeds 2^31-1 rows");
  if (a.slot_ids && a.keys.page_size > INT32_MAX) fail("page_size is too large for slot ids");
  if (a.keys.rows() > 0 && (!out.indices || !out.topk_length)) fail("indices and topk_length outputs are required");
}


FusedSelectPlan plan_fused_select(const FusedSelectArgs& a, int64_t chunk, int sm_count) {
  validate_indexer_args(a.keys);
  check_k_and_length(a.k, a.max_context, "max_context");
  return make_plan(a.keys.rows(), a.max_context, a.k, a.keys.page_size, a.keys.next_n - 1,
                   static_cast<size_t>(a.keys.requests) * 4, chunk, sm_count);
}

FusedSelectPlan plan_fused_select(const FusedSelectRaggedArgs& a, int64_t chunk, int sm_count) {
  validate_indexer_args(a.keys);
  check_k_and_length(a.k, a.max_length, "max_length");
  return make_plan(a.keys.rows, a.max_length, a.k, 1, 0, static_cast<size_t>(a.keys.rows) * 8, chunk, sm_count);
}

void validate_fused_select_args(const FusedSelectRaggedArgs& a, const TopkOutputs& out) {
  validate_indexer_args(a.keys);
  if (a.keys.logits || a.keys.logits_stride != 0) fail("keys.logits must be null and keys.logits_stride 0 (nothing is materialized)");
  check_k_and_length(a.k, a.max_length, "max_length");
  if (a.keys.rows > INT32_MAX) fail("rows exceed 2^31-1");
  if (a.keys.rows > 0 && (!out.indices || !out.topk_length)) fail("indices and topk_length outputs are required");
}

IndexerRaggedArgs fused_chunk_problem(const FusedSelectRaggedArgs& a, const FusedSelectPlan& plan, const int32_t* chunk_ranges,
                                      float* logits) {
  IndexerRaggedArgs s = a.keys;
  s.row_starts = chunk_ranges;
  s.row_ends = chunk_ranges + a.keys.rows;
  s.logits = logits;
  s.logits_stride = plan.logits_stride;
  return s;
}

TopkArgs fused_chunk_topk_args(const FusedSelectRaggedArgs& a, const FusedSelectPlan& plan, int64_t c, const float* logits) {
  return chunk_topk(a.keys.rows, a.k, plan, c, logits);
}

TopkArgs fused_fold_args(const FusedSelectRaggedArgs& a, const FusedSelectPlan& plan, const float* candidate_values,
                         const int32_t* candidate_positions) {
  return fold(a.keys.rows, a.k, plan, candidate_values, candidate_positions);
}

void fused_select_reference(const FusedSelectRaggedArgs& a, int64_t chunk, const TopkOutputs& out) {
  validate_fused_select_args(a, out);
  const FusedSelectPlan plan = plan_fused_select(a, chunk, 1);
  IndexerRaggedArgs whole = a.keys;
  whole.logits_stride = a.max_length;
  validate_indexer_metadata(whole);
  const int64_t rows = a.keys.rows;
  std::vector<float> logits(static_cast<size_t>(rows) * plan.logits_stride);
  std::vector<int32_t> ranges(static_cast<size_t>(rows) * 2);
  auto score = [&](int64_t c) {
    for (int64_t r = 0; r < rows; ++r)
      fused_chunk_range(a.keys.row_starts[r], a.keys.row_ends[r], c * plan.chunk, plan.chunk, &ranges[r], &ranges[rows + r]);
    indexer_logits_reference(fused_chunk_problem(a, plan, ranges.data(), logits.data()));
  };
  reference_chain(rows, a.k, plan, logits, score, fused_fold_args(a, plan, nullptr, nullptr), out);
}

void validate_fused_select_metadata(const FusedSelectArgs& a) {
  const IndexerPagedArgs& keys = a.keys;
  for (int64_t b = 0; b < keys.requests; ++b)
    if (keys.context_lens[b] < 0 || keys.context_lens[b] > a.max_context)
      fail("request " + std::to_string(b) + ": context_lens " + std::to_string(keys.context_lens[b]) + " is outside 0..max_context " +
           std::to_string(a.max_context));
  IndexerPagedArgs whole = keys;
  whole.logits_stride = a.max_context;
  validate_indexer_metadata(whole);
}

void fused_select_reference(const FusedSelectArgs& a, int64_t chunk, const TopkOutputs& out) {
  validate_fused_select_args(a, out);
  const FusedSelectPlan plan = plan_fused_select(a, chunk, 1);
  validate_fused_select_metadata(a);
  const IndexerPagedArgs& keys = a.keys;

  std::vector<float> logits(static_cast<size_t>(keys.rows()) * plan.logits_stride);
  std::vector<int32_t> chunk_context(keys.requests);
  auto score = [&](int64_t c) {
    for (int64_t b = 0; b < keys.requests; ++b)
      chunk_context[b] = static_cast<int32_t>(fused_chunk_context(keys.context_lens[b], c * plan.chunk, plan.chunk, keys.next_n));
    indexer_logits_reference(fused_chunk_problem(a, plan, c, chunk_context.data(), logits.data()));
  };
  reference_chain(keys.rows(), a.k, plan, logits, score, fused_fold_args(a, plan, nullptr, nullptr), out);
}

}  // namespace nvfp4mla
