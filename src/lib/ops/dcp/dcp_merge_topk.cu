// The DCP top-k merge on the GPU (cuda/dcp.h); the CPU reference is dcp_cpu.cpp. Each row's
// candidates are placed in position order by merge-path ranks (own index + the count of smaller
// positions in every other rank's list), then the exact top-k (cuda/topk.h) runs on that list
// with its positions, as topk_reference does in the reference.
#include <cuda_runtime.h>

#include <cstdint>
#include <string>

#include "device/cuda_check.h"
#include "nvfp4mla/cuda/dcp.h"
#include "nvfp4mla/cuda/topk.h"

namespace nvfp4mla::cuda {
namespace {

constexpr int kThreads = 256;

// The valid candidates of rank r in a row: topk_length, or 0 (counted) when outside 0..k_rank.
__device__ __forceinline__ int rank_length(const int32_t* topk_length, int rank, int rows, int row, int k_rank) {
  const int32_t len = topk_length[int64_t(rank) * rows + row];
  return len >= 0 && len <= k_rank ? len : 0;
}

// Grid (rows, ranks): block (row, r) places rank r's candidates of the row.
__global__ void __launch_bounds__(kThreads) place_candidates_kernel(DcpTopkMergeArgs a, float* __restrict__ values,
                                                                    int32_t* __restrict__ positions,
                                                                    int32_t* __restrict__ lengths,
                                                                    unsigned long long* error_count) {
  const int row = blockIdx.x, rank = blockIdx.y;
  const int64_t columns = int64_t(a.ranks) * a.k_rank;
  const int len = rank_length(a.topk_length, rank, a.rows, row, a.k_rank);
  if (threadIdx.x == 0) {
    const int32_t raw = a.topk_length[int64_t(rank) * a.rows + row];
    if ((raw < 0 || raw > a.k_rank) && error_count) atomicAdd(error_count, 1ull);
    if (rank == 0) {
      int total = 0;
      for (int r = 0; r < a.ranks; ++r) total += rank_length(a.topk_length, r, a.rows, row, a.k_rank);
      lengths[row] = total;
    }
  }
  const int64_t mine = (int64_t(rank) * a.rows + row) * a.k_rank;
  for (int c = threadIdx.x; c < len; c += kThreads) {
    const int32_t pos = a.indices[mine + c];
    int64_t dest = c;
    for (int r = 0; r < a.ranks; ++r) {
      if (r == rank) continue;
      const int32_t* list = a.indices + (int64_t(r) * a.rows + row) * a.k_rank;
      int lo = 0, hi = rank_length(a.topk_length, r, a.rows, row, a.k_rank);  // first entry >= pos
      while (lo < hi) {
        const int mid = (lo + hi) / 2;
        if (list[mid] < pos) lo = mid + 1;
        else hi = mid;
      }
      dest += lo;
    }
    values[row * columns + dest] = a.values[mine + c];
    positions[row * columns + dest] = pos;
  }
}

}  // namespace

void dcp_merge_topk(const DcpTopkMergeArgs& a, const TopkPlan& plan, void* workspace, size_t workspace_bytes,
                    const TopkOutputs& out, unsigned long long* error_count, cudaStream_t stream) {
  validate_dcp_merge_topk_args(a, out);
  const DcpMergeTopkWorkspace ws = dcp_merge_topk_workspace(a, plan);
  if (workspace_bytes < ws.total_bytes)
    throw Error("dcp top-k merge: workspace_bytes " + std::to_string(workspace_bytes) + " < the " +
                std::to_string(ws.total_bytes) + " bytes the plan needs");
  if (a.rows > 0 && !workspace) throw Error("dcp top-k merge: workspace is null");
  if (reinterpret_cast<uintptr_t>(workspace) % 256 != 0) throw Error("dcp top-k merge: workspace is not 256-byte aligned");
  if (a.ranks > 65535) throw Error("dcp top-k merge: ranks must be at most 65535 (got " + std::to_string(a.ranks) + ")");
  if (a.rows == 0) return;
  auto* base = static_cast<uint8_t*>(workspace);
  auto* values = reinterpret_cast<float*>(base + ws.values_offset);
  auto* positions = reinterpret_cast<int32_t*>(base + ws.positions_offset);
  auto* lengths = reinterpret_cast<int32_t*>(base + ws.lengths_offset);
  TopkArgs t;
  t.values = values;
  t.rows = a.rows;
  t.columns = int64_t(a.ranks) * a.k_rank;
  t.stride = t.columns;
  t.lengths = lengths;
  t.positions = positions;
  t.k = a.k;
  validate_topk_args(t, out);  // before anything is launched
  place_candidates_kernel<<<dim3(a.rows, a.ranks), kThreads, 0, stream>>>(a, values, positions, lengths, error_count);
  check_launch("dcp top-k merge: candidate placement launch");
  topk(t, plan, ws.topk_offset < ws.total_bytes ? base + ws.topk_offset : nullptr, ws.total_bytes - ws.topk_offset, out,
       error_count, stream);
}

}  // namespace nvfp4mla::cuda
