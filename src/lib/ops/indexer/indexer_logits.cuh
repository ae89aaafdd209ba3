#pragma once
// The indexer logits kernel (indexer.h semantics), shared by the ragged and paged forms.
//
// Work: a block takes a "query block" of kRows rows (kRows = kN / kHp: each row's heads padded
// to kHp columns of the N side of the MMA) and a chunk of relative columns [c0, c1). Row r needs
// the keys [start_r + c0, start_r + min(c1, len_r)); the block walks 64-key tiles over the union
// of those ranges, skipping gaps (rows of different sequences in one block), and writes -inf to
// its columns in [len_r, c1).
//
// Product: for a 64-key tile, D[key, column] = k . q over the 128 dims is one warpgroup MMA of
// M = 64 keys (A, the tile) by N = kN query columns (B, the query block, loaded once), K = 128 as
// four k32 steps on E4M3 operands with fp32 accumulators. Each thread then holds two keys x
// kN / 4 columns; it sums w * max(d, 0) over its columns of each row, a quad shuffle completes
// the head sums, and one multiply by the key's scale gives the logit
// (s * sum_h w_h max(d_h, 0), as indexer.h pins it).
//
// Pipeline: two warpgroups, each with its own kStages-deep cp.async ring of tiles (64 x 128
// bytes + 64 scales) and its own named barrier, take alternate tiles; they drift apart so that
// one's epilogue (CUDA cores) overlaps the other's MMA (tensor cores). Everything a warpgroup
// loads it also consumes, so no cross-warpgroup synchronization is needed after the setup.
//
// Shared-memory operands use the tensor cores' 128-byte-swizzled layout (indexer_schedule.h's
// core_offset; wgmma layout type 1): one 128-byte row per key or query column, 16-byte pieces
// permuted within the row by the row's index in its 8-row atom, atoms 1024 bytes apart (SBO);
// step s of K starts 32 s bytes in. The mma.sync engine (sm_89 and later) reads the same layout
// with ldmatrix, and its per-warp accumulator layout equals wgmma's, so the epilogue is shared.
#include <cuda_runtime.h>

#include <climits>
#include <cstdint>

#include "nvfp4mla/index_key.h"
#include "ops/indexer/indexer_schedule.h"
#include "ops/indexer/wgmma_fp8.cuh"
#include "ops/sparse_mla/mma_sm80.cuh"

