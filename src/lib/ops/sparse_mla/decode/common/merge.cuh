#pragma once
// Combining the KV splits of a (row, head): weights 2^(lse_s - max), output = weighted mean of
// the splits' normalized partials (fp32 or BF16). Shared by the merge kernel (merge.cu) and the kernels
// that merge inside their own launch (merge_share_of_heads), so both give the same bits.
#include <cooperative_groups.h>
#include <cuda_bf16.h>

#include <cmath>
#include <cstdint>

#include "ops/sparse_mla/decode/common/decode_common.cuh"
#include "ops/sparse_mla/mma_sm80.cuh"

namespace nvfp4mla::cuda {

// One warp: the splits' weights of one (row, head) into `weights` (shared memory); every lane
// gets the largest LSE and the weights' sum. `pl`: the (row, head)'s base-2 partial LSEs. Up to
// 64 splits are read once (one L2 round trip), more twice.
struct SplitWeights {
  float max, sum;
};
__device__ __forceinline__ SplitWeights split_weights(const float* pl, int splits, float* weights, int lane) {
  auto warp_max = [](float v) {
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xFFFFFFFFu, v, o));
    return v;
  };
  auto warp_sum = [](float v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xFFFFFFFFu, v, o);
    return v;
  };
  if (splits <= 64) {
    const float l0 = lane < splits ? __ldcg(pl + lane) : -INFINITY;
    const float l1 = lane + 32 < splits ? __ldcg(pl + lane + 32) : -INFINITY;
    const float m = warp_max(fmaxf(l0, l1));
    const float w0 = m == -INFINITY ? 0.0f : exp2f(l0 - m), w1 = m == -INFINITY ? 0.0f : exp2f(l1 - m);
    if (lane < splits) weights[lane] = w0;
    if (lane + 32 < splits) weights[lane + 32] = w1;
    return {m, warp_sum(w0 + w1)};
  }
  float m = -INFINITY;
  for (int s = lane; s < splits; s += 32) m = fmaxf(m, __ldcg(pl + s));
  m = warp_max(m);
  float sum = 0.0f;
  for (int s = lane; s < splits; s += 32) {
    const float w = m == -INFINITY ? 0.0f : exp2f(__ldcg(pl + s) - m);
    weights[s] = w;
    sum += w;
  }
  return {m, warp_sum(sum)};
}

// Dims of a 16-byte load of partials (fp32: 4, BF16: 8): what one merging thread takes per split.
template <class T>
constexpr int kPartialDims = 16 / sizeof(T);

// Output dims [kDims q, kDims q + kDims) of one (row, head): `po` points at split 0's dims (the
// splits 512 values apart). The partials are read 8 splits at a time, all loads issued before any
// is used (one dependent L2 round trip per split made the merge latency-bound). A split of weight
// 0 is skipped after its load: empty splits never wrote their partials, which may hold anything.
template <class T>
__device__ __forceinline__ void merge_dims(const T* po, const float* weights, int splits, const SplitWeights& sw,
                                           __nv_bfloat16* out_dims) {
  constexpr int kBatch = 8, kDims = kPartialDims<T>;
  float acc[kDims] = {};
  for (int first = 0; first < splits; first += kBatch) {
    uint4 v[kBatch];
#pragma unroll
    for (int u = 0; u < kBatch; ++u)
      if (first + u < splits) v[u] = __ldcg(reinterpret_cast<const uint4*>(po + static_cast<int64_t>(first + u) * kLatentDim));
#pragma unroll
    for (int u = 0; u < kBatch; ++u) {
      const float w = first + u < splits ? weights[first + u] : 0.0f;
      if (w == 0.0f) continue;
      const uint32_t x[4] = {v[u].x, v[u].y, v[u].z, v[u].w};
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        if constexpr (kDims == 8) {  // BF16 pairs: the low half is the lower dim
          acc[2 * k] += w * __uint_as_float(x[k] << 16);
          acc[2 * k + 1] += w * __uint_as_float(x[k] & 0xFFFF0000u);
        } else {
          acc[k] += w * __uint_as_float(x[k]);
        }
      }
    }
  }
  const float inv = sw.sum > 0.0f ? 1.0f / sw.sum : 0.0f;
  uint32_t packed[kDims / 2];
#pragma unroll
  for (int k = 0; k < kDims / 2; ++k) packed[k] = ptx::pack_bf16x2(acc[2 * k] * inv, acc[2 * k + 1] * inv);
  if constexpr (kDims == 8) *reinterpret_cast<uint4*>(out_dims) = make_uint4(packed[0], packed[1], packed[2], packed[3]);
  else *reinterpret_cast<uint2*>(out_dims) = make_uint2(packed[0], packed[1]);
}

__device__ __forceinline__ float merged_lse(const SplitWeights& sw, bool lse_base2) {
  const float l2 = sw.sum > 0.0f ? sw.max + log2f(sw.sum) : -INFINITY;
  return lse_base2 ? l2 : l2 * kLn2;
}

// For launches whose whole grid is resident at once (a cooperative launch). Every thread of every
// CTA waits here until every split's partials are written.
__device__ __forceinline__ void grid_barrier() { cooperative_groups::this_grid().sync(); }

// After grid_barrier: the CTA of split `split` merges its share of the group's heads, split s
// taking heads [s * share, (s + 1) * share). Run by kThreads threads of the CTA (thread index t)
// that synchronize on named barrier `bar`; `scratch`: shared memory no longer in use, room for
// share x (splits + 2) floats.
template <int kThreads>
__device__ __forceinline__ void merge_share_of_heads(const DecodeParams& p, int row, int head0, int heads_here, int split,
                                                     float* scratch, int t, int bar) {
  const int share = (heads_here + p.splits - 1) / p.splits;
  const int h0 = split * share, n = min(heads_here, h0 + share) - h0;
  if (n <= 0) return;  // uniform over the CTA
  const int lane = t & 31, warp = t >> 5;
  const int64_t rh0 = static_cast<int64_t>(row) * p.heads + head0 + h0;
  float* stats = scratch + share * p.splits;  // per head: max, sum
  for (int h = warp; h < n; h += kThreads / 32) {
    const SplitWeights sw = split_weights(p.part_lse + (rh0 + h) * p.splits, p.splits, scratch + h * p.splits, lane);
    if (lane == 0) {
      stats[2 * h] = sw.max;
      stats[2 * h + 1] = sw.sum;
      p.lse[rh0 + h] = merged_lse(sw, p.lse_base2);
    }
  }
  ptx::named_barrier_sync_unaligned(bar, kThreads);
  auto merge = [&](auto type) {
    using T = decltype(type);
    constexpr int kDims = kPartialDims<T>, kPieces = kLatentDim / kDims;
    for (int i = t; i < n * kPieces; i += kThreads) {
      const int h = i / kPieces, q = i % kPieces;
      const int64_t rh = rh0 + h;
      merge_dims(static_cast<const T*>(p.part_out) + rh * p.splits * kLatentDim + kDims * q, scratch + h * p.splits, p.splits,
                 {stats[2 * h], stats[2 * h + 1]}, p.out + rh * kLatentDim + kDims * q);
    }
  };
  if (p.partials_bf16) merge(__nv_bfloat16{});
  else merge(float{});
}

}  // namespace nvfp4mla::cuda
