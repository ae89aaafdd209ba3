#pragma once
// 16-head sparse decode for NVFP4 records on sm_90a: warpgroup MMAs with the entries as M.
//
// With 16 heads every K value serves only 16 query rows, so a kernel spends its time on the
// dequantization and on the fixed costs around the MMAs, not on the MMAs. The portable 16-head
// kernel (sm80/h16_kernel.cuh) feeds mma.sync from registers: per warp and 32 entries it ran
// ~960 instructions, of which the score chains, the exchange of four partial score blocks, the
// transposition of every K fragment (movmatrix) and 100 HMMA were most of the overhead. Here the
// MMAs are transposed so that the entries are the M of wgmma:
//   scores  S^T[64 entries x 16 heads] = K[64 x 576] Q^T   (A = K from registers, B = Q in smem)
//   output  O^T[512 dims x 16 heads] += V^T[512 x 64] P^T   (A = V^T in smem, B = P^T in smem)
// so one wgmma sums over all 576 dims (no partial scores), V^T reaches shared memory by
// stmatrix.trans straight from the K fragments, and the output is 32 asynchronous wgmma per
// 64 entries.
//
// One CTA = one query row x 16 heads x one split, two warpgroups that take the split's 64-entry
// tiles in turns (tile 2i + wg) with their own softmax state and O^T; they merge at the end.
// In a warpgroup, warp w owns entries 16w..16w+15 of a tile (rows g and g + 8 of the A layout)
// and lane quad position t4 a 32-dim block of each 128-dim latent slab, 16 RoPE dims, and the
// two group scales of each block. Each thread loads its share of its two records straight from
// global memory into registers one tile ahead and reloads each part as soon as it has been
// dequantized (no raw-record stages in shared memory; only the split's indices and the records'
// fp32 outer-scale fields go through it).
//
// Values: the latent enters the MMAs as e2m1 * d * 2^-8 (exact in BF16, codec.h); the outer
// scale (token or layer) times 2^8 multiplies each entry's latent score and its weights, the FP8
// RoPE scale its RoPE score. K is exact; the weights P are rounded to BF16 once (as in the 64-head
// kernels: decode_weights_are_bf16) and normalized by the fp32 sum.
// Dim order: in k16 step s of the latent (slab s / 8, step s % 8 of the slab) the logical k index
// 8c + 2 t4 + h is dim 128 (s / 8) + 32 t4 + perm_dim(s % 8, c, h) (the pairs (e, e + 4) that
// codec::e2m1x8_to_bf16_pairs makes); RoPE step r's index is dim 512 + 16 t4 + 4 r + 2 c + h.
// Q is staged in that order, and O^T's rows are the latent's logical order (row 16 s + k).
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <mutex>

#include "device/cuda_check.h"
#include "device/per_device.h"
#include "nvfp4mla/error.h"
#include "ops/sparse_mla/decode/common/decode_common.cuh"
#include "ops/sparse_mla/decode/common/step_trace.cuh"
#include "ops/sparse_mla/decode/kernel_shapes.h"
#include "ops/sparse_mla/kv_tile.cuh"
#include "ops/sparse_mla/mma_sm80.cuh"
#include "ops/sparse_mla/wgmma_sm90.cuh"

