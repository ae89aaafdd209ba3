#pragma once
// 16-head sparse decode for NVFP4 records with the dequantization fed straight into registers
// (portable: mma.sync, movmatrix, cp.async; sm_80 and later). On sm_90 the wgmma kernel of
// sm90/h16_kernel.cuh runs by default (DecodeKernel::sm80_h16 selects this one there).
//
// One CTA = one query row x 16 heads x one split, four warps. Warp w owns latent dims
// [128w, 128w + 128) and RoPE dims [16w, 16w + 16) of every entry. Per sub-tile of kH16Sub (32)
// entries:
//   1. raw records arrive by cp.async (4 or 5 sub-tiles ahead, as many as fit 99 KB);
//   2. each warp dequantizes its dims of the records straight into mma.sync B fragments
//      (no BF16 K tile in shared memory) and computes its partial scores Q[:, dims] K[:, dims]^T;
//   3. the four partials are summed through shared memory and the online softmax is split by
//      heads: warp w runs it for heads 4w..4w+3 (8 lanes per head, 4 entries each) and leaves the
//      weights P and each head's rescale factor in shared memory;
//   4. O[:, latent dims of w] += P V, P by ldmatrix, the V fragments being the K fragments of
//      step 2 transposed in registers (movmatrix), P entering as a BF16 part and its BF16
//      remainder.
// Why: with 16 heads each K value serves only 16 query rows, so the MMAs are cheap and what the
// 64-head design pays for (a BF16 K tile written and read through shared memory, Q re-read by
// every warp, 36-deep MMA chains) dominated; here the raw records are the only bulk traffic.
//
// Scale folding: latent values enter the MMAs as e2m1 * d * 2^-8 (exact in BF16, codec.h);
// the outer scale (token or layer) times 2^8 multiplies each entry's scores and its weights in P,
// and the FP8 RoPE scale multiplies the RoPE part of the scores. Neither K nor P is rounded to
// BF16, so this path is closer to the fp32 reference than the BF16-operand kernels
// (decode_rounds_k_to_bf16 says which model a plan's kernel follows).
// Dim order: a lane quad splits a warp's 128 latent dims into 32-dim blocks, one per lane; in
// its block the k order is permuted (pairs (e, e + 4) of each 8-dim chunk, see perm_dim). Q is
// loaded with the same permutation and the output is stored back in dim order.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <mutex>

#include "device/cuda_check.h"
#include "device/per_device.h"
#include "ops/sparse_mla/decode/common/decode_common.cuh"
#include "ops/sparse_mla/decode/kernel_shapes.h"
#include "ops/sparse_mla/kv_tile.cuh"
#include "ops/sparse_mla/mma_sm80.cuh"

