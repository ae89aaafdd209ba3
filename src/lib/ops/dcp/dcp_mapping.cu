// The DCP mappings on the device (cuda/dcp.h): writer slots and attention indices per rank,
// elementwise with the arithmetic of dcp_math.h the CPU functions use.
#include <cuda_runtime.h>

#include <cstdint>

#include "device/cuda_check.h"
#include "nvfp4mla/cuda/dcp.h"
#include "ops/dcp/dcp_math.h"

namespace nvfp4mla::cuda {
namespace {

constexpr int kThreads = 256;

unsigned blocks_for(int64_t n) {
  const int64_t b = (n + kThreads - 1) / kThreads;
  return static_cast<unsigned>(b < 65536 * 16 ? b : 65536 * 16);  // grid-stride loops cover the rest
}

__global__ void __launch_bounds__(kThreads) slot_mapping_kernel(DcpPlacement p, int page_size, int rank,
                                                                const int64_t* __restrict__ global_slots, int64_t n,
                                                                int64_t* __restrict__ local_slots) {
  for (int64_t i = int64_t(blockIdx.x) * kThreads + threadIdx.x; i < n; i += int64_t(gridDim.x) * kThreads)
    local_slots[i] = dcp_math::local_slot(global_slots[i], p.ranks, p.interleave, page_size, rank);
}

// positions and local_indices may alias (in-place): each element is read before it is written.
__global__ void __launch_bounds__(kThreads) local_indices_kernel(DcpPlacement p, int rank, const int32_t* positions,
                                                                 int64_t n, int k, TopkSlotMap m, int32_t* local_indices,
                                                                 unsigned long long* error_count) {
  for (int64_t i = int64_t(blockIdx.x) * kThreads + threadIdx.x; i < n; i += int64_t(gridDim.x) * kThreads) {
    const int64_t v = dcp_math::local_index(positions[i], i / k, p.ranks, p.interleave, rank, m);
    if (v == -2 && error_count) atomicAdd(error_count, 1ull);
    local_indices[i] = static_cast<int32_t>(v < 0 ? -1 : v);
  }
}

}  // namespace

void dcp_local_slot_mapping(const DcpPlacement& p, int page_size, int rank, const int64_t* global_slots, int64_t n,
                            int64_t* local_slots, cudaStream_t stream) {
  validate_dcp_slot_mapping_args(p, page_size, rank, n);
  if (n == 0) return;
  if (!global_slots || !local_slots) throw Error("dcp: global_slots and local_slots are required");
  slot_mapping_kernel<<<blocks_for(n), kThreads, 0, stream>>>(p, page_size, rank, global_slots, n, local_slots);
  check_launch("dcp slot mapping launch");
}

void dcp_local_indices(const DcpPlacement& p, int rank, const int32_t* positions, int rows, int k, const TopkSlotMap& slots,
                       int32_t* local_indices, unsigned long long* error_count, cudaStream_t stream) {
  validate_dcp_local_indices_args(p, rank, positions, rows, k, slots, local_indices);
  const int64_t n = int64_t(rows) * k;
  if (n == 0) return;
  local_indices_kernel<<<blocks_for(n), kThreads, 0, stream>>>(p, rank, positions, n, k, slots, local_indices, error_count);
  check_launch("dcp local indices launch");
}

}  // namespace nvfp4mla::cuda