namespace nvfp4mla::cuda {
namespace {

constexpr int kHeads = 16;
constexpr int kWarpgroups = 2, kThreads = 128 * kWarpgroups, kQuads = kThreads / 4;
constexpr int kTile = 64;                          // entries per tile: the M of the score wgmma
constexpr int kLatentSteps = kLatentDim / 16;      // 32 k16 steps
constexpr int kRopeSteps = kRopeDim / 16;          // 4
constexpr int kQSteps = kLatentSteps + kRopeSteps; // 36
constexpr int kChunks = kLatentSteps / 4;          // latent chunks of 4 k steps = one output M tile each
constexpr int kSlabs = kLatentDim / 128;           // 4: a lane quad splits each 128-dim slab
// The records of the warpgroup's next tile go to L2 at the top of each tile (prefetch), so that
// their register loads, issued part by part through the tile, find them there or on their way.
constexpr int kPrefetchTiles = 1, kL2LineBytes = 128;
constexpr int kCore = 128;                         // bytes of an 8x8 BF16 core matrix
constexpr int kPlannerTile = decode::kPlannerTile;
static_assert(kTile % kPlannerTile == 0 && kTile == decode::kSm90H16Tile && kThreads == 32 * decode::kSm90H16Warps,
              "the planner's shape of this kernel (kernel_shapes.h)");

// Shared memory (no-swizzle canonical layouts, wgmma_sm90.cuh):
//   V^T per warpgroup: core (mc = M row / 8, kc = entry / 8) at (8 mc + kc) * 128: LBO 128, SBO 1024;
//   Q: k step s, core (nc = head / 8, kc) at 512 s + (2 nc + kc) * 128: LBO 128, SBO 256;
//   P^T per warpgroup: core (nc, kc = entry / 8) at (8 nc + kc) * 128: LBO 128, SBO 1024.
struct H16WgSmem {
  static constexpr size_t vt_bytes = size_t(kLatentDim) * kTile * 2;
  static constexpr size_t q_off = kWarpgroups * vt_bytes;
  static constexpr size_t p_off = q_off + size_t(kQSteps) * 4 * kCore;
  static constexpr size_t p_bytes = size_t(kHeads) * kTile * 2;
  static constexpr size_t red_off = p_off + kWarpgroups * p_bytes;  // per warpgroup, warp, head: a float
  static constexpr size_t vote_off = red_off + size_t(kWarpgroups) * 4 * kHeads * 4;  // per warpgroup, warp: a flag
  static constexpr size_t head_off = vote_off + size_t(kWarpgroups) * 4 * 4;  // merge: warpgroup 1's m and l
  // Outer-scale fields, [tile buffer][field][lane quad]: a quad's lanes share their two entries
  static constexpr size_t scale_off = head_off + size_t(2) * kHeads * 4;
  static constexpr size_t idx_off = scale_off + size_t(2) * 4 * kQuads * 4;  // the split's top-k indices
  static constexpr size_t max_total = decode::kSmemBudgetPerBlock;
  static constexpr size_t total(int split_entries) { return idx_off + size_t(split_entries) * 4; }
  static_assert(vt_bytes >= size_t(kHeads) * kLatentDim * 4, "warpgroup 1 hands its O^T over in its V^T buffer");
};
static_assert(H16WgSmem::total(decode::kSm90H16MaxSplitEntries) <= H16WgSmem::max_total);

// The dim of logical k index k (0..15) of k16 step s (0..35).
__host__ __device__ constexpr int logical_dim(int s, int k) {
  const int c = k / 8, j = k % 8;
  return s < kLatentSteps ? 128 * (s / 8) + 32 * (j / 2) + perm_dim(s % 8, c, j % 2)
                          : kLatentDim + 16 * (j / 2) + 4 * (s - kLatentSteps) + 2 * c + j % 2;
}

// The closed forms the kernel uses instead of logical_dim, checked against it at compile time:
// where Q staging puts dim 8 cd + j of head 0, and the dim of O^T row 64 mt + 16 w + g + 8 c.
__host__ __device__ constexpr int q_stage_offset(int cd, int j) {
  constexpr int kPairOffset[4] = {0, kCore, 4 * kCore, 5 * kCore};
  if (cd < kLatentDim / 8)
    return (8 * (cd / 16) + 2 * (cd % 4)) * 4 * kCore + 4 * ((cd / 4) % 4) + kPairOffset[j % 4] + 2 * (j / 4);
  const int r = cd - kLatentDim / 8;
  return (kLatentSteps + 2 * (r % 2)) * 4 * kCore + 4 * (r / 2) + kPairOffset[j / 2] + 2 * (j % 2);
}
__host__ __device__ constexpr int out_dim(int mt, int w, int g, int c) { return 8 * (w / 2) + 2 * (w % 2) + 32 * (g / 2) + 4 * (g % 2) + 128 * (mt / 2) + 16 * (mt % 2) + c; }
constexpr bool closed_forms_match() {
  for (int s = 0; s < kQSteps; ++s)
    for (int k = 0; k < 16; ++k) {
      const int d = logical_dim(s, k);
      if (q_stage_offset(d / 8, d % 8) != s * 4 * kCore + (k / 8) * kCore + (k % 8) * 2) return false;
    }
  for (int mt = 0; mt < kChunks; ++mt)
    for (int w = 0; w < 4; ++w)
      for (int g = 0; g < 8; ++g)
        for (int c = 0; c < 2; ++c)
          if (out_dim(mt, w, g, c) != logical_dim(4 * mt + w, g + 8 * c)) return false;
  return true;
}
static_assert(closed_forms_match());

// A thread's share of one record in registers: per 128-dim slab its 16 bytes of nibbles (32 dims)
// and their two group scales, and its 16 RoPE dims. (The fp32 outer-scale fields travel by
// cp.async instead: copy_outer_scales.)
template <class F>
struct RecordShare {
  // A lane's 16 of the 64 RoPE values (FP8 or BF16) in 16-byte words.
  static constexpr int kRopeWords = (F::kRecordBytes - layout::nvfp4::kRopeOffset) / 4 / 16;
  uint4 latent[kSlabs];
  uint32_t scales[kSlabs];
  uint4 rope[kRopeWords];
};

// Where a lane's share lies in the record (format.h layout): its 32-dim block of slab `slab` is
// kLaneBlockBytes of nibbles and kLaneGroups consecutive E4M3 group scales.
constexpr int kLaneDims = 128 / 4, kLaneBlockBytes = kLaneDims / 2, kLaneGroups = kLaneDims / layout::nvfp4::kGroupSize;
static_assert(kLaneBlockBytes == 16 && kLaneGroups == 2, "a lane's block is one 16-byte load and one 16-bit scale pair");
static_assert(4 * kLaneDims == 128 && kSlabs * 128 == kLatentDim);
// Record words are loaded with plain (weak) global loads, and each group of the next tile's loads
// is followed by pin_loads(), a warp barrier. ptxas placed read-only (ld.global.nc) loads whose
// results are used only in the next iteration at the end of the loop body, below the last score
// MMA (all 18 of them, wherever the source issued them), which left them only the softmax to land
// in; a weak load cannot move past a barrier, so it stays where the source issues it, right after
// the part it replaces has been dequantized. Masked entries read nothing and give zeros.
__device__ __forceinline__ uint4 load_pinned_v4(const void* src, bool valid) {
  uint4 r = make_uint4(0, 0, 0, 0);
#ifdef NVFP4MLA_WGMMA
  asm volatile("{\n.reg .pred q;\nsetp.ne.b32 q, %5, 0;\n@q ld.global.v4.u32 {%0,%1,%2,%3}, [%4];\n}\n"
               : "+r"(r.x), "+r"(r.y), "+r"(r.z), "+r"(r.w)
               : "l"(src), "r"(static_cast<int>(valid)));
#endif
  return r;
}
__device__ __forceinline__ uint32_t load_pinned_u16(const void* src, bool valid) {
  uint32_t r = 0;
#ifdef NVFP4MLA_WGMMA
  asm volatile("{\n.reg .pred q;\nsetp.ne.b32 q, %2, 0;\n@q ld.global.u16 %0, [%1];\n}\n" : "+r"(r) : "l"(src), "r"(static_cast<int>(valid)));
#endif
  return r;
}
__device__ __forceinline__ void pin_loads() { __syncwarp(); }

template <class F>
__device__ __forceinline__ void load_latent(RecordShare<F>& r, const uint8_t* rec, bool valid, int slab, int t4) {
  namespace L = layout::nvfp4;
  // The lane's block is block 4 slab + t4 of the latent's 16.
  r.latent[slab] = load_pinned_v4(rec + L::kLatentOffset + 4 * kLaneBlockBytes * slab + kLaneBlockBytes * t4, valid);
  r.scales[slab] = load_pinned_u16(rec + L::kGroupScaleOffset + 4 * kLaneGroups * slab + kLaneGroups * t4, valid);
}
template <class F>
__device__ __forceinline__ void load_rope(RecordShare<F>& r, const uint8_t* rec, bool valid, int t4) {
  namespace L = layout::nvfp4;
  const uint4* src = reinterpret_cast<const uint4*>(rec + L::kRopeOffset) + RecordShare<F>::kRopeWords * t4;
#pragma unroll
  for (int i = 0; i < RecordShare<F>::kRopeWords; ++i) r.rope[i] = load_pinned_v4(src + i, valid);
}
// The fp32 RoPE and token scales of entry e (where the format has them) into fields 2e and 2e + 1
// of the lane quad's slot {rope e0, token e0, rope e1, token e1} (field f at slot[f * kQuads]), by
// cp.async (zeros for a masked entry); the quad's first lane copies them. Loaded into
// registers a tile ahead instead, they stalled the loop's back edge on every tile: ptxas sank
// their consumers below the next tile's loads, which then landed in other registers and were
// moved back at the end of the loop, waiting for memory (21% of the stall samples).
template <class F>
__device__ __forceinline__ void copy_outer_scales(float* slot, const uint8_t* rec, bool valid, int e) {
  namespace L = layout::nvfp4;
  if constexpr (F::spec.rope == RopeEncoding::fp8) ptx::cp_async_4_zfill(slot + 2 * e * kQuads, rec + L::kRopeScaleOffset, valid ? 4 : 0);
  if constexpr (F::spec.scale_mode == ScaleMode::dynamic)
    ptx::cp_async_4_zfill(slot + (2 * e + 1) * kQuads, rec + L::kTokenScaleOffset, valid ? 4 : 0);
}

// RoPE pair (k16 step r, fragment slot) of a share as BF16.
template <class F>
__device__ __forceinline__ uint32_t rope_pair(const RecordShare<F>& r, int step, int slot) {
  if constexpr (F::spec.rope == RopeEncoding::fp8) {
    const uint32_t w = step == 0 ? r.rope[0].x : step == 1 ? r.rope[0].y : step == 2 ? r.rope[0].z : r.rope[0].w;
    return e4m3x2_to_bf16x2(w >> (16 * slot));
  } else {
    const uint4 q = r.rope[step / 2];
    const int i = 2 * (step % 2) + slot;
    return i == 0 ? q.x : i == 1 ? q.y : i == 2 ? q.z : q.w;
  }
}

template <class F>
__global__ void __launch_bounds__(kThreads, 1) sparse_decode_h16_sm90_kernel(const DecodeParams p) {
#ifdef NVFP4MLA_WGMMA
  static_assert(F::spec.dtype == CacheDtype::nvfp4_ds_mla);
  using Smem = H16WgSmem;
  StepTrace::cta_begin();
  extern __shared__ __align__(128) uint8_t smem[];
  const CtaWork work = cta_work(kHeads);
  const int row = work.row, head0 = work.head0, split = work.split;
  const int heads_here = min(kHeads, p.heads - head0);
  // The warpgroup index comes through a shuffle from lane 0 so that ptxas knows it is warp-uniform
  // and keeps the shared-memory descriptors that depend on it in uniform registers (computed per
  // thread they took 2 R2UR per descriptor and MMA, 257 R2UR in the kernel, and the kernel ran 15%
  // more instructions: 25.02M against 21.72M at 128 x 16).
  const int tid = threadIdx.x, wg = __shfl_sync(0xFFFFFFFFu, tid >> 7, 0), wtid = tid & 127, warp = wtid >> 5, lane = tid & 31, g = lane >> 2, t4 = lane & 3;
  // Trace marks (profiling builds), per tile of the warpgroup: 0 tile begins, 1 chunk 0's MMAs
  // may start, 2 chunk 4's may start, 3 scores done, 4 references agreed, 5 P in place; offsets
  // count from the kernel's entry.
  StepTrace trace(wg, wtid == 0, row, gridDim.y, head0 == 0 && split == 0);
  const int len = row_length(p, row);
  const int split_begin = split * p.tiles_per_split * kPlannerTile;
  const int split_end = min(min(p.num_tiles, (split + 1) * p.tiles_per_split) * kPlannerTile, len);
  const int num_tiles = split_end > split_begin ? (split_end - split_begin + kTile - 1) / kTile : 0;

  const int32_t* row_indices = p.indices + static_cast<int64_t>(row) * p.topk;
  auto pos_of = [&](int t, int e) { return split_begin + t * kTile + 16 * warp + g + 8 * e; };
  // Prologue: every global load is issued before any result is used, so that the latencies of
  // Q, the split's indices and the first records overlap (staged one after another they were
  // 13% of the kernel's stall samples).
  // Q in 16-byte chunks (72 per head: 64 latent, 8 RoPE), staged below in the score product's
  // logical k order.
  constexpr int kQChunks = kHeads * kQkDim / 8, kQPerThread = (kQChunks + kThreads - 1) / kThreads;
  uint4 q_chunk[kQPerThread];
#pragma unroll
  for (int i = 0; i < kQPerThread; ++i) {
    const int c = tid + i * kThreads, h = c / (kQkDim / 8);
    q_chunk[i] = c < kQChunks && h < heads_here
                     ? __ldg(reinterpret_cast<const uint4*>(p.q + (static_cast<int64_t>(row) * p.heads + head0 + h) * kQkDim) + c % (kQkDim / 8))
                     : make_uint4(0, 0, 0, 0);
  }
  auto slot_valid = [&](int32_t idx) { return idx >= 0 && idx < p.capacity; };  // else masked, never read
  auto record_of = [&](int32_t idx) { return p.cache + static_cast<int64_t>(idx < 0 ? 0 : idx) * F::kRecordBytes; };
  // The warpgroup's first records; their fp32 outer-scale fields go by cp.async (copy_outer_scales).
  float* sScale = reinterpret_cast<float*>(smem + Smem::scale_off);
  auto scale_slot = [&](int buf) { return sScale + buf * 4 * kQuads + (tid >> 2); };
  // The split's indices go to shared memory (-1 past its end), so that no tile waits on a global
  // index load: loaded in registers a tile ahead, they stalled the loop's back edge (ptxas placed
  // the loads late and moved the result into the loop-carried register there). Eight loads per
  // thread in flight at once (a loop of one load per trip waits for each in turn); the first eight
  // go out before warpgroup 0's first records, whose loads wait for their own indices.
  int32_t* sIdx = reinterpret_cast<int32_t*>(smem + Smem::idx_off);
  constexpr int kIdxBatch = 8;
  auto load_index_batch = [&](int i0, int32_t(&v)[kIdxBatch]) {
#pragma unroll
    for (int k = 0; k < kIdxBatch; ++k) {
      const int i = i0 + k * kThreads + tid;
      v[k] = split_begin + i < split_end ? __ldg(row_indices + split_begin + i) : -1;
    }
  };
  auto store_index_batch = [&](int i0, const int32_t(&v)[kIdxBatch]) {
#pragma unroll
    for (int k = 0; k < kIdxBatch; ++k)
      if (const int i = i0 + k * kThreads + tid; i < num_tiles * kTile) sIdx[i] = v[k];
  };
  int32_t first_batch[kIdxBatch];
  load_index_batch(0, first_batch);
  RecordShare<F> share[2];
  bool valid[2];
  // The warpgroup's first records. Warpgroup 0 loads its own now, warpgroup 1 its own after the
  // barrier below (from the staged indices), so that warpgroup 0's arrive first: issued together
  // at the launch's start, the two warpgroups' first records held the first tile back by ~3,000
  // SM clocks more, and warpgroup 1 still begins only a few hundred clocks after warpgroup 0.
  auto load_first_records = [&](const int32_t(&idx)[2]) {
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      valid[e] = slot_valid(idx[e]);
      const uint8_t* rec = record_of(valid[e] ? idx[e] : -1);
#pragma unroll
      for (int slab = 0; slab < kSlabs; ++slab) load_latent(share[e], rec, valid[e], slab, t4);
      load_rope(share[e], rec, valid[e], t4);
      if (t4 == 0) copy_outer_scales<F>(scale_slot(0), rec, valid[e], e);
    }
    ptx::cp_async_commit();
  };
  if (wg == 0) {
    int32_t idx[2];
#pragma unroll
    for (int e = 0; e < 2; ++e) idx[e] = 0 < num_tiles && pos_of(0, e) < split_end ? __ldg(row_indices + pos_of(0, e)) : -1;
    load_first_records(idx);
  }
  store_index_batch(0, first_batch);
  for (int i0 = kIdxBatch * kThreads; i0 < num_tiles * kTile; i0 += kIdxBatch * kThreads) {
    int32_t v[kIdxBatch];
    load_index_batch(i0, v);
    store_index_batch(i0, v);
  }
  auto staged_index_of = [&](int t, int e) -> int32_t { return t < num_tiles ? sIdx[pos_of(t, e) - split_begin] : -1; };
  // Q's chunk of dims 8c'..8c'+7 of one head lands as four BF16 pairs (q_stage_offset):
  // latent pairs (0,4) (1,5) (2,6) (3,7), RoPE pairs (0,1) (2,3) (4,5) (6,7).
  uint8_t* sQ = smem + Smem::q_off;
#pragma unroll
  for (int i = 0; i < kQPerThread; ++i) {
    const int c = tid + i * kThreads;
    if (c >= kQChunks) break;
    const int h = c / (kQkDim / 8), cd = c % (kQkDim / 8);
    const uint4 v = q_chunk[i];
    int base;
    uint32_t w[4];
    if (cd < kLatentDim / 8) {  // dims 8 cd..: slab cd / 16, lane block (cd / 4) % 4, k steps 2 (cd % 4) + {0, 1}
      base = (8 * (cd / 16) + 2 * (cd % 4)) * 4 * kCore + 4 * ((cd / 4) % 4);
      w[0] = __byte_perm(v.x, v.z, 0x5410);
      w[1] = __byte_perm(v.x, v.z, 0x7632);
      w[2] = __byte_perm(v.y, v.w, 0x5410);
      w[3] = __byte_perm(v.y, v.w, 0x7632);
    } else {  // RoPE dims 16 t4 + 4 step + 2 c + h: chunk r = cd - 64 holds t4 = r / 2, steps 2 (r % 2) + {0, 1}
      const int r = cd - kLatentDim / 8;
      base = (kLatentSteps + 2 * (r % 2)) * 4 * kCore + 4 * (r / 2);
      w[0] = v.x, w[1] = v.y, w[2] = v.z, w[3] = v.w;
    }
    uint8_t* dst = sQ + base + (h / 8) * 2 * kCore + (h % 8) * 16;  // base = q_stage_offset(cd, 0)
    *reinterpret_cast<uint32_t*>(dst) = w[0];
    *reinterpret_cast<uint32_t*>(dst + kCore) = w[1];
    *reinterpret_cast<uint32_t*>(dst + 4 * kCore) = w[2];
    *reinterpret_cast<uint32_t*>(dst + 5 * kCore) = w[3];
  }
  wgmma::fence_proxy_async_smem();
  __syncthreads();
  if (wg == 1) {
    const int32_t idx[2] = {staged_index_of(1, 0), staged_index_of(1, 1)};
    load_first_records(idx);
  }

