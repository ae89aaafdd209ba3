#pragma once
// Warp-specialized indexer logits for the ragged form on sm_90a (indexer.h semantics); the
// two-warpgroup kernel of indexer_logits.cuh serves the paged form, 16 heads and mma.sync.
//
// Why: in the two-warpgroup kernel every warpgroup loads, multiplies, sums and stores, so a
// warpgroup waits on its own MMA between the halves of a tile and spends many instructions per
// tile on copies, weight loads, shuffles and range-checked stores. Here each role does one thing:
//   - kWsMathGroups math warpgroups: warpgroup g multiplies key slice g % kWsKeySlices (64 keys)
//     of the block by column group g / kWsKeySlices (128 query columns = 128 / kHp rows) as two
//     64-column wgmmas, summing w * max(d, 0) over the first half's columns while the second
//     runs (with 64 heads its weights stay in registers for the whole query block). It stores
//     per (key, row) the partial sums of its 16 columns (one per quad lane) to an epilogue
//     buffer, without shuffles, range checks or global stores;
//   - an epilogue warpgroup: adds the four partials of each (key, row), multiplies by the key's
//     scale (read from global memory before the block's partials are due), checks the row's range
//     and stores. One of its threads also loads the keys: each block of kWsBlockKeys keys by one
//     TMA (a 2-D tensor map over the key buffer, 128-byte swizzle = indexer_schedule.h's
//     core_offset layout; rows past the buffer read as zero) into a ring of kWsKeyStages stages.
//     A block's partials arrive only after every math thread's MMAs on it are done, so the
//     block's stage is free then: no empty barrier, and no producer warp of its own (which would
//     make 672 threads, which ptxas budgets as 768: 80 registers each instead of 96).
// Handoffs are CTA-scope mbarriers (full/empty per stage); setmaxnreg moves registers from the
// epilogue to the math warpgroups. Every role follows the same TileWalk over the key blocks (the
// rows' ranges are in shared memory), so no block index travels between roles.
//
// A query block is kWsQueryCols columns (kWsQueryCols / kHp rows); a block of kWsKeySlices x 64
// keys times a query block of kWsColGroups x 128 columns keeps the ratio of tensor-core work to
// key bytes of the two-warpgroup kernel's 256-column blocks (L2 reads of the key buffer).
#include <cuda.h>  // CUtensorMap
#include <cuda_runtime.h>

#include <climits>
#include <cstdint>

#include "device/mbarrier.cuh"
#include "ops/indexer/indexer_logits.cuh"

namespace nvfp4mla::cuda::indexer_kernels {

inline constexpr int kWsMathThreads = 128 * kWsMathGroups;
inline constexpr int kWsEpilogueThreads = 128;
inline constexpr int kWsThreads = kWsMathThreads + kWsEpilogueThreads;
inline constexpr int kWsKeyStages = 8;  // the epilogue, which refills a stage, may trail the math by kWsEpilogueStages blocks
inline constexpr int kWsEpilogueStages = 3;
// Registers: 65536 / kWsThreads rounds down to 96 per thread at launch; the epilogue
// warpgroup's release pays for the math warpgroups' increase. 104 holds a math thread's 64
// accumulators and (64 heads) 32 weights without spills (ptxas -v); the epilogue spills at 32,
// hence 104 / 64 rather than 112 / 32.
inline constexpr int kWsLaunchRegs = 96, kWsMathRegs = 104, kWsEpilogueRegs = 64;
static_assert(kWsThreads * kWsLaunchRegs <= 65536 && kWsThreads * (kWsLaunchRegs + 8) > 65536);
static_assert(kWsMathThreads * (kWsMathRegs - kWsLaunchRegs) <= kWsEpilogueThreads * (kWsLaunchRegs - kWsEpilogueRegs));
static_assert(kWsEpilogueThreads == kWsMathGroups * 32, "one epilogue thread per (math warpgroup, quad)");

template <int kHp>
struct WsLayout {
  static constexpr int kRows = kWsQueryCols / kHp;      // rows of a query block
  static constexpr int kGroupRows = 128 / kHp;          // rows of one column group
  static constexpr int kValues = 2 * kGroupRows;        // a math thread's partial sums per block: (row, key pair)
  static constexpr int kPlanes = kValues / 4;           // float4 planes of the epilogue buffer
  // A math thread keeps its 32 weights in registers with 64 heads; with 32 heads (twice the
  // partial sums) that spills, so it reads them from shared memory per tile (4 x 16 bytes a half).
  static constexpr bool kWeightsInRegisters = kHp == 64;
  static constexpr int q_off = 0;                       // kWsQueryCols x 128 bytes
  static constexpr int key_stage_bytes = kWsBlockKeys * kDim;
  static constexpr int keys_off = q_off + kWsQueryCols * kDim;
  static constexpr int plane_bytes = kWsMathThreads * 16;
  static constexpr int epi_stage_bytes = kPlanes * plane_bytes;
  static constexpr int epi_off = keys_off + kWsKeyStages * key_stage_bytes;
  static constexpr int w_off = epi_off + kWsEpilogueStages * epi_stage_bytes;     // weights (weight_slot order)
  static constexpr int rows_off = w_off + kWsQueryCols * 4;                         // RowRange per row
  static constexpr int bars_off = rows_off + kRows * 16;
  static constexpr int bytes = bars_off + 8 * (kWsKeyStages + 2 * kWsEpilogueStages);
  static_assert(keys_off % kSwizzleAtomBytes == 0 && key_stage_bytes % kSwizzleAtomBytes == 0);
  static_assert(kValues % 4 == 0 && bytes <= 227 * 1024);
};

// TMA: rows [k, k + kWsBlockKeys) of the key buffer into `dst` (1024-byte aligned); the box's
// bytes (zero-filled rows included) complete the transaction count of mbarrier `bar`.
__device__ __forceinline__ void tma_load_keys(uint32_t dst, const CUtensorMap* map, int32_t k, uint32_t bar) {
#ifdef NVFP4MLA_WGMMA
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];\n" ::"r"(dst),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(0), "r"(k), "r"(bar)
      : "memory");