namespace nvfp4mla::cuda::indexer_kernels {

using namespace indexer_schedule;

enum class Mma { wgmma, mma_sync };
enum class Source { contiguous, paged };

inline constexpr int kStages = 4;  // tiles in flight per warpgroup
inline constexpr int kThreads = 128 * kGroups;
inline constexpr int kDim = index_key::kDim;
inline constexpr int kTileBytes = kTileKeys * kDim;  // 8 KB

struct Params {
  const uint8_t* q;
  const float* weights;
  int heads;
  int64_t rows;  // ragged: rows; paged: requests * next_n
  // ragged
  const int32_t* row_starts;
  const int32_t* row_ends;
  const uint8_t* key_values;
  int64_t key_value_stride;
  const float* key_scales;
  int64_t key_scale_stride;
  // paged
  const uint8_t* cache;
  int32_t page_size;
  const int32_t* block_table;
  int64_t block_table_stride;
  const int32_t* context_lens;
  int next_n;
  int qblocks_per_request;
  // output
  float* logits;
  int64_t stride;
  int64_t chunk;  // columns per block along grid y, a multiple of kTileKeys
  const unsigned long long* invalid_count;
};

// Operands first: every tile starts at a multiple of 1024 bytes (swizzle atoms).
template <int kN>
struct Layout {
  static constexpr int q_off = 0;                                       // kN x 128 bytes
  static constexpr int keys_off = q_off + kN * kDim;                    // kGroups x kStages tiles
  static constexpr int scales_off = keys_off + kGroups * kStages * kTileBytes;
  static constexpr int w_off = scales_off + kGroups * kStages * kTileKeys * 4;
  static constexpr int rows_off = w_off + kN * 4;                       // RowRange per row
  static constexpr int bytes(int rows) { return rows_off + rows * 16; }
  static_assert(keys_off % kSwizzleAtomBytes == 0 && kTileBytes % kSwizzleAtomBytes == 0);
};

template <Source S>
struct KeySource {
  const Params& p;
  int64_t request;
  // Pointers of key `key` (a key index of the buffer, or a token position of the request).
  __device__ __forceinline__ void locate(int32_t key, const uint8_t*& values, const float*& scale) const {
    if constexpr (S == Source::contiguous) {
      values = p.key_values + key * p.key_value_stride;
      scale = p.key_scales + key * p.key_scale_stride;
    } else {
      const uint32_t pos = static_cast<uint32_t>(key), ps = static_cast<uint32_t>(p.page_size);
      const int64_t page = p.block_table[request * p.block_table_stride + pos / ps];
      const uint8_t* base = p.cache + page * (int64_t(ps) * index_key::kRecordBytes);
      const uint32_t off = pos % ps;
      values = base + off * index_key::kValueBytes;
      scale = reinterpret_cast<const float*>(base + int64_t(ps) * index_key::kValueBytes + off * index_key::kScaleBytes);
    }
  }
};

template <Source S>
__device__ __forceinline__ void load_tile(const KeySource<S>& src, int32_t k0, int32_t key_limit, uint8_t* vals,
                                          float* scales, int tid) {
#pragma unroll
  for (int u = 0; u < kTileKeys * 8 / 128; ++u) {
    int t, c;
    piece_of(tid + 128 * u, t, c);
    const int64_t key = int64_t(k0) + t;
    const bool valid = key < key_limit;
    const uint8_t* v = src.p.q;  // any valid address: nothing is read when the size is 0
    const float* s;
    if (valid) src.locate(static_cast<int32_t>(key), v, s);
    ptx::cp_async_16_zfill(vals + core_offset(t, c), v + (valid ? c * 16 : 0), valid ? 16 : 0);
  }
  if (tid < kTileKeys) {
    const int64_t key = int64_t(k0) + tid;
    const bool valid = key < key_limit;
    const uint8_t* v;
    const float* s = src.p.weights;
    if (valid) src.locate(static_cast<int32_t>(key), v, s);
    ptx::cp_async_4_zfill(scales + tid, s, valid ? 4 : 0);
  }
}

// D = tile x query block for one warpgroup (warp `warp` of it holds keys 16 warp .. +15).
template <Mma E, int kN>
__device__ __forceinline__ void tile_product(float (&acc)[kN / 8][4], const uint8_t* tile, const uint8_t* qs, int warp,
                                             int lane) {
  if constexpr (E == Mma::wgmma) {
    const uint64_t da = wgmma::smem_desc_sw128(ptx::smem_addr(tile), kSwizzleAtomBytes);
    const uint64_t db = wgmma::smem_desc_sw128(ptx::smem_addr(qs), kSwizzleAtomBytes);
    wgmma::fence_operand(acc);
    wgmma::fence();
#pragma unroll
    for (int s = 0; s < kDim / 32; ++s)
      wgmma::m64nk32_e4m3<kN / 8>(acc, wgmma::desc_advance(da, 32 * s), wgmma::desc_advance(db, 32 * s), s > 0);
    wgmma::commit();
    wgmma::wait<0>();
    wgmma::fence_operand(acc);
  } else {
#pragma unroll
    for (int j = 0; j < kN / 8; ++j) acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.0f;
    const int i = lane >> 3, r = lane & 7;
#pragma unroll
    for (int s = 0; s < kDim / 32; ++s) {
      // A: matrices (keys 0-7, K piece 2s), (8-15, 2s), (0-7, 2s+1), (8-15, 2s+1) of this warp.
      uint32_t a[4];
      ptx::ldmatrix_x4(a, tile + core_offset(16 * warp + (i & 1) * 8 + r, 2 * s + (i >> 1)));
#pragma unroll
      for (int nb = 0; nb < kN / 16; ++nb) {
        // B: matrices (columns 16nb..+7, piece 2s), (same, 2s+1), (16nb+8..+15, 2s), (same, 2s+1).
        uint32_t b[4];
        ptx::ldmatrix_x4(b, qs + core_offset(16 * nb + (i >> 1) * 8 + r, 2 * s + (i & 1)));
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
#pragma unroll
        for (int h = 0; h < 2; ++h)
          asm volatile(
              "mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
              "{%0,%1,%2,%3};\n"
              : "+f"(acc[2 * nb + h][0]), "+f"(acc[2 * nb + h][1]), "+f"(acc[2 * nb + h][2]), "+f"(acc[2 * nb + h][3])
              : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[2 * h]), "r"(b[2 * h + 1]));
#endif
      }
    }
  }
}