  uint8_t* sVt = smem + wg * Smem::vt_bytes;
  uint8_t* sP = smem + Smem::p_off + wg * Smem::p_bytes;
  float* sRed = reinterpret_cast<float*>(smem + Smem::red_off) + wg * 4 * kHeads;
  int* sVote = reinterpret_cast<int*>(smem + Smem::vote_off) + wg * 4;
  // stmatrix: lane 8i + j writes row j of matrix i's transpose; matrix i = 2 c + e covers entries
  // 8 e.. of the warp's 16 and the fragment slot (V^T) or head block (P^T) c.
  const uint32_t st_lane = ((lane >> 4) * 8 + 2 * warp + ((lane >> 3) & 1)) * kCore + 16 * (lane & 7);
  const uint32_t vt_lane = ptx::smem_addr(sVt) + st_lane, p_lane = ptx::smem_addr(sP) + st_lane;
  const uint64_t q_desc = wgmma::smem_desc(ptx::smem_addr(sQ), kCore, 2 * kCore);
  const uint64_t vt_desc = wgmma::smem_desc(ptx::smem_addr(sVt), kCore, 8 * kCore);
  const uint64_t p_desc = wgmma::smem_desc(ptx::smem_addr(sP), kCore, 8 * kCore);
  const int bar_id = 1 + wg;

