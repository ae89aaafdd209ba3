#pragma once
// DecodeKernel::sm80_mma (mma.sync, cp.async; sm_80 and later, any record format):
// one CTA = one query row x one group of HG heads (16, 32 or 64) x one split of the row's top-k
// list; warp w owns head block w % NB (16 heads) and part w / NB of the work (CTA shape per head
// group in kernel_shapes.h). Per KV tile:
//   1. raw records arrive by cp.async (kStages tiles ahead) and are dequantized into a BF16 K
//      tile in shared memory (invalid entries become zero rows and are never read);
//   2. S = Q K^T: each warp computes its head block's scores for its share of the entries and
//      shares them through shared memory, so every warp holds its head block's full scores;
//   3. online softmax (base 2), P stays in registers as the A operand of
//   4. O += P V: each warp accumulates 512/PARTS output dims of its 16 heads.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <mutex>

#include "device/cuda_check.h"
#include "device/per_device.h"
#include "nvfp4mla/error.h"
#include "ops/sparse_mla/decode/common/decode_common.cuh"
#include "ops/sparse_mla/decode/kernel_shapes.h"
#include "ops/sparse_mla/kv_tile.cuh"
#include "ops/sparse_mla/mma_sm80.cuh"

namespace nvfp4mla::cuda {
namespace {

// CTA shape per head block count (kernel_shapes.h holds the table the planner uses too).
template <int NB> constexpr decode::TileConfig kConfig = decode::tile_config(16 * NB);
template <int NB, class F>
struct DecodeSmem {
  static constexpr int HG = 16 * NB, BN = kConfig<NB>.tile_tokens, kScoreStride = BN + 8;
  static constexpr int stages = decode::mma_stages(kConfig<NB>, F::kRecordBytes, F::kRawIsKRow);
  static constexpr size_t q_bytes = size_t(HG) * kRowStride * 2;
  static constexpr size_t k_bytes = size_t(BN) * kRowStride * 2;
  static constexpr size_t s_bytes = size_t(HG) * kScoreStride * 4;
  static constexpr size_t raw_stage_bytes = F::kRawIsKRow ? 0 : size_t(BN) * F::kRecordBytes;
  static constexpr size_t idx_bytes = size_t(2 * stages + 1) * BN * 4;
  static constexpr size_t k_off = q_bytes, s_off = k_off + k_bytes, raw_off = s_off + s_bytes,
                          idx_off = raw_off + stages * raw_stage_bytes, total = idx_off + idx_bytes;
  static_assert(total == decode::mma_smem_bytes(kConfig<NB>, F::kRecordBytes, F::kRawIsKRow, stages));
  static_assert(total <= decode::kSmemBudgetPerBlock);
};


// O += P V for a tile of NT * 8 entries: P (the packed weights `w`) is the A operand straight from
// registers; V rows come from the K tile (`k_tile`, row stride kRowStride) by transposing
// ldmatrix, output dims [dim0, dim0 + 8 * NT_O).
template <int NT, int NT_O>
__device__ __forceinline__ void pv_update(const uint32_t (&w)[NT][2], const __nv_bfloat16* k_tile, int dim0, int lane,
                                          float (&o)[NT_O][4]) {
#pragma unroll
  for (int kk = 0; kk < NT / 2; ++kk) {
    const uint32_t a[4] = {w[2 * kk][0], w[2 * kk][1], w[2 * kk + 1][0], w[2 * kk + 1][1]};
    const __nv_bfloat16* v_base = k_tile + (kk * 16 + (lane & 15)) * kRowStride + dim0 + (lane >> 4) * 8;
#pragma unroll
    for (int n = 0; n < NT_O; n += 2) {
      uint32_t b[4];
      ptx::ldmatrix_x4_trans(b, v_base + n * 8);
      ptx::mma_bf16_16816(o[n], a, b[0], b[1]);
      ptx::mma_bf16_16816(o[n + 1], a, b[2], b[3]);
    }
  }
}

template <int NB, class F>
__global__ void __launch_bounds__(32 * kConfig<NB>.warps, kConfig<NB>.min_ctas) sparse_decode_kernel(const DecodeParams p) {
  constexpr int kWarps = kConfig<NB>.warps;
  constexpr int kThreads = 32 * kWarps;
  constexpr int kTile = kConfig<NB>.tile_tokens;
  using Smem = DecodeSmem<NB, F>;
  constexpr int kScoreStride = Smem::kScoreStride;
  constexpr int HG = Smem::HG;
  constexpr int PARTS = kWarps / NB;
  constexpr int TPW = kTile / PARTS;   // score columns per warp
  constexpr int NT_S = TPW / 8;
  constexpr int DPW = kLatentDim / PARTS;  // output dims per warp
  constexpr int NT_O = DPW / 8;
  static_assert(NT_S >= 1 && NT_O % 2 == 0);

  extern __shared__ __align__(128) uint8_t smem[];
  __nv_bfloat16* sQ = reinterpret_cast<__nv_bfloat16*>(smem);
  __nv_bfloat16* sK = reinterpret_cast<__nv_bfloat16*>(smem + Smem::k_off);
  float* sS = reinterpret_cast<float*>(smem + Smem::s_off);
  uint8_t* sRaw = F::kRawIsKRow ? reinterpret_cast<uint8_t*>(sK) : smem + Smem::raw_off;
  int32_t* sIdx = reinterpret_cast<int32_t*>(smem + Smem::idx_off);

  const CtaWork work = cta_work(HG);
  const int row = work.row, head0 = work.head0, split = work.split;
  const int heads_here = min(HG, p.heads - head0);
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int hb = warp % NB, part = warp / NB;
  const int g = lane >> 2, t4 = lane & 3;
  const int len = row_length(p, row);
  const int tile_begin = split * p.tiles_per_split;
  const int tile_end = min(p.num_tiles, tile_begin + p.tiles_per_split);

  // Q rows of this head group (padding heads are zero).
  constexpr int q_chunks = kQkDim / 8;
  for (int c = tid; c < HG * q_chunks; c += kThreads) {
    const int h = c / q_chunks, ch = c % q_chunks;
    uint4 v = make_uint4(0, 0, 0, 0);
    if (h < heads_here) v = *reinterpret_cast<const uint4*>(p.q + (static_cast<int64_t>(row) * p.heads + head0 + h) * kQkDim + 8 * ch);
    *reinterpret_cast<uint4*>(sQ + h * kRowStride + 8 * ch) = v;
  }
  // Raw records travel kStages tiles ahead of the computed tile (a ring of kStages buffers; bf16
  // records go straight into the K tile, one tile ahead) and their top-k indices kStages tiles
  // further, both by cp.async: the group of tile u holds u's records and the indices of
  // u + kStages (empty groups past the end keep the count uniform). sIdx is a ring of
  // 2 kStages + 1 tiles of indices.
  constexpr int kStages = Smem::stages;
  constexpr int kIdxRing = 2 * kStages + 1;
  auto raw_of = [&](int t) { return F::kRawIsKRow ? sRaw : sRaw + size_t(t % kStages) * Smem::raw_stage_bytes; };
  auto idx_of = [&](int t) { return sIdx + (t % kIdxRing) * kTile; };
  if (tid < kTile)
    for (int t = tile_begin; t < min(tile_end, tile_begin + kStages); ++t) issue_index_copy<kTile>(p, row, len, t, idx_of(t), tid);
  ptx::cp_async_commit();
  ptx::cp_async_wait_group<0>();
  __syncthreads();
  auto issue_group = [&](int u) {
    if (u < tile_end) issue_record_copies<F, kThreads, kTile, F::kRawIsKRow>(p, len, u * kTile, idx_of(u), raw_of(u), tid);
    if (tid < kTile && u + kStages < tile_end) issue_index_copy<kTile>(p, row, len, u + kStages, idx_of(u + kStages), tid);
    ptx::cp_async_commit();
  };
  for (int t = tile_begin; t < tile_begin + kStages; ++t) issue_group(t);

  float o[NT_O][4];
#pragma unroll
  for (int i = 0; i < NT_O; ++i) o[i][0] = o[i][1] = o[i][2] = o[i][3] = 0.0f;
  SoftmaxState st;

  for (int tile = tile_begin; tile < tile_end; ++tile) {
    const int32_t* idx = idx_of(tile);
    auto valid_entry = [&](int e) { return slot_of_index(p, len, tile * kTile + e, idx[e]) >= 0; };
    const uint8_t* raw = raw_of(tile);
    ptx::cp_async_wait_group<kStages - 1>();
    __syncthreads();
    // 1. Dequantize into the K tile; masked entries become zero rows. Latent groups and RoPE
    //    chunks run in separate loops so that no warp diverges between the two paths.
    for (int u = tid; u < kTile * kLatentUnits; u += kThreads) {
      const int t = u / kLatentUnits, k = u % kLatentUnits;
      __nv_bfloat16* dst = sK + t * kRowStride + 16 * k;
      if (kStageSkip & 1) {
        if (t == 0) store_16_zero(contiguous(dst));
      } else if (!valid_entry(t)) {
        store_16_zero(contiguous(dst));
      } else if constexpr (!F::kRawIsKRow) {
        dequant_unit<F>(raw + size_t(t) * F::kRecordBytes, k, p.layer_scale, dst);
      }
    }
    constexpr int kRopeUnits = kUnitsPerRow - kLatentUnits;
    for (int u = tid; u < kTile * kRopeUnits; u += kThreads) {
      const int t = u / kRopeUnits, k = kLatentUnits + u % kRopeUnits;
      __nv_bfloat16* dst = sK + t * kRowStride + 16 * k;
      if (!valid_entry(t)) {
        store_16_zero(contiguous(dst));
      } else if constexpr (!F::kRawIsKRow) {
        dequant_unit<F>(raw + size_t(t) * F::kRecordBytes, k, p.layer_scale, dst);
      }
    }
    __syncthreads();
    if constexpr (!F::kRawIsKRow) {  // the buffer just dequantized takes tile + kStages
      issue_group(tile + kStages);
    }

    // 2. Scores of this warp's columns.
    float acc[NT_S][4];
#pragma unroll
    for (int j = 0; j < NT_S; ++j) acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.0f;
    const __nv_bfloat16* q_base = sQ + (hb * 16 + (lane & 15)) * kRowStride + (lane >> 4) * 8;
    const int col0 = part * TPW;
#pragma unroll 4
    for (int kk = 0; kk < ((kStageSkip & 2) ? 0 : kQkDim / 16); ++kk) {
      uint32_t a[4];
      ptx::ldmatrix_x4(a, q_base + kk * 16);
      if constexpr (NT_S == 1) {
        uint32_t b[2];
        ptx::ldmatrix_x2(b, sK + (col0 + (lane & 7)) * kRowStride + kk * 16 + ((lane >> 3) & 1) * 8);
        ptx::mma_bf16_16816(acc[0], a, b[0], b[1]);
      } else {
#pragma unroll
        for (int j = 0; j < NT_S; j += 2) {
          uint32_t b[4];
          ptx::ldmatrix_x4(b, sK + (col0 + j * 8 + (lane & 7) + ((lane >> 4) << 3)) * kRowStride + kk * 16 +
                                  ((lane >> 3) & 1) * 8);
          ptx::mma_bf16_16816(acc[j], a, b[0], b[1]);
          ptx::mma_bf16_16816(acc[j + 1], a, b[2], b[3]);
        }
      }
    }
#pragma unroll
    for (int j = 0; j < NT_S; ++j) {
      float* s0 = sS + (hb * 16 + g) * kScoreStride + col0 + j * 8 + 2 * t4;
      *reinterpret_cast<float2*>(s0) = make_float2(acc[j][0], acc[j][1]);
      *reinterpret_cast<float2*>(s0 + 8 * kScoreStride) = make_float2(acc[j][2], acc[j][3]);
    }
    __syncthreads();

    // 3. Online softmax over the full 16 x 64 score block of this head block.
    float s[kTile / 8][4];
#pragma unroll
    for (int j = 0; j < kTile / 8; ++j) {
      const float* s0 = sS + (hb * 16 + g) * kScoreStride + j * 8 + 2 * t4;
      const float2 lo = *reinterpret_cast<const float2*>(s0);
      const float2 hi = *reinterpret_cast<const float2*>(s0 + 8 * kScoreStride);
      const bool v0 = valid_entry(j * 8 + 2 * t4), v1 = valid_entry(j * 8 + 2 * t4 + 1);
      s[j][0] = v0 ? lo.x * p.scale_log2 : -INFINITY;
      s[j][1] = v1 ? lo.y * p.scale_log2 : -INFINITY;
      s[j][2] = v0 ? hi.x * p.scale_log2 : -INFINITY;
      s[j][3] = v1 ? hi.y * p.scale_log2 : -INFINITY;
    }
    uint32_t w[kTile / 8][2];
    softmax_update(s, st, o, w);

    // 4. O += P V over this warp's output dims.
    if (!(kStageSkip & 4)) pv_update(w, sK, part * DPW, lane, o);
    __syncthreads();
    if constexpr (F::kRawIsKRow) {  // the K tile is free again: it takes the next tile's rows
      issue_group(tile + 1);
    }
  }

  store_outputs(p, row_totals(st), o, row, head0, heads_here, hb, part * DPW, part == 0, split, lane);
}

template <int NB, class F>
void launch_decode(const DecodeParams& p, int rows, int head_groups, cudaStream_t stream) {
  using Smem = DecodeSmem<NB, F>;
  static PerDevice<bool> opted_in;
  opt_in_shared_memory(opted_in, sparse_decode_kernel<NB, F>, static_cast<int>(Smem::total), "sparse decode: shared memory opt-in");
  const dim3 grid = decode_grid(rows, head_groups, p.splits);
  sparse_decode_kernel<NB, F><<<grid, 32 * kConfig<NB>.warps, Smem::total, stream>>>(p);
  check_launch("sparse decode kernel launch");
}

}  // namespace

// The kernel of the plan's head group (16, 32 or 64).
template <class F>
void launch_sm80_mma(const DecodeParams& p, int head_group, int rows, int head_groups, cudaStream_t stream) {
  switch (head_group) {
    case 16: return launch_decode<1, F>(p, rows, head_groups, stream);
    case 32: return launch_decode<2, F>(p, rows, head_groups, stream);
    case 64: return launch_decode<4, F>(p, rows, head_groups, stream);
    default: throw Error("sparse decode (sm80_mma): head group must be 16, 32 or 64");
  }
}

}  // namespace nvfp4mla::cuda
