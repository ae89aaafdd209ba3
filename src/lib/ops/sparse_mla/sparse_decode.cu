// Split-KV sparse MLA decode: two kernels behind one host API.
//
// Portable kernel (mma.sync; any head group on non-Hopper GPUs, 16/32-head groups everywhere):
// one CTA = one query row x one group of HG heads (16, 32 or 64) x one split of the row's top-k
// list; warp w owns head block w % NB (16 heads) and part w / NB of the work (CTA shape per head
// group in decode_plan.h). Per KV tile:
//   1. raw records arrive by cp.async (kStages tiles ahead) and are dequantized into a BF16 K
//      tile in shared memory (invalid entries become zero rows and are never read);
//   2. S = Q K^T: each warp computes its head block's scores for its share of the entries and
//      shares them through shared memory, so every warp holds its head block's full scores;
//   3. online softmax (base 2), P stays in registers as the A operand of
//   4. O += P V: each warp accumulates 512/PARTS output dims of its 16 heads.
// sm_90 kernel (64-head groups, wgmma, warp-specialized; 128 heads as 2-CTA clusters): see the
// comment above sparse_decode_ws_kernel.
// 16-head groups of NVFP4 records run kernels of their own: sparse_decode_h16_sm90.cu (wgmma,
// sm_90) and sparse_decode_h16.cu (mma.sync, elsewhere).
// Splits write fp32 partials (normalized output and base-2 LSE); a merge kernel combines them.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <mutex>

#include "device/cuda_check.h"
#include "nvfp4mla/cuda/sparse_decode.h"
#include "nvfp4mla/error.h"
#include "ops/sparse_mla/cluster_sm90.cuh"
#include "ops/sparse_mla/decode_common.cuh"
#include "ops/sparse_mla/format_dispatch.cuh"
#include "ops/sparse_mla/kv_tile.cuh"
#include "ops/sparse_mla/mma_sm80.cuh"
#include "ops/sparse_mla/wgmma_sm90.cuh"