// One block per SM for the wide query blocks, and for mma.sync, whose B fragments need the
// registers (two blocks of 128 columns spill there); two for wgmma with 128 columns.
template <Mma E, Source S, int kHp, int kN>
__global__ void __launch_bounds__(kThreads, (kN == 256 || E == Mma::mma_sync) ? 1 : 2) indexer_logits_kernel(const Params p) {
  constexpr int kRows = kN / kHp;
  using L = Layout<kN>;
  if (*p.invalid_count != 0) return;  // bad metadata: write nothing
  extern __shared__ __align__(1024) uint8_t smem[];  // swizzle atoms are 1024-byte aligned
  uint8_t* sq = smem + L::q_off;
  float* sw = reinterpret_cast<float*>(smem + L::w_off);
  RowRange* rr = reinterpret_cast<RowRange*>(smem + L::rows_off);
  const int tid = threadIdx.x;

  // ---- setup: the block's rows, their ranges in this chunk, the query block ----------------
  int64_t request = 0, first_row;
  int rows_here;
  if constexpr (S == Source::paged) {
    request = blockIdx.x / p.qblocks_per_request;
    const int first_i = (blockIdx.x % p.qblocks_per_request) * kRows;
    first_row = request * p.next_n + first_i;
    rows_here = min(kRows, p.next_n - first_i);
  } else {
    first_row = int64_t(blockIdx.x) * kRows;
    rows_here = p.rows - first_row < kRows ? static_cast<int>(p.rows - first_row) : kRows;
  }
  const int64_t c0 = int64_t(blockIdx.y) * p.chunk, c1 = c0 + p.chunk < p.stride ? c0 + p.chunk : p.stride;
  if (tid < kRows) {
    RowRange x{0, 0, 0};
    if (tid < rows_here) {
      const int64_t row = first_row + tid;
      if constexpr (S == Source::paged) {
        const int64_t l = int64_t(p.context_lens[request]) - p.next_n + (row - request * p.next_n) + 1;
        x = row_range(0, l < 0 ? 0 : l, c0, c1, row, p.stride);
      } else {
        x = row_range(p.row_starts[row], int64_t(p.row_ends[row]) - p.row_starts[row], c0, c1, row, p.stride);
      }
    }
    rr[tid] = x;
  }
  for (int idx = tid; idx < kN * 8; idx += kThreads) {
    int n, c;
    piece_of(idx, n, c);
    const int r = n / kHp, h = n % kHp;
    const bool valid = r < rows_here && h < p.heads;
    const uint8_t* src = p.q + (valid ? ((first_row + r) * p.heads + h) * kDim + c * 16 : 0);
    ptx::cp_async_16_zfill(sq + core_offset(n, c), src, valid ? 16 : 0);
  }
  ptx::cp_async_commit();
  for (int n = tid; n < kN; n += kThreads) {
    const int r = n / kHp, h = n % kHp;
    sw[n] = (r < rows_here && h < p.heads) ? p.weights[(first_row + r) * p.heads + h] : 0.0f;
  }
  ptx::cp_async_wait_all();
  wgmma::fence_proxy_async_smem();
  __syncthreads();

  // -inf past each row's length in this chunk's columns.
  for (int r = 0; r < rows_here; ++r) {
    float* out = p.logits + (first_row + r) * p.stride;
    for (int64_t j = first_tail_column(rr[r], c0) + tid; j < c1; j += kThreads) out[j] = -INFINITY;
  }
  const Span span = span_of<kRows>(rr);
  if (span.lo >= span.hi) return;

  // ---- per-warpgroup pipeline ----------------------------------------------------------------
  const int group = tid / 128, gtid = tid % 128, warp = gtid / 32, lane = tid % 32;
  uint8_t* ring = smem + L::keys_off + group * kStages * kTileBytes;
  float* scale_ring = reinterpret_cast<float*>(smem + L::scales_off) + group * kStages * kTileKeys;
  const KeySource<S> src{p, request};
  const TileWalk<kRows> walk{rr, span};
  int32_t load_k = walk.first(group), comp_k = load_k;
#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) {
    if (load_k != INT_MAX) {
      load_tile<S>(src, load_k, span.hi, ring + s * kTileBytes, scale_ring + s * kTileKeys, gtid);
      load_k = walk.advance(load_k);
    }
    ptx::cp_async_commit();
  }
  const int g4 = lane >> 2, c4 = lane & 3;
  for (int it = 0; comp_k != INT_MAX; ++it) {
    const int stage = it % kStages;
    ptx::cp_async_wait_group<kStages - 2>();
    wgmma::fence_proxy_async_smem();
    ptx::named_barrier_sync(1 + group, 128);  // tile `it` landed; tile it-1 fully consumed
    if (load_k != INT_MAX) {
      const int ls = (it + kStages - 1) % kStages;
      load_tile<S>(src, load_k, span.hi, ring + ls * kTileBytes, scale_ring + ls * kTileKeys, gtid);
      load_k = walk.advance(load_k);
    }
    ptx::cp_async_commit();

    float acc[kN / 8][4];
    tile_product<E, kN>(acc, ring + stage * kTileBytes, sq, warp, lane);

    // Epilogue: keys kt[e] = 16 warp + g4 + 8 e of the tile; columns 8j + 2 c4 + {0, 1}.
    float part[kRows][2];
#pragma unroll
    for (int r = 0; r < kRows; ++r) part[r][0] = part[r][1] = 0.0f;
#pragma unroll
    for (int j = 0; j < kN / 8; ++j) {
      constexpr int kBlocksPerRow = kHp / 8;
      const int r = j / kBlocksPerRow;
      const float2 w = *reinterpret_cast<const float2*>(sw + 8 * j + 2 * c4);
      part[r][0] = fmaf(w.x, fmaxf(acc[j][0], 0.0f), part[r][0]);
      part[r][0] = fmaf(w.y, fmaxf(acc[j][1], 0.0f), part[r][0]);
      part[r][1] = fmaf(w.x, fmaxf(acc[j][2], 0.0f), part[r][1]);
      part[r][1] = fmaf(w.y, fmaxf(acc[j][3], 0.0f), part[r][1]);
    }
#pragma unroll
    for (int r = 0; r < kRows; ++r)
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        part[r][e] += __shfl_xor_sync(0xFFFFFFFFu, part[r][e], 1);
        part[r][e] += __shfl_xor_sync(0xFFFFFFFFu, part[r][e], 2);
      }
    const float* sc = scale_ring + stage * kTileKeys;
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      const int kt = 16 * warp + g4 + 8 * e;
      const int64_t key = int64_t(comp_k) + kt;
      const float scale = sc[kt];
