#pragma once
// DecodeKernel::sm90_ws, sm90_ws_wide, sm90_ws_pair, sm90_ws_pair_wide: warp-specialized decode
// for 64-head groups (sm_90a: wgmma, setmaxnreg, clusters).
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
// ahead; or, for NVFP4 and FP8 records, 64-entry K buffers (the softmax, barrier and hand-off
// chain of the scores warpgroup runs once per 64 entries, and the score MMAs are m64n64k16,
// whose shared-memory reads balance the tensor rate where n32 reads 1.5x what the shared memory
// delivers). Q and two 64-entry K buffers fill the shared memory, so those producers load their
// records straight into registers, one step ahead (FlashMLA's FP8 kernel does the same). BF16
// records (what the staged extend attends over) are K rows already: a single CTA's cp.async
// copies them into K buffers laid out as 128-byte swizzled rows, eight lanes per 128-byte line of
// a record (the core-matrix layout would take a 16-byte piece of each of eight records).
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <mutex>
#include <string>

#include "device/cuda_check.h"
#include "device/per_device.h"
#include "device/tensor_map.cuh"
#include "ops/sparse_mla/decode/common/decode_common.cuh"
#include "ops/sparse_mla/decode/common/merge.cuh"
#include "ops/sparse_mla/decode/common/step_trace.cuh"
#include "ops/sparse_mla/decode/kernel_shapes.h"
#include "ops/sparse_mla/decode/sm90/cluster.cuh"
#include "ops/sparse_mla/kv_tile.cuh"
#include "ops/sparse_mla/mma_sm80.cuh"
#include "ops/sparse_mla/wgmma_sm90.cuh"

namespace nvfp4mla::cuda {
namespace {

constexpr int kWsTile = 32, kWsWideTile = 64, kWsHeads = 64, kWsConsumers = 256, kWsProducers = 256,
              kWsThreads = kWsConsumers + kWsProducers;
// setmaxnreg budgets (65536 registers for 512 threads): scores warpgroup, output warpgroup, each
// producer warpgroup. (A third producer warpgroup does not fit: with 640 threads the launch
// leaves 96 registers per thread to redistribute, and setmaxnreg.inc beyond the pool never returns.)
// Wide tiles, pairs: 176 / 224 / 56, the 56-register producers holding one entry's slices (160 /
// 224 / 64 measured 3% slower at 256 x 128); a single CTA (two entries per producer thread): 160 /
// 224 / 64 (176 / 224 / 56 spilled 64 bytes).
// The wide NVFP4 and FP8 instantiations neither spill nor have a stack frame (ptxas -v); with the
// in-kernel merge the bf16 and 32-entry ones spill 16-32 bytes (the staged extend, bf16, measured
// the same time with and without it).
// The output dims are split between the two consumers: [0, scores_dims) accumulate in the scores
// warpgroup, the rest in the output warpgroup. Wide tiles give the scores warpgroup (whose chain
// sets the pace, and which holds 64-entry score accumulators) a quarter of them.
template <int kTile, bool kPair>
struct WsRoles {
  static constexpr bool wide = kTile == kWsWideTile, two_entries = wide && !kPair;
  static constexpr int scores_dims = wide ? 128 : 256, output_dims = kLatentDim - scores_dims;
  static constexpr int scores = two_entries ? 160 : wide ? 176 : 216, output = wide ? 224 : 168,
                       producer = two_entries ? 64 : wide ? 56 : 64;
  static_assert(scores + output + 2 * producer == 65536 / 128);
  static_assert(scores_dims % 128 == 0 && output_dims % 128 == 0, "n128 output MMAs");
};
constexpr int kBarProducer = 1, kBarConsumers = 2, kBarQ = 3, kBarOutputWg = 4, kBarScoresWg = 5;
static_assert(kWsTile == decode::kPlannerTile && kWsTile == decode::kWsTile && kWsWideTile == decode::kWsWideTile &&
                  kWsHeads == decode::kWsHeads && kWsThreads == 32 * decode::kWsWarps,
              "the planner's shape of this kernel (kernel_shapes.h)");

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
  static constexpr bool wide = kTile == kWsWideTile;  // no raw record stages in shared memory
  static constexpr bool copies_records = wide && decode::ws_wide_copies(F::spec);  // cp.async into the K buffers
  static constexpr bool register_records = wide && !copies_records;
  static_assert(!(copies_records && kPair), "bf16 records: single CTAs only (decode_kernel_unsupported)");
  // Copied records' K buffers: 128-byte swizzled rows, one 64-dim segment of all kTile entries
  // after another; an atom of 8 rows is 1024 bytes.
  static constexpr uint32_t segment_bytes = uint32_t(kTile) * 128, atom_bytes = 8 * 128;
  // Full-barrier arrivals per use: every producer thread; with copied records each thread's
  // copies arrive (noinc) and one thread per entry arrives again after writing its mask.
  static constexpr int mask_writers = kWsProducers / 8;  // copied records: one thread per 8-lane group
  static constexpr uint32_t full_arrivals = kWsProducers + (copies_records ? mask_writers : 0);
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
  static constexpr int stages = wide                                   ? 0
                                : bytes_for(4) <= decode::kSmemBudgetPerBlock   ? 4
                                : bytes_for(3) <= decode::kSmemBudgetPerBlock ? 3
                                : bytes_for(2) <= decode::kSmemBudgetPerBlock ? 2
                                                                      : 1;
  static constexpr size_t idx_off = raw_off + stages * raw_stage_bytes, total = bytes_for(stages);
  static_assert(total <= decode::kSmemBudgetPerBlock && bar_off % 8 == 0 && raw_off % 16 == 0);
  static_assert(stages == decode::ws_stages(F::kRecordBytes, kPair, kTile) &&
                    total == decode::ws_smem_bytes(F::kRecordBytes, kPair, kTile, stages),
                "the planner's bytes (kernel_shapes.h)");
};

// Walking rows: TMA maps of q (the rows' Q loads) and out (the staged outputs' stores); the other
// launches pass empty ones.
struct WalkMaps {
  CUtensorMap q, out;
};

// kRowWalk (DecodePlan::row_ctas; bf16 records, one split): CTA y of a head group attends rows
// y, y + gridDim.y, ... < p.rows. Its steps run on across rows: the producers' K-buffer ring and
// the consumers' P hand-off continue from one row's last step to the next row's first, so the
// next row's first records are copied while this one ends. Q's buffer takes the next row's Q as
// soon as the last score MMAs of a row are done (the producers copy it while the scores
// warpgroup runs the row's last softmax), and a row's outputs are staged in its last step's K
// buffer instead (stage_row_outputs, send_row_boxes below).
template <class F, bool kPair, int kTile, bool kRowWalk = false>
__global__ void __launch_bounds__(kWsThreads, 1) sparse_decode_ws_kernel(const DecodeParams p, const __grid_constant__ WalkMaps maps) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  using Smem = WsSmem<F, kPair, kTile>;
  static_assert(!kRowWalk || (Smem::copies_records && !kPair), "rows are walked over copied records by single CTAs");
  using Roles = WsRoles<kTile, kPair>;
  StepTrace::cta_begin();
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
  // A K buffer's release: one lane per consumer warp of each CTA, counting for its warp's 32
  // threads when rows are walked, where every consumer thread arrives for itself on a row's last
  // step (it wrote outputs into the buffer: release_staged_k_tile).
  constexpr uint32_t kEmptyArrivals = kRowWalk ? kWsConsumers : 8 * kCtas;
  // Walking rows (single CTAs: no remote-full barriers in use), those two hand Q's buffer over:
  // q_full completes when a row's Q has landed, q_empty when the row's last score MMAs are done.
  const uint32_t q_full_bar = remote_full_bar(0), q_empty_bar = remote_full_bar(1);