namespace nvfp4mla::cuda {
namespace {

constexpr decode::TileConfig kH16Config = decode::tile_config(16);  // the planner's tiles
constexpr int kH16Heads = 16, kH16Warps = 4, kH16Threads = 32 * kH16Warps;
// Entries per sub-tile: 32 (two CTAs per SM, five stages on the H200). With the softmax split by heads they
// measured 6-7% faster than 16 (three CTAs per SM, six stages) on the H200 at locked clocks:
// 128 x 16 heads 116.0-116.6 vs 124.3-124.8 us, 14% fewer instructions.
constexpr int kH16Sub = 32;
constexpr int kCols = kH16Sub / 8;  // column blocks of the score MMA per sub-tile
// Q's fragments live in shared memory (ldmatrix per k step), which left room for three CTAs per
// SM at 16-entry sub-tiles; keeping them in registers measured the same.
constexpr int kH16MinCtas = 2;
constexpr int kLatentPerWarp = kLatentDim / kH16Warps;  // 128
constexpr int kLatentPerLane = kLatentPerWarp / 4;      // 32 (a lane quad splits the warp's dims)
constexpr int kRopePerWarp = kRopeDim / kH16Warps;      // 16: one k16 step
constexpr int kKSteps = kLatentPerWarp / 16;            // latent k16 steps per warp
constexpr int kQSteps = kKSteps + kRopePerWarp / 16;    // k16 steps of Q per warp: 8 latent, 1 RoPE
constexpr int kSStride = kH16Sub + 8;                   // partial-score row stride (floats; no bank conflicts)
constexpr int kPStride = kH16Sub + 8;                   // P row stride (BF16: 48 or 80 bytes, conflict-free ldmatrix)
// The softmax of a sub-tile is split by heads: warp w owns heads 4w..4w+3, lane l head 4w + l / 8
// and kSoftmaxCols consecutive entries from kSoftmaxCols (l % 8).
constexpr int kSoftmaxHeadsPerWarp = kH16Heads / kH16Warps, kSoftmaxCols = kH16Sub / 8;
static_assert(kH16Warps == 4 && kRopePerWarp == 16 && kLatentPerLane == 32);
static_assert(kSoftmaxHeadsPerWarp * 8 == 32 && kSoftmaxCols % 2 == 0, "8 lanes per head, entries in pairs");
static_assert(decode::kPlannerTile % kH16Sub == 0, "planner tiles are whole sub-tiles");
static_assert(kH16Warps == decode::kH16Warps && kH16Sub == decode::kH16Sub && kH16MinCtas == decode::kH16MinCtas,
              "the planner's shape of this kernel (kernel_shapes.h)");

template <class F>
struct H16Smem {
  static constexpr int stages = decode::h16_stages(F::kRecordBytes);  // raw record sub-tiles in flight
  static constexpr int idx_ring = 2 * stages;                         // sub-tiles of top-k indices
  static constexpr size_t raw_stage_bytes = size_t(kH16Sub) * F::kRecordBytes;
  static constexpr size_t idx_off = stages * raw_stage_bytes;
  static constexpr size_t mask_off = idx_off + size_t(idx_ring) * kH16Sub * 4;
  static constexpr size_t s_off = mask_off + size_t(stages) * kH16Sub * 4;
  static constexpr size_t p_off = s_off + size_t(kH16Warps) * kH16Heads * kSStride * 4;  // P: BF16 part, remainder
  static constexpr size_t head_off = p_off + size_t(2) * kH16Heads * kPStride * 2;          // per head: alpha, 1/l, LSE
  static constexpr size_t q_off = head_off + size_t(3) * kH16Heads * 4;
  // Q A fragments per warp and k step: 16 rows of 16 logical k (32 bytes, 16-byte chunks swizzled)
  static constexpr size_t total = q_off + size_t(kH16Warps) * kQSteps * kH16Heads * 32;
  static_assert(raw_stage_bytes % 16 == 0 && s_off % 16 == 0 && p_off % 16 == 0 && q_off % 16 == 0);
  static_assert(total == decode::h16_smem_bytes(F::kRecordBytes), "the planner's bytes (kernel_shapes.h)");
  static_assert((total + decode::kSmemBudgetReservedPerCta) * kH16MinCtas <= decode::kSmemBudgetPerSm);
};


template <class F>
__global__ void __launch_bounds__(kH16Threads, kH16MinCtas) sparse_decode_h16_kernel(const DecodeParams p) {
  static_assert(F::spec.dtype == CacheDtype::nvfp4_ds_mla);
  namespace L = layout::nvfp4;
  using Smem = H16Smem<F>;
  constexpr int kH16Stages = Smem::stages, kIdxRing = Smem::idx_ring;
  extern __shared__ __align__(16) uint8_t smem[];
  uint8_t* sRaw = smem;
  int32_t* sIdx = reinterpret_cast<int32_t*>(smem + Smem::idx_off);  // top-k index ring
  float* sMask = reinterpret_cast<float*>(smem + Smem::mask_off);     // per staged entry: 0 or -inf
  float* sS = reinterpret_cast<float*>(smem + Smem::s_off);  // [warp][head][entry] partial scores

  const CtaWork work = cta_work(kH16Heads);
  const int row = work.row, head0 = work.head0, split = work.split;
  const int heads_here = min(kH16Heads, p.heads - head0);
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, g = lane >> 2, t4 = lane & 3;
  const int len = row_length(p, row);
  constexpr int kSubPerTile = kH16Config.tile_tokens / kH16Sub;
  const int sub_begin = split * p.tiles_per_split * kSubPerTile;
  // Sub-tiles past the row's length hold only masked entries: skipped.
  const int sub_end = min(min(p.num_tiles, (split + 1) * p.tiles_per_split) * kSubPerTile, (len + kH16Sub - 1) / kH16Sub);
  const int latent0 = kLatentPerWarp * warp + kLatentPerLane * t4;  // this lane's latent block
  const int rope0 = kRopePerWarp * warp + 4 * t4;                   // this lane's 4 RoPE dims

  // Q as A fragments in shared memory, per warp, k step (8 latent, 1 RoPE), row and 16-byte chunk
  // (fragment registers 0, 2 / 1, 3: rows g / g + 8, chunks 0 / 1), chunks swizzled by row / 4 so
  // ldmatrix reads eight rows without bank conflicts. Rows past heads_here are zero.
  __nv_bfloat16* sQw = reinterpret_cast<__nv_bfloat16*>(smem + Smem::q_off) + warp * kQSteps * kH16Heads * 16;
  auto q_word = [&](int kk, int row, int chunk) { return sQw + (kk * kH16Heads + row) * 16 + 8 * (chunk ^ ((row >> 2) & 1)); };
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int h = g + 8 * r;
    uint32_t v[16] = {};
    uint2 rp = make_uint2(0, 0);
    if (h < heads_here) {
      const uint16_t* qh = p.q + (static_cast<int64_t>(row) * p.heads + head0 + h) * kQkDim;
#pragma unroll
      for (int c = 0; c < 4; ++c) {
        const uint4 x = *reinterpret_cast<const uint4*>(qh + latent0 + 8 * c);
        v[4 * c] = x.x;
        v[4 * c + 1] = x.y;
        v[4 * c + 2] = x.z;
        v[4 * c + 3] = x.w;
      }
      rp = *reinterpret_cast<const uint2*>(qh + kLatentDim + rope0);
    }
#pragma unroll
    for (int kk = 0; kk < kQSteps; ++kk)
#pragma unroll
      for (int slot = 0; slot < 2; ++slot) {
        uint32_t word = slot ? rp.y : rp.x;  // RoPE: dims 4 t4 + {0, 1} and {2, 3}
        if (kk < kKSteps) {
          // Dims d and d + 4 of chunk kk / 2: word (d / 2) and word (d / 2 + 2), half d % 2.
          const int d = perm_dim(kk, slot, 0) % 8, c = kk / 2;
          word = __byte_perm(v[4 * c + d / 2], v[4 * c + d / 2 + 2], d % 2 ? 0x7632 : 0x5410);
        }
        *reinterpret_cast<uint32_t*>(q_word(kk, h, slot) + 2 * t4) = word;
      }
  }
  __syncwarp();
  const __nv_bfloat16* q_lane = q_word(0, 8 * ((lane >> 3) & 1) + (lane & 7), lane >> 4);  // this lane's ldmatrix row