  float o[kChunks][2][4];  // O^T, M tile mt: rows 64 mt + 16 warp + g (+8), heads 8j + 2 t4 (+1)
#pragma unroll
  for (int mt = 0; mt < kChunks; ++mt)
#pragma unroll
    for (int j = 0; j < 2; ++j) o[mt][j][0] = o[mt][j][1] = o[mt][j][2] = o[mt][j][3] = 0.0f;
  // Softmax state of the thread's heads hh = 2j + b (head 8j + 2 t4 + b): the warpgroup's lazy
  // reference (the same in all its threads) and this thread's share of the sum of weights.
  float m[4], l[4];
#pragma unroll
  for (int hh = 0; hh < 4; ++hh) m[hh] = -INFINITY, l[hh] = 0.0f;

  // O^T += V^T P^T of the warpgroup's last tile (32 asynchronous wgmma). Issued at the top of the
  // next tile rather than at the end of this one, so that no wgmma is in flight across the loop's
  // back edge, where register moves of the accumulators would make ptxas serialize every wgmma.
  auto issue_output = [&] {
#pragma unroll
    for (int mt = 0; mt < kChunks; ++mt) wgmma::fence_operand(o[mt]);
    wgmma::fence();
#pragma unroll
    for (int mt = 0; mt < kChunks; ++mt) {
#pragma unroll
      for (int ke = 0; ke < kTile / 16; ++ke)
        wgmma::m64n16k16_ss(o[mt], wgmma::desc_advance(vt_desc, mt * 64 * kCore + ke * 2 * kCore),
                            wgmma::desc_advance(p_desc, ke * 2 * kCore));
      if (mt == kChunks / 2 - 1 || mt == kChunks - 1) wgmma::commit();  // two groups: M tiles 0-3, 4-7
    }
  };