  // Single CTAs take the decode grid (decode_grid); a pair's two head groups are a cluster along y.
  const CtaWork work = kPair ? CtaWork{static_cast<int>(blockIdx.x), static_cast<int>(blockIdx.y) * kWsHeads, static_cast<int>(blockIdx.z)}
                             : cta_work(kWsHeads);
  const int row = work.row, head0 = work.head0, split = work.split;
  const int grid_rows = kPair ? gridDim.x : gridDim.y;
  // The merge runs after every CTA's loops: Q's buffer is free then, and so it is for staging
  // the final outputs (one split: never both).
  float* merge_scratch = reinterpret_cast<float*>(smem);
  uint8_t* output_stage = smem;
  static_assert(kWsHeads * kOutputStageRowBytes <= Smem::k_off, "the output stage fits Q's buffer");
  const int heads_here = min(kWsHeads, p.heads - head0);
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const uint32_t peer = kPair ? cluster::rank() ^ 1u : 0u;
  const int len = row_length(p, row);
  // Steps of kTile entries over this split's planner tiles; a wide step may reach past the
  // split's last tile, whose entries are masked like those past the row's length.
  const int tile_begin = split * p.tiles_per_split;
  const int tile_end = min(p.num_tiles, tile_begin + p.tiles_per_split);
  const int num_steps = (tile_end - tile_begin + kStepTiles - 1) / kStepTiles;
  // The CTA's rows (one unless kRowWalk): row_at(k) for k < cta_rows; its steps, one row's after
  // another, are numbered 0 .. total_steps - 1 (gs below).
  const int cta_rows = kRowWalk ? (row < p.rows ? (p.rows - 1 - row) / static_cast<int>(gridDim.y) + 1 : 0) : 1;
  const int total_steps = cta_rows * num_steps;
  auto row_at = [&](int k) { return kRowWalk ? row + k * static_cast<int>(gridDim.y) : row; };
  // Profiling builds record steps from here on: walking rows, the last 8 of the CTA's first row
  // and the start of its second.
  const int trace_first_step = kRowWalk && cta_rows > 1 ? max(num_steps - 8, 0) : 0;
  auto k_buf = [&](int b) { return sK + b * (Smem::k_buf_bytes / 2); };
  const bool dequant = !(kStageSkip & 1);

  const int ptid = tid - kWsConsumers;  // producer thread index (negative in consumers)
  if (tid == 0) {
    for (int b = 0; b < kWsKBufs; ++b) {
      mbarrier::init(full_bar(b), Smem::full_arrivals);  // this CTA's producers
      // This CTA's expect-tx arrival (+ the peer's bytes); walking rows, Q's hand-over: the Q
      // loader's expect-tx arrival (q_full) or every thread of the scores warpgroup (q_empty).
      mbarrier::init(remote_full_bar(b), !kRowWalk || b == 0 ? 1 : 128);
      mbarrier::init(empty_bar(b), kEmptyArrivals);
    }
    mbarrier::init(p_full_bar, 128);  // every thread of the scores warpgroup
    mbarrier::init(p_empty_bar, 128);  // every thread of the output warpgroup
    mbarrier::fence_init();
  }
  if constexpr (kPair) cluster::sync();  // the peer's barriers exist before anything arrives on them
  else __syncthreads();