  // Raw records travel kH16Stages - 1 sub-tiles ahead of the computed one and their top-k
  // indices kH16Stages - 1 further, both by cp.async: the group committed for sub-tile u holds
  // u's records and the indices of u + kH16Stages - 1 (empty groups past the end keep the
  // count uniform). The index ring holds 2 kH16Stages sub-tiles.
  auto idx_of = [&](int t) { return sIdx + (t % kIdxRing) * kH16Sub; };
  auto raw_of = [&](int t) { return sRaw + (t % kH16Stages) * Smem::raw_stage_bytes; };
  const bool copies_indices = tid < kH16Sub;
  if (copies_indices)
    for (int t = sub_begin; t < min(sub_end, sub_begin + kH16Stages - 1); ++t) issue_index_copy<kH16Sub>(p, row, len, t, idx_of(t), tid);
  ptx::cp_async_commit();
  ptx::cp_async_wait_group<0>();
  __syncthreads();
  auto mask_of = [&](int t) { return sMask + (t % kH16Stages) * kH16Sub; };
  // Records of sub-tile u, masked entries as zero bytes (read from nowhere: zero group scales,
  // token and RoPE scales and values, so they reach the MMAs as exact zeros and no per-entry
  // validity is needed downstream), the softmax mask of u, and the indices of u + kH16Stages - 1.
  const bool copies = !(kStageSkip & 8);
  auto issue_group = [&](int u) {
    if (u < sub_end && copies) {
      const int32_t* ring = idx_of(u);
      issue_record_copies<F, kH16Threads, kH16Sub, false, MaskedRecords::zero_fill>(p, len, u * kH16Sub, ring, raw_of(u), tid);
      if (tid < kH16Sub) mask_of(u)[tid] = slot_of_index(p, len, u * kH16Sub + tid, ring[tid]) >= 0 ? 0.0f : -INFINITY;
    }
    const int v = u + kH16Stages - 1;
    if (copies_indices && v < sub_end) issue_index_copy<kH16Sub>(p, row, len, v, idx_of(v), tid);
    ptx::cp_async_commit();
  };
  for (int t = sub_begin; t < sub_begin + kH16Stages - 1; ++t) issue_group(t);

