// The DCP decode step on the GPU (cuda/dcp_step.h): the library's kernels in sequence per rank,
// with the communicator's all-gathers between the phases; and the two small kernels it adds
// (local row lengths, local -> global positions), elementwise with dcp_math.h's arithmetic.
#include <cuda_runtime.h>

#include <cstdint>
#include <string>
#include <vector>

#include "device/alignment.h"
#include "device/cuda_check.h"
#include "nvfp4mla/cuda/dcp.h"
#include "nvfp4mla/cuda/dcp_step.h"
#include "nvfp4mla/cuda/fused_select.h"
#include "nvfp4mla/cuda/sparse_decode.h"
#include "nvfp4mla/cuda/topk.h"
#include "nvfp4mla/indexer.h"
#include "ops/dcp/dcp_math.h"

namespace nvfp4mla::cuda {
namespace {

constexpr int kThreads = 256;

unsigned blocks_for(int64_t n) {
  const int64_t b = (n + kThreads - 1) / kThreads;
  return static_cast<unsigned>(b < 65536 * 16 ? b : 65536 * 16);  // grid-stride loops cover the rest
}

__global__ void __launch_bounds__(kThreads) row_lengths_kernel(DcpPlacement p, int rank, const int32_t* __restrict__ context_lens,
                                                               int64_t rows, int next_n, int32_t* __restrict__ lengths,
                                                               unsigned long long* error_count) {
  for (int64_t row = int64_t(blockIdx.x) * kThreads + threadIdx.x; row < rows; row += int64_t(gridDim.x) * kThreads) {
    const int32_t ctx = context_lens[row / next_n];
    const int i = static_cast<int>(row % next_n);
    if (ctx < 0) {
      if (i == 0 && error_count) atomicAdd(error_count, 1ull);  // once per request
      lengths[row] = 0;
      continue;
    }
    const int64_t global = ctx - next_n + i + 1;
    lengths[row] = static_cast<int32_t>(dcp_math::local_length(global < 0 ? 0 : global, p.ranks, p.interleave, rank));
  }
}

__global__ void __launch_bounds__(kThreads) local_to_global_kernel(DcpPlacement p, int rank, int32_t* positions, int64_t n) {
  for (int64_t i = int64_t(blockIdx.x) * kThreads + threadIdx.x; i < n; i += int64_t(gridDim.x) * kThreads) {
    const int32_t l = positions[i];
    positions[i] = l < 0 ? -1 : static_cast<int32_t>(dcp_math::global_of(l, p.ranks, p.interleave, rank));
  }
}

// *total += *count (one thread): fused selection's own counter into the step's error word.
__global__ void add_count_kernel(unsigned long long* total, const unsigned long long* count) {
  if (*count) *total += *count;
}

void require_rank(const DcpPlacement& p, int rank) {
  validate_dcp_placement(p);
  if (rank < 0 || rank >= p.ranks) throw Error("dcp: rank must be in 0..ranks-1 (got " + std::to_string(rank) + ")");
}

}  // namespace

void dcp_local_row_lengths(const DcpPlacement& p, int rank, const int32_t* context_lens, int64_t requests, int next_n,
                           int32_t* lengths, unsigned long long* error_count, cudaStream_t stream) {
  require_rank(p, rank);
  if (requests < 0 || next_n < 1) throw Error("dcp: requests must be >= 0 and next_n >= 1");
  if (requests == 0) return;
  if (!context_lens || !lengths) throw Error("dcp: context_lens and lengths are required");
  const int64_t rows = requests * next_n;
  row_lengths_kernel<<<blocks_for(rows), kThreads, 0, stream>>>(p, rank, context_lens, rows, next_n, lengths, error_count);
  check_launch("dcp local row lengths launch");
}

void dcp_local_to_global(const DcpPlacement& p, int rank, int32_t* positions, int64_t n, cudaStream_t stream) {
  require_rank(p, rank);
  if (n < 0) throw Error("dcp: n must be >= 0");
  if (n == 0) return;
  if (!positions) throw Error("dcp: positions is required");
  local_to_global_kernel<<<blocks_for(n), kThreads, 0, stream>>>(p, rank, positions, n);
  check_launch("dcp local to global launch");
}

void dcp_decode_step(DcpCommunicator& comm, const DcpStepArgs& a, const DcpStepPlan& plan, const DcpRankStep* rs,
                     void* const* workspaces, size_t workspace_bytes, const cudaStream_t* streams) {
  const int local = comm.local_ranks();
  // The world first: rank_steps holds one entry per local rank of a matching communicator.
  if (comm.world_size() != a.placement.ranks)
    throw Error("dcp step: the communicator's world size " + std::to_string(comm.world_size()) +
                " is not the placement's ranks " + std::to_string(a.placement.ranks));
  validate_dcp_step_args(a, rs, local);
  validate_dcp_step_plan(a, plan);
  if (!workspaces || !streams) throw Error("dcp step: workspaces and streams are required");
  if (workspace_bytes < plan.workspace_bytes)
    throw Error("dcp step: workspace_bytes " + std::to_string(workspace_bytes) + " < the plan's " +
                std::to_string(plan.workspace_bytes));
  for (int i = 0; i < local; ++i)
    if (!workspaces[i] || reinterpret_cast<uintptr_t>(workspaces[i]) % 256 != 0)
      throw Error("dcp step: workspace of local rank " + std::to_string(i) + " is null or not 256-byte aligned");
  // The parts' alignment rules, for every local rank before anything runs: a rank refused midway
  // would skip a collective its peers then wait in.
  if (a.index_heads > 0 && a.slots.page_size % 4 != 0)
    throw Error("dcp step: slots.page_size must be a multiple of 4 with the indexer on the GPU (16-byte aligned index pages)");
  for (int i = 0; i < local; ++i) {
    const DcpRankStep& r = rs[i];
    const bool indexer = a.index_heads > 0;
    if (!aligned(r.q, 16) || !aligned(r.cache, 16) || !aligned(r.out, 16) || !aligned(r.lse, 4) ||
        (indexer && (!aligned(r.index_q, 16) || !aligned(r.index_cache, 16) || !aligned(r.index_w, 4))) ||
        (!indexer && !aligned(r.logits, 4)))
      throw Error("dcp step: rank step " + std::to_string(i) +
                  ": q, cache, out (and index_q, index_cache) must be 16-byte aligned, lse, logits and index_w 4-byte");
  }
  if (a.rows == 0) return;

  const int n = a.placement.ranks;
  const size_t rows = size_t(a.rows), block = rows * size_t(a.k), rh = rows * size_t(a.heads);
  const bool exact = a.selection == DcpSelection::exact;
  auto at = [&](int i, size_t offset) { return static_cast<char*>(workspaces[i]) + offset; };
  auto cand_idx = [&](int i) { return reinterpret_cast<int32_t*>(at(i, plan.candidate_indices_offset)); };
  auto cand_val = [&](int i) { return reinterpret_cast<float*>(at(i, plan.candidate_values_offset)); };
  auto cand_len = [&](int i) { return reinterpret_cast<int32_t*>(at(i, plan.candidate_lengths_offset)); };
  // Each rank writes its results into its own block of a gathered region, gathered in place.
  std::vector<const void*> send(local);
  std::vector<void*> recv(local);
  auto gather = [&](size_t offset, size_t bytes_per_rank) {
    for (int i = 0; i < local; ++i) {
      recv[i] = at(i, offset);
      send[i] = at(i, offset) + size_t(comm.local_rank(i)) * bytes_per_rank;
    }
    comm.all_gather(send.data(), recv.data(), bytes_per_rank, streams);
  };

  // 1. Local top-k over local positions, as global-position candidates.
  for (int i = 0; i < local; ++i) {
    const int r = comm.local_rank(i);
    const cudaStream_t s = streams[i];
    if (rs[i].errors) check(cudaMemsetAsync(rs[i].errors, 0, sizeof(unsigned long long), s), "dcp step: error reset");
    const TopkOutputs mine{cand_idx(i) + r * block, cand_len(i) + r * rows, cand_val(i) + r * block};
    if (a.index_heads == 0) {
      topk(dcp_local_topk_args(a, rs[i].logits, rs[i].lengths), plan.local_topk, at(i, plan.scratch_offset), plan.scratch_bytes, mine, rs[i].errors, s);
    } else {
      // Each row as a request of its own: its local length and its request's table row.
      const int64_t requests = a.rows / a.next_n;
      const size_t row_bytes = size_t(a.slots.table_stride) * 4;
      int32_t* row_lengths = reinterpret_cast<int32_t*>(at(i, plan.row_lengths_offset));
      int32_t* row_table = reinterpret_cast<int32_t*>(at(i, plan.row_table_offset));
      dcp_local_row_lengths(a.placement, r, rs[i].context_lens, requests, a.next_n, row_lengths, rs[i].errors, s);
      for (int j = 0; j < a.next_n; ++j)
        check(cudaMemcpy2DAsync(reinterpret_cast<char*>(row_table) + j * row_bytes, a.next_n * row_bytes, rs[i].block_table,
                                row_bytes, row_bytes, size_t(requests), cudaMemcpyDeviceToDevice, s),
              "dcp step: row tables");
      // Fused selection resets its counter and selects nothing when it is not zero: its own word.
      auto* select_errors = reinterpret_cast<unsigned long long*>(at(i, plan.select_errors_offset));
      fused_select(dcp_fused_select_args(a, rs[i].index_cache, rs[i].index_q, rs[i].index_w, row_lengths, row_table), plan.select,
                   at(i, plan.scratch_offset), plan.scratch_bytes, mine, select_errors, s);
      if (rs[i].errors) {
        add_count_kernel<<<1, 1, 0, s>>>(rs[i].errors, select_errors);
        check_launch("dcp step: error count");
      }
    }
    dcp_local_to_global(a.placement, r, mine.indices, int64_t(block), s);
  }
  // 2. The selection: the global top-k of everyone's candidates, or the rank's own.
  if (exact) {
    gather(plan.candidate_indices_offset, block * 4);
    gather(plan.candidate_values_offset, block * 4);
    gather(plan.candidate_lengths_offset, rows * 4);
  }
  for (int i = 0; i < local; ++i) {
    const int r = comm.local_rank(i);
    const cudaStream_t s = streams[i];
    const DcpRankStep& o = rs[i];
    if (exact) {
      const DcpTopkMergeArgs m{n, a.rows, a.k, cand_idx(i), cand_val(i), cand_len(i), a.k};
      dcp_merge_topk(m, plan.merge_topk, at(i, plan.scratch_offset), plan.scratch_bytes, {o.indices, o.topk_length, o.values},
                     o.errors, s);
    } else {
      check(cudaMemcpyAsync(o.indices, cand_idx(i) + r * block, block * 4, cudaMemcpyDeviceToDevice, s), "dcp step: copy");
      check(cudaMemcpyAsync(o.topk_length, cand_len(i) + r * rows, rows * 4, cudaMemcpyDeviceToDevice, s), "dcp step: copy");
      if (o.values)
        check(cudaMemcpyAsync(o.values, cand_val(i) + r * block, block * 4, cudaMemcpyDeviceToDevice, s), "dcp step: copy");
    }
    // 3. This rank's partial attention over the selected positions it holds.
    TopkSlotMap slots = a.slots;
    slots.block_table = o.block_table;
    int32_t* local_idx = reinterpret_cast<int32_t*>(at(i, plan.local_indices_offset));
    dcp_local_indices(a.placement, r, o.indices, a.rows, a.k, slots, local_idx, o.errors, s);
    SparseMlaArgs d;
    d.q = o.q;
    d.rows = a.rows;
    d.heads = a.heads;
    d.cache = o.cache;
    d.capacity = a.slots.capacity;
    d.indices = local_idx;
    d.topk = a.k;
    d.sm_scale = a.sm_scale;
    d.layer_scale = a.layer_scale;
    d.lse_base = a.lse_base;
    uint16_t* part_out = reinterpret_cast<uint16_t*>(at(i, plan.partial_out_offset)) + r * rh * kDcpLatentDim;
    float* part_lse = reinterpret_cast<float*>(at(i, plan.partial_lse_offset)) + r * rh;
    sparse_decode(a.spec, d, plan.decode, at(i, plan.scratch_offset), plan.scratch_bytes, part_out, part_lse, s);
  }
  // 4. The partials of all ranks, merged on every rank.
  gather(plan.partial_out_offset, rh * kDcpLatentDim * 2);
  gather(plan.partial_lse_offset, rh * 4);
  for (int i = 0; i < local; ++i) {
    DcpMergeArgs g;
    g.ranks = n;
    g.rows = a.rows;
    g.heads = a.heads;
    g.partial_out = at(i, plan.partial_out_offset);
    g.partial_type = DcpPartialType::bf16;
    g.partial_lse = reinterpret_cast<const float*>(at(i, plan.partial_lse_offset));
    g.lse_base = a.lse_base;
    dcp_merge(g, {rs[i].out, DcpPartialType::bf16, rs[i].lse}, streams[i]);
  }
}

}  // namespace nvfp4mla::cuda
