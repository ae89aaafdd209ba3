#pragma once
// Pieces shared by the sparse decode kernels (sm80/ and sm90/): launch parameters, the top-k
// index and raw-record copies, the online softmax of a 16-row block, the final row totals and
// the output stores.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>

#include "nvfp4mla/decode_plan.h"
#include "nvfp4mla/format.h"
#include "ops/sparse_mla/mma_sm80.cuh"

// Profiling builds only (CMake NVFP4MLA_DECODE_STAGE_SKIP, default 0): the kernels leave out
// stages to show where the time goes, and their results are garbage. Bits: 1 dequantization (not
// in the 16-head kernels), 2 QK^T, 4 PV, 8 record copies (64- and 16-head kernels), 16 all
// compute (sm80_h16: the copy pipeline alone), 64 the copies of dequantized values into the peer
// CTA (the pairs), 128 the softmax of the 64-head kernels (unit weights), 256 the softmax's work
// alone (weights |score| / 64: as varied as real ones, so the tensor cores' power stays alike),
// 512 Q's load and 1024 the bulk stores of staged outputs (64-head kernels), 2048 the record
// copies of every head group but the first (bf16 records: what sharing one load between a row's
// head groups could save; the other groups attend stale K buffers).
#ifndef NVFP4MLA_DECODE_STAGE_SKIP
#define NVFP4MLA_DECODE_STAGE_SKIP 0
#endif