namespace nvfp4mla::cuda {
namespace {

// CTA shape per head block count (decode_plan.h holds the table the planner uses too).
template <int NB> constexpr DecodeTileConfig kConfig = decode_tile_config(16 * NB);
template <int NB, class F>
struct DecodeSmem {
  static constexpr int HG = 16 * NB, BN = kConfig<NB>.tile_tokens, kScoreStride = BN + 8;
  static constexpr int stages = decode_stages(kConfig<NB>, F::kRecordBytes, F::kRawIsKRow);
  static constexpr size_t q_bytes = size_t(HG) * kRowStride * 2;
  static constexpr size_t k_bytes = size_t(BN) * kRowStride * 2;
  static constexpr size_t s_bytes = size_t(HG) * kScoreStride * 4;
  static constexpr size_t raw_stage_bytes = F::kRawIsKRow ? 0 : size_t(BN) * F::kRecordBytes;
  static constexpr size_t idx_bytes = size_t(2 * stages + 1) * BN * 4;
  static constexpr size_t k_off = q_bytes, s_off = k_off + k_bytes, raw_off = s_off + s_bytes,
                          idx_off = raw_off + stages * raw_stage_bytes, total = idx_off + idx_bytes;
  static_assert(total == decode_smem_bytes(kConfig<NB>, F::kRecordBytes, F::kRawIsKRow, stages));
  static_assert(total <= kDecodeSmemPerBlock);
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

// Normalize and store this thread's outputs (heads hb*16 + g and + 8, dims [dim0, +8*NT_O)):
// the final BF16 output and LSE when there is one split, else this split's fp32 partial.
template <int NT_O>
__device__ __forceinline__ void store_outputs(const DecodeParams& p, const RowTotals& tot, const float (&o)[NT_O][4],
                                              int row, int head0, int heads_here, int hb, int dim0, bool writes_lse,
                                              int split, int lane) {
  const int g = lane >> 2, t4 = lane & 3;
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int h = hb * 16 + g + 8 * r;
    if (h >= heads_here) continue;
    const float inv = tot.inv[r], lse2 = tot.lse2[r];
    const int64_t rh = static_cast<int64_t>(row) * p.heads + head0 + h;
    if (p.splits == 1) {
      __nv_bfloat16* dst = p.out + rh * kLatentDim + dim0 + 2 * t4;
#pragma unroll
      for (int n = 0; n < NT_O; ++n)
        *reinterpret_cast<uint32_t*>(dst + n * 8) = ptx::pack_bf16x2(o[n][2 * r] * inv, o[n][2 * r + 1] * inv);
      if (writes_lse && t4 == 0) p.lse[rh] = p.lse_base2 ? lse2 : lse2 * kLn2;
    } else {
      const int64_t ps = rh * p.splits + split;
      float* dst = p.part_out + ps * kLatentDim + dim0 + 2 * t4;
#pragma unroll
      for (int n = 0; n < NT_O; ++n)
        *reinterpret_cast<float2*>(dst + n * 8) = make_float2(o[n][2 * r] * inv, o[n][2 * r + 1] * inv);
      if (writes_lse && t4 == 0) p.part_lse[ps] = lse2;
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

  const int row = blockIdx.x, head0 = blockIdx.y * HG, split = blockIdx.z;
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
      if (p.debug_skip & 1) {
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
    for (int kk = 0; kk < ((p.debug_skip & 2) ? 0 : kQkDim / 16); ++kk) {
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
    if (!(p.debug_skip & 4)) pv_update(w, sK, part * DPW, lane, o);
    __syncthreads();
    if constexpr (F::kRawIsKRow) {  // the K tile is free again: it takes the next tile's rows
      issue_group(tile + 1);
    }
  }

  store_outputs(p, row_totals(st), o, row, head0, heads_here, hb, part * DPW, part == 0, split, lane);
}

// ---- warp-specialized decode for 64-head tiles (sm_90a, wgmma) -----------------------------
//
// Four warpgroups per CTA of 64 query heads, KV tiles of 32 or 64 entries (kTile below):
//  - two producer warpgroups gather raw records and dequantize each tile into one of two K
//    buffers;
//  - the scores warpgroup (consumer 0) computes S = Q K^T over all 576 dims, runs the online
//    softmax once, hands the BF16 weights P and each head's rescale factor to the other
//    consumer through shared memory, and accumulates O[:, 0:D) += P V with P from registers
//    (D = WsRoles::scores_dims: 256 with 32-entry tiles, 128 with 64-entry tiles);
//  - the output warpgroup (consumer 1) accumulates O[:, D:512) += P V with P from shared
//    memory, a tile behind, so its MMAs overlap the next tile's score MMAs and softmax.
// (The layout before split the score dims between two symmetric consumers: each tile then
// needed a two-way exchange of partial scores and a duplicated softmax, and neither consumer
// could run ahead of the other.) Warp w of a consumer holds heads 16w..16w+15. Q, the K buffers
// and P are stored as 8x8 core matrices (wgmma_sm90.cuh), so one K buffer is the B operand of
// both products.
//
// kPair: the two 64-head groups of a row (128 heads) run as a 2-CTA cluster on the same
// entries; each CTA dequantizes half of every tile and writes it into both CTAs' K buffers, the
// peer's copy by st.async, whose bytes complete a transaction count on the peer's remote-full
// barrier. Every handoff is a CTA-scope mbarrier (ncu showed cluster-scope release barriers and
// acquire invalidations costing a large share of the stalls); setmaxnreg moves registers to the
// consumers.
//
// kTile: 32-entry K buffers, raw records staged in shared memory by cp.async kStages tiles
// ahead; or, for pairs of NVFP4 records, 64-entry K buffers (the softmax, barrier and hand-off
// chain of the scores warpgroup runs once per 64 entries, and the score MMAs are m64n64k16,
// whose shared-memory reads balance the tensor rate where n32 reads 1.5x what the shared memory
// delivers). Q and two 64-entry K buffers fill the shared memory, so those producers load their
// records straight into registers, one step ahead (FlashMLA's FP8 kernel does the same).
constexpr int kWsTile = 32, kWsWideTile = 64, kWsHeads = 64, kWsConsumers = 256, kWsProducers = 256,
              kWsThreads = kWsConsumers + kWsProducers;
// setmaxnreg budgets (65536 registers for 512 threads): scores warpgroup, output warpgroup, each
// producer warpgroup. (A third producer warpgroup does not fit: with 640 threads the launch
// leaves 96 registers per thread to redistribute, and setmaxnreg.inc beyond the pool never returns.)
// Wide tiles: 176 / 224 / 56 is the split with neither spills nor a stack frame (ptxas -v) in
// every NVFP4 instantiation; the 56-register producers hold one record slice in flight.
// The output dims are split between the two consumers: [0, scores_dims) accumulate in the scores
// warpgroup, the rest in the output warpgroup. Wide tiles give the scores warpgroup (whose chain
// sets the pace, and which holds 64-entry score accumulators) a quarter of them.
template <int kTile>
struct WsRoles {
  static constexpr bool wide = kTile == kWsWideTile;
  static constexpr int scores_dims = wide ? 128 : 256, output_dims = kLatentDim - scores_dims;
  static constexpr int scores = wide ? 176 : 216, output = wide ? 224 : 168, producer = wide ? 56 : 64;
  static_assert(scores + output + 2 * producer == 65536 / 128);
  static_assert(scores_dims % 128 == 0 && output_dims % 128 == 0, "n128 output MMAs");
};
constexpr int kBarProducer = 1, kBarConsumers = 2;
static_assert(decode_tile_config(kWsHeads).tile_tokens == kWsTile, "the planner's tiles must match");
static_assert(kWsWideTile == kDecodeWideTileTiles * kWsTile, "the planner rounds splits to whole wide tiles");

// O[:, 128c, 128c + 128) += P V_c for each 128-dim chunk c of a consumer's accumulators (16 blocks
// per chunk); `vd` is chunk 0's descriptor, chunks lie `chunk_bytes` apart. P from registers (rs)
// or shared memory (ss).
template <int kBlocks>
__device__ __forceinline__ void pv_chunks_rs(float (&o)[kBlocks][4], const uint32_t (&a)[4], uint64_t vd, uint32_t chunk_bytes) {
  static_assert(kBlocks % 16 == 0 && kBlocks <= 48);
  wgmma::m64n128k16_rs_tb<0>(o, a, vd);
  if constexpr (kBlocks >= 32) wgmma::m64n128k16_rs_tb<16>(o, a, wgmma::desc_advance(vd, chunk_bytes));
  if constexpr (kBlocks >= 48) wgmma::m64n128k16_rs_tb<32>(o, a, wgmma::desc_advance(vd, 2 * chunk_bytes));
}
template <int kBlocks>
__device__ __forceinline__ void pv_chunks_ss(float (&o)[kBlocks][4], uint64_t pd, uint64_t vd, uint32_t chunk_bytes) {
  static_assert(kBlocks % 16 == 0 && kBlocks <= 48);
  wgmma::m64n128k16_ss_tb<0>(o, pd, vd);
  if constexpr (kBlocks >= 32) wgmma::m64n128k16_ss_tb<16>(o, pd, wgmma::desc_advance(vd, chunk_bytes));
  if constexpr (kBlocks >= 48) wgmma::m64n128k16_ss_tb<32>(o, pd, wgmma::desc_advance(vd, 2 * chunk_bytes));
}
template <int kBlocks>
__device__ __forceinline__ void zero_blocks(float (&o)[kBlocks][4]) {
#pragma unroll
  for (int n = 0; n < kBlocks; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.0f;
}
// Element offset of (row r, dim d) in a core-matrix tile of `rows` rows: dim blocks of 8 are
// outermost, then rows, 8 dims (16 bytes) per row.
template <int kRows>
__device__ __forceinline__ int core_offset(int r, int d) { return ((d >> 3) * kRows + r) * 8 + (d & 7); }

// Shared memory of the warp-specialized kernel: Q, the K buffers, P, per-head rescale factors
// and normalizers, per-entry masks, the mbarriers, then (32-entry tiles) as many raw record
// stages (up to 4) as fit, and the top-k index ring of 2 stages + 1 tiles.
// Two K buffers: a third (producers two tiles ahead of the score MMAs, one raw stage fewer)
// measured the same on the H200 (256 x 64: 310-326 vs 311-336 us; 256 x 128: 529-565 vs 526-572).
template <class F, bool kPair, int kTile>
struct WsSmem {
  static constexpr int k_bufs = 2;
  static constexpr bool register_records = kTile == kWsWideTile;
  static_assert(kTile == kWsTile || (register_records && kPair && F::spec.dtype == CacheDtype::nvfp4_ds_mla),
                "64-entry tiles: pairs of NVFP4 records only (eight producer threads per entry)");
  static constexpr int tokens_per_cta = kPair ? kTile / 2 : kTile;  // records this CTA gathers per tile
  // Bytes the peer delivers per tile (pairs): its half of the K buffer and, with register
  // records, its entries' masks.
  static constexpr uint32_t peer_mask_bytes = kPair && register_records ? uint32_t(kTile / 2) * sizeof(float) : 0;
  static constexpr uint32_t peer_bytes = kPair ? uint32_t(kTile / 2) * kQkDim * 2 + peer_mask_bytes : 0;
  static constexpr size_t k_buf_bytes = size_t(kTile) * kQkDim * 2;
  static constexpr size_t raw_stage_bytes = size_t(tokens_per_cta) * F::kRecordBytes;
  static constexpr int num_bars = 3 * k_bufs + 2;  // full, remote full, empty per K buffer; P full, P empty
  static constexpr size_t k_off = size_t(kWsHeads) * kQkDim * 2, p_off = k_off + k_bufs * k_buf_bytes,
                          rows_off = p_off + size_t(kWsHeads) * kTile * 2,  // P: BF16 weights of one tile
                          mask_off = rows_off + size_t(2) * kWsHeads * 4,   // per head: rescale factor, normalizer
                          bar_off = mask_off + size_t(k_bufs) * kTile * 4,
                          raw_off = bar_off + size_t(num_bars + 1) / 2 * 16;  // keeps the raw stages 16-byte aligned
  // The top-k index ring holds 2 stages + 1 tiles (indices travel `stages` tiles ahead of the records).
  static constexpr size_t bytes_for(int stages) {
    return raw_off + stages * raw_stage_bytes + (stages > 0 ? size_t(2 * stages + 1) * kTile * 4 : 0);
  }
  static constexpr int stages = register_records                       ? 0
                                : bytes_for(4) <= kDecodeSmemPerBlock   ? 4
                                : bytes_for(3) <= kDecodeSmemPerBlock ? 3
                                : bytes_for(2) <= kDecodeSmemPerBlock ? 2
                                                                      : 1;
  static constexpr size_t idx_off = raw_off + stages * raw_stage_bytes, total = bytes_for(stages);
  static_assert(total <= kDecodeSmemPerBlock && bar_off % 8 == 0 && raw_off % 16 == 0);
};

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define NVFP4MLA_SETMAXNREG(dir, n) asm volatile("setmaxnreg." #dir ".sync.aligned.u32 %0;\n" ::"n"(n))
#else
#define NVFP4MLA_SETMAXNREG(dir, n)
#endif

template <class F, bool kPair, int kTile>
__global__ void __launch_bounds__(kWsThreads, 1) sparse_decode_ws_kernel(const DecodeParams p) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  using Smem = WsSmem<F, kPair, kTile>;
  constexpr int kStages = Smem::stages, kIdxRing = 2 * kStages + 1, kTokens = Smem::tokens_per_cta;
  constexpr int kCtas = kPair ? 2 : 1, kWsKBufs = Smem::k_bufs;
  constexpr int kStepTiles = kTile / kWsTile;  // planner tiles per K buffer
  extern __shared__ __align__(128) uint8_t smem[];
  __nv_bfloat16* sQ = reinterpret_cast<__nv_bfloat16*>(smem);
  __nv_bfloat16* sK = reinterpret_cast<__nv_bfloat16*>(smem + Smem::k_off);
  __nv_bfloat16* sP = reinterpret_cast<__nv_bfloat16*>(smem + Smem::p_off);
  float* sAlpha = reinterpret_cast<float*>(smem + Smem::rows_off);  // this tile's rescale factor per head
  float* sInv = sAlpha + kWsHeads;                                  // final output normalizer per head
  float* sMask = reinterpret_cast<float*>(smem + Smem::mask_off);  // per K buffer entry: 0 or -inf
  uint8_t* sRaw = smem + Smem::raw_off;
  int32_t* sIdx = reinterpret_cast<int32_t*>(smem + Smem::idx_off);  // top-k index ring
  const uint32_t bar0 = ptx::smem_addr(smem + Smem::bar_off);
  auto full_bar = [&](int b) { return bar0 + 8 * b; };                      // this CTA's producers wrote buffer b
  auto remote_full_bar = [&](int b) { return bar0 + 8 * (kWsKBufs + b); };  // the peer's half of buffer b arrived
  auto empty_bar = [&](int b) { return bar0 + 8 * (2 * kWsKBufs + b); };    // every consumer of the row left b
  const uint32_t p_full_bar = bar0 + 8 * (3 * kWsKBufs), p_empty_bar = p_full_bar + 8;

  const int row = blockIdx.x, head0 = blockIdx.y * kWsHeads, split = blockIdx.z;
  const int heads_here = min(kWsHeads, p.heads - head0);
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const uint32_t peer = kPair ? cluster::rank() ^ 1u : 0u;
  const int len = row_length(p, row);
  // Steps of kTile entries over this split's planner tiles; a wide step may reach past the
  // split's last tile, whose entries are masked like those past the row's length.
  const int tile_begin = split * p.tiles_per_split;
  const int tile_end = min(p.num_tiles, tile_begin + p.tiles_per_split);
  const int num_steps = (tile_end - tile_begin + kStepTiles - 1) / kStepTiles;
  auto k_buf = [&](int b) { return sK + b * (Smem::k_buf_bytes / 2); };
  const bool dequant = !(p.debug_skip & 1);

  constexpr int q_chunks = kQkDim / 8;
  for (int c = tid; c < kWsHeads * q_chunks; c += kWsThreads) {
    const int h = c / q_chunks, ch = c % q_chunks;
    uint4 v = make_uint4(0, 0, 0, 0);
    if (h < heads_here) v = *reinterpret_cast<const uint4*>(p.q + (static_cast<int64_t>(row) * p.heads + head0 + h) * kQkDim + 8 * ch);
    *reinterpret_cast<uint4*>(sQ + core_offset<kWsHeads>(h, 8 * ch)) = v;
  }
  wgmma::fence_proxy_async_smem();
  const int ptid = tid - kWsConsumers;  // producer thread index (negative in consumers)
  if (tid == 0) {
    for (int b = 0; b < kWsKBufs; ++b) {
      cluster::mbarrier_init(full_bar(b), kWsProducers);   // every producer thread of this CTA
      cluster::mbarrier_init(remote_full_bar(b), 1);       // this CTA's expect-tx arrival (+ the peer's bytes)
      cluster::mbarrier_init(empty_bar(b), 8 * kCtas);     // one lane per consumer warp of each CTA
    }
    cluster::mbarrier_init(p_full_bar, 128);  // every thread of the scores warpgroup
    cluster::mbarrier_init(p_empty_bar, 128);  // every thread of the output warpgroup
    cluster::fence_mbarrier_init();
  }
  if constexpr (kPair) cluster::sync();  // the peer's barriers exist before anything arrives on them
  else __syncthreads();

  // The role must be visibly warp-uniform for ptxas to compile each branch under its
  // setmaxnreg budget (the consumers' 128 accumulators do not fit the 128-register entry cap).
  const int warpgroup = __shfl_sync(0xFFFFFFFFu, tid / 128, 0);
  if (warpgroup >= kWsConsumers / 128) {
    // ---- producer warpgroups ----
    NVFP4MLA_SETMAXNREG(dec, WsRoles<kTile>::producer);
    const bool copies = !(p.debug_skip & 8);
    const int tok0 = kPair ? kTokens * static_cast<int>(peer ^ 1u) : 0;  // this CTA's entries of each tile
    // The start of buffer b's use: its consumers (both CTAs') have left it; a pair's CTA then
    // expects the peer's half of the tile on its remote-full barrier.
    auto acquire_buffer = [&](int i, int b) {
      const int use = i / kWsKBufs;
      if (use > 0) cluster::wait(empty_bar(b), (use - 1) & 1);
      if constexpr (kPair)
        if (ptid == 0) cluster::arrive_expect_tx(remote_full_bar(b), dequant ? Smem::peer_bytes : Smem::peer_mask_bytes);
    };
    // 16 dequantized values of entry t at dims [d, d + 16) (two core-matrix rows) into this CTA's
    // K buffer and, for pairs, the peer's.
    auto store_values = [&](__nv_bfloat16* kt, uint32_t kt_peer, uint32_t peer_full, int t, int d, uint4 lo, uint4 hi) {
      const int o_lo = core_offset<kTile>(t, d), o_hi = core_offset<kTile>(t, d + 8);
      store_16_words(Dst16{kt + o_lo, kt + o_hi}, lo, hi);
      if constexpr (kPair) {
        cluster::store_async(kt_peer + 2 * o_lo, lo, peer_full);
        cluster::store_async(kt_peer + 2 * o_hi, hi, peer_full);
      }
    };
    // Tile published: masks written, stores visible to the tensor cores.
    auto publish_buffer = [&](int b) {
      wgmma::fence_proxy_async_smem();  // the tensor cores read these buffers next
      cluster::arrive_local(full_bar(b));
    };
    if constexpr (Smem::register_records) {
      // Eight threads per entry, records loaded into registers one step ahead of their
      // dequantization; no producer barrier at all. A warp takes 8 entries x 4 consecutive
      // eighths: each load instruction reads whole sectors of 8 records (not one field of 32), and
      // each 16-byte store fills four whole core-matrix rows (no bank conflicts).
      using Slice = Nvfp4Slice<F>;
      static_assert(kWsProducers == Slice::kParts * kTokens && kTokens == 32 && Slice::kParts == 8);
      const int pw = ptid / 32, tl = 8 * (pw % 4) + lane % 8, part = 4 * (pw / 4) + lane / 8, t = tok0 + tl;
      const int len_here = min(len, tile_end * kWsTile);
      const int32_t* row_indices = p.indices + static_cast<int64_t>(row) * p.topk;
      auto pos_of = [&](int i) { return (tile_begin + i * kStepTiles) * kWsTile + t; };  // this entry in step i
      // Raw index of this thread's entry in step i (-1 past the split or the row: never read there).
      auto load_index = [&](int i) {
        const int pos = pos_of(i);
        return pos < len_here ? __ldg(row_indices + pos) : -1;
      };
      // Loads step i's slice; returns whether the entry is valid.
      auto load_slice = [&](int i, int32_t idx, Slice& x) {
        const int32_t slot = slot_of_index(p, len_here, pos_of(i), idx);
        load_nvfp4_slice<F>(p.cache + static_cast<int64_t>(slot < 0 ? 0 : slot) * F::kRecordBytes, part,
                            slot >= 0 && copies, x);
        return slot >= 0;
      };
      // The entry's mask goes from the part-0 thread into both CTAs' mask arrays.
      const bool writes_mask = part == 0;
      int32_t idx_next = load_index(1);
      Slice cur, next;
      bool valid_next = load_slice(0, load_index(0), cur);
      auto step = [&](int i, Slice& x, Slice& x_next) {
        const int b = i % kWsKBufs;
        const bool valid = valid_next;
        if (i + 1 < num_steps) {
          valid_next = load_slice(i + 1, idx_next, x_next);
          idx_next = load_index(i + 2);
        }
        acquire_buffer(i, b);
        __nv_bfloat16* kt = k_buf(b);
        const uint32_t kt_peer = kPair ? cluster::map_to_rank(ptx::smem_addr(kt), peer) : 0u;
        const uint32_t peer_full = kPair ? cluster::map_to_rank(remote_full_bar(b), peer) : 0u;
        if (dequant) {
          const float latent_scale = slice_latent_scale(x, p.layer_scale);
#pragma unroll
          for (int j = 0; j < Slice::kGroups; ++j) {
            const Words16 w = slice_group_words(x, j, latent_scale);
            store_values(kt, kt_peer, peer_full, t, 16 * (Slice::kGroups * part + j), w.lo, w.hi);
          }
          // The eight RoPE values: one core-matrix row; a pair of threads' halves make the 16.
          const uint4 r = slice_rope_words(x);
          const int o_r = core_offset<kTile>(t, kLatentDim + Slice::kRopeValues * part);
          *reinterpret_cast<uint4*>(kt + o_r) = r;
          if constexpr (kPair) cluster::store_async(kt_peer + 2 * o_r, r, peer_full);
        }
        if (writes_mask) {
          const float m = valid ? 0.0f : -INFINITY;
          float* mask = sMask + b * kTile + t;
          *mask = m;
          if constexpr (kPair) cluster::store_async(cluster::map_to_rank(ptx::smem_addr(mask), peer), __float_as_uint(m), peer_full);
        }
        publish_buffer(b);
      };
      // Two register sets, alternating, so that no slice is copied (a copy would wait for its loads).
      for (int i = 0; i < num_steps; i += 2) {
        step(i, cur, next);
        if (i + 1 < num_steps) step(i + 1, next, cur);
      }
    } else {
      // Records travel kStages tiles ahead of the dequantized one and their top-k indices kStages
      // further, both by cp.async: the group of tile u holds this CTA's records of u and the
      // indices of u + kStages (decode_common.cuh: issue_index_copy).
      auto idx_of = [&](int t) { return sIdx + (t % kIdxRing) * kTile; };
      auto raw_of = [&](int t) { return sRaw + (t % kStages) * Smem::raw_stage_bytes; };
      const bool copies_indices = ptid < kTile;
      if (copies_indices)
        for (int t = tile_begin; t < min(tile_end, tile_begin + kStages); ++t) issue_index_copy<kTile>(p, row, len, t, idx_of(t), ptid);
      ptx::cp_async_commit();
      ptx::cp_async_wait_group<0>();
      ptx::named_barrier_sync(kBarProducer, kWsProducers);
      auto issue_group = [&](int u) {
        if (u < tile_end && copies)
          issue_record_copies<F, kWsProducers, kTokens>(p, len, u * kTile + tok0, idx_of(u) + tok0, raw_of(u), ptid);
        const int v = u + kStages;
        if (copies_indices && v < tile_end) issue_index_copy<kTile>(p, row, len, v, idx_of(v), ptid);
        ptx::cp_async_commit();
      };
      for (int t = tile_begin; t < tile_begin + kStages; ++t) issue_group(t);
      for (int tile = tile_begin; tile < tile_end; ++tile) {
        const int i = tile - tile_begin, b = i % kWsKBufs;
        acquire_buffer(i, b);
        ptx::cp_async_wait_group<kStages - 1>();
        ptx::named_barrier_sync(kBarProducer, kWsProducers);  // every producer's copies of this tile landed
        const int32_t* idx = idx_of(tile);
        auto valid_entry = [&](int e) { return slot_of_index(p, len, tile * kTile + e, idx[e]) >= 0; };
        const uint8_t* raw = raw_of(tile);
        __nv_bfloat16* kt = k_buf(b);
        const uint32_t kt_peer = kPair ? cluster::map_to_rank(ptx::smem_addr(kt), peer) : 0u;
        const uint32_t peer_full = kPair ? cluster::map_to_rank(remote_full_bar(b), peer) : 0u;
        // Thread = (entry, unit phase): kTokens consecutive threads take this CTA's kTokens entries
        // of one unit, so a warp's 16-byte stores fill whole core-matrix rows (no bank conflicts),
        // no warp mixes latent groups and RoPE chunks, and each thread reads its entry's validity
        // and outer scales once per tile.
        if (dequant) {
          constexpr int kPhases = kWsProducers / kTokens, kRounds = (kUnitsPerRow + kPhases - 1) / kPhases;
          const int tl = ptid % kTokens, t = tok0 + tl, phase = ptid / kTokens;
          const uint8_t* rec = raw + size_t(tl) * F::kRecordBytes;
          const bool valid = valid_entry(t);
          const RecordScales sc = record_scales<F>(rec, p.layer_scale);  // unused for invalid entries
          // Straight-line rounds (only the last may be partial, uniformly per warp) and a select
          // instead of a branch for masked entries (their raw bytes are stale but harmless), so
          // the compiler can overlap the dependent chains of consecutive units.
#pragma unroll
          for (int r = 0; r < kRounds; ++r) {
            const int k = phase + r * kPhases;
            if (kUnitsPerRow % kPhases != 0 && r == kRounds - 1 && k >= kUnitsPerRow) break;
            Words16 w = dequant_unit_words<F>(rec, k, sc);
            if (!valid) w = Words16{make_uint4(0, 0, 0, 0), make_uint4(0, 0, 0, 0)};
            store_values(kt, kt_peer, peer_full, t, 16 * k, w.lo, w.hi);
          }
        }
        if (ptid < kTile) sMask[b * kTile + ptid] = valid_entry(ptid) ? 0.0f : -INFINITY;
        publish_buffer(b);
        ptx::named_barrier_sync(kBarProducer, kWsProducers);  // all reads of this raw stage are done
        issue_group(tile + kStages);
      }
    }
  } else {
  // ---- consumer warpgroups ----
  const int hb = warp & 3, g = lane >> 2, t4 = lane & 3;
  constexpr int NT = kTile / 8;       // score column blocks per tile
  using Roles = WsRoles<kTile>;
  // Output accumulators: each branch declares and zeroes its own after setmaxnreg (registers
  // shared across the branches would tie the two wgmma pipelines).
  // Byte strides of the core-matrix tiles: next 8 dims (a dim block), next 8 rows.
  constexpr uint32_t kQDimBlock = kWsHeads * 16, kKDimBlock = kTile * 16, kEight = 128;
  // Descriptors are built once; each MMA advances them by a compile-time byte offset. V from
  // dim d0 on is a K buffer read transposed (tokens are the k dim); 128-dim chunks lie
  // kVChunk apart. (Buffer b's descriptors are buffer 0's advanced by b buffers: one add per tile.)
  constexpr uint32_t kKBufBytes = Smem::k_buf_bytes, kVChunk = 16 * kKDimBlock;
  auto v_desc = [&](int d0) {
    return wgmma::smem_desc(ptx::smem_addr(k_buf(0)) + (d0 / 8) * kKDimBlock, kEight, kKDimBlock);
  };
  // The full/remote-full waits of a K buffer's use (the second consumer repeats them: already
  // complete then, they cost a poll and give it the acquire of the producers' writes).
  auto wait_k_tile = [&](int b, int use) {
    cluster::wait(full_bar(b), use & 1);
    if constexpr (kPair) cluster::wait(remote_full_bar(b), use & 1);
  };
  // Done with a K buffer: one lane per warp tells both CTAs' producers.
  auto release_k_tile = [&](int b) {
    __syncwarp();
    if (lane == 0) {
      cluster::arrive_local(empty_bar(b));
      if constexpr (kPair) cluster::arrive_remote(cluster::map_to_rank(empty_bar(b), peer));
    }
  };
  if (warpgroup == 0) {
    // ---- scores warpgroup: S, softmax, P, output dims [0, scores_dims) ----
    NVFP4MLA_SETMAXNREG(inc, WsRoles<kTile>::scores);
    float o[Roles::scores_dims / 8][4];
    zero_blocks(o);
    SoftmaxState st;
    const uint64_t q_desc = wgmma::smem_desc(ptx::smem_addr(sQ), kQDimBlock, kEight);
    const uint64_t k_desc0 = wgmma::smem_desc(ptx::smem_addr(k_buf(0)), kKDimBlock, kEight), v_desc0 = v_desc(0);
    for (int i = 0; i < num_steps; ++i) {
      const int b = i % kWsKBufs;
      wait_k_tile(b, i / kWsKBufs);
      const uint64_t k_desc = wgmma::desc_advance(k_desc0, b * kKBufBytes), vd = wgmma::desc_advance(v_desc0, b * kKBufBytes);
      float acc[NT][4];
      wgmma::fence();
      if (!(p.debug_skip & 2))
#pragma unroll
        for (int kk = 0; kk < kQkDim / 16; ++kk)
          wgmma::m64nk16_ss<NT>(acc, wgmma::desc_advance(q_desc, 2 * kk * kQDimBlock),
                                wgmma::desc_advance(k_desc, 2 * kk * kKDimBlock), kk > 0);
      wgmma::commit();
      wgmma::wait<0>();
      // Scaled logits; masked entries (zero K rows) get -inf from the additive mask.
      float s[NT][4];
      const float* mask = sMask + b * kTile;
#pragma unroll
      for (int j = 0; j < NT; ++j) {
        const float2 m01 = *reinterpret_cast<const float2*>(mask + j * 8 + 2 * t4);
        s[j][0] = fmaf(acc[j][0], p.scale_log2, m01.x);
        s[j][1] = fmaf(acc[j][1], p.scale_log2, m01.y);
        s[j][2] = fmaf(acc[j][2], p.scale_log2, m01.x);
        s[j][3] = fmaf(acc[j][3], p.scale_log2, m01.y);
      }
      float m_use[2], alpha[2];
      softmax_rescale(s, st, o, m_use, alpha);
      uint32_t w[NT][2];
      softmax_weights(s, st, m_use, w);
      // P as the A operand of m64nNk16: two column blocks make one m16n8k16 A fragment per warp.
      uint32_t a[NT / 2][4];
#pragma unroll
      for (int kk = 0; kk < NT / 2; ++kk) {
        a[kk][0] = w[2 * kk][0];
        a[kk][1] = w[2 * kk][1];
        a[kk][2] = w[2 * kk + 1][0];
        a[kk][3] = w[2 * kk + 1][1];
      }
      // Hand P and the rescale factors to the output warpgroup once it has read the last ones.
      if (i > 0) cluster::wait(p_empty_bar, (i - 1) & 1);
      const int h0 = hb * 16 + g;
#pragma unroll
      for (int j = 0; j < NT; ++j) {
        *reinterpret_cast<uint32_t*>(sP + core_offset<kWsHeads>(h0, 8 * j + 2 * t4)) = w[j][0];
        *reinterpret_cast<uint32_t*>(sP + core_offset<kWsHeads>(h0 + 8, 8 * j + 2 * t4)) = w[j][1];
      }
      if (t4 == 0) {
        sAlpha[h0] = alpha[0];
        sAlpha[h0 + 8] = alpha[1];
      }
      wgmma::fence_proxy_async_smem();  // P is read by the tensor cores
      cluster::arrive_local(p_full_bar);
      wgmma::fence();
      if (!(p.debug_skip & 4))
#pragma unroll
        for (int kk = 0; kk < NT / 2; ++kk)  // tokens 16kk..16kk+15: two 8-row core-matrix groups, 16 bytes a row
          pv_chunks_rs(o, a[kk], wgmma::desc_advance(vd, kk * 16 * 16), kVChunk);
      wgmma::commit();
      wgmma::wait<0>();  // the buffer is read asynchronously: done before it is released
      release_k_tile(b);
    }
    const RowTotals tot = row_totals(st);
    if (t4 == 0) {
      sInv[hb * 16 + g] = tot.inv[0];
      sInv[hb * 16 + g + 8] = tot.inv[1];
    }
    ptx::named_barrier_sync(kBarConsumers, kWsConsumers);  // the normalizers are in sInv
    store_outputs(p, tot, o, row, head0, heads_here, hb, 0, true, split, lane);
  } else {
    // ---- output warpgroup: output dims [scores_dims, 512) with P from shared memory ----
    NVFP4MLA_SETMAXNREG(inc, WsRoles<kTile>::output);
    float o[Roles::output_dims / 8][4];
    zero_blocks(o);
    constexpr uint32_t kPDimBlock = kWsHeads * 16;  // P: next 8 tokens
    const uint64_t p_desc = wgmma::smem_desc(ptx::smem_addr(sP), kPDimBlock, kEight);
    const uint64_t v_desc1 = v_desc(Roles::scores_dims);
    for (int i = 0; i < num_steps; ++i) {
      const int b = i % kWsKBufs;
      cluster::wait(p_full_bar, i & 1);
      wait_k_tile(b, i / kWsKBufs);
      const uint64_t vd = wgmma::desc_advance(v_desc1, b * kKBufBytes);
      const float alpha[2] = {sAlpha[hb * 16 + g], sAlpha[hb * 16 + g + 8]};
      wgmma::wait<0>();  // nothing is in flight; without it ptxas serializes every wgmma (C7515)
      rescale_rows(o, alpha);
      wgmma::fence();
      if (!(p.debug_skip & 4))
#pragma unroll
        for (int kk = 0; kk < NT / 2; ++kk)
          pv_chunks_ss(o, wgmma::desc_advance(p_desc, 2 * kk * kPDimBlock), wgmma::desc_advance(vd, kk * 16 * 16), kVChunk);
      wgmma::commit();
      wgmma::wait<0>();
      cluster::arrive_local(p_empty_bar);  // its reads of sAlpha are done too
      release_k_tile(b);
    }
    ptx::named_barrier_sync(kBarConsumers, kWsConsumers);
    RowTotals tot;
    tot.inv[0] = sInv[hb * 16 + g];
    tot.inv[1] = sInv[hb * 16 + g + 8];
    tot.lse2[0] = tot.lse2[1] = 0.0f;  // the scores warpgroup writes the LSE
    store_outputs(p, tot, o, row, head0, heads_here, hb, Roles::scores_dims, false, split, lane);
  }
  }
  // A pair's CTAs write into each other's shared memory until the end: neither exits first.
  if constexpr (kPair) cluster::sync();
#endif
}

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
  float4 acc = make_float4(0, 0, 0, 0);
  for (int s = 0; s < splits; ++s) {
    const float w = weights[s];
    if (w == 0.0f) continue;  // also skips never-written partials of empty splits
    const float4 v = reinterpret_cast<const float4*>(part_out + (rh * splits + s) * kLatentDim)[threadIdx.x];
    acc.x += w * v.x; acc.y += w * v.y; acc.z += w * v.z; acc.w += w * v.w;
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

template <int NB, class F>
void launch_decode(const DecodeParams& p, int rows, int head_groups, cudaStream_t stream) {
  using Smem = DecodeSmem<NB, F>;
  static std::once_flag once;
  std::call_once(once, [] {
    check(cudaFuncSetAttribute(sparse_decode_kernel<NB, F>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                               static_cast<int>(Smem::total)),
          "sparse decode: shared memory opt-in");
  });
  const dim3 grid(rows, head_groups, p.splits);
  sparse_decode_kernel<NB, F><<<grid, 32 * kConfig<NB>.warps, Smem::total, stream>>>(p);
  check_launch("sparse decode kernel launch");
}

template <class F, bool kPair, int kTile>
void launch_decode_ws(const DecodeParams& p, int rows, int head_groups, cudaStream_t stream) {
  using Smem = WsSmem<F, kPair, kTile>;
  static std::once_flag once;
  std::call_once(once, [] {
    check(cudaFuncSetAttribute(sparse_decode_ws_kernel<F, kPair, kTile>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                               static_cast<int>(Smem::total)),
          "sparse decode: shared memory opt-in");
  });
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = dim3(rows, head_groups, p.splits);
  cfg.blockDim = dim3(kWsThreads);
  cfg.dynamicSmemBytes = Smem::total;
  cfg.stream = stream;
  cudaLaunchAttribute attr{};
  attr.id = cudaLaunchAttributeClusterDimension;
  attr.val.clusterDim.x = 1;
  attr.val.clusterDim.y = kPair ? 2 : 1;  // the two head groups of a row
  attr.val.clusterDim.z = 1;
  cfg.attrs = &attr;
  cfg.numAttrs = 1;
  check(cudaLaunchKernelEx(&cfg, sparse_decode_ws_kernel<F, kPair, kTile>, p), "sparse decode (warp-specialized) kernel launch");
}

// The warp-specialized kernel needs sm_90a (setmaxnreg); other GPUs run the portable kernel.
bool current_device_is_sm90() {
  int dev = 0, major = 0, minor = 0;
  check(cudaGetDevice(&dev), "cudaGetDevice");
  check(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev), "compute capability");
  check(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev), "compute capability");
  static const bool force_portable = std::getenv("NVFP4MLA_PORTABLE_DECODE") != nullptr;
  return major == 9 && minor == 0 && !force_portable;
}

// NVFP4 records with 16-head groups run a 16-head kernel: on sm_90 the wgmma one, elsewhere the
// register-fed mma.sync one. A/B timing aids: NVFP4MLA_DEBUG_NO_H16 (the portable kernel),
// NVFP4MLA_DEBUG_H16_MMA_SYNC (the mma.sync 16-head kernel on sm_90 too).
bool h16_kernel_enabled() {
  static const bool disabled = std::getenv("NVFP4MLA_DEBUG_NO_H16") != nullptr;
  return !disabled;
}
bool h16_runs_wgmma() {
  static const bool mma_sync = std::getenv("NVFP4MLA_DEBUG_H16_MMA_SYNC") != nullptr;
  return h16_kernel_enabled() && !mma_sync && current_device_is_sm90();
}

template <class F>
void dispatch_heads(const DecodePlan& plan, const DecodeParams& p, int rows, cudaStream_t stream) {
  switch (plan.head_group) {
    case 16:
      if constexpr (F::spec.dtype == CacheDtype::nvfp4_ds_mla)
        if (h16_runs_wgmma()) return launch_decode_h16_sm90<F>(p, rows, plan.num_head_groups, stream);
        else if (h16_kernel_enabled()) return launch_decode_h16<F>(p, rows, plan.num_head_groups, stream);
      return launch_decode<1, F>(p, rows, plan.num_head_groups, stream);
    case 32: return launch_decode<2, F>(p, rows, plan.num_head_groups, stream);
    case 64:
      if (current_device_is_sm90()) {
        // A/B timing aids: NVFP4MLA_DEBUG_NO_PAIR (one CTA per 64 heads), NVFP4MLA_DEBUG_NARROW (pairs
        // of NVFP4 records on 32-entry tiles).
        static const bool no_pair = std::getenv("NVFP4MLA_DEBUG_NO_PAIR") != nullptr;
        static const bool narrow = std::getenv("NVFP4MLA_DEBUG_NARROW") != nullptr;
        if (plan.num_head_groups % 2 == 0 && !no_pair) {
          if constexpr (F::spec.dtype == CacheDtype::nvfp4_ds_mla)
            if (!narrow) return launch_decode_ws<F, true, kWsWideTile>(p, rows, plan.num_head_groups, stream);
          return launch_decode_ws<F, true, kWsTile>(p, rows, plan.num_head_groups, stream);
        }
        return launch_decode_ws<F, false, kWsTile>(p, rows, plan.num_head_groups, stream);
      }
      return launch_decode<4, F>(p, rows, plan.num_head_groups, stream);
    default: throw Error("sparse decode: head group must be 16, 32 or 64");
  }
}

}  // namespace

int current_sm_count() {
  int dev = 0, sms = 0;
  check(cudaGetDevice(&dev), "cudaGetDevice");
  check(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev), "cudaDeviceGetAttribute(SM count)");
  return sms;
}

// Both 16-head NVFP4 kernels have exact K products; the mma.sync one also carries the weights'
// BF16 remainder, the wgmma one rounds them once like the other kernels.
static bool runs_h16_kernel(const RecordSpec& spec, const DecodePlan& plan) {
  return decode_uses_h16_kernel(spec, plan.head_group) && h16_kernel_enabled();
}
bool decode_rounds_k_to_bf16(const RecordSpec& spec, const DecodePlan& plan) { return !runs_h16_kernel(spec, plan); }
bool decode_weights_are_bf16(const RecordSpec& spec, const DecodePlan& plan) {
  return !runs_h16_kernel(spec, plan) || h16_runs_wgmma();
}

void sparse_decode(const RecordSpec& spec, const SparseMlaArgs& a, const DecodePlan& plan, void* workspace,
                   size_t workspace_bytes, uint16_t* out, float* lse, cudaStream_t stream) {
  validate_sparse_mla_args(spec, a);
  if (a.rows == 0) return;
  if (!out || !lse) throw Error("sparse decode: out and lse are required");
  if (a.capacity > INT32_MAX) throw Error("sparse decode: capacity above 2^31 slots is not supported by int32 indices");
  const int expect_groups = (a.heads + plan.head_group - 1) / plan.head_group;
  const DecodeTileConfig cfg = decode_tile_config(plan.head_group);
  const int expect_warps = decode_uses_h16_kernel(spec, cfg.head_group) ? kDecodeH16Warps : cfg.warps;
  if (plan.num_head_groups != expect_groups || plan.head_group != cfg.head_group || plan.warps != expect_warps ||
      plan.tile_tokens != cfg.tile_tokens || plan.num_tiles != (a.topk + cfg.tile_tokens - 1) / cfg.tile_tokens ||
      plan.splits < 1 ||
      static_cast<int64_t>(plan.splits) * plan.tiles_per_split < plan.num_tiles)
    throw Error("sparse decode: the plan does not match rows/heads/topk; build it with plan_sparse_decode");
  const auto ws = decode_workspace_layout(plan, a.rows, a.heads);
  if (workspace_bytes < ws.total_bytes || (ws.total_bytes > 0 && !workspace))
    throw Error("sparse decode: workspace of " + std::to_string(ws.total_bytes) + " bytes required, got " +
                std::to_string(workspace_bytes));
  if ((reinterpret_cast<uintptr_t>(a.q) & 15) || (reinterpret_cast<uintptr_t>(a.cache) & 15) ||
      (reinterpret_cast<uintptr_t>(workspace) & 255))
    throw Error("sparse decode: q and cache must be 16-byte aligned, the workspace 256-byte aligned");

  DecodeParams p{};
  p.q = a.q;
  p.cache = a.cache;
  p.capacity = a.capacity;
  p.indices = a.indices;
  p.topk_length = a.topk_length;
  p.topk = a.topk;
  p.heads = a.heads;
  p.splits = plan.splits;
  p.tiles_per_split = plan.tiles_per_split;
  p.num_tiles = plan.num_tiles;
  p.scale_log2 = a.sm_scale * kLog2e;
  p.layer_scale = a.layer_scale;
  p.lse_base2 = a.lse_base == LseBase::base2;
  static const int debug_skip = [] {
    const char* e = std::getenv("NVFP4MLA_DEBUG_SKIP");
    return e ? std::atoi(e) : 0;
  }();
  p.debug_skip = debug_skip;
  p.out = reinterpret_cast<__nv_bfloat16*>(out);
  p.lse = lse;
  if (plan.splits > 1) {
    p.part_out = reinterpret_cast<float*>(static_cast<uint8_t*>(workspace) + ws.partial_out_offset);
    p.part_lse = reinterpret_cast<float*>(static_cast<uint8_t*>(workspace) + ws.partial_lse_offset);
  }
  with_record_format(spec, "sparse decode",
                     [&](auto format) { dispatch_heads<decltype(format)>(plan, p, a.rows, stream); });
  if (plan.splits > 1) {
    const int64_t n = static_cast<int64_t>(a.rows) * a.heads;
    merge_splits_kernel<<<static_cast<unsigned>(n), kMergeThreads, plan.splits * sizeof(float), stream>>>(
        p.part_out, p.part_lse, plan.splits, p.lse_base2, p.out, lse);
    check_launch("split merge kernel launch");
  }
}

}  // namespace nvfp4mla::cuda