  // The role must be visibly warp-uniform for ptxas to compile each branch under its
  // setmaxnreg budget (the consumers' 128 accumulators do not fit the 128-register entry cap).
  const int warpgroup = __shfl_sync(0xFFFFFFFFu, tid / 128, 0);
  if (warpgroup >= kWsConsumers / 128) {
    // ---- producer warpgroups ----
    NVFP4MLA_SETMAXNREG(dec, Roles::producer);
    const bool copies = !(kStageSkip & 8) && !((kStageSkip & 2048) && head0 != 0), peer_values = !(kStageSkip & 64);
    const int tok0 = kPair ? kTokens * static_cast<int>(peer ^ 1u) : 0;  // this CTA's entries of each tile
    // Trace marks (profiling builds): 0 buffer wait begins, 1 buffer free, 2 buffer published.
    StepTrace trace(0, ptid == 0, row, grid_rows, head0 == 0 && split == 0);
    if constexpr (kRowWalk) trace.first_step = trace_first_step;
    // The start of buffer b's use: its consumers (both CTAs') have left it; a pair's CTA then
    // expects the peer's half of the tile on its remote-full barrier.
    auto acquire_buffer = [&](int i, int b) {
      const int use = i / kWsKBufs;
      trace.mark(i, 0);
      if (use > 0) mbarrier::wait(empty_bar(b), (use - 1) & 1);
      trace.mark(i, 1);
      if constexpr (kPair)
        if (ptid == 0) mbarrier::arrive_expect_tx(remote_full_bar(b), dequant && peer_values ? Smem::peer_bytes : Smem::peer_mask_bytes);
    };
    // 16 dequantized values of entry t at dims [d, d + 16) (two core-matrix rows) into this CTA's
    // K buffer and, for pairs, the peer's.
    auto store_values = [&](__nv_bfloat16* kt, uint32_t kt_peer, uint32_t peer_full, int t, int d, uint4 lo, uint4 hi) {
      const int o_lo = core_offset<kTile>(t, d), o_hi = core_offset<kTile>(t, d + 8);
      store_16_words(Dst16{kt + o_lo, kt + o_hi}, lo, hi);
      if constexpr (kPair) if (peer_values) {
        cluster::store_async(kt_peer + 2 * o_lo, lo, peer_full);
        cluster::store_async(kt_peer + 2 * o_hi, hi, peer_full);
      }
    };
    // Tile published: masks written, stores visible to the tensor cores.
    auto publish_buffer = [&](int b) {
      wgmma::fence_proxy_async_smem();  // the tensor cores read these buffers next
      mbarrier::arrive(full_bar(b));
    };
    if constexpr (Smem::copies_records) {
      // BF16 records are K rows already: cp.async copies them straight into the K buffer (no
      // registers, no dequantization), laid out as 128-byte swizzled rows: segment s (dims
      // [64s, 64s + 64)) of entry t is the 128-byte row at s * kSegBytes + 128 t, its 16-byte chunk
      // j stored at chunk j ^ (t % 8). Eight lanes copy one whole line (a segment of one entry),
      // so a warp instruction reads four lines and writes four conflict-free rows. A thread copies
      // the segments of entries t0 and t0 + 32; the first lane of each group writes their masks. The
      // copies arrive on the full barrier when they land; the consumers fence the async proxy after
      // their wait. No L2 prefetch of the next step's records: it slows every bf16 case.
      constexpr int kSegments = kQkDim / 64, kSegBytes = Smem::segment_bytes, kEntries = kTokens / 32;
      static_assert(kWsProducers / 8 * kEntries == kTokens && F::kRecordBytes == kQkDim * 2);
      const int j = lane % 8, t0 = 4 * (ptid / 32) + lane / 8;
      const bool group_leader = j == 0;
      // Step gs of the CTA: its row, the step within the row, the row's length within the split
      // (past the last step: none, so nothing is read).
      struct Step {
        int row, i, len;
      };
      const int len_here = min(len, tile_end * kWsTile);
      auto step_of = [&](int gs) {
        if constexpr (kRowWalk) {
          if (gs >= total_steps) return Step{0, 0, 0};
          const int k = gs / num_steps, r = row_at(k);
          return Step{r, gs - k * num_steps, min(row_length(p, r), tile_end * kWsTile)};
        } else {
          return Step{row, gs, gs < num_steps ? len_here : 0};
        }
      };
      auto pos_of = [&](const Step& s, int e) { return (tile_begin + s.i * kStepTiles) * kWsTile + t0 + 32 * e; };
      auto load_index = [&](const Step& s, int e) {
        return pos_of(s, e) < s.len ? __ldg(p.indices + static_cast<int64_t>(s.row) * p.topk + pos_of(s, e)) : -1;
      };
      auto slot_at = [&](const Step& s, int e, int32_t idx) { return s.len > 0 ? slot_of_index(p, s.len, pos_of(s, e), idx) : -1; };
      auto record_of = [&](int32_t slot) { return p.cache + static_cast<int64_t>(slot < 0 ? 0 : slot) * F::kRecordBytes; };
      // Walking rows, the first producer thread loads each row's Q by TMA (nine 64-dim boxes of the
      // CTA's 64 heads, in the K buffers' swizzled layout; evicted from L2 first, as it is read
      // once): the first row's before any record, row k's once the scores warpgroup's last score
      // MMAs of row k - 1 are done, before the buffer of row k's second step (its first when rows
      // have one step). The boxes complete q_full's phase k. (By TMA, Q's loads do not queue
      // behind the producers' record copies in the load pipes.)
      auto issue_q = [&](int k) {
        if (ptid != 0) return;
        if (k > 0) mbarrier::wait(q_empty_bar, (k - 1) & 1);
        mbarrier::arrive_expect_tx(q_full_bar, (kStageSkip & 512) ? 0 : kQkDim * kWsHeads * 2);
        if constexpr (!(kStageSkip & 512))
          for (int s = 0; s < kQkDim / 64; ++s)
            tma::load_3d(ptx::smem_addr(sQ) + s * Smem::segment_bytes, &maps.q, 64 * s, head0, row_at(k), q_full_bar,
                         tma::l2_evict_first_policy());
      };
      const int q_step_in_row = num_steps > 1 ? 1 : 0;
      if constexpr (kRowWalk)
        if (total_steps > 0) issue_q(0);
      int32_t slot[kEntries], slot_next[kEntries];
      {
        const Step s0 = step_of(0), s1 = step_of(1);
#pragma unroll
        for (int e = 0; e < kEntries; ++e) {
          slot[e] = slot_at(s0, e, load_index(s0, e));
          slot_next[e] = slot_at(s1, e, load_index(s1, e));
        }
      }
      for (int i = 0; i < total_steps; ++i) {
        const int b = i % kWsKBufs;
        const Step after = step_of(i + 2);
        int32_t idx_after[kEntries];
#pragma unroll
        for (int e = 0; e < kEntries; ++e) idx_after[e] = load_index(after, e);
        if constexpr (kRowWalk) {
          const int k = i / num_steps;
          if (k > 0 && i - k * num_steps == q_step_in_row) issue_q(k);
        }
        acquire_buffer(i, b);
        if (copies) {
          uint8_t* kt = reinterpret_cast<uint8_t*>(k_buf(b));
#pragma unroll
          for (int e = 0; e < kEntries; ++e) {
            const int t = t0 + 32 * e;
            const uint8_t* src = record_of(slot[e]) + 16 * j;
            uint8_t* dst = kt + 128 * t + 16 * (j ^ (t % 8));
#pragma unroll
            for (int sg = 0; sg < kSegments; ++sg)
              ptx::cp_async_16_zfill(dst + sg * kSegBytes, src + 128 * sg, slot[e] < 0 ? 0 : 16);
          }
        }
        mbarrier::arrive_on_async_copies(full_bar(b));
        if (group_leader) {
#pragma unroll
          for (int e = 0; e < kEntries; ++e) sMask[b * kTile + t0 + 32 * e] = slot[e] >= 0 ? 0.0f : -INFINITY;
          mbarrier::arrive(full_bar(b));
        }
        trace.mark(i, 2);
#pragma unroll
        for (int e = 0; e < kEntries; ++e) {
          slot[e] = slot_next[e];
          slot_next[e] = slot_at(after, e, idx_after[e]);
        }
      }
      ptx::cp_async_wait_all();  // nothing of this thread's is in flight when it exits
    } else if constexpr (Smem::register_records) {
      // Eight threads per entry, records loaded into registers ahead of their dequantization; no
      // producer barrier at all. A warp takes 8 entries x 4 consecutive eighths: each load
      // instruction reads whole sectors of 8 records (not one field of 32), and each 16-byte store
      // fills four whole core-matrix rows (no bank conflicts). A pair's CTA gathers 32 entries a
      // step (one per thread), a single CTA all 64 (two per thread, 32 apart).
      using Slice = RecordSlice<F>;
      constexpr int kEntries = kTokens / 32;  // entries per producer thread and step
      static_assert(kWsProducers * kEntries == Slice::kParts * kTokens && Slice::kParts == 8 && kEntries <= 2);
      const int pw = ptid / 32, tl = 8 * (pw % 4) + lane % 8, part = 4 * (pw / 4) + lane / 8;
      auto entry = [&](int e) { return tok0 + tl + 32 * e; };
      const int len_here = min(len, tile_end * kWsTile);
      const int32_t* row_indices = p.indices + static_cast<int64_t>(row) * p.topk;
      auto pos_of = [&](int i, int e) { return (tile_begin + i * kStepTiles) * kWsTile + entry(e); };  // entry e in step i
      // Raw index of this thread's entry e in step i (-1 past the split or the row: never read there).
      auto load_index = [&](int i, int e) {
        const int pos = pos_of(i, e);
        return pos < len_here ? __ldg(row_indices + pos) : -1;
      };
      // Loads step i's slice of entry e; returns whether the entry is valid.
      auto load_slice = [&](int i, int e, int32_t idx, Slice& x) {
        const int32_t slot = slot_of_index(p, len_here, pos_of(i, e), idx);
        load_record_slice(p.cache + static_cast<int64_t>(slot < 0 ? 0 : slot) * F::kRecordBytes, part, slot >= 0 && copies, x);
        return slot >= 0;
      };
      // Two slices of one entry in flight fit the pair's 56-register producers for NVFP4 records
      // (64-byte slices), not for FP8 (96 bytes: ptxas spilled 24 bytes with 64-register
      // producers, and no split leaves them 72 without spilling in a consumer); those keep one
      // slice per entry, as single CTAs do.
      constexpr bool kStepAhead = kEntries == 1 && sizeof(Slice) <= 64;
      // Dequantizes a slice into buffer b (both CTAs' for pairs); the entry's mask goes from the
      // part-0 thread into the mask arrays. With slices a step ahead, latent group 0's scale was
      // decoded earlier (first_group_scale; the step-ahead loop says why).
      auto store_slice = [&](int b, int t, bool valid, const Slice& x, float first_group_scale = 0.0f) {
        __nv_bfloat16* kt = k_buf(b);
        const uint32_t kt_peer = kPair ? cluster::map_to_rank(ptx::smem_addr(kt), peer) : 0u;
        const uint32_t peer_full = kPair ? cluster::map_to_rank(remote_full_bar(b), peer) : 0u;
        if (dequant) {
          const float latent_scale = slice_latent_scale(x, p.layer_scale);
#pragma unroll
          for (int j = 0; j < Slice::kGroups; ++j) {
            const Words16 w = [&] {
              if constexpr (kStepAhead) return slice_group_words(x, j, latent_scale, j == 0 ? first_group_scale : slice_group_scale(x, j));
              else return slice_group_words(x, j, latent_scale);
            }();
            store_values(kt, kt_peer, peer_full, t, 16 * (Slice::kGroups * part + j), w.lo, w.hi);
          }
          // The eight RoPE values: one core-matrix row; a pair of threads' halves make the 16.
          const uint4 r = slice_rope_words(x);
          const int o_r = core_offset<kTile>(t, kLatentDim + Slice::kRopeValues * part);
          *reinterpret_cast<uint4*>(kt + o_r) = r;
          if constexpr (kPair) if (peer_values) cluster::store_async(kt_peer + 2 * o_r, r, peer_full);
        }
        if (part == 0) {
          const float m = valid ? 0.0f : -INFINITY;
          float* mask = sMask + b * kTile + t;
          *mask = m;
          if constexpr (kPair) cluster::store_async(cluster::map_to_rank(ptx::smem_addr(mask), peer), __float_as_uint(m), peer_full);
        }
      };
      // NVFP4 slices are reloaded only after the step's dequantization has used every set it
      // reads: loads issued before the dequantization of data loaded earlier can share ptxas's
      // scoreboards with it, and the first use of the old data then waits for the new loads too.
      // FP8 slices (single CTAs) measured faster reloaded entry by entry, right after each is used.
      constexpr bool kReloadEachEntry = F::spec.dtype == CacheDtype::fp8_ds_mla;
      if constexpr (kStepAhead) {
        // One entry a step: two register sets, alternating, each reloaded for the step after
        // next once it has been dequantized (a whole step ahead of its use). ptxas tracks every
        // global load of these producers on one scoreboard, so the first read of a set waits for
        // every load issued before it: each set's first read (its group-0 scale) comes before the
        // other set's reload, when only its own loads, a step old, are in flight. (Read after the
        // reload, it waited a full memory latency every other step: ncu, 27% of the producers'
        // samples.) Every set is loaded before the loop, zeros past the split, so the read never
        // touches unloaded registers.
        Slice xs[2];
        bool valid[2];
        float first_scale[2];
        valid[0] = load_slice(0, 0, load_index(0, 0), xs[0]);
        first_scale[0] = slice_group_scale(xs[0], 0);
        valid[1] = load_slice(1, 0, load_index(1, 0), xs[1]);  // zeros past the split: read below even then
        int32_t idx_after = load_index(2, 0);
        auto step = [&](int i, int set) {
          const int b = i % kWsKBufs;
          acquire_buffer(i, b);
          store_slice(b, entry(0), valid[set], xs[set], first_scale[set]);
          publish_buffer(b);
          trace.mark(i, 2);
        };
        // After step i: the other set's first read, then this set's reload for step i + 2.
        auto read_other_and_reload = [&](int i, int set) {
          first_scale[set ^ 1] = slice_group_scale(xs[set ^ 1], 0);
          if (i + 2 < num_steps) {
            valid[set] = load_slice(i + 2, 0, idx_after, xs[set]);
            idx_after = load_index(i + 3, 0);
          }
        };
        // The loop starts at a first read: ptxas makes the first read of loaded data after a loop
        // head wait for every load in flight, so the head must not follow a reload.
        if (num_steps > 0) step(0, 0);
        for (int i = 0; i + 1 < num_steps; i += 2) {
          read_other_and_reload(i, 0);
          step(i + 1, 1);
          read_other_and_reload(i + 1, 1);
          if (i + 2 < num_steps) step(i + 2, 0);
        }
      } else {
        // Up to two entries a step in one register set each (four would not fit the producers'
        // budget), reloaded for the next step once dequantized, so the loads overlap the next
        // buffer wait.
        Slice xs[kEntries];
        bool valid[kEntries];
        int32_t idx_next[kEntries];
#pragma unroll
        for (int e = 0; e < kEntries; ++e) {
          valid[e] = load_slice(0, e, load_index(0, e), xs[e]);
          idx_next[e] = load_index(1, e);
        }
        auto reload = [&](int i, int e) {
          if (i + 1 < num_steps) {
            valid[e] = load_slice(i + 1, e, idx_next[e], xs[e]);
            idx_next[e] = load_index(i + 2, e);
          }
        };
        for (int i = 0; i < num_steps; ++i) {
          const int b = i % kWsKBufs;
          acquire_buffer(i, b);
#pragma unroll
          for (int e = 0; e < kEntries; ++e) {
            store_slice(b, entry(e), valid[e], xs[e]);
            if constexpr (kReloadEachEntry) reload(i, e);
          }
          publish_buffer(b);
          trace.mark(i, 2);
          if constexpr (!kReloadEachEntry)
#pragma unroll
            for (int e = 0; e < kEntries; ++e) reload(i, e);
        }
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
        trace.mark(i, 2);
        ptx::named_barrier_sync(kBarProducer, kWsProducers);  // all reads of this raw stage are done
        issue_group(tile + kStages);
      }
    }
    trace.finish(total_steps);
    if (p.merge_in_kernel) grid_barrier();  // the consumers merge
  } else {
  // ---- consumer warpgroups ----
  const int hb = warp & 3, g = lane >> 2, t4 = lane & 3;
  // Q is loaded by the consumer warpgroup with the larger register budget (after its setmaxnreg)
  // while the producers gather the first records: the CTA's start waits for the longer of the
  // two, not for both in turn. The other consumer waits for it at the same named barrier.
  // (Walking rows, the producers load every row's Q by TMA: issue_q.)
  constexpr int kQLoader = Roles::output > Roles::scores ? 1 : 0;
  // Every 16-byte piece of Q goes out by cp.async before any is waited for (zero-filled past the
  // row's heads): the CTA's start pays one memory latency for Q, not one per piece. A warp copies
  // two neighbouring pieces (one 32-byte sector) of each of 16 heads: 16 consecutive core-matrix
  // rows per piece, so its shared-memory writes are conflict-free (32 pieces of one head would
  // all fall in the same four banks, 1 KB apart).
  auto load_q = [&] {
    constexpr int q_chunks = kQkDim / 8;
    static_assert(q_chunks % 2 == 0 && kWsHeads == 64);
    const uint16_t* q_rows = p.q + (static_cast<int64_t>(row) * p.heads + head0) * kQkDim;
    if constexpr (!(kStageSkip & 512)) {  // profiling: Q left unloaded
      for (int c = tid - 128 * kQLoader; c < kWsHeads * q_chunks; c += 128) {
        const int h = (c >> 1) & (kWsHeads - 1), ch = 2 * (c >> 7) + (c & 1);
        const bool here = h < heads_here;
        ptx::cp_async_16_zfill(sQ + core_offset<kWsHeads>(h, 8 * ch), q_rows + (here ? h : 0) * kQkDim + 8 * ch, here ? 16 : 0);
      }
    }
    ptx::cp_async_commit();
    ptx::cp_async_wait_all();
    wgmma::fence_proxy_async_smem();
    ptx::named_barrier_sync_unaligned(kBarQ, kWsConsumers);
  };
  // Walking rows, a row's outputs are staged in its last step's K buffer (Q's buffer holds the
  // next row's Q by then) as TMA store boxes of 64 heads x 64 dims in the buffer's own segments:
  // the scores warpgroup's dims [0, 128) in segments 0-1, which only its own MMAs read, once its
  // last output MMAs are done; the output warpgroup's dims [128, 512) in segments 2-7 after its
  // own. Each warpgroup sends its boxes by TMA (rows past the heads are not written) and leaves.
  static_assert(!kRowWalk || (Roles::scores_dims == 128 && Smem::segment_bytes == kWsHeads * 128 &&
                              8 * Smem::segment_bytes <= Smem::k_buf_bytes),
                "the staged boxes are K-buffer segments of 64 heads x 128 bytes");
  // This thread's normalized outputs (heads hb*16 + g and + 8, dims [dim0, dim0 + 8 NT_O)) into
  // the boxes at `stage`: head h's 16-byte chunk j of segment s at s * 8 KB + 128 h + 16 (j ^ h % 8),
  // so a warp's 32 stores fall in 32 banks.
  auto stage_row_outputs = [&](uint8_t* stage, const RowTotals& tot, const auto& o, int dim0) {
    constexpr int NT_O = sizeof(o) / sizeof(o[0]);
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int h = hb * 16 + g + 8 * r;
#pragma unroll
      for (int n = 0; n < NT_O; ++n) {
        const int d = dim0 + 8 * n;
        *reinterpret_cast<uint32_t*>(stage + (d / 64) * Smem::segment_bytes + 128 * h + 16 * (((d % 64) / 8) ^ (h & 7)) + 4 * t4) =
            ptx::pack_bf16x2(o[n][2 * r] * tot.inv[r], o[n][2 * r + 1] * tot.inv[r]);
      }
    }
  };
  // Segments [s0, s1) of the staged boxes to row r's outputs, by one thread, waited for until read.
  // The outputs, like each row's Q, are evicted from L2 first: they leave the staged records there
  // (each read ~128 times in a prefill chunk; docs/PERF.md).
  auto send_row_boxes = [&](const uint8_t* stage, int s0, int s1, int r) {
    if constexpr (!(kStageSkip & 1024)) {  // profiling: outputs left unstored
      const uint64_t evict_first = tma::l2_evict_first_policy();
      for (int s = s0; s < s1; ++s)
        tma::store_3d(&maps.out, 64 * s, head0, r, ptx::smem_addr(stage + s * Smem::segment_bytes), evict_first);
      ptx::bulk_commit_and_wait_read();
    }
  };
  constexpr int NT = kTile / 8;       // score column blocks per tile
  // Output accumulators: each branch declares and zeroes its own after setmaxnreg (registers
  // shared across the branches would tie the two wgmma pipelines).
  // Byte strides of the core-matrix tiles: next 8 dims (a dim block), next 8 rows.
  constexpr uint32_t kQDimBlock = kWsHeads * 16, kKDimBlock = kTile * 16, kEight = 128;
  // Descriptors are built once; each MMA advances them by a compile-time byte offset. V from
  // dim d0 on is a K buffer read transposed (tokens are the k dim); 128-dim chunks lie
  // kVChunk apart. (Buffer b's descriptors are buffer 0's advanced by b buffers: one add per tile.)
  constexpr uint32_t kKBufBytes = Smem::k_buf_bytes, kVChunk = 16 * kKDimBlock;
  // Copied records lie in 128-byte swizzled rows (producer comment): segments of 64 dims kSegBytes
  // apart, 8-entry groups 1024 bytes apart. The K buffer's byte offset of k-step kk's 16 dims
  // (score MMAs) and of 16 entries (output MMAs) in either layout:
  constexpr bool kSwizzled = Smem::copies_records;
  constexpr uint32_t kSegBytes = Smem::segment_bytes, kAtom = Smem::atom_bytes;
  auto k_dims_offset = [](int kk) { return kSwizzled ? (kk / 4) * kSegBytes + (kk % 4) * 32 : 2 * kk * kKDimBlock; };
  constexpr uint32_t kV16Entries = kSwizzled ? 2 * kAtom : 16 * 16;
  static_assert(!kSwizzled || (kVChunk == 2 * kSegBytes && Smem::k_off % kAtom == 0 && Smem::k_buf_bytes % kAtom == 0),
                "swizzled K buffers: 128-dim chunks are two segments; atoms 1024-byte aligned");
  auto k_desc_at = [&](uint32_t addr) {
    return kSwizzled ? wgmma::smem_desc_sw128(addr, 16, kAtom) : wgmma::smem_desc(addr, kKDimBlock, kEight);
  };
  auto v_desc = [&](int d0) {
    const uint32_t base = ptx::smem_addr(k_buf(0));
    return kSwizzled ? wgmma::smem_desc_sw128(base + (d0 / 64) * kSegBytes, kSegBytes, kAtom)
                     : wgmma::smem_desc(base + (d0 / 8) * kKDimBlock, kEight, kKDimBlock);
  };
  // The full/remote-full waits of a K buffer's use (the second consumer repeats them: already
  // complete then, they cost a poll and give it the acquire of the producers' writes).
  auto wait_k_tile = [&](int b, int use) {
    mbarrier::wait(full_bar(b), use & 1);
    if constexpr (kPair) mbarrier::wait(remote_full_bar(b), use & 1);
    // Copied records were written by cp.async (generic proxy); the tensor cores read them next.
    if constexpr (Smem::copies_records) wgmma::fence_proxy_async_smem();
  };
  // Done with a K buffer: one lane per warp tells both CTAs' producers.
  auto release_k_tile = [&](int b) {
    __syncwarp();
    if (lane == 0) {
      if constexpr (kRowWalk) mbarrier::arrive(empty_bar(b), 32);
      else mbarrier::arrive(empty_bar(b));
      if constexpr (kPair) cluster::arrive_remote(cluster::map_to_rank(empty_bar(b), peer));
    }
  };
  // Walking rows, a row's last K buffer holds staged outputs: every thread arrives after its own
  // staging stores (the sending thread after its TMA stores' reads). One lane's arrival after the
  // named barriers and __syncwarp orders them as well, but compute-sanitizer's racecheck does not
  // follow that chain and reports the producers' next copies as racing with the stores.
  auto release_staged_k_tile = [&](int b) { mbarrier::arrive(empty_bar(b)); };
  if (warpgroup == 0) {
    // ---- scores warpgroup: S, softmax, P, output dims [0, scores_dims) ----
    NVFP4MLA_SETMAXNREG(inc, Roles::scores);
    // Trace marks (profiling builds), from before Q is in place: 0 K wait begins, 1 K ready,
    // 2 scores done, 3 weights done, 4 P slot free, 5 own output MMAs done.
    StepTrace trace(1, tid == 0, row, grid_rows, head0 == 0 && split == 0);
    if constexpr (kRowWalk) trace.first_step = trace_first_step;
    if constexpr (!kRowWalk) {
      if constexpr (kQLoader == 0) load_q();
      else ptx::named_barrier_sync_unaligned(kBarQ, kWsConsumers);  // Q is in place
    }
    // Walking rows, Q arrives by TMA in the K buffers' layout (128-byte swizzled rows of 64 dims).
    const uint64_t q_desc = kRowWalk ? k_desc_at(ptx::smem_addr(sQ)) : wgmma::smem_desc(ptx::smem_addr(sQ), kQDimBlock, kEight);
    const uint64_t k_desc0 = k_desc_at(ptx::smem_addr(k_buf(0))), v_desc0 = v_desc(0);
    int gs = 0;  // the CTA's step
    for (int k = 0; k < cta_rows; ++k) {
      const int row_k = row_at(k);
      const bool next_row = k + 1 < cta_rows;
      if constexpr (kRowWalk) mbarrier::wait(q_full_bar, k & 1);  // TMA's writes: no proxy fence
      float o[Roles::scores_dims / 8][4];
      zero_blocks(o);
      SoftmaxState st;
      RowTotals tot{};
      for (int i = 0; i < num_steps; ++i, ++gs) {
        const int b = gs % kWsKBufs;
        const bool last_step = i + 1 == num_steps;
        trace.mark(gs, 0);
        wait_k_tile(b, gs / kWsKBufs);
        trace.mark(gs, 1);
        const uint64_t k_desc = wgmma::desc_advance(k_desc0, b * kKBufBytes), vd = wgmma::desc_advance(v_desc0, b * kKBufBytes);
        float acc[NT][4];
        wgmma::fence();
        if (!(kStageSkip & 2))
#pragma unroll
          for (int kk = 0; kk < kQkDim / 16; ++kk)
            wgmma::m64nk16_ss<NT>(acc, wgmma::desc_advance(q_desc, kRowWalk ? k_dims_offset(kk) : 2 * kk * kQDimBlock),
                                  wgmma::desc_advance(k_desc, k_dims_offset(kk)), kk > 0);
        wgmma::commit();
        wgmma::wait<0>();
        trace.mark(gs, 2);
        if constexpr (kRowWalk)
          if (last_step && next_row) mbarrier::arrive(q_empty_bar);  // the next row's Q may land
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
        uint32_t w[NT][2];
        if constexpr (kStageSkip & 128) {  // profiling: unit weights, no softmax
          alpha[0] = alpha[1] = 1.0f;
#pragma unroll
          for (int j = 0; j < NT; ++j) w[j][0] = w[j][1] = 0x3F803F80u;
        } else if constexpr (kStageSkip & 256) {  // profiling: varied weights |s| / 64, no softmax
          alpha[0] = alpha[1] = 1.0f;
#pragma unroll
          for (int j = 0; j < NT; ++j) {
            w[j][0] = ptx::pack_bf16x2(fabsf(s[j][0]) * 0x1p-6f, fabsf(s[j][1]) * 0x1p-6f);
            w[j][1] = ptx::pack_bf16x2(fabsf(s[j][2]) * 0x1p-6f, fabsf(s[j][3]) * 0x1p-6f);
          }
        } else {
          softmax_rescale(s, st, o, m_use, alpha);
          softmax_weights(s, st, m_use, w);
        }
        // P as the A operand of m64nNk16: two column blocks make one m16n8k16 A fragment per warp.
        uint32_t a[NT / 2][4];
#pragma unroll
        for (int kk = 0; kk < NT / 2; ++kk) {
          a[kk][0] = w[2 * kk][0];
          a[kk][1] = w[2 * kk][1];
          a[kk][2] = w[2 * kk + 1][0];
          a[kk][3] = w[2 * kk + 1][1];
        }
        // Hand P and the rescale factors to the output warpgroup once it has read the last ones
        // (walking rows, with a row's last P its normalizers too).
        trace.mark(gs, 3);
        if (gs > 0) mbarrier::wait(p_empty_bar, (gs - 1) & 1);
        trace.mark(gs, 4);
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
        if constexpr (kRowWalk)
          if (last_step) {
            tot = row_totals(st);
            if (t4 == 0) {
              sInv[h0] = tot.inv[0];
              sInv[h0 + 8] = tot.inv[1];
            }
          }
        wgmma::fence_proxy_async_smem();  // P is read by the tensor cores
        mbarrier::arrive(p_full_bar);
        wgmma::fence();
        if (!(kStageSkip & 4))
#pragma unroll
          for (int kk = 0; kk < NT / 2; ++kk)  // tokens 16kk..16kk+15: two 8-row core-matrix groups, 16 bytes a row
            pv_chunks_rs(o, a[kk], wgmma::desc_advance(vd, kk * kV16Entries), kVChunk);
        wgmma::commit();
        wgmma::wait<0>();  // the buffer is read asynchronously: done before it is released
        trace.mark(gs, 5);
        if (!kRowWalk || !last_step) release_k_tile(b);
      }
      if constexpr (kRowWalk) {
        // This warpgroup's dims into the last step's K buffer, sent, and the buffer left.
        const int b = (gs - 1) % kWsKBufs;
        uint8_t* stage = reinterpret_cast<uint8_t*>(k_buf(b));
        stage_row_outputs(stage, tot, o, 0);
        wgmma::fence_proxy_async_smem();  // read by the TMA stores
        ptx::named_barrier_sync(kBarScoresWg, 128);  // every box of this warpgroup is whole
        if (tid == 0) send_row_boxes(stage, 0, Roles::scores_dims / 64, row_k);
        release_staged_k_tile(b);
        store_lse(p, tot, row_k, head0, heads_here, hb, lane);
      } else {
        tot = row_totals(st);
        if (t4 == 0) {
          sInv[hb * 16 + g] = tot.inv[0];
          sInv[hb * 16 + g + 8] = tot.inv[1];
        }
        if (stages_outputs(p)) {
          // Q's buffer is free (the last score MMAs are done); the output warpgroup sends the rows.
          stage_outputs(output_stage, tot, o, hb, 0, lane);
          store_lse(p, tot, row_k, head0, heads_here, hb, lane);
          wgmma::fence_proxy_async_smem();  // read by the bulk copies
          ptx::named_barrier_arrive(kBarConsumers, kWsConsumers);  // sInv and this warpgroup's dims are in place
        } else {
          ptx::named_barrier_sync_unaligned(kBarConsumers, kWsConsumers);  // the normalizers are in sInv
          store_outputs(p, tot, o, row_k, head0, heads_here, hb, 0, true, split, lane);
        }
      }
    }
    // Trace marks after the loop (step total_steps): 0 outputs stored, 1 grid barrier passed, 2 merged.
    trace.mark(total_steps, 0);
    if (p.merge_in_kernel) {
      grid_barrier();
      trace.mark(total_steps, 1);
      merge_share_of_heads<kWsConsumers>(p, row, head0, heads_here, split, merge_scratch, tid, kBarConsumers);
      trace.mark(total_steps, 2);
    }
    trace.finish(total_steps + 1);
  } else {
    // ---- output warpgroup: output dims [scores_dims, 512) with P from shared memory ----
    NVFP4MLA_SETMAXNREG(inc, Roles::output);
    if constexpr (!kRowWalk) {
      if constexpr (kQLoader == 1) load_q();
      else ptx::named_barrier_sync_unaligned(kBarQ, kWsConsumers);
    }
    constexpr uint32_t kPDimBlock = kWsHeads * 16;  // P: next 8 tokens
    const uint64_t p_desc = wgmma::smem_desc(ptx::smem_addr(sP), kPDimBlock, kEight);
    const uint64_t v_desc1 = v_desc(Roles::scores_dims);
    // Trace marks (profiling builds): 0 P wait begins, 1 P ready, 2 K ready, 3 output MMAs done.
    StepTrace trace(2, tid == 128, row, grid_rows, head0 == 0 && split == 0);
    if constexpr (kRowWalk) trace.first_step = trace_first_step;
    int gs = 0;  // the CTA's step
    for (int k = 0; k < cta_rows; ++k) {
      const int row_k = row_at(k);
      float o[Roles::output_dims / 8][4];
      zero_blocks(o);
      RowTotals tot{};
      for (int i = 0; i < num_steps; ++i, ++gs) {
        const int b = gs % kWsKBufs;
        const bool last_step = i + 1 == num_steps;
        trace.mark(gs, 0);
        mbarrier::wait(p_full_bar, gs & 1);
        trace.mark(gs, 1);
        wait_k_tile(b, gs / kWsKBufs);
        trace.mark(gs, 2);
        const uint64_t vd = wgmma::desc_advance(v_desc1, b * kKBufBytes);
        const float alpha[2] = {sAlpha[hb * 16 + g], sAlpha[hb * 16 + g + 8]};
        if constexpr (kRowWalk)
          if (last_step) {  // read before P's slot is handed back: the next row's may follow at once
            tot.inv[0] = sInv[hb * 16 + g];
            tot.inv[1] = sInv[hb * 16 + g + 8];
          }
        wgmma::wait<0>();  // nothing is in flight; without it ptxas serializes every wgmma (C7515)
        rescale_rows(o, alpha);
        wgmma::fence();
        if (!(kStageSkip & 4))
#pragma unroll
          for (int kk = 0; kk < NT / 2; ++kk)
            pv_chunks_ss(o, wgmma::desc_advance(p_desc, 2 * kk * kPDimBlock), wgmma::desc_advance(vd, kk * kV16Entries), kVChunk);
        wgmma::commit();
        wgmma::wait<0>();
        trace.mark(gs, 3);
        // Its reads of sAlpha are done too. Walking rows of a single step, it arrives after the row's
        // end below: the scores warpgroup then starts the next row's P once this one has left.
        if (!kRowWalk || num_steps > 1) mbarrier::arrive(p_empty_bar);
        if (!kRowWalk || !last_step) release_k_tile(b);
      }
      if constexpr (kRowWalk) {
        // Its dims into the last step's K buffer, sent, and the buffer left.
        const int b = (gs - 1) % kWsKBufs;
        uint8_t* stage = reinterpret_cast<uint8_t*>(k_buf(b));
        stage_row_outputs(stage, tot, o, Roles::scores_dims);
        wgmma::fence_proxy_async_smem();  // read by the TMA stores
        ptx::named_barrier_sync(kBarOutputWg, 128);  // every box of this warpgroup is whole
        if (tid == 128) send_row_boxes(stage, Roles::scores_dims / 64, kLatentDim / 64, row_k);
        if (num_steps == 1) mbarrier::arrive(p_empty_bar);
        release_staged_k_tile(b);
      } else {
        ptx::named_barrier_sync_unaligned(kBarConsumers, kWsConsumers);
        tot.inv[0] = sInv[hb * 16 + g];
        tot.inv[1] = sInv[hb * 16 + g + 8];
        tot.lse2[0] = tot.lse2[1] = 0.0f;  // the scores warpgroup writes the LSE
        if (stages_outputs(p)) {
          stage_outputs(output_stage, tot, o, hb, Roles::scores_dims, lane);
          wgmma::fence_proxy_async_smem();
          ptx::named_barrier_sync(kBarOutputWg, 128);  // every staged row is whole
          if (warp == 4 && !(kStageSkip & 1024)) send_staged_outputs(p, output_stage, row_k, head0, heads_here, lane);
        } else {
          store_outputs(p, tot, o, row_k, head0, heads_here, hb, Roles::scores_dims, false, split, lane);
        }
      }
    }
    trace.finish(total_steps);
    if (p.merge_in_kernel) {
      grid_barrier();
      merge_share_of_heads<kWsConsumers>(p, row, head0, heads_here, split, merge_scratch, tid, kBarConsumers);
    }
  }
  }
  // A pair's CTAs write into each other's shared memory until the end: neither exits first.
  if constexpr (kPair) cluster::sync();
  StepTrace::cta_end();