namespace nvfp4mla::cuda {

constexpr int kRowStride = kQkDim + 8;    // BF16 elements per Q/K smem row (pad: no bank conflicts)
constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;
constexpr int kStageSkip = NVFP4MLA_DECODE_STAGE_SKIP;

struct DecodeParams {
  const uint16_t* q;
  const uint8_t* cache;
  int64_t capacity;
  const int32_t* indices;
  const int32_t* topk_length;
  int topk, heads;
  int splits, tiles_per_split, num_tiles;
  float scale_log2;  // sm_scale * log2(e)
  float layer_scale;
  bool lse_base2;
  bool merge_in_kernel;  // splits > 1: the kernel merges them itself (merge.cuh; a cooperative launch)
  __nv_bfloat16* out;   // final output when splits == 1 or merge_in_kernel
  float* lse;
  void* part_out;       // [rows, heads, splits, 512] when splits > 1: fp32, or BF16 with partials_bf16
  float* part_lse;      // [rows, heads, splits] (base 2)
  bool partials_bf16;   // DecodePlan::partial_bytes == 2
  int rows;             // rows of this launch (the row-walking kernel's bound)
};

// A decode launch's grid: x = head group, y = row, z = split. A row's head groups are
// neighbouring CTAs, so they run at the same time and the later ones find the row's records in
// L2 instead of memory. Rows along y keep a division out of the kernel (x / groups measured
// slower on small batches). gridDim.y holds at most kMaxGridRows rows: sparse_decode launches
// more as row chunks (rows_from).
constexpr int kMaxGridRows = 65535;
inline dim3 decode_grid(int rows, int head_groups, int splits) { return dim3(head_groups, rows, splits); }
struct CtaWork {
  int row, head0, split;
};
__device__ __forceinline__ CtaWork cta_work(int head_group) {
  return {static_cast<int>(blockIdx.y), static_cast<int>(blockIdx.x) * head_group, static_cast<int>(blockIdx.z)};
}
// The parameters of rows [r0, ...) of a launch, as a launch of their own.
inline DecodeParams rows_from(const DecodeParams& p, int64_t r0) {
  DecodeParams c = p;
  const int64_t heads = p.heads, head_splits = heads * p.splits;
  c.q += r0 * heads * kQkDim;
  c.indices += r0 * p.topk;
  if (c.topk_length) c.topk_length += r0;
  c.out += r0 * heads * kLatentDim;
  c.lse += r0 * heads;
  if (c.part_out) c.part_out = static_cast<uint8_t*>(c.part_out) + r0 * head_splits * kLatentDim * (p.partials_bf16 ? 2 : 4);
  if (c.part_lse) c.part_lse += r0 * head_splits;
  return c;
}

// A row's top-k length: topk without per-row lengths, else its length clamped to [0, topk].
__device__ __forceinline__ int clamped_row_length(const int32_t* topk_length, int topk, int row) {
  if (!topk_length) return topk;
  const int n = topk_length[row];
  return n < 0 ? 0 : (n > topk ? topk : n);
}
__device__ __forceinline__ int row_length(const DecodeParams& p, int row) {
  return clamped_row_length(p.topk_length, p.topk, row);
}

// Top-k indices travel by cp.async into a shared-memory ring, in the same cp.async groups as the
// raw records, so no thread ever waits for an index load. (The register ring used before,
// shifted once per tile, waited for each index load at its first move: it prefetched one tile
// deep, and every tile paid a global-memory latency.) Entry `lane` of tile `tile` (lane < kTile);
// zero bytes, read from nowhere, past the row's length.
template <int kTile>
__device__ __forceinline__ void issue_index_copy(const DecodeParams& p, int row, int len, int tile, int32_t* ring_tile,
                                                 int lane) {
  const int pos = tile * kTile + lane;
  const int32_t* src = p.indices + static_cast<int64_t>(row) * p.topk + (pos < len ? pos : 0);
  ptx::cp_async_4_zfill(ring_tile + lane, src, pos < len ? 4 : 0);
}
// The slot of top-k position `pos` given its raw index, or -1 when the entry is masked (past the
// row's length, negative, or outside a cache of `capacity` slots).
__device__ __forceinline__ int32_t attended_slot_of(int64_t capacity, int len, int pos, int32_t idx) {
  return (pos < len && idx >= 0 && idx < capacity) ? idx : -1;
}
__device__ __forceinline__ int32_t slot_of_index(const DecodeParams& p, int len, int pos, int32_t idx) {
  return attended_slot_of(p.capacity, len, pos, idx);
}
// What the record copies do for a masked entry: skip it (its bytes stay stale, so callers must
// not let them reach the MMAs) or write zero bytes read from nowhere (cp.async with a zero source
// size: zero scales and values, so the record reaches the MMAs as exact zeros).
enum class MaskedRecords { skip, zero_fill };
// The asynchronous copies of the raw records of kCount consecutive entries from top-k position
// pos0, whose indices are at `ring`. With kIntoKRows (bf16 records) the records land as rows of a
// K tile (row stride kRowStride).
template <class F, int kThreads, int kCount, bool kIntoKRows = false, MaskedRecords kMasked = MaskedRecords::skip>
__device__ __forceinline__ void issue_record_copies(const DecodeParams& p, int len, int pos0, const int32_t* ring,
                                                    uint8_t* raw, int thread) {
  constexpr int chunks = F::kRecordBytes / 16, kIters = (kCount * chunks + kThreads - 1) / kThreads;
  constexpr size_t dst_stride = kIntoKRows ? size_t(kRowStride) * 2 : F::kRecordBytes;
  // Unrolled with a compile-time trip count: each iteration's entry and chunk depend on the
  // thread alone, so a caller's tile loop computes them once.
#pragma unroll
  for (int k = 0; k < kIters; ++k) {
    const int c = thread + k * kThreads;
    if (kCount * chunks % kThreads != 0 && c >= kCount * chunks) break;
    const int t = c / chunks, ch = c % chunks;
    const int32_t slot = slot_of_index(p, len, pos0 + t, ring[t]);
    if constexpr (kMasked == MaskedRecords::zero_fill) {
      ptx::cp_async_16_zfill(raw + t * dst_stride + 16 * ch,
                             p.cache + static_cast<int64_t>(slot < 0 ? 0 : slot) * F::kRecordBytes + 16 * ch, slot < 0 ? 0 : 16);
    } else {
      if (slot < 0) continue;
      ptx::cp_async_16(raw + t * dst_stride + 16 * ch, p.cache + static_cast<int64_t>(slot) * F::kRecordBytes + 16 * ch);
    }
  }
}

// Online softmax state of one thread: rows g and g + 8 of its warp's 16-head block. l sums the
// fp32 weights (for the LSE); l_out sums the BF16-rounded weights the PV product uses (for
// normalizing the output).
struct SoftmaxState {
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f}, l_out[2] = {0.0f, 0.0f};
};

