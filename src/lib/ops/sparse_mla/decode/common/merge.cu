// Combines the KV splits of a decode into the final output and LSE (every kernel's partials
// have the same layout: normalized fp32 output and base-2 LSE per (row, head, split)).
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>

#include "device/cuda_check.h"
#include "device/dependent_launch.cuh"
#include "ops/sparse_mla/decode/common/decode_common.cuh"
#include "ops/sparse_mla/decode/common/launchers.h"
#include "ops/sparse_mla/mma_sm80.cuh"

namespace nvfp4mla::cuda {
namespace {

// Combine the splits of one (row, head): weights 2^(lse_s - max), output = weighted mean.
// Launched as a programmatic dependent of the decode kernel (dependent_launch.cuh): its CTAs can
// be resident before the decode grid completes (few-row, many-split decodes leave SMs idle) and
// wait for the partials at wait_for_primary_grid. The partials are read through L2 (__ldcg), never
// the non-coherent path: the decode grid writes them while this grid is already resident.
constexpr int kMergeThreads = kLatentDim / 4;
__global__ void __launch_bounds__(kMergeThreads) merge_splits_kernel(const float* __restrict__ part_out,
                                                                     const float* __restrict__ part_lse, int splits,
                                                                     bool lse_base2, __nv_bfloat16* __restrict__ out,
                                                                     float* __restrict__ lse) {
  extern __shared__ float weights[];
  __shared__ float s_max, s_sum;
  const int64_t rh = blockIdx.x;
  const float* pl = part_lse + rh * splits;
  // The splits' partials are read kMergeBatch at a time, all loads issued before any is used (one
  // dependent L2 round trip per split made the merge latency-bound); the first batch is in flight
  // while the weights are worked out. A split of weight 0 is skipped after its load: empty splits
  // never wrote their partials, which may hold anything.
  constexpr int kMergeBatch = 8;
  const float4* po = reinterpret_cast<const float4*>(part_out + rh * splits * kLatentDim) + threadIdx.x;
  float4 v[kMergeBatch];
  auto load_batch = [&](int first) {
#pragma unroll
    for (int u = 0; u < kMergeBatch; ++u)
      if (first + u < splits) v[u] = __ldcg(po + (first + u) * (kLatentDim / 4));
  };
  wait_for_primary_grid();
  load_batch(0);
  if (threadIdx.x < 32) {
    // A lane's first split's LSE is loaded once (the weights loop reads it again).
    const int lane = threadIdx.x;
    const float first_lse = lane < splits ? __ldcg(pl + lane) : -INFINITY;
    auto lse_of = [&](int s) { return s == lane ? first_lse : __ldcg(pl + s); };
    float m = -INFINITY;
    for (int s = lane; s < splits; s += 32) m = fmaxf(m, lse_of(s));
    for (int o = 16; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xFFFFFFFFu, m, o));
    float sum = 0.0f;
    for (int s = lane; s < splits; s += 32) {
      const float w = m == -INFINITY ? 0.0f : exp2f(lse_of(s) - m);
      weights[s] = w;
      sum += w;
    }
    for (int o = 16; o > 0; o >>= 1) sum += __shfl_xor_sync(0xFFFFFFFFu, sum, o);
    if (lane == 0) {
      s_max = m;
      s_sum = sum;
    }
  }
  __syncthreads();
  const float inv = s_sum > 0.0f ? 1.0f / s_sum : 0.0f;
  float4 acc = make_float4(0, 0, 0, 0);
  for (int first = 0; first < splits; first += kMergeBatch) {
    if (first > 0) load_batch(first);
#pragma unroll
    for (int u = 0; u < kMergeBatch; ++u) {
      const float w = first + u < splits ? weights[first + u] : 0.0f;
      if (w == 0.0f) continue;
      acc.x += w * v[u].x; acc.y += w * v[u].y; acc.z += w * v[u].z; acc.w += w * v[u].w;
    }
  }
  uint2 packed;
  packed.x = ptx::pack_bf16x2(acc.x * inv, acc.y * inv);
  packed.y = ptx::pack_bf16x2(acc.z * inv, acc.w * inv);
  reinterpret_cast<uint2*>(out + rh * kLatentDim)[threadIdx.x] = packed;
  if (threadIdx.x == 0) {
    const float l2 = s_sum > 0.0f ? s_max + log2f(s_sum) : -INFINITY;
    lse[rh] = lse_base2 ? l2 : l2 * kLn2;
  }
}

}  // namespace

void launch_merge_splits(const DecodeParams& p, int rows, cudaStream_t stream) {
  // Decided once per process (one GPU model per process, as the decode kernels' opt-ins assume).
  static const bool dependent = waits_for_primary_grid(merge_splits_kernel);
  const int64_t n = static_cast<int64_t>(rows) * p.heads;
  launch_kernel(merge_splits_kernel, dim3(static_cast<unsigned>(n)), dim3(kMergeThreads), p.splits * sizeof(float), stream,
                dependent, "split merge kernel launch", p.part_out, p.part_lse, p.splits, p.lse_base2, p.out, p.lse);
}

}  // namespace nvfp4mla::cuda