#endif
}

// Clusters of `cfg`'s shape the current device holds at once for `kernel`, asked once per device
// and kernel (`known` is the launching instantiation's own: a pair's 2-CTA clusters and a single
// CTA's fit differently).
template <class Kernel>
int64_t max_active_clusters(PerDevice<int64_t>& known, Kernel kernel, const cudaLaunchConfig_t& cfg) {
  return known.get([&] {
    int n = 0;
    check(cudaOccupancyMaxActiveClusters(&n, kernel, &cfg), "sparse decode: resident clusters");
    return int64_t(n);
  });
}

}  // namespace

template <class F, bool kPair, int kTile>
bool launch_decode_ws(const DecodeParams& plan_params, int rows, int head_groups, cudaStream_t stream) {
  using Smem = WsSmem<F, kPair, kTile>;
  constexpr auto kernel = sparse_decode_ws_kernel<F, kPair, kTile>;
  static PerDevice<bool> opted_in;
  static PerDevice<int64_t> resident_clusters;
  opt_in_shared_memory(opted_in, kernel, static_cast<int>(Smem::total), "sparse decode: shared memory opt-in");
  static_assert(size_t(kWsHeads) * (decode::kMaxMergeInKernelSplits + 2) * 4 <= Smem::k_off, "merge scratch in Q's buffer");
  DecodeParams p = plan_params;
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = kPair ? dim3(rows, head_groups, p.splits) : decode_grid(rows, head_groups, p.splits);
  cfg.blockDim = dim3(kWsThreads);
  cfg.dynamicSmemBytes = Smem::total;
  cfg.stream = stream;
  cudaLaunchAttribute attrs[2]{};
  attrs[0].id = cudaLaunchAttributeClusterDimension;
  attrs[0].val.clusterDim.x = 1;
  attrs[0].val.clusterDim.y = kPair ? 2 : 1;  // the two head groups of a row
  attrs[0].val.clusterDim.z = 1;
  cfg.attrs = attrs;
  cfg.numAttrs = 1;
  if (p.merge_in_kernel) {
    // The planner assumed the grid resident at once from the SM count; the device decides (how its
    // SMs group into clusters). A grid that does not fit runs the merge kernel instead.
    const int64_t clusters = static_cast<int64_t>(rows) * head_groups * p.splits / (kPair ? 2 : 1);
    if (clusters > max_active_clusters(resident_clusters, kernel, cfg)) {
      p.merge_in_kernel = false;
    } else {
      attrs[1].id = cudaLaunchAttributeCooperative;  // grid.sync() before the merge
      attrs[1].val.cooperative = 1;
      cfg.numAttrs = 2;
    }
  }
  clear_step_traces(stream);
  const WalkMaps unused{};
  check(cudaLaunchKernelEx(&cfg, kernel, p, unused), "sparse decode (warp-specialized) kernel launch");
  print_step_traces(stream, rows, rows * head_groups * p.splits, {"producer", "scores", "output"});
  return p.merge_in_kernel;
}