#endif
}

// One block per SM: Q block + key ring + epilogue ring take most of the shared memory, and the
// 640 threads all the registers.
template <int kHp>
__global__ void __launch_bounds__(kWsThreads, 1)
    indexer_logits_ws_kernel(const Params p, const __grid_constant__ CUtensorMap keys_map) {
#ifdef NVFP4MLA_WGMMA
  using L = WsLayout<kHp>;
  constexpr int kRows = L::kRows, kValues = L::kValues, kPlanes = L::kPlanes;
  if (*p.invalid_count != 0) return;  // bad metadata: write nothing
  extern __shared__ __align__(1024) uint8_t smem[];  // swizzle atoms (and TMA's 128-byte swizzle) are 1024-byte aligned
  uint8_t* sq = smem + L::q_off;
  RowRange* rr = reinterpret_cast<RowRange*>(smem + L::rows_off);
  const uint32_t bars = ptx::smem_addr(smem + L::bars_off);
  auto key_full = [&](int s) { return bars + 8 * s; };
  auto epi_full = [&](int s) { return bars + 8 * (kWsKeyStages + s); };
  auto epi_empty = [&](int s) { return bars + 8 * (kWsKeyStages + kWsEpilogueStages + s); };
  const int tid = threadIdx.x;

  // ---- setup: the block's rows, their ranges in this chunk, the query block, the barriers ----
  // (With 64 heads the math threads load their weights into registers themselves.)
  const QueryBlock qb = setup_query_block<Source::contiguous, kHp, kWsQueryCols, kWsThreads, !L::kWeightsInRegisters>(
      p, tid, sq, reinterpret_cast<float*>(smem + L::w_off), rr);
  const int64_t first_row = qb.first_row;
  const int rows_here = qb.rows_here;
  if (tid == 0) {
    for (int s = 0; s < kWsKeyStages; ++s) mbarrier::init(key_full(s), 1);  // the loader's expect-tx arrival (+ the TMA bytes)
    for (int s = 0; s < kWsEpilogueStages; ++s) {
      mbarrier::init(epi_full(s), kWsMathThreads);       // every math thread, after its MMAs and partial sums
      mbarrier::init(epi_empty(s), kWsEpilogueThreads);  // every epilogue thread, after its reads
    }
    mbarrier::fence_init();
  }
  ptx::cp_async_wait_all();
  wgmma::fence_proxy_async_smem();
  __syncthreads();

  write_tails<kWsThreads>(p, qb, rr, tid);
  const Span span = span_of<kRows>(rr);
  if (span.lo >= span.hi) return;
  const TileWalk<kRows, kWsBlockKeys, 1> walk{rr, span};
  uint8_t* keys = smem + L::keys_off;
  float* epi = reinterpret_cast<float*>(smem + L::epi_off);
  const int group = tid / 128, gtid = tid % 128, warp = gtid / 32, lane = tid % 32;
  const int g4 = lane >> 2, c4 = lane & 3;

  if (group == kWsMathGroups) {
    // ---- epilogue warpgroup (and the key loads) ---------------------------------------------
    NVFP4MLA_SETMAXNREG(dec, kWsEpilogueRegs);
    const bool loader = gtid == 0;
    int32_t load_k = walk.first(0);
    if (loader) {
      asm volatile("prefetch.tensormap [%0];\n" ::"l"(reinterpret_cast<uint64_t>(&keys_map)) : "memory");
      for (int s = 0; s < kWsKeyStages && load_k != INT_MAX; ++s, load_k = walk.advance(load_k)) {
        mbarrier::arrive_expect_tx(key_full(s), L::key_stage_bytes);
        tma_load_keys(ptx::smem_addr(keys + s * L::key_stage_bytes), &keys_map, load_k, key_full(s));
      }
    }
    // Thread gtid finishes quad q of warp w of math warpgroup mg: two keys (value parity e) of
    // each block, kGroupRows rows of the query block (indexer_schedule.h, ws_value_*).
    int mg, w, q;
    ws_epilogue_item(gtid, mg, w, q);
    const float* partials = epi + 4 * 128 * mg;
    int stage = 0, kstage = 0;
    uint32_t phase = 0;
    for (int32_t k = walk.first(0); k != INT_MAX; k = walk.advance(k)) {
      float scale[2];
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int kt = ws_value_key(mg, w, q, e);
        scale[e] = kt < span.hi - k ? p.key_scales[(int64_t(k) + kt) * p.key_scale_stride] : 0.0f;
      }
      mbarrier::wait(epi_full(stage), phase);
      // Every math thread is done with this block's keys: refill its stage.
      if (loader && load_k != INT_MAX) {
        mbarrier::arrive_expect_tx(key_full(kstage), L::key_stage_bytes);
        tma_load_keys(ptx::smem_addr(keys + kstage * L::key_stage_bytes), &keys_map, load_k, key_full(kstage));
      }
      if (load_k != INT_MAX) load_k = walk.advance(load_k);
      // Plane by plane (values 4 pl .. 4 pl + 3: two rows), to keep few sums live.
      const float* part = partials + stage * (L::epi_stage_bytes / 4);
#pragma unroll
      for (int pl = 0; pl < kPlanes; ++pl) {
        float sum[4];
#pragma unroll
        for (int c = 0; c < 4; ++c) {
          const float4 v = *reinterpret_cast<const float4*>(part + pl * (L::plane_bytes / 4) + 4 * ws_partial_slot(w, q, c));
          if (c == 0) {
            sum[0] = v.x, sum[1] = v.y, sum[2] = v.z, sum[3] = v.w;
          } else {
            sum[0] += v.x, sum[1] += v.y, sum[2] += v.z, sum[3] += v.w;
          }
        }
        if (pl == kPlanes - 1) mbarrier::arrive(epi_empty(stage));
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          const RowRange x = rr[ws_value_row<kHp>(mg, 4 * pl + 2 * r)];
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            const int kt = ws_value_key(mg, w, q, e);
            // Relative to the block (k + kt may pass INT32_MAX near the end of a 2^31-key buffer).
            if (kt >= x.lo - k && kt < x.hi - k) p.logits[x.out_off + k + kt] = scale[e] * sum[2 * r + e];
          }
        }
      }
      if (++stage == kWsEpilogueStages) stage = 0, phase ^= 1;
      if (++kstage == kWsKeyStages) kstage = 0;
    }
  } else {
    // ---- math warpgroups --------------------------------------------------------------------
    NVFP4MLA_SETMAXNREG(inc, kWsMathRegs);
    const int slice = group % kWsKeySlices, cg = group / kWsKeySlices;
    // The weights of the thread's accumulator columns 128 cg + 64 half + 8 j + 2 c4 + b.
    constexpr bool kRegs = L::kWeightsInRegisters;
    float wt[kRegs ? 2 : 1][8][2];
    if constexpr (kRegs) {
#pragma unroll
      for (int half = 0; half < 2; ++half)
#pragma unroll
        for (int j = 0; j < 8; ++j)
#pragma unroll
          for (int b = 0; b < 2; ++b) {
            const int n = 128 * cg + 64 * half + 8 * j + 2 * c4 + b, r = n / kHp, h = n % kHp;
            wt[half][j][b] = (r < rows_here && h < p.heads) ? p.weights[(first_row + r) * p.heads + h] : 0.0f;
          }
    }
    const float* sw = reinterpret_cast<const float*>(smem + L::w_off);
    const uint8_t* q_half0 = sq + (128 * cg) * kDim;
    const uint8_t* q_half1 = q_half0 + 64 * kDim;
    float* my_slots = epi + 4 * (128 * group + ws_partial_slot(warp, g4, c4));
    // Partial sums of one 64-column half: vals[2 r + e] for the half's rows r (of the column
    // group) and keys 16 warp + g4 + 8 e. With one row per half (64 heads) each value is two
    // chains (even and odd columns), so that four independent FMA chains are in flight.
    float vals[kValues];
    auto sum_half = [&](const float (&acc)[8][4], int half) {
      constexpr int kHalfRows = 64 / kHp, kChains = kHalfRows == 1 ? 2 : 1;
      float s[2 * kHalfRows][kChains];
#pragma unroll
      for (int v = 0; v < 2 * kHalfRows; ++v)
#pragma unroll
        for (int c = 0; c < kChains; ++c) s[v][c] = 0.0f;
#pragma unroll
      for (int jj = 0; jj < 4; ++jj) {
        float4 w4{};  // shared-memory weights of blocks 2 jj, 2 jj + 1 (weight_slot)
        if constexpr (!kRegs) w4 = *reinterpret_cast<const float4*>(sw + 4 * (4 * (8 * cg + 4 * half + jj) + c4));
#pragma unroll
        for (int hb = 0; hb < 2; ++hb) {
          const int j = 2 * jj + hb, v = ws_value_of<kHp>(half, j, 0) - 2 * kHalfRows * half;
#pragma unroll
          for (int b = 0; b < 2; ++b) {
            const float wv = kRegs ? wt[kRegs ? half : 0][j][b] : (hb ? (b ? w4.w : w4.z) : (b ? w4.y : w4.x));
            s[v][b % kChains] = fmaf(wv, fmaxf(acc[j][b], 0.0f), s[v][b % kChains]);
            s[v + 1][b % kChains] = fmaf(wv, fmaxf(acc[j][2 + b], 0.0f), s[v + 1][b % kChains]);
          }
        }
      }
#pragma unroll
      for (int v = 0; v < 2 * kHalfRows; ++v)
        vals[2 * kHalfRows * half + v] = kChains == 2 ? s[v][0] + s[v][kChains - 1] : s[v][0];
    };
    int stage = 0, estage = 0;
    uint32_t phase = 0, ephase = 0;
    for (int32_t k = walk.first(0); k != INT_MAX; k = walk.advance(k)) {
      mbarrier::wait(key_full(stage), phase);
      const uint8_t* tile = keys + stage * L::key_stage_bytes + slice * kTileBytes;
      float first[8][4], second[8][4];
      issue_product<64>(first, tile, q_half0);
      issue_product<64>(second, tile, q_half1);
      wgmma::wait<1>();
      wgmma::fence_operand(first);
      sum_half(first, 0);
      wgmma::wait<0>();
      wgmma::fence_operand(second);
      sum_half(second, 1);
      mbarrier::wait(epi_empty(estage), ephase ^ 1);
      float* dst = my_slots + estage * (L::epi_stage_bytes / 4);
#pragma unroll
      for (int pl = 0; pl < kPlanes; ++pl)
        *reinterpret_cast<float4*>(dst + pl * (L::plane_bytes / 4)) =
            make_float4(vals[4 * pl], vals[4 * pl + 1], vals[4 * pl + 2], vals[4 * pl + 3]);
      mbarrier::arrive(epi_full(estage));
      if (++stage == kWsKeyStages) stage = 0, phase ^= 1;
      if (++estage == kWsEpilogueStages) estage = 0, ephase ^= 1;
    }
  }