  float o[2 * kKSteps][4];  // output n-block 2 kk + slot: the dims of (kk, slot) in every lane's block
#pragma unroll
  for (int n = 0; n < 2 * kKSteps; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.0f;
  // This lane's softmax head and entries (the split above), its online state: the head's lazy
  // reference m (the same in the head's 8 lanes) and the lane's share of the sum of weights.
  __nv_bfloat16* sP = reinterpret_cast<__nv_bfloat16*>(smem + Smem::p_off);  // [part][head][entry]
  float* sAlpha = reinterpret_cast<float*>(smem + Smem::head_off);           // per head: this sub-tile's rescale
  float* sInv = sAlpha + kH16Heads;                                          // per head: 1 / sum of weights
  float* sLse2 = sInv + kH16Heads;                                           // per head: base-2 LSE
  const int soft_head = kSoftmaxHeadsPerWarp * warp + (lane >> 3), soft_col = kSoftmaxCols * (lane & 7);
  float soft_m = -INFINITY, soft_l = 0.0f;

  ptx::cp_async_wait_group<kH16Stages - 2>();
  __syncthreads();  // sub_begin's records landed
  for (int t = sub_begin; t < sub_end; ++t) {
    issue_group(t + kH16Stages - 1);  // into sub-tile t - 1's buffers, which every warp has left
    const uint8_t* raw = raw_of(t);
    const float* mask = mask_of(t);
    if (kStageSkip & 16) {  // the copy pipeline alone
      ptx::cp_async_wait_group<kH16Stages - 2>();
      __syncthreads();
      continue;
    }

    // 2. K fragments of entries 8j + g (masked entries are zero records), then this warp's
    //    partial scores.
    uint32_t kl[kCols][kKSteps][2], kr[kCols][2];
#pragma unroll
    for (int j = 0; j < kCols; ++j) {
      const uint8_t* rec = raw + (8 * j + g) * F::kRecordBytes;
      const uint4 nib = *reinterpret_cast<const uint4*>(rec + L::kLatentOffset + latent0 / 2);
      const uint32_t words[4] = {nib.x, nib.y, nib.z, nib.w};
      // The lane's two NVFP4 groups: words 0-1 and 2-3.
      const uint32_t sc = *reinterpret_cast<const uint16_t*>(rec + L::kGroupScaleOffset + latent0 / L::kGroupSize);
      const float2 d = e4m3x2_to_float2(sc);
      const uint32_t dpair[2] = {e2m1_pair_scale(d.x), e2m1_pair_scale(d.y)};
#pragma unroll
      for (int wd = 0; wd < 4; ++wd) {
        uint32_t pr[4];
        codec::e2m1x8_to_bf16_pairs(words[wd], pr);
#pragma unroll
        for (int e = 0; e < 4; ++e) kl[j][2 * wd + e / 2][e % 2] = bf16x2_mul(pr[e], dpair[wd / 2]);
      }
      if constexpr (F::spec.rope == RopeEncoding::fp8) {
        const uint32_t b = *reinterpret_cast<const uint32_t*>(rec + L::kRopeOffset + rope0);
        kr[j][0] = e4m3x2_to_bf16x2(b);
        kr[j][1] = e4m3x2_to_bf16x2(b >> 16);
      } else {
        const uint2 b = *reinterpret_cast<const uint2*>(rec + L::kRopeOffset + 2 * rope0);
        kr[j][0] = b.x;
        kr[j][1] = b.y;
      }
    }
    float acc[kCols][4] = {}, acc_rope[kCols][4] = {};  // [column block][fragment]
    if (!(kStageSkip & 2)) {
#pragma unroll
      for (int kk = 0; kk < kKSteps; ++kk) {
        uint32_t a[4];
        ptx::ldmatrix_x4(a, q_lane + kk * kH16Heads * 16);
#pragma unroll
        for (int j = 0; j < kCols; ++j) ptx::mma_bf16_16816(acc[j], a, kl[j][kk][0], kl[j][kk][1]);
      }
      uint32_t a[4];
      ptx::ldmatrix_x4(a, q_lane + kKSteps * kH16Heads * 16);
#pragma unroll
      for (int j = 0; j < kCols; ++j) ptx::mma_bf16_16816(acc_rope[j], a, kr[j][0], kr[j][1]);
    }
    // This lane's score columns 8j + 2 t4 + e: outer scales (pair_scaled_record_scales; finite
    // for masked entries too).
    float col_latent[kCols][2], col_rope[kCols][2];
#pragma unroll
    for (int j = 0; j < kCols; ++j)
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const RecordScales sc = pair_scaled_record_scales<F>(raw + (8 * j + 2 * t4 + e) * F::kRecordBytes, p.layer_scale);
        col_latent[j][e] = sc.latent;
        col_rope[j][e] = sc.rope;
      }
    float* my_s = sS + (warp * kH16Heads + g) * kSStride + 2 * t4;
#pragma unroll
    for (int j = 0; j < kCols; ++j)
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        float part[2];
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const int i = 2 * r + e;
          part[e] = acc[j][i] * col_latent[j][e] + acc_rope[j][i] * col_rope[j][e];
        }
        *reinterpret_cast<float2*>(my_s + 8 * r * kSStride + 8 * j) = make_float2(part[0], part[1]);
      }
    // The softmax's own inputs from this sub-tile's records, loaded before the barrier so that
    // their latency is not on the softmax's path: its entries' latent scales and masks.
    float soft_c[kSoftmaxCols], soft_mask[kSoftmaxCols];
#pragma unroll
    for (int i = 0; i < kSoftmaxCols; ++i) {
      soft_c[i] = pair_scaled_record_scales<F>(raw + (soft_col + i) * F::kRecordBytes, p.layer_scale).latent;
      soft_mask[i] = mask[soft_col + i];
    }
    __syncthreads();  // every warp's partial scores of t are in sS

