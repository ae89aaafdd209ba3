// Combines the KV splits of a decode into the final output and LSE (every kernel's partials
// have the same layout: normalized fp32 output and base-2 LSE per (row, head, split)).
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>

#include "device/cuda_check.h"
#include "ops/sparse_mla/decode/common/decode_common.cuh"
#include "ops/sparse_mla/decode/common/launchers.h"
#include "ops/sparse_mla/mma_sm80.cuh"

namespace nvfp4mla::cuda {
namespace {

// Combine the splits of one (row, head): weights 2^(lse_s - max), output = weighted mean.
constexpr int kMergeThreads = kLatentDim / 4;
__global__ void __launch_bounds__(kMergeThreads) merge_splits_kernel(const float* __restrict__ part_out,
                                                                     const float* __restrict__ part_lse, int splits,
                                                                     bool lse_base2, __nv_bfloat16* __restrict__ out,
                                                                     float* __restrict__ lse) {
  extern __shared__ float weights[];
  __shared__ float s_max, s_sum;
  const int64_t rh = blockIdx.x;
  const float* pl = part_lse + rh * splits;
  if (threadIdx.x < 32) {
    float m = -INFINITY;
    for (int s = threadIdx.x; s < splits; s += 32) m = fmaxf(m, pl[s]);
    for (int o = 16; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xFFFFFFFFu, m, o));
    float sum = 0.0f;
    for (int s = threadIdx.x; s < splits; s += 32) {
      const float w = m == -INFINITY ? 0.0f : exp2f(pl[s] - m);
      weights[s] = w;
      sum += w;
    }
    for (int o = 16; o > 0; o >>= 1) sum += __shfl_xor_sync(0xFFFFFFFFu, sum, o);
    if (threadIdx.x == 0) {
      s_max = m;
      s_sum = sum;
    }
  }
  __syncthreads();
  const float inv = s_sum > 0.0f ? 1.0f / s_sum : 0.0f;
  // The splits' partials are read kMergeBatch at a time, all loads issued before any is used (one
  // dependent L2 round trip per split made the merge latency-bound). A split of weight 0 is
  // skipped after its load: empty splits never wrote their partials, which may hold anything.
  constexpr int kMergeBatch = 8;
  const float4* po = reinterpret_cast<const float4*>(part_out + rh * splits * kLatentDim) + threadIdx.x;
  float4 acc = make_float4(0, 0, 0, 0);
  for (int first = 0; first < splits; first += kMergeBatch) {
    float4 v[kMergeBatch];
#pragma unroll
    for (int u = 0; u < kMergeBatch; ++u)
      if (first + u < splits) v[u] = __ldcg(po + (first + u) * (kLatentDim / 4));
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
  const int64_t n = static_cast<int64_t>(rows) * p.heads;
  merge_splits_kernel<<<static_cast<unsigned>(n), kMergeThreads, p.splits * sizeof(float), stream>>>(
      p.part_out, p.part_lse, p.splits, p.lse_base2, p.out, p.lse);
  check_launch("split merge kernel launch");
}

}  // namespace nvfp4mla::cuda