#endif
}

// Launches the kernel for heads padded to kHp (32 or 64); `keys_map` is the key buffer's tensor
// map (2-D, UINT8, dims {128, num_keys}, box {128, kWsBlockKeys}, 128-byte swizzle). False,
// launching nothing, when the compiled kernel's register count does not allow its setmaxnreg
// split (the caller then runs the two-warpgroup kernel).
template <int kHp>
bool launch_ws(const Params& p, const CUtensorMap& keys_map, dim3 grid, cudaStream_t stream);

}  // namespace nvfp4mla::cuda::indexer_kernels

#ifdef NVFP4MLA_INDEXER_WS_INSTANTIATE
#include <mutex>

#include "device/cuda_check.h"
#include "device/per_device.h"

namespace nvfp4mla::cuda::indexer_kernels {

template <int kHp>
bool launch_ws(const Params& p, const CUtensorMap& keys_map, dim3 grid, cudaStream_t stream) {
  constexpr int bytes = WsLayout<kHp>::bytes;
  static PerDevice<bool> usable_on;
  const bool usable = usable_on.get([] {
    check(cudaFuncSetAttribute(indexer_logits_ws_kernel<kHp>, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes),
          "indexer logits (warp-specialized): shared memory attribute");
    // setmaxnreg.inc waits for registers that the epilogue's dec must have freed: launched with
    // fewer than kWsLaunchRegs each, the math warpgroups would wait forever.
    cudaFuncAttributes attr{};
    check(cudaFuncGetAttributes(&attr, indexer_logits_ws_kernel<kHp>), "indexer logits (warp-specialized): attributes");
    return attr.numRegs == kWsLaunchRegs;
  });
  if (!usable) return false;
  indexer_logits_ws_kernel<kHp><<<grid, kWsThreads, bytes, stream>>>(p, keys_map);
  check_launch("indexer logits (warp-specialized) kernel launch");
  return true;
}

}  // namespace nvfp4mla::cuda::indexer_kernels
#endif