    // 3. The softmax of this lane's head and kSoftmaxCols entries: full scores (sum of the four
    //    warps' partials), masked; lazy reference; weights carrying each entry's latent scale,
    //    as a BF16 part and its BF16 remainder in shared memory, with the head's rescale factor.
    {
      float sc[kSoftmaxCols];
#pragma unroll
      for (int i = 0; i < kSoftmaxCols; i += 2) {
        float2 sum = make_float2(0.0f, 0.0f);
#pragma unroll
        for (int w2 = 0; w2 < kH16Warps; ++w2) {
          const float2 x = *reinterpret_cast<const float2*>(sS + (w2 * kH16Heads + soft_head) * kSStride + soft_col + i);
          sum.x += x.x;
          sum.y += x.y;
        }
        sc[i] = fmaf(sum.x, p.scale_log2, soft_mask[i]);
        sc[i + 1] = fmaf(sum.y, p.scale_log2, soft_mask[i + 1]);
      }
      float mx = sc[0];
#pragma unroll
      for (int i = 1; i < kSoftmaxCols; ++i) mx = fmaxf(mx, sc[i]);
      // The head's maximum only matters when it moves the lazy reference; one vote finds out
      // whether any lane of the warp has a score that would (rare once the first sub-tiles are
      // in), and only then do the heads reduce their maxima (three dependent shuffles less on the
      // common path, same reference and weights either way).
      LazyStep step = lazy_reference_kept(soft_m);
      if (__any_sync(0xFFFFFFFFu, mx > soft_m + kLazyRescaleLog2)) {
        mx = fmaxf(mx, __shfl_xor_sync(0xFFFFFFFFu, mx, 1));
        mx = fmaxf(mx, __shfl_xor_sync(0xFFFFFFFFu, mx, 2));
        mx = fmaxf(mx, __shfl_xor_sync(0xFFFFFFFFu, mx, 4));
        step = lazy_reference_step(mx, soft_m);
      }
      const float m_use = step.m_use, alpha = step.alpha;
      float e_sum = 0.0f;
#pragma unroll
      for (int i = 0; i < kSoftmaxCols; i += 2) {
        const float e0 = ptx::exp2_approx(sc[i] - m_use), e1 = ptx::exp2_approx(sc[i + 1] - m_use);
        e_sum += e0 + e1;
        const Bf16Split a = bf16_split_pair(e0 * soft_c[i], e1 * soft_c[i + 1]);
        *reinterpret_cast<uint32_t*>(sP + soft_head * kPStride + soft_col + i) = a.hi;
        *reinterpret_cast<uint32_t*>(sP + (kH16Heads + soft_head) * kPStride + soft_col + i) = a.lo;
      }
      soft_l = fmaf(soft_l, alpha, e_sum);
      if ((lane & 7) == 0) sAlpha[soft_head] = alpha;
    }
    ptx::cp_async_wait_group<kH16Stages - 2>();
    __syncthreads();  // P of t is in shared memory; sub-tile t + 1's records landed