// One tile of the online softmax (base 2). `s` holds the tile's logits (scaled, -inf where
// masked) in the MMA accumulator layout; the BF16-rounded weights come back packed (step 2).
// Lazy rescaling: the reference maximum m only moves when a tile's maximum exceeds it by more
// than kLazyRescaleLog2, so weights stay below 2^kLazyRescaleLog2 (exact in BF16's range, harmless
// to the fp32 sums) and the output accumulators are rescaled only in the rare tiles where some
// row of the warp moves its reference. Out, l and the LSE are the same quantities either way.
constexpr float kLazyRescaleLog2 = 8.0f;
// Output accumulators of a thread's two rows times their rescale factors (skipped, warp-wide,
// when no row moved its reference).
template <int NT_O>
__device__ __forceinline__ void rescale_rows(float (&o)[NT_O][4], const float (&alpha)[2]) {
  if (__any_sync(0xFFFFFFFFu, alpha[0] != 1.0f || alpha[1] != 1.0f)) {
#pragma unroll
    for (int i = 0; i < NT_O; ++i) {
      o[i][0] *= alpha[0];
      o[i][1] *= alpha[0];
      o[i][2] *= alpha[1];
      o[i][3] *= alpha[1];
    }
  }
}
// The lazy reference of one row given a tile's maximum `mx` (of scores already reduced over the
// row's lanes): moves `m` when mx exceeds it by more than kLazyRescaleLog2 (a -inf reference,
// nothing valid yet, moves to any finite maximum); returns the reference the tile's weights use
// (0 while nothing is valid) and the factor the row's earlier sums are scaled by.
struct LazyStep {
  float m_use, alpha;
};
// What lazy_reference_step returns when the tile's maximum does not exceed m + kLazyRescaleLog2.
__device__ __forceinline__ LazyStep lazy_reference_kept(float m) { return {m == -INFINITY ? 0.0f : m, 1.0f}; }
__device__ __forceinline__ LazyStep lazy_reference_step(float mx, float& m) {
  const bool move = mx > m + kLazyRescaleLog2;
  const float m_new = move ? mx : m;
  LazyStep step = lazy_reference_kept(m_new);
  if (move) step.alpha = ptx::exp2_approx(m - step.m_use);
  m = m_new;
  return step;
}
// Step 1: the tile's row maxima move the references where needed and rescale the output
// accumulators and sums; returns each row's reference for step 2 (0 while nothing is valid) and
// the factor its earlier sums were scaled by (1 unless the reference moved).
template <int NT, int NT_O>
__device__ __forceinline__ void softmax_rescale(const float (&s)[NT][4], SoftmaxState& st, float (&o)[NT_O][4],
                                                float (&m_use)[2], float (&alpha)[2]) {
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    float mx = -INFINITY;
#pragma unroll
    for (int j = 0; j < NT; ++j) mx = fmaxf(mx, fmaxf(s[j][2 * r], s[j][2 * r + 1]));
    mx = fmaxf(mx, __shfl_xor_sync(0xFFFFFFFFu, mx, 1));
    mx = fmaxf(mx, __shfl_xor_sync(0xFFFFFFFFu, mx, 2));
    const LazyStep step = lazy_reference_step(mx, st.m[r]);
    m_use[r] = step.m_use;
    alpha[r] = step.alpha;
    st.l[r] *= alpha[r];
    st.l_out[r] *= alpha[r];
  }
  rescale_rows(o, alpha);
}
// Step 2: weights 2^(s - m) rounded to BF16 (what the output product uses), packed in pairs:
// w[j][0] holds row g's columns 8j + 2*(lane%4) + {0,1}, w[j][1] row g + 8's (the mma.sync
// m16n8k16 A-operand layout, so two column blocks make one A fragment). l sums the fp32
// weights (for the LSE), l_out the rounded ones (for normalizing), read back from the packed
// words (one pack per pair instead of a conversion per value).
template <int NT>
__device__ __forceinline__ void softmax_weights(const float (&s)[NT][4], SoftmaxState& st, const float (&m_use)[2],
                                                uint32_t (&w)[NT][2]) {
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    float sum = 0.0f, sum_rounded = 0.0f;
#pragma unroll
    for (int j = 0; j < NT; ++j) {
      const float e0 = ptx::exp2_approx(s[j][2 * r] - m_use[r]), e1 = ptx::exp2_approx(s[j][2 * r + 1] - m_use[r]);
      sum += e0 + e1;
      w[j][r] = ptx::pack_bf16x2(e0, e1);
      sum_rounded += __uint_as_float(w[j][r] << 16) + __uint_as_float(w[j][r] & 0xFFFF0000u);
    }
    st.l[r] += sum;
    st.l_out[r] += sum_rounded;
  }
}
// Two fp32 weights as a BF16 pair and the BF16 pair of their remainders: two products P V carry
// the weights to about 16 bits, for kernels whose weights carry a per-entry factor outside the
// BF16 values (the rounding of a single BF16 part would move the output; normalize by the fp32 sum).
struct Bf16Split {
  uint32_t hi, lo;
};
__device__ __forceinline__ Bf16Split bf16_split_pair(float a0, float a1) {
  Bf16Split x;
  x.hi = ptx::pack_bf16x2(a0, a1);
  x.lo = ptx::pack_bf16x2(a0 - __uint_as_float(x.hi << 16), a1 - __uint_as_float(x.hi & 0xFFFF0000u));
  return x;
}
template <int NT, int NT_O>
__device__ __forceinline__ void softmax_update(const float (&s)[NT][4], SoftmaxState& st, float (&o)[NT_O][4],
                                               uint32_t (&w)[NT][2]) {
  float m_use[2], alpha[2];
  softmax_rescale(s, st, o, m_use, alpha);
  softmax_weights(s, st, m_use, w);
}