  for (int t = wg; t < num_tiles; t += kWarpgroups) {
    trace.mark(t / kWarpgroups, 0);
    if (t != wg) issue_output();
    // The next tile's records, loaded part by part as this tile's are used.
    bool next_valid[2];
    const uint8_t* next_rec[2];
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      const int32_t idx = staged_index_of(t + kWarpgroups, e);
      next_valid[e] = slot_valid(idx);
      next_rec[e] = record_of(next_valid[e] ? idx : -1);
    }
    // The records kPrefetchTiles tiles of this warpgroup ahead into L2 (prefetch, no register): a
    // lane quad touches every 128-byte line of each of its records. Not on the warpgroup's first
    // tile: at the launch's start those lines would compete with the first tile's own loads.
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      const int32_t idx = t != wg ? staged_index_of(t + kPrefetchTiles * kWarpgroups, e) : -1;
      constexpr int kPoints = (F::kRecordBytes - 1 + kL2LineBytes - 1) / kL2LineBytes + 1;
      if (slot_valid(idx))
        for (int i = t4; i < kPoints; i += 4) ptx::prefetch_l2(record_of(idx) + i * (F::kRecordBytes - 1) / (kPoints - 1));
    }
    // The next tile's outer-scale fields go out, this tile's (copied a tile ago) come in.
    const int buf = (t / kWarpgroups) % 2;
#pragma unroll
    for (int e = 0; e < 2; ++e)
      if (t4 == 0) copy_outer_scales<F>(scale_slot(buf ^ 1), next_rec[e], next_valid[e], e);
    ptx::cp_async_commit();
    ptx::cp_async_wait_group<1>();  // this tile's fields (copied a tile ago) have landed
    __syncwarp();                   // and the quad's other lanes see what its first lane copied
    const float* slot = scale_slot(buf);
    const float4 fields = make_float4(slot[0], slot[kQuads], slot[2 * kQuads], slot[3 * kQuads]);
    float c_lat[2], score_lat[2], score_rope[2];
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      c_lat[e] = latent_outer_scale<F>(e ? fields.w : fields.y, p.layer_scale) * float(1 << codec::kE2m1PairShift);
      score_lat[e] = c_lat[e] * p.scale_log2;
      score_rope[e] = (F::spec.rope == RopeEncoding::fp8 ? (e ? fields.z : fields.x) : 1.0f) * p.scale_log2;
    }

    // Scores: RoPE first (its fragments are not part of V), then the latent in chunks of four
    // k steps; each latent chunk also goes to V^T (M tile = chunk).
    float acc[2][4], acc_rope[2][4];
    {
      uint32_t a[kRopeSteps][4];
#pragma unroll
      for (int r = 0; r < kRopeSteps; ++r)
#pragma unroll
        for (int slot = 0; slot < 2; ++slot)
#pragma unroll
          for (int e = 0; e < 2; ++e) a[r][2 * slot + e] = rope_pair(share[e], r, slot);
#pragma unroll
      for (int r = 0; r < kRopeSteps; ++r) wgmma::fence_operand(a[r]);
      wgmma::fence();
#pragma unroll
      for (int r = 0; r < kRopeSteps; ++r)
        wgmma::m64n16k16_rs(acc_rope, a[r], wgmma::desc_advance(q_desc, (kLatentSteps + r) * 4 * kCore), r > 0);
      wgmma::commit();
    }