    // 4. O += P V: P (a BF16 part and its BF16 remainder) as A fragments by ldmatrix; V (k =
    //    entries, n = 8 dims) is each K fragment register transposed.
    const float alpha[2] = {sAlpha[g], sAlpha[g + 8]};
    rescale_rows(o, alpha);
    if (!(kStageSkip & 4)) {
#pragma unroll
      for (int e16 = 0; e16 < kCols / 2; ++e16) {  // 16 entries: column blocks 2 e16 and 2 e16 + 1
        uint32_t a[4], a_lo[4];
        const __nv_bfloat16* p_lane = sP + (lane & 15) * kPStride + 16 * e16 + 8 * (lane >> 4);
        ptx::ldmatrix_x4(a, p_lane);
        ptx::ldmatrix_x4(a_lo, p_lane + kH16Heads * kPStride);
#pragma unroll
        for (int kk = 0; kk < kKSteps; ++kk)
#pragma unroll
          for (int slot = 0; slot < 2; ++slot) {
            const uint32_t v0 = ptx::movmatrix_trans(kl[2 * e16][kk][slot]), v1 = ptx::movmatrix_trans(kl[2 * e16 + 1][kk][slot]);
            ptx::mma_bf16_16816(o[2 * kk + slot], a, v0, v1);
            ptx::mma_bf16_16816(o[2 * kk + slot], a_lo, v0, v1);
          }
      }
    }
  }
  ptx::cp_async_wait_group<0>();  // no copy outlives the kernel

  // Row totals: each head's owner lanes reduce their sums and publish 1 / l and the LSE.
  soft_l += __shfl_xor_sync(0xFFFFFFFFu, soft_l, 1);
  soft_l += __shfl_xor_sync(0xFFFFFFFFu, soft_l, 2);
  soft_l += __shfl_xor_sync(0xFFFFFFFFu, soft_l, 4);
  if ((lane & 7) == 0) {
    sInv[soft_head] = soft_l > 0.0f ? 1.0f / soft_l : 0.0f;
    sLse2[soft_head] = soft_l > 0.0f ? soft_m + log2f(soft_l) : -INFINITY;
  }
  __syncthreads();
  RowTotals tot;
  tot.inv[0] = sInv[g];
  tot.inv[1] = sInv[g + 8];
  tot.lse2[0] = sLse2[g];
  tot.lse2[1] = sLse2[g + 8];

  // Output: lane (g, t4) holds heads g and g + 8 over its whole 32-dim block (o[2 kk + slot]
  // columns 2 t4 + h are dims perm_dim(kk, slot, h)); stored in dim order, 16 bytes at a time.
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int h = g + 8 * r;
    if (h >= heads_here) continue;
    float v[kLatentPerLane];