// A thread's two rows (heads hb*16 + g and + 8) once the tiles are done: the output
// normalizer 1 / l_out and the base-2 LSE (0 and -inf for a row without valid entries).
struct RowTotals {
  float inv[2], lse2[2];
};
__device__ __forceinline__ RowTotals row_totals(const SoftmaxState& st) {
  RowTotals t;
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    float l = st.l[r], lo = st.l_out[r];
    l += __shfl_xor_sync(0xFFFFFFFFu, l, 1);
    l += __shfl_xor_sync(0xFFFFFFFFu, l, 2);
    lo += __shfl_xor_sync(0xFFFFFFFFu, lo, 1);
    lo += __shfl_xor_sync(0xFFFFFFFFu, lo, 2);
    t.inv[r] = lo > 0.0f ? 1.0f / lo : 0.0f;
    t.lse2[r] = l > 0.0f ? st.m[r] + log2f(l) : -INFINITY;
  }
  return t;
}

// Final outputs (one split) of the warp-specialized kernels go through shared memory: each thread
// writes its normalized BF16 values into a row of kOutputStageRowBytes per head (the 16 bytes past
// the 512 dims put the eight heads of a warp's store in different banks), then bulk copies send
// whole 1 KB head rows to global memory (sparse_decode requires out 16-byte aligned; the kernels
// check it again, and the fallback is the direct stores of store_outputs). Stored
// straight from the fragments instead, every warp store wrote 16-byte halves of eight sectors,
// and a CTA's 64 KB took ~10,000 SM clocks to leave (256 x 128 decode trace).
constexpr int kOutputStageRowBytes = kLatentDim * 2 + 16;
__device__ __forceinline__ bool stages_outputs(const DecodeParams& p) {
  return p.splits == 1 && reinterpret_cast<uintptr_t>(p.out) % 16 == 0;
}
// This thread's normalized outputs (heads hb*16 + g and + 8, dims [dim0, +8*NT_O)) into the staged
// rows: head h's row starts at row_of(h).
template <int NT_O, class RowOf>
__device__ __forceinline__ void stage_outputs_at(RowOf row_of, const RowTotals& tot, const float (&o)[NT_O][4], int hb, int dim0, int lane) {
  const int g = lane >> 2, t4 = lane & 3;
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    uint8_t* dst = row_of(hb * 16 + g + 8 * r) + 2 * (dim0 + 2 * t4);
#pragma unroll
    for (int n = 0; n < NT_O; ++n)
      *reinterpret_cast<uint32_t*>(dst + 16 * n) = ptx::pack_bf16x2(o[n][2 * r] * tot.inv[r], o[n][2 * r + 1] * tot.inv[r]);
  }
}
// ... into rows of kOutputStageRowBytes from `stage` on.
template <int NT_O>
__device__ __forceinline__ void stage_outputs(uint8_t* stage, const RowTotals& tot, const float (&o)[NT_O][4], int hb, int dim0, int lane) {
  stage_outputs_at([stage](int h) { return stage + h * kOutputStageRowBytes; }, tot, o, hb, dim0, lane);
}
// One warp sends the staged rows of the row's heads [head0, head0 + heads_here) to p.out and waits
// until they have been read out of shared memory.
__device__ __forceinline__ void send_staged_outputs(const DecodeParams& p, const uint8_t* stage, int row, int head0, int heads_here, int lane) {
  for (int h = lane; h < heads_here; h += 32)
    ptx::bulk_store_global(p.out + (static_cast<int64_t>(row) * p.heads + head0 + h) * kLatentDim,
                           ptx::smem_addr(stage + h * kOutputStageRowBytes), kLatentDim * 2);
  ptx::bulk_commit_and_wait_read();
}
// The LSE of this thread's heads when the outputs are staged (lane t4 == 0 of each quad).
__device__ __forceinline__ void store_lse(const DecodeParams& p, const RowTotals& tot, int row, int head0, int heads_here, int hb, int lane) {
  const int g = lane >> 2, t4 = lane & 3;
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int h = hb * 16 + g + 8 * r;
    if (h < heads_here && t4 == 0) p.lse[static_cast<int64_t>(row) * p.heads + head0 + h] = p.lse_base2 ? tot.lse2[r] : tot.lse2[r] * kLn2;
  }
}