#pragma unroll
    for (int c = 0; c < kChunks; ++c) {
      const int slab = c / 2, half = c % 2;
      uint32_t a[4][4];  // k step 4 half + kk of the slab: registers (slot, entry)
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const uint4 nib = share[e].latent[slab];
        const float2 d = e4m3x2_to_float2(share[e].scales[slab]);
        const uint32_t dpair = e2m1_pair_scale(half ? d.y : d.x);
        const uint32_t words[2] = {half ? nib.z : nib.x, half ? nib.w : nib.y};
#pragma unroll
        for (int wd = 0; wd < 2; ++wd) {
          uint32_t pr[4];
          codec::e2m1x8_to_bf16_pairs(words[wd], pr);
#pragma unroll
          for (int i = 0; i < 4; ++i) a[2 * wd + i / 2][2 * (i % 2) + e] = bf16x2_mul(pr[i], dpair);
        }
      }
      if (half == 1) {
#pragma unroll
        for (int e = 0; e < 2; ++e) load_latent(share[e], next_rec[e], next_valid[e], slab, t4);
        pin_loads();
      }
      // Chunk 0 waits only for the previous tile's output group of M tiles 0-3 (it overwrites M
      // tile 0 of V^T); from chunk 1 on at most the previous chunk still runs: the chunk before it
      // released its registers, and the second output group and the RoPE product have finished.
      if (c == 0) wgmma::wait<2>();
      else wgmma::wait<1>();
      if (c == 0 || c == 4) trace.mark(t / kWarpgroups, c == 0 ? 1 : 2);
      if (c == 1) {  // the RoPE product has finished with the registers (bf16 RoPE words are its A fragments)
#pragma unroll
        for (int e = 0; e < 2; ++e) load_rope(share[e], next_rec[e], next_valid[e], t4);
        pin_loads();
      }
#pragma unroll
      for (int kk = 0; kk < 4; ++kk)
        ptx::stmatrix_x4_trans(vt_lane + (4 * c + kk) * 16 * kCore, a[kk][0], a[kk][1], a[kk][2], a[kk][3]);
#pragma unroll
      for (int kk = 0; kk < 4; ++kk) wgmma::fence_operand(a[kk]);
      wgmma::fence();
#pragma unroll
      for (int kk = 0; kk < 4; ++kk)
        wgmma::m64n16k16_rs(acc, a[kk], wgmma::desc_advance(q_desc, (4 * c + kk) * 4 * kCore), c > 0 || kk > 0);
      wgmma::commit();
    }
    wgmma::wait<0>();
    trace.mark(t / kWarpgroups, 3);
    wgmma::fence_operand(acc);
    wgmma::fence_operand(acc_rope);
