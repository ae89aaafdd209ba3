// Sparse attention scores: the logit of every (row, head, top-k position), for the evaluation's
// attention distributions and needle ranks. Clarity over speed: one CTA dequantizes a tile of
// the row's entries into BF16 K rows in shared memory (dequant_unit, as the decode kernel does),
// then each warp computes whole dot products, one (head, entry) pair at a time: every lane
// multiplies 18 BF16 pairs (exact in fp32) and accumulates them in fp32, then a butterfly sum
// over the 32 lanes.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <string>

#include "device/cuda_check.h"
#include "nvfp4mla/cuda/sparse_scores.h"
#include "nvfp4mla/error.h"
#include "ops/sparse_mla/format_dispatch.cuh"
#include "ops/sparse_mla/kv_tile.cuh"

namespace nvfp4mla::cuda {
namespace {

constexpr int kTileEntries = 32;                // top-k entries per CTA
constexpr int kThreads = 256;                   // 8 warps
constexpr int kWarps = kThreads / 32;
constexpr int kRowStride = kQkDim + 8;          // BF16 values per K row in shared memory (16-byte aligned rows)
constexpr int kMaxTilesPerRow = 65535;          // gridDim.y
static_assert((kRowStride * 2) % 16 == 0, "K rows must stay 16-byte aligned for dequant_unit");
static_assert(kQkDim % 64 == 0, "a warp covers a K row in steps of 32 BF16 pairs");

// grid: x = row, y = tile of kTileEntries positions.
template <class F>
__global__ void __launch_bounds__(kThreads) sparse_scores_kernel(const SparseMlaArgs p, float* __restrict__ scores) {
  __shared__ __align__(16) __nv_bfloat16 k_rows[kTileEntries * kRowStride];
  __shared__ int64_t slot[kTileEntries];
  const int row = blockIdx.x;
  const int first = blockIdx.y * kTileEntries;
  const int entries = min(kTileEntries, p.topk - first);
  if (threadIdx.x < kTileEntries) {
    const int pos = first + static_cast<int>(threadIdx.x);
    int64_t s = -1;  // masked
    if (pos < p.topk && (!p.topk_length || pos < p.topk_length[row])) {
      const int32_t idx = p.indices[static_cast<int64_t>(row) * p.topk + pos];
      if (idx >= 0 && idx < p.capacity) s = idx;
    }
    slot[threadIdx.x] = s;
  }
  __syncthreads();
  for (int w = threadIdx.x; w < entries * kUnitsPerRow; w += kThreads) {
    const int e = w / kUnitsPerRow, u = w % kUnitsPerRow;
    __nv_bfloat16* dst = k_rows + e * kRowStride + 16 * u;
    if (slot[e] >= 0) dequant_unit<F>(p.cache + slot[e] * F::kRecordBytes, u, p.layer_scale, dst);
    else store_16_zero(contiguous(dst));
  }
  __syncthreads();
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  for (int pair = warp; pair < p.heads * entries; pair += kWarps) {
    const int h = pair / entries, e = pair % entries;
    const int64_t rh = static_cast<int64_t>(row) * p.heads + h;
    float* out = scores + rh * p.topk + first + e;
    if (slot[e] < 0) {
      if (lane == 0) *out = -INFINITY;
      continue;
    }
    const __nv_bfloat162* q2 = reinterpret_cast<const __nv_bfloat162*>(p.q + rh * kQkDim);
    const __nv_bfloat162* k2 = reinterpret_cast<const __nv_bfloat162*>(k_rows + e * kRowStride);
    float acc = 0.0f;
#pragma unroll
    for (int i = lane; i < kQkDim / 2; i += 32) {
      const float2 a = __bfloat1622float2(q2[i]), b = __bfloat1622float2(k2[i]);
      acc = fmaf(a.x, b.x, acc);  // BF16 x BF16 products are exact in fp32: fma = multiply + add
      acc = fmaf(a.y, b.y, acc);
    }
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, off);
    if (lane == 0) *out = p.sm_scale * acc;
  }
}

}  // namespace

void sparse_scores(const RecordSpec& spec, const SparseMlaArgs& a, float* scores, cudaStream_t stream) {
  validate_sparse_mla_args(spec, a);
  if (a.rows == 0) return;
  if (!scores) throw Error("sparse scores: the scores buffer is required");
  if (a.capacity > INT32_MAX) throw Error("sparse scores: capacity above 2^31 slots is not supported by int32 indices");
  const int64_t tiles = (static_cast<int64_t>(a.topk) + kTileEntries - 1) / kTileEntries;
  if (tiles > kMaxTilesPerRow)
    throw Error("sparse scores: topk " + std::to_string(a.topk) + " is above the supported " +
                std::to_string(int64_t{kMaxTilesPerRow} * kTileEntries));
  if ((reinterpret_cast<uintptr_t>(a.q) & 15) || (reinterpret_cast<uintptr_t>(a.cache) & 15) ||
      (reinterpret_cast<uintptr_t>(scores) & 3))
    throw Error("sparse scores: q and cache must be 16-byte aligned, scores 4-byte aligned");
  const dim3 grid(static_cast<unsigned>(a.rows), static_cast<unsigned>(tiles));
  with_record_format(spec, "sparse scores", [&](auto format) {
    sparse_scores_kernel<decltype(format)><<<grid, kThreads, 0, stream>>>(a, scores);
  });
  check_launch("sparse scores kernel launch");
}

}  // namespace nvfp4mla::cuda