#pragma unroll
      for (int r = 0; r < kRows; ++r) {
        if ((r & 3) != c4) continue;  // the quad's lanes share the rows out
        const RowRange x = rr[r];
        if (key >= x.lo && key < x.hi) p.logits[x.out_off + key] = scale * part[r][e];
      }
    }
    comp_k = walk.advance(comp_k);
  }
}

// Launches the kernel for heads padded to kHp with N = n (128 or 256) query columns. Each
// instantiation lives in its own translation unit (indexer_logits_h*.cu).
template <int kHp>
void launch_for_heads(Mma mma, Source source, int n, const Params& p, dim3 grid, cudaStream_t stream);

}  // namespace nvfp4mla::cuda::indexer_kernels

// The definition, included by the per-head-count translation units only.
#ifdef NVFP4MLA_INDEXER_INSTANTIATE
#include <mutex>
#include <string>

#include "device/cuda_check.h"
#include "nvfp4mla/error.h"

namespace nvfp4mla::cuda::indexer_kernels {

template <Mma E, Source S, int kHp, int kN>
void launch_one(const Params& p, dim3 grid, cudaStream_t stream) {
  constexpr int bytes = Layout<kN>::bytes(kN / kHp);
  static std::once_flag once;
  std::call_once(once, [] {
    check(cudaFuncSetAttribute(indexer_logits_kernel<E, S, kHp, kN>, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes),
          "indexer logits: shared memory attribute");
  });
  indexer_logits_kernel<E, S, kHp, kN><<<grid, kThreads, bytes, stream>>>(p);
  check_launch("indexer logits kernel launch");
}

template <Mma E, Source S, int kHp>
void launch_n(int n, const Params& p, dim3 grid, cudaStream_t stream) {
  if (n == 128) return launch_one<E, S, kHp, 128>(p, grid, stream);
  if (n == 256) return launch_one<E, S, kHp, 256>(p, grid, stream);
  throw Error("indexer logits: unsupported query block width " + std::to_string(n));
}

template <int kHp>
void launch_for_heads(Mma mma, Source source, int n, const Params& p, dim3 grid, cudaStream_t stream) {
  if (mma == Mma::wgmma) {
    if (source == Source::paged) return launch_n<Mma::wgmma, Source::paged, kHp>(n, p, grid, stream);
    return launch_n<Mma::wgmma, Source::contiguous, kHp>(n, p, grid, stream);
  }
  if (source == Source::paged) return launch_n<Mma::mma_sync, Source::paged, kHp>(n, p, grid, stream);
  return launch_n<Mma::mma_sync, Source::contiguous, kHp>(n, p, grid, stream);
}

}  // namespace nvfp4mla::cuda::indexer_kernels
#endif