#pragma unroll
    for (int kk = 0; kk < kKSteps; ++kk)
#pragma unroll
      for (int slot = 0; slot < 2; ++slot)
#pragma unroll
        for (int hh = 0; hh < 2; ++hh) v[perm_dim(kk, slot, hh)] = o[2 * kk + slot][2 * r + hh] * tot.inv[r];
    const int64_t rh = static_cast<int64_t>(row) * p.heads + head0 + h;
    const bool writes_lse = warp == 0 && t4 == 0;
    if (p.splits == 1) {
      uint4* dst = reinterpret_cast<uint4*>(p.out + rh * kLatentDim + latent0);
#pragma unroll
      for (int c = 0; c < kLatentPerLane / 8; ++c)
        dst[c] = make_uint4(ptx::pack_bf16x2(v[8 * c], v[8 * c + 1]), ptx::pack_bf16x2(v[8 * c + 2], v[8 * c + 3]),
                            ptx::pack_bf16x2(v[8 * c + 4], v[8 * c + 5]), ptx::pack_bf16x2(v[8 * c + 6], v[8 * c + 7]));
      if (writes_lse) p.lse[rh] = p.lse_base2 ? tot.lse2[r] : tot.lse2[r] * kLn2;
    } else {
      const int64_t ps = rh * p.splits + split;
      if (p.partials_bf16) {
        uint4* dst = reinterpret_cast<uint4*>(static_cast<__nv_bfloat16*>(p.part_out) + ps * kLatentDim + latent0);
#pragma unroll
        for (int c = 0; c < kLatentPerLane / 8; ++c)
          dst[c] = make_uint4(ptx::pack_bf16x2(v[8 * c], v[8 * c + 1]), ptx::pack_bf16x2(v[8 * c + 2], v[8 * c + 3]),
                              ptx::pack_bf16x2(v[8 * c + 4], v[8 * c + 5]), ptx::pack_bf16x2(v[8 * c + 6], v[8 * c + 7]));
      } else {
        float4* dst = reinterpret_cast<float4*>(static_cast<float*>(p.part_out) + ps * kLatentDim + latent0);
#pragma unroll
        for (int c = 0; c < kLatentPerLane / 4; ++c) dst[c] = make_float4(v[4 * c], v[4 * c + 1], v[4 * c + 2], v[4 * c + 3]);
      }
      if (writes_lse) p.part_lse[ps] = tot.lse2[r];
    }
  }
}

}  // namespace

template <class F>
void launch_decode_h16(const DecodeParams& p, int rows, int head_groups, cudaStream_t stream) {
  using Smem = H16Smem<F>;
  static PerDevice<bool> opted_in;
  opt_in_shared_memory(opted_in, sparse_decode_h16_kernel<F>, static_cast<int>(Smem::total),
                       "sparse decode (16 heads): shared memory opt-in");
  sparse_decode_h16_kernel<F><<<decode_grid(rows, head_groups, p.splits), kH16Threads, Smem::total, stream>>>(p);
  check_launch("sparse decode (16 heads) kernel launch");
}

}  // namespace nvfp4mla::cuda