// Normalize and store this thread's outputs (heads hb*16 + g and + 8, dims [dim0, +8*NT_O)):
// the final BF16 output and LSE when there is one split, else this split's partial (fp32, or
// BF16 with partials_bf16).
template <int NT_O>
__device__ __forceinline__ void store_outputs(const DecodeParams& p, const RowTotals& tot, const float (&o)[NT_O][4],
                                              int row, int head0, int heads_here, int hb, int dim0, bool writes_lse,
                                              int split, int lane) {
  const int g = lane >> 2, t4 = lane & 3;
  if (p.splits > 1 && p.partials_bf16) {
    // A lane quad holds 8 dims of a head per block, 2 per lane: 16 bytes of BF16. Written as
    // they lie, every store would fill half a 32-byte sector (half-sector writes made the
    // partials slower than fp32 ones); so the quad trades words, and lane t4 stores dims
    // [4 t4, 4 t4 + 4) of the block pair (n, n + 1): whole sectors.
    static_assert(NT_O % 2 == 0);
    const int src = (lane & ~3) | (2 * (t4 & 1));
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int h = hb * 16 + g + 8 * r;  // uniform over the quad: the shuffles stay inside it
      const float inv = tot.inv[r];
      const int64_t ps = (static_cast<int64_t>(row) * p.heads + head0 + h) * p.splits + split;
      __nv_bfloat16* dst = static_cast<__nv_bfloat16*>(p.part_out) + ps * kLatentDim + dim0 + 4 * t4;
#pragma unroll
      for (int n = 0; n < NT_O; n += 2) {
        const uint32_t a = ptx::pack_bf16x2(o[n][2 * r] * inv, o[n][2 * r + 1] * inv);
        const uint32_t b = ptx::pack_bf16x2(o[n + 1][2 * r] * inv, o[n + 1][2 * r + 1] * inv);
        const uint32_t a0 = __shfl_sync(0xFFFFFFFFu, a, src), b0 = __shfl_sync(0xFFFFFFFFu, b, src);
        const uint32_t a1 = __shfl_sync(0xFFFFFFFFu, a, src + 1), b1 = __shfl_sync(0xFFFFFFFFu, b, src + 1);
        if (h < heads_here) *reinterpret_cast<uint2*>(dst + n * 8) = t4 < 2 ? make_uint2(a0, a1) : make_uint2(b0, b1);
      }
      if (h < heads_here && writes_lse && t4 == 0) p.part_lse[ps] = tot.lse2[r];
    }
    return;
  }
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
      float* dst = static_cast<float*>(p.part_out) + ps * kLatentDim + dim0 + 2 * t4;
#pragma unroll
      for (int n = 0; n < NT_O; ++n)
        *reinterpret_cast<float2*>(dst + n * 8) = make_float2(o[n][2 * r] * inv, o[n][2 * r + 1] * inv);
      if (writes_lse && t4 == 0) p.part_lse[ps] = lse2;
    }
  }
}

}  // namespace nvfp4mla::cuda