#pragma unroll
    for (int mt = 0; mt < kChunks; ++mt) wgmma::fence_operand(o[mt]);

    // Softmax (base 2) of the thread's 2 entries x 4 heads.
    float s[2][4];
    bool moves = false;
#pragma unroll
    for (int j = 0; j < 2; ++j)
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const int e = i / 2, hh = 2 * j + i % 2;
        const float x = acc[j][i] * score_lat[e] + acc_rope[j][i] * score_rope[e];
        s[j][i] = valid[e] ? x : -INFINITY;
        moves |= s[j][i] > m[hh] + kLazyRescaleLog2;
      }
    float m_use[4];
    // The warpgroup's vote: a flag per warp and a named barrier. (bar.red.or would do it in one
    // instruction, but compute-sanitizer's racecheck then misreads the later __syncthreads phases
    // of a CTA whose warpgroups ran different numbers of tiles and reports false races.)
    const bool warp_moves = __any_sync(0xFFFFFFFFu, moves);
    if (lane == 0) sVote[warp] = warp_moves;
    ptx::named_barrier_sync(bar_id, 128);
    trace.mark(t / kWarpgroups, 4);
    const int4 votes = *reinterpret_cast<const int4*>(sVote);  // the warpgroup's four flags in one load
    if (votes.x | votes.y | votes.z | votes.w) {
      // Rare (the first tiles): the warpgroup's maximum per head moves the references.
      float mx[4];
#pragma unroll
      for (int hh = 0; hh < 4; ++hh) {
        mx[hh] = fmaxf(s[hh / 2][hh % 2], s[hh / 2][2 + hh % 2]);
        mx[hh] = fmaxf(mx[hh], __shfl_xor_sync(0xFFFFFFFFu, mx[hh], 4));
        mx[hh] = fmaxf(mx[hh], __shfl_xor_sync(0xFFFFFFFFu, mx[hh], 8));
        mx[hh] = fmaxf(mx[hh], __shfl_xor_sync(0xFFFFFFFFu, mx[hh], 16));
        if (g == 0) sRed[warp * kHeads + 8 * (hh / 2) + 2 * t4 + hh % 2] = mx[hh];
      }
      ptx::named_barrier_sync(bar_id, 128);
      float alpha[4];
#pragma unroll
      for (int hh = 0; hh < 4; ++hh) {
        const int h = 8 * (hh / 2) + 2 * t4 + hh % 2;
        const float x = fmaxf(fmaxf(sRed[h], sRed[kHeads + h]), fmaxf(sRed[2 * kHeads + h], sRed[3 * kHeads + h]));
        const LazyStep step = lazy_reference_step(x, m[hh]);
        m_use[hh] = step.m_use;
        alpha[hh] = step.alpha;
        l[hh] *= alpha[hh];
      }
#pragma unroll
      for (int mt = 0; mt < kChunks; ++mt)
#pragma unroll
        for (int j = 0; j < 2; ++j)
#pragma unroll
          for (int i = 0; i < 4; ++i) o[mt][j][i] *= alpha[2 * j + i % 2];
      ptx::named_barrier_sync(bar_id, 128);  // sRed read by all before a later tile writes it
    } else {
#pragma unroll
      for (int hh = 0; hh < 4; ++hh) m_use[hh] = lazy_reference_kept(m[hh]).m_use;
    }
    uint32_t pw[4];  // P: register 2j + e = entry g + 8e, heads 8j + 2 t4 (+1)
#pragma unroll
    for (int j = 0; j < 2; ++j)
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const float w0 = ptx::exp2_approx(s[j][2 * e] - m_use[2 * j]), w1 = ptx::exp2_approx(s[j][2 * e + 1] - m_use[2 * j + 1]);
        l[2 * j] += w0;
        l[2 * j + 1] += w1;
        pw[2 * j + e] = ptx::pack_bf16x2(w0 * c_lat[e], w1 * c_lat[e]);
      }
    ptx::stmatrix_x4_trans(p_lane, pw[0], pw[1], pw[2], pw[3]);
    wgmma::fence_proxy_async_smem();
    ptx::named_barrier_sync(bar_id, 128);  // the warpgroup's V^T and P^T of this tile are in place for issue_output
    trace.mark(t / kWarpgroups, 5);

#pragma unroll
    for (int e = 0; e < 2; ++e) valid[e] = next_valid[e];
  }
  if (wg < num_tiles) issue_output();
  wgmma::wait<0>();
  trace.finish((num_tiles - wg + kWarpgroups - 1) / kWarpgroups);
  ptx::cp_async_wait_group<0>();  // no copy outlives the kernel
#pragma unroll
  for (int mt = 0; mt < kChunks; ++mt) wgmma::fence_operand(o[mt]);

  // Each warpgroup's sums per head, then warpgroup 1 hands its state to warpgroup 0.
