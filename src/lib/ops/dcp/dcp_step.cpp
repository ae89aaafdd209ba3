// The DCP decode step on the host: the local row lengths, local -> global candidates, the checks
// and plan both implementations share, and the CPU reference of the whole step (dcp.h).
#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "nvfp4mla/dcp.h"
#include "nvfp4mla/error.h"
#include "nvfp4mla/indexer.h"
#include "ops/dcp/dcp_math.h"

namespace nvfp4mla {
namespace {

std::string str(int64_t v) { return std::to_string(v); }

size_t align_up(size_t n) { return (n + 255) / 256 * 256; }

[[noreturn]] void fail(const std::string& what) { throw Error("dcp step: " + what); }

}  // namespace

const char* to_string(DcpSelection s) { return s == DcpSelection::union_local ? "union" : "exact"; }

void dcp_local_row_lengths(const DcpPlacement& p, int rank, const int32_t* context_lens, int64_t requests, int next_n,
                           int32_t* lengths) {
  validate_dcp_placement(p);
  if (rank < 0 || rank >= p.ranks) throw Error("dcp: rank must be in 0..ranks-1 (got " + str(rank) + ")");
  if (requests < 0 || next_n < 1) throw Error("dcp: requests must be >= 0 and next_n >= 1");
  if (requests == 0) return;
  if (!context_lens || !lengths) throw Error("dcp: context_lens and lengths are required");
  for (int64_t b = 0; b < requests; ++b)
    if (context_lens[b] < 0) throw Error("dcp: context_lens[" + str(b) + "] is negative (" + str(context_lens[b]) + ")");
  for (int64_t b = 0; b < requests; ++b)
    for (int i = 0; i < next_n; ++i)
      lengths[b * next_n + i] = static_cast<int32_t>(
          dcp_math::local_length(paged_row_length(context_lens[b], next_n, i), p.ranks, p.interleave, rank));
}

void dcp_local_to_global(const DcpPlacement& p, int rank, int32_t* positions, int64_t n) {
  validate_dcp_placement(p);
  if (rank < 0 || rank >= p.ranks) throw Error("dcp: rank must be in 0..ranks-1 (got " + str(rank) + ")");
  if (n < 0) throw Error("dcp: n must be >= 0");
  if (n > 0 && !positions) throw Error("dcp: positions is required");
  for (int64_t i = 0; i < n; ++i)
    if (positions[i] >= 0 && dcp_global_position(p, rank, positions[i]) > INT32_MAX)
      throw Error("dcp: positions[" + str(i) + "] lies past global position 2^31-1");
  for (int64_t i = 0; i < n; ++i)
    positions[i] = positions[i] < 0 ? -1 : static_cast<int32_t>(dcp_global_position(p, rank, positions[i]));
}

namespace {

// The checks on the shared arguments (everything but the per-rank pointers).
void validate_step_shape(const DcpStepArgs& a) {
  validate_dcp_placement(a.placement);
  if (a.rows < 0) fail("rows must be >= 0");
  if (a.heads < 1) fail("heads must be >= 1");
  if (a.k < 1 || a.k > kTopkMaxK) fail("k must be in 1.." + str(kTopkMaxK) + " (got " + str(a.k) + ")");
  if (a.columns < 1) fail("columns must be >= 1");
  if (a.index_heads == 0 && a.logits_stride < a.columns) fail("logits_stride must be >= columns");
  // Every local position below `columns`, on any rank, has an int32 global position.
  if (dcp_global_position(a.placement, a.placement.ranks - 1, a.columns - 1) > INT32_MAX)
    fail("columns: local position " + str(a.columns - 1) + " lies past global position 2^31-1");
  if (a.slots.block_table) fail("slots.block_table must be null (each rank's table is in its DcpRankStep)");
  if (a.slots.page_size < 1 || a.slots.requests < 1 || a.slots.pages < 1 || a.slots.table_stride < a.slots.pages ||
      a.slots.rows_per_request < 1 || a.slots.capacity < 1)
    fail("slots: page_size, requests, pages, rows_per_request and capacity must be positive, table_stride >= pages");
  if (int64_t(a.rows) > a.slots.requests * a.slots.rows_per_request) fail("slots: rows exceed requests x rows_per_request");
  if (a.index_heads < 0 || a.index_heads > kIndexerMaxHeads)
    fail("index_heads must be in 0.." + str(kIndexerMaxHeads) + " (got " + str(a.index_heads) + ")");
  if (a.index_heads > 0) {
    if (a.next_n < 1) fail("next_n must be >= 1");
    if (a.slots.rows_per_request != a.next_n) fail("slots.rows_per_request must equal next_n with the indexer");
    if (a.rows % a.next_n != 0) fail("rows must be a multiple of next_n with the indexer");
    if (a.index_pages < 1) fail("index_pages must be >= 1 with the indexer");
  }
}

// Stand-ins for the device pointers the planners check for presence only.
const uint8_t kPlanBytes[16] = {};
const int32_t kPlanInts[4] = {};
const float kPlanFloats[4] = {};

}  // namespace

template <class Out>
void validate_dcp_step_args(const DcpStepArgs& a, const DcpRankStepOf<Out>* rank_steps, int count) {
  validate_step_shape(a);
  if (count < 1 || !rank_steps) fail("rank steps are required");
  if (a.rows == 0) return;
  for (int i = 0; i < count; ++i) {
    const DcpRankStepOf<Out>& r = rank_steps[i];
    const std::string who = "rank step " + str(i) + ": ";
    if (a.index_heads == 0) {
      if (!r.logits) fail(who + "logits is required");
      if (!r.lengths) fail(who + "lengths is required");
    } else {
      if (!r.index_cache) fail(who + "index_cache is required");
      if (!r.index_q) fail(who + "index_q is required");
      if (!r.index_w) fail(who + "index_w is required");
      if (!r.context_lens) fail(who + "context_lens is required");
    }
    if (!r.q) fail(who + "q is required");
    if (!r.cache) fail(who + "cache is required");
    if (!r.block_table) fail(who + "block_table is required");
    if (!r.out) fail(who + "out is required");
    if (!r.indices) fail(who + "indices is required");
    if (!r.topk_length) fail(who + "topk_length is required");
  }
}
template void validate_dcp_step_args(const DcpStepArgs&, const DcpRankStepOf<uint16_t>*, int);
template void validate_dcp_step_args(const DcpStepArgs&, const DcpRankStepOf<float>*, int);

TopkArgs dcp_local_topk_args(const DcpStepArgs& a, const float* logits, const int32_t* lengths) {
  TopkArgs t;
  t.values = logits;
  t.rows = a.rows;
  t.columns = a.columns;
  t.stride = a.logits_stride;
  t.lengths = lengths;
  t.k = a.k;
  return t;
}

FusedSelectArgs dcp_fused_select_args(const DcpStepArgs& a, const uint8_t* index_cache, const uint8_t* index_q,
                                      const float* index_w, const int32_t* row_lengths, const int32_t* row_table) {
  FusedSelectArgs f;
  f.keys.q = index_q;
  f.keys.weights = index_w;
  f.keys.requests = a.rows;
  f.keys.next_n = 1;
  f.keys.heads = a.index_heads;
  f.keys.cache = index_cache;
  f.keys.num_pages = a.index_pages;
  f.keys.page_size = a.slots.page_size;
  f.keys.block_table = row_table;
  f.keys.block_table_stride = a.slots.table_stride;
  f.keys.context_lens = row_lengths;
  f.max_context = a.columns;
  f.k = a.k;
  return f;
}

namespace {

// The workspace regions of a plan whose scratch_bytes is set (they depend on the arguments' sizes
// only, not on the SM count).
void assign_step_regions(const DcpStepArgs& a, DcpStepPlan& p) {
  const size_t n = size_t(a.placement.ranks), rows = size_t(a.rows), k = size_t(a.k), heads = size_t(a.heads);
  size_t at = 0;
  auto region = [&](size_t bytes) {
    const size_t offset = at;
    at += align_up(bytes);
    return offset;
  };
  p.candidate_indices_offset = region(n * rows * k * 4);
  p.candidate_values_offset = region(n * rows * k * 4);
  p.candidate_lengths_offset = region(n * rows * 4);
  p.local_indices_offset = region(rows * k * 4);
  const bool indexer = a.index_heads > 0;
  p.row_lengths_offset = region(indexer ? rows * 4 : 0);
  p.row_table_offset = region(indexer ? rows * size_t(a.slots.table_stride) * 4 : 0);
  p.select_errors_offset = region(indexer ? 8 : 0);
  p.partial_out_offset = region(n * rows * heads * kDcpLatentDim * 2);
  p.partial_lse_offset = region(n * rows * heads * 4);
  p.scratch_offset = region(p.scratch_bytes);
  p.workspace_bytes = at;
  const size_t candidates = rows * (k * 8 + 4), partials = rows * heads * (kDcpLatentDim * 2 + 4);
  p.gathered_bytes_per_layer = (n - 1) * ((a.selection == DcpSelection::exact ? candidates : 0) + partials);
}

}  // namespace

DcpStepPlan plan_dcp_step(const DcpStepArgs& a, int sm_count) {
  validate_step_shape(a);
  const size_t n = size_t(a.placement.ranks);
  DcpStepPlan p;
  p.local_topk = plan_topk(a.rows, a.columns, sm_count);
  if (a.index_heads > 0)
    p.select = plan_fused_select(dcp_fused_select_args(a, kPlanBytes, kPlanBytes, kPlanFloats, kPlanInts, kPlanInts), 0,
                                 sm_count);
  p.merge_topk = plan_topk(a.rows, int64_t(n) * a.k, sm_count);
  p.decode = plan_sparse_decode(a.spec, a.rows, a.heads, a.k, sm_count);
  DcpTopkMergeArgs m;
  m.ranks = a.placement.ranks;
  m.rows = a.rows;
  m.k_rank = a.k;
  m.k = a.k;
  p.scratch_bytes = std::max({topk_workspace_bytes(p.local_topk, a.rows), dcp_merge_topk_workspace(m, p.merge_topk).total_bytes,
                              decode_workspace_layout(p.decode, a.rows, a.heads).total_bytes, p.select.workspace_bytes});
  assign_step_regions(a, p);
  return p;
}

void validate_dcp_step_plan(const DcpStepArgs& a, const DcpStepPlan& plan) {
  DcpStepPlan want = plan;
  assign_step_regions(a, want);
  if (plan.candidate_indices_offset != want.candidate_indices_offset || plan.candidate_values_offset != want.candidate_values_offset ||
      plan.candidate_lengths_offset != want.candidate_lengths_offset || plan.local_indices_offset != want.local_indices_offset ||
      plan.row_lengths_offset != want.row_lengths_offset || plan.row_table_offset != want.row_table_offset ||
      plan.select_errors_offset != want.select_errors_offset || plan.partial_out_offset != want.partial_out_offset ||
      plan.partial_lse_offset != want.partial_lse_offset || plan.scratch_offset != want.scratch_offset ||
      plan.workspace_bytes != want.workspace_bytes)
    fail("the plan's workspace regions were made for other arguments (rows, heads, k, ranks or the block table stride): "
         "plan_dcp_step for these");
}

void dcp_decode_step_reference(const DcpStepArgs& a, const DcpRankStepReference* rs, const ReferenceOptions& options) {
  const int n = a.placement.ranks;
  validate_dcp_step_args(a, rs, n);
  if (a.rows == 0) return;
  const size_t rows = size_t(a.rows), k = size_t(a.k), rh = rows * size_t(a.heads), block = rows * k;
  // 1. Each rank's top-k over its local positions, as (value, global position) candidates.
  std::vector<int32_t> cand_idx(n * block), cand_len(n * rows);
  std::vector<float> cand_val(n * block);
  for (int r = 0; r < n; ++r) {
    const TopkOutputs mine{cand_idx.data() + r * block, cand_len.data() + r * rows, cand_val.data() + r * block};
    if (a.index_heads == 0) {
      topk_reference(dcp_local_topk_args(a, rs[r].logits, rs[r].lengths), mine);
    } else {
      const int64_t requests = a.rows / a.next_n, stride = a.slots.table_stride;
      std::vector<int32_t> row_lengths(rows), row_table(rows * size_t(stride));
      dcp_local_row_lengths(a.placement, r, rs[r].context_lens, requests, a.next_n, row_lengths.data());
      for (size_t row = 0; row < rows; ++row)
        std::copy_n(rs[r].block_table + (row / a.next_n) * stride, stride, row_table.begin() + row * stride);
      fused_select_reference(dcp_fused_select_args(a, rs[r].index_cache, rs[r].index_q, rs[r].index_w, row_lengths.data(),
                                                   row_table.data()),
                             0, mine);
    }
    dcp_local_to_global(a.placement, r, mine.indices, int64_t(block));
  }
  // 2. The selection each rank attends: the merged global top-k, or its own.
  std::vector<int32_t> sel_idx = cand_idx, sel_len = cand_len;
  std::vector<float> sel_val = cand_val;
  if (a.selection == DcpSelection::exact) {
    DcpTopkMergeArgs m{n, a.rows, a.k, cand_idx.data(), cand_val.data(), cand_len.data(), a.k};
    dcp_merge_topk_reference(m, {sel_idx.data(), sel_len.data(), sel_val.data()});
    for (int r = 1; r < n; ++r) {
      std::copy_n(sel_idx.begin(), block, sel_idx.begin() + r * block);
      std::copy_n(sel_len.begin(), rows, sel_len.begin() + r * rows);
      std::copy_n(sel_val.begin(), block, sel_val.begin() + r * block);
    }
  }
  // 3. Each rank's partial attention over the selected positions it holds.
  std::vector<float> part_out(n * rh * kDcpLatentDim), part_lse(n * rh);
  std::vector<int32_t> local(block);
  for (int r = 0; r < n; ++r) {
    TopkSlotMap m = a.slots;
    m.block_table = rs[r].block_table;
    dcp_local_indices_reference(a.placement, r, sel_idx.data() + r * block, a.rows, a.k, m, local.data());
    SparseMlaArgs s;
    s.q = rs[r].q;
    s.rows = a.rows;
    s.heads = a.heads;
    s.cache = rs[r].cache;
    s.capacity = a.slots.capacity;
    s.indices = local.data();
    s.topk = a.k;
    s.sm_scale = a.sm_scale;
    s.layer_scale = a.layer_scale;
    s.lse_base = a.lse_base;
    sparse_mla_reference(a.spec, s, part_out.data() + r * rh * kDcpLatentDim, part_lse.data() + r * rh, options);
  }
  // 4. The merge; every rank gets the result.
  std::vector<float> out(rh * kDcpLatentDim), lse(rh);
  DcpMergeArgs g;
  g.ranks = n;
  g.rows = a.rows;
  g.heads = a.heads;
  g.partial_out = part_out.data();
  g.partial_lse = part_lse.data();
  g.lse_base = a.lse_base;
  dcp_merge_reference(g, {out.data(), DcpPartialType::f32, lse.data()});
  for (int r = 0; r < n; ++r) {
    std::copy(out.begin(), out.end(), rs[r].out);
    if (rs[r].lse) std::copy(lse.begin(), lse.end(), rs[r].lse);
    std::copy_n(sel_idx.begin() + r * block, block, rs[r].indices);
    std::copy_n(sel_len.begin() + r * rows, rows, rs[r].topk_length);
    if (rs[r].values) std::copy_n(sel_val.begin() + r * block, block, rs[r].values);
  }
}

}  // namespace nvfp4mla
