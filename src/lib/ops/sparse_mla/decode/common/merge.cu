// Combines the KV splits of a decode into the final output and LSE (every kernel's partials
// have the same layout: normalized output (fp32 or BF16) and base-2 LSE per (row, head, split)), for
// launches that do not merge inside the kernel (merge.cuh).
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "device/cuda_check.h"
#include "ops/sparse_mla/decode/common/launchers.h"
#include "ops/sparse_mla/decode/common/merge.cuh"

namespace nvfp4mla::cuda {
namespace {

// One block per (row, head): warp 0 computes the weights, every thread merges 16 bytes of each
// split (4 fp32 or 8 BF16 dims).
template <class T>
__global__ void __launch_bounds__(kLatentDim / kPartialDims<T>) merge_splits_kernel(
    const T* __restrict__ part_out, const float* __restrict__ part_lse, int splits, bool lse_base2,
    __nv_bfloat16* __restrict__ out, float* __restrict__ lse) {
  constexpr int kDims = kPartialDims<T>;
  extern __shared__ float weights[];
  __shared__ SplitWeights s_weights;
  const int64_t rh = blockIdx.x;
  if (threadIdx.x < 32) {
    const SplitWeights sw = split_weights(part_lse + rh * splits, splits, weights, threadIdx.x);
    if (threadIdx.x == 0) {
      s_weights = sw;
      lse[rh] = merged_lse(sw, lse_base2);
    }
  }
  __syncthreads();
  merge_dims(part_out + rh * splits * kLatentDim + kDims * threadIdx.x, weights, splits, s_weights,
             out + rh * kLatentDim + kDims * threadIdx.x);
}

template <class T>
void launch_merge(const DecodeParams& p, int rows, cudaStream_t stream) {
  const int64_t n = static_cast<int64_t>(rows) * p.heads;
  merge_splits_kernel<T><<<static_cast<unsigned>(n), kLatentDim / kPartialDims<T>, p.splits * sizeof(float), stream>>>(
      static_cast<const T*>(p.part_out), p.part_lse, p.splits, p.lse_base2, p.out, p.lse);
}

}  // namespace

void launch_merge_splits(const DecodeParams& p, int rows, cudaStream_t stream) {
  if (p.partials_bf16) launch_merge<__nv_bfloat16>(p, rows, stream);
  else launch_merge<float>(p, rows, stream);
  check_launch("split merge kernel launch");
}

}  // namespace nvfp4mla::cuda