#pragma unroll
  for (int hh = 0; hh < 4; ++hh) {
    l[hh] += __shfl_xor_sync(0xFFFFFFFFu, l[hh], 4);
    l[hh] += __shfl_xor_sync(0xFFFFFFFFu, l[hh], 8);
    l[hh] += __shfl_xor_sync(0xFFFFFFFFu, l[hh], 16);
    if (g == 0) sRed[warp * kHeads + 8 * (hh / 2) + 2 * t4 + hh % 2] = l[hh];
  }
  ptx::named_barrier_sync(bar_id, 128);
  float* sHead = reinterpret_cast<float*>(smem + Smem::head_off);  // m and l of warpgroup 1
  float4* sO1 = reinterpret_cast<float4*>(smem + Smem::vt_bytes);  // warpgroup 1's O^T
#pragma unroll
  for (int hh = 0; hh < 4; ++hh) {
    const int h = 8 * (hh / 2) + 2 * t4 + hh % 2;
    l[hh] = sRed[h] + sRed[kHeads + h] + sRed[2 * kHeads + h] + sRed[3 * kHeads + h];
    if (wg == 1 && warp == 0 && g == 0) {
      sHead[h] = m[hh];
      sHead[kHeads + h] = l[hh];
    }
  }
  if (wg == 1) {
#pragma unroll
    for (int mt = 0; mt < kChunks; ++mt)
#pragma unroll
      for (int j = 0; j < 2; ++j) sO1[(2 * mt + j) * 128 + wtid] = make_float4(o[mt][j][0], o[mt][j][1], o[mt][j][2], o[mt][j][3]);
  }
  __syncthreads();
  if (wg == 0) {
    // Merge with warpgroup 1 and store: O^T values (i, i + 2) of a head are dims d, d + 1.
    float f0[4], f1[4];
#pragma unroll
    for (int hh = 0; hh < 4; ++hh) {
      const int h = 8 * (hh / 2) + 2 * t4 + hh % 2;
      const float m1 = sHead[h], l1 = sHead[kHeads + h];
      const float mm = fmaxf(m[hh], m1);
      const float a0 = m[hh] == -INFINITY ? 0.0f : ptx::exp2_approx(m[hh] - mm);
      const float a1 = m1 == -INFINITY ? 0.0f : ptx::exp2_approx(m1 - mm);
      const float total = l[hh] * a0 + l1 * a1;
      const float inv = total > 0.0f ? 1.0f / total : 0.0f;
      f0[hh] = a0 * inv;
      f1[hh] = a1 * inv;
      if (warp == 0 && g == 0 && h < heads_here) {
        const int64_t rh = static_cast<int64_t>(row) * p.heads + head0 + h;
        const float lse2 = total > 0.0f ? mm + log2f(total) : -INFINITY;
        if (p.splits == 1) p.lse[rh] = p.lse_base2 ? lse2 : lse2 * kLn2;
        else p.part_lse[rh * p.splits + split] = lse2;
      }
    }
    // O^T row 64 mt + 16 warp + g + 8 c is logical_dim(4 mt + warp, g + 8 c) = out_dim(mt, warp, g, c).
    const int out_dim0 = out_dim(0, warp, g, 0);
#pragma unroll
    for (int mt = 0; mt < kChunks; ++mt)
#pragma unroll
      for (int j = 0; j < 2; ++j) {
        const float4 x = sO1[(2 * mt + j) * 128 + wtid];
        const float x1[4] = {x.x, x.y, x.z, x.w};
#pragma unroll
        for (int b = 0; b < 2; ++b) {
          const int hh = 2 * j + b, h = 8 * j + 2 * t4 + b;
          if (h >= heads_here) continue;
          const float v0 = o[mt][j][b] * f0[hh] + x1[b] * f1[hh], v1 = o[mt][j][b + 2] * f0[hh] + x1[b + 2] * f1[hh];
          const int64_t rh = static_cast<int64_t>(row) * p.heads + head0 + h;
          const int d = out_dim0 + out_dim(mt, 0, 0, 0);
          if (p.splits == 1) *reinterpret_cast<uint32_t*>(p.out + rh * kLatentDim + d) = ptx::pack_bf16x2(v0, v1);
          else if (p.partials_bf16)
            *reinterpret_cast<uint32_t*>(static_cast<__nv_bfloat16*>(p.part_out) + (rh * p.splits + split) * kLatentDim + d) =
                ptx::pack_bf16x2(v0, v1);
          else *reinterpret_cast<float2*>(static_cast<float*>(p.part_out) + (rh * p.splits + split) * kLatentDim + d) = make_float2(v0, v1);
        }
      }
  }
  StepTrace::cta_end();
#endif
}

}  // namespace

template <class F>
void launch_decode_h16_sm90(const DecodeParams& p, int rows, int head_groups, cudaStream_t stream) {
  static PerDevice<bool> opted_in;
  opt_in_shared_memory(opted_in, sparse_decode_h16_sm90_kernel<F>, static_cast<int>(H16WgSmem::max_total),
                       "sparse decode (16 heads, sm_90): shared memory opt-in");
  const int split_entries = (p.tiles_per_split * kPlannerTile + kTile - 1) / kTile * kTile;
  if (split_entries > decode::kSm90H16MaxSplitEntries) throw Error("sparse decode (16 heads, sm_90): split of " + std::to_string(split_entries) + " entries");
  clear_step_traces(stream);
  sparse_decode_h16_sm90_kernel<F><<<decode_grid(rows, head_groups, p.splits), kThreads, H16WgSmem::total(split_entries), stream>>>(p);
  check_launch("sparse decode (16 heads, sm_90) kernel launch");
  print_step_traces(stream, rows, rows * head_groups * p.splits, {"wg0", "wg1", "none"});
}

}  // namespace nvfp4mla::cuda