template <class F>
void launch_decode_ws_rows(const DecodeParams& plan_params, int rows, int head_groups, int row_ctas, cudaStream_t stream) {
  using Smem = WsSmem<F, false, kWsWideTile>;
  constexpr auto kernel = sparse_decode_ws_kernel<F, false, kWsWideTile, true>;
  static PerDevice<bool> opted_in;
  opt_in_shared_memory(opted_in, kernel, static_cast<int>(Smem::total), "sparse decode: shared memory opt-in");
  DecodeParams p = plan_params;
  p.rows = rows;
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = dim3(head_groups, std::min(rows, row_ctas), 1);
  cfg.blockDim = dim3(kWsThreads);
  cfg.dynamicSmemBytes = Smem::total;
  cfg.stream = stream;
  // q and out as (dims, heads, rows) bf16 tensors: 64 x 64 boxes, 128-byte swizzle; q's heads past
  // p.heads read as zero, out's are not written.
  const EncodeTiled encode = encode_tiled();
  auto map_rows = [&](CUtensorMap& map, const void* base, int dims_per_head, const char* what) {
    const cuuint64_t dims[3] = {cuuint64_t(dims_per_head), cuuint64_t(p.heads), cuuint64_t(rows)};
    const cuuint64_t strides[2] = {cuuint64_t(dims_per_head) * 2, cuuint64_t(dims_per_head) * 2 * p.heads};
    const cuuint32_t box[3] = {64, cuuint32_t(kWsHeads), 1}, element_strides[3] = {1, 1, 1};
    if (!encode || encode(&map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 3, const_cast<void*>(base), dims, strides, box, element_strides,
                          CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                          CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) != CUDA_SUCCESS)
      throw Error(std::string("sparse decode (walking rows): the driver cannot map ") + what + " for TMA");
  };
  WalkMaps maps{};
  map_rows(maps.q, p.q, kQkDim, "q");
  map_rows(maps.out, p.out, kLatentDim, "out");
  clear_step_traces(stream);
  check(cudaLaunchKernelEx(&cfg, kernel, p, maps), "sparse decode (warp-specialized, walking rows) kernel launch");
  print_step_traces(stream, cfg.gridDim.y, cfg.gridDim.x * cfg.gridDim.y, {"producer", "scores", "output"});
}

}  // namespace nvfp4mla::cuda
