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
// Pipeline: two warpgroups, each with its own kStages-deep (3 or 4) cp.async ring of tiles (64 x 128
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

// 256-column blocks split each tile's product into two 128-column halves with their own
// accumulators, queued back to back, so that a warpgroup sums the first half (the epilogue, on
// the CUDA cores) while the tensor cores run the second. Nothing stays in flight across a branch
// (ptxas serializes wgmma otherwise).
template <Mma E, int kN>
inline constexpr bool kSplitHalves = E == Mma::wgmma && kN == 256;
// Tiles in flight per warpgroup: 4, but 3 for the mma.sync engine's 256-column blocks, so that
// they fit the 99 KB a CTA gets on sm_89 and sm_120, the devices that engine is for (with 4:
// 101,376 bytes before the row ranges).
template <Mma E, int kN>
inline constexpr int kStages = E == Mma::mma_sync && kN == 256 ? 3 : 4;
inline constexpr int kMmaSyncSmemLimit = 99 * 1024;

// Operands first: every tile starts at a multiple of 1024 bytes (swizzle atoms).
template <int kN, int kStg>
struct Layout {
  static constexpr int q_off = 0;                                       // kN x 128 bytes
  static constexpr int keys_off = q_off + kN * kDim;                    // kGroups x kStg tiles
  static constexpr int scales_off = keys_off + kGroups * kStg * kTileBytes;
  static constexpr int w_off = scales_off + kGroups * kStg * kTileKeys * 4;
  static constexpr int rows_off = w_off + kN * 4;                       // RowRange per row
  static constexpr int bytes(int rows) { return rows_off + rows * 16; }
  static_assert(keys_off % kSwizzleAtomBytes == 0 && kTileBytes % kSwizzleAtomBytes == 0);
};

// Per-thread state of the tile loads. A thread moves the same four pieces of every tile (piece c
// of rows t0 + 16 u, indexer_schedule.h), so everything but the tile's first key is computed once:
// per tile a load costs one address multiply-add and the validity compares.
template <Source S>
struct TileLoader {
  const Params& p;
  int64_t request;
  int tid, t0, off0;               // off0: shared-memory offset of the thread's first piece
  const uint8_t* values;           // contiguous: key 0's piece; paged: the cache
  const float* scales;             // contiguous: key `tid`'s scale
  int64_t value_stride, scale_stride;
  int64_t page_bytes;              // paged: bytes of one page
  int32_t page_size, piece_col;    // paged: byte offset of the thread's piece within a key's values
  int32_t page_shift;              // log2(page_size) when a power of two, else -1
  bool page_tiles;                 // paged and every tile inside one page (see the constructor)

  __device__ __forceinline__ TileLoader(const Params& params, int64_t req, int thread) : p(params), request(req), tid(thread) {
    int c;
    piece_of(tid, t0, c);
    off0 = core_offset(t0, c);
    if constexpr (S == Source::contiguous) {
      value_stride = p.key_value_stride;
      scale_stride = p.key_scale_stride;
      values = p.key_values + t0 * value_stride + c * 16;
      scales = p.key_scales + tid * scale_stride;
    } else {
      values = p.cache;
      page_size = p.page_size;
      page_bytes = index_key::page_bytes(page_size);
      piece_col = c * 16;
      page_shift = (page_size & (page_size - 1)) == 0 ? __ffs(page_size) - 1 : -1;
    }
    // Paged blocks hold rows of one request, all starting at token 0, so their tiles start at the
    // chunk's first column plus multiples of 64: with pages of a multiple of 64 tokens a tile never
    // crosses a page.
    page_tiles = S == Source::paged && p.page_size % kTileKeys == 0 && p.chunk % kTileKeys == 0;
  }

  __device__ __forceinline__ int32_t page_of(int32_t pos) const {
    const uint32_t u = static_cast<uint32_t>(pos);
    const uint32_t entry = page_shift >= 0 ? u >> page_shift : u / static_cast<uint32_t>(page_size);
    return p.block_table[request * p.block_table_stride + entry];
  }
  __device__ __forceinline__ int32_t in_page(int32_t pos) const {
    const uint32_t u = static_cast<uint32_t>(pos);
    return static_cast<int32_t>(page_shift >= 0 ? u & static_cast<uint32_t>(page_size - 1) : u % static_cast<uint32_t>(page_size));
  }

  // The block-table entry of the tile at k0 when tiles lie in one page (read a tile ahead of its
  // loads, so that the read's latency hides behind a tile's MMA), else 0.
  __device__ __forceinline__ int32_t tile_page(int32_t k0, int32_t key_limit) const {
    if constexpr (S == Source::paged)
      if (page_tiles && k0 < key_limit) return page_of(k0);
    return 0;
  }

  // Issues the copies of the tile whose first key is k0 < key_limit (keys from key_limit on are
  // zero-filled).
  __device__ __forceinline__ void load(int32_t k0, int32_t page, int32_t key_limit, uint8_t* vals, float* scale_out) const {
    const int32_t left = key_limit - k0;  // a tile row t exists when t < left
    const void* dummy = p.q;              // any valid address: nothing is read when the size is 0
    if constexpr (S == Source::contiguous) {
      const uint8_t* g = values + int64_t(k0) * value_stride;
#pragma unroll
      for (int u = 0; u < kPiecesPerThread; ++u) {
        const bool valid = t0 + kPieceRowStep * u < left;
        ptx::cp_async_16_zfill(vals + off0 + u * kPieceOffsetStep, valid ? g : dummy, valid ? 16 : 0);
        g += kPieceRowStep * value_stride;
      }
      if (tid < kTileKeys) {
        const bool valid = tid < left;
        ptx::cp_async_4_zfill(scale_out + tid, valid ? scales + int64_t(k0) * scale_stride : dummy, valid ? 4 : 0);
      }
    } else if (page_tiles) {
      const uint8_t* base = values + int64_t(page) * page_bytes;
      const int32_t first = in_page(k0);
#pragma unroll
      for (int u = 0; u < kPiecesPerThread; ++u) {
        const int t = t0 + kPieceRowStep * u;
        const bool valid = t < left;
        ptx::cp_async_16_zfill(vals + off0 + u * kPieceOffsetStep,
                               valid ? base + index_key::value_offset_in_page(first + t) + piece_col : dummy, valid ? 16 : 0);
      }
      if (tid < kTileKeys) {
        const bool valid = tid < left;
        const uint8_t* s = base + index_key::scale_offset_in_page(first + tid, page_size);
        ptx::cp_async_4_zfill(scale_out + tid, valid ? s : dummy, valid ? 4 : 0);
      }
    } else {  // pages smaller than a tile, or not a multiple of 64 tokens: each key's own page
#pragma unroll
      for (int u = 0; u < kPiecesPerThread; ++u) {
        const int t = t0 + kPieceRowStep * u;
        const bool valid = t < left;
        const void* v = dummy;
        if (valid) v = page_start(page_of(k0 + t)) + index_key::value_offset_in_page(in_page(k0 + t)) + piece_col;
        ptx::cp_async_16_zfill(vals + off0 + u * kPieceOffsetStep, v, valid ? 16 : 0);
      }
      if (tid < kTileKeys) {
        const bool valid = tid < left;
        const void* s = dummy;
        if (valid) s = page_start(page_of(k0 + tid)) + index_key::scale_offset_in_page(in_page(k0 + tid), page_size);
        ptx::cp_async_4_zfill(scale_out + tid, s, valid ? 4 : 0);
      }
    }
  }

  __device__ __forceinline__ const uint8_t* page_start(int32_t page) const { return values + int64_t(page) * page_bytes; }
};

// Issues D = tile x (kCols query columns at qs) for one warpgroup without waiting (wgmma only).
template <int kCols>
__device__ __forceinline__ void issue_product(float (&acc)[kCols / 8][4], const uint8_t* tile, const uint8_t* qs) {
  const uint64_t da = wgmma::smem_desc_sw128(ptx::smem_addr(tile), kSwizzleAtomBytes);
  const uint64_t db = wgmma::smem_desc_sw128(ptx::smem_addr(qs), kSwizzleAtomBytes);
  wgmma::fence_operand(acc);
  wgmma::fence();
#pragma unroll
  for (int s = 0; s < kDim / 32; ++s)
    wgmma::m64nk32_e4m3<kCols / 8>(acc, wgmma::desc_advance(da, 32 * s), wgmma::desc_advance(db, 32 * s), s > 0);
  wgmma::commit();
}

// D = tile x query block for one warpgroup (warp `warp` of it holds keys 16 warp .. +15).
template <Mma E, int kN>
__device__ __forceinline__ void tile_product(float (&acc)[kN / 8][4], const uint8_t* tile, const uint8_t* qs, int warp,
                                             int lane) {
  if constexpr (E == Mma::wgmma) {
    issue_product<kN>(acc, tile, qs);
    wgmma::wait<0>();
    wgmma::fence_operand(acc);
  } else {
#pragma unroll
    for (int j = 0; j < kN / 8; ++j) acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.0f;
    const int i = lane >> 3, r = lane & 7;
    // One k32 step at a time, so that only one step's B fragments are live: with the steps
    // unrolled ptxas loads them all up front and spills (docs/PERF.md, Indexer logits).
#pragma unroll 1
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

// A block's rows [first_row, first_row + rows_here) (of request `request` in the paged form) and
// its chunk of relative columns [c0, c1).
struct QueryBlock {
  int64_t request, first_row;
  int rows_here;
  int64_t c0, c1;
};

// Block setup of the logits kernels (two-warpgroup and warp-specialized): the block's rows and
// chunk from its grid position, each row's range in the chunk into rr[0, kCols / kHp), the
// query block's kCols columns (heads padded to kHp) into sq by cp.async (committed, not waited
// for) and, when kWeights, their weights into sw in weight_slot order; kBlockThreads threads
// share the copies. Columns past a row's heads or past the rows are zero.
template <Source S, int kHp, int kCols, int kBlockThreads, bool kWeights>
__device__ __forceinline__ QueryBlock setup_query_block(const Params& p, int tid, uint8_t* sq, float* sw, RowRange* rr) {
  constexpr int kRows = kCols / kHp;
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
  for (int idx = tid; idx < kCols * 8; idx += kBlockThreads) {
    int n, c;
    piece_of(idx, n, c);
    const int r = n / kHp, h = n % kHp;
    const bool valid = r < rows_here && h < p.heads;
    const uint8_t* src = p.q + (valid ? ((first_row + r) * p.heads + h) * kDim + c * 16 : 0);
    ptx::cp_async_16_zfill(sq + core_offset(n, c), src, valid ? 16 : 0);
  }
  ptx::cp_async_commit();
  if constexpr (kWeights) {
    for (int n = tid; n < kCols; n += kBlockThreads) {
      const int r = n / kHp, h = n % kHp;
      sw[weight_slot(n)] = (r < rows_here && h < p.heads) ? p.weights[(first_row + r) * p.heads + h] : 0.0f;
    }
  }
  return QueryBlock{request, first_row, rows_here, c0, c1};
}

// -inf past each row's length in the block's chunk (after the setup's rr is visible to all).
template <int kBlockThreads>
__device__ __forceinline__ void write_tails(const Params& p, const QueryBlock& b, const RowRange* rr, int tid) {
  for (int r = 0; r < b.rows_here; ++r) {
    float* out = p.logits + (b.first_row + r) * p.stride;
    for (int64_t j = first_tail_column(rr[r], b.c0) + tid; j < b.c1; j += kBlockThreads) out[j] = -INFINITY;
  }
}

// One block per SM for the wide query blocks, and for mma.sync, whose B fragments need the
// registers (two blocks of 128 columns spill there); two for wgmma with 128 columns.
template <Mma E, Source S, int kHp, int kN>
__global__ void __launch_bounds__(kThreads, (kN == 256 || E == Mma::mma_sync) ? 1 : 2) indexer_logits_kernel(const Params p) {
  constexpr int kRows = kN / kHp, kStg = kStages<E, kN>;
  using L = Layout<kN, kStg>;
  if (*p.invalid_count != 0) return;  // bad metadata: write nothing
  extern __shared__ __align__(1024) uint8_t smem[];  // swizzle atoms are 1024-byte aligned
  uint8_t* sq = smem + L::q_off;
  float* sw = reinterpret_cast<float*>(smem + L::w_off);
  RowRange* rr = reinterpret_cast<RowRange*>(smem + L::rows_off);
  const int tid = threadIdx.x;

  // ---- setup: the block's rows, their ranges in this chunk, the query block ----------------
  const QueryBlock qb = setup_query_block<S, kHp, kN, kThreads, true>(p, tid, sq, sw, rr);
  ptx::cp_async_wait_all();
  wgmma::fence_proxy_async_smem();
  __syncthreads();
  write_tails<kThreads>(p, qb, rr, tid);
  const Span span = span_of<kRows>(rr);
  if (span.lo >= span.hi) return;

  // ---- per-warpgroup pipeline ----------------------------------------------------------------
  constexpr bool kSplit = kSplitHalves<E, kN>;
  constexpr int kAhead = kStg - 1;  // tiles loaded ahead of the one being multiplied
  const int group = tid / 128, gtid = tid % 128, warp = gtid / 32, lane = tid % 32;
  uint8_t* ring = smem + L::keys_off + group * kStg * kTileBytes;
  float* scale_ring = reinterpret_cast<float*>(smem + L::scales_off) + group * kStg * kTileKeys;
  const TileLoader<S> loader(p, qb.request, gtid);
  const TileWalk<kRows> walk{rr, span};
  int32_t load_k = walk.first(group), comp_k = load_k;
#pragma unroll
  for (int s = 0; s < kAhead; ++s) {
    if (load_k != INT_MAX) {
      loader.load(load_k, loader.tile_page(load_k, span.hi), span.hi, ring + s * kTileBytes, scale_ring + s * kTileKeys);
      load_k = walk.advance(load_k);
    }
    ptx::cp_async_commit();
  }
  int32_t ahead_page = loader.tile_page(load_k, span.hi);

  // Epilogue bookkeeping, per part of the columns (two 128-column halves when split, else one):
  // a quad's lanes (c4 = 0..3) share a key pair; between them they hold the kValues sums (row r of
  // the part, key e) of that pair, value 2 r + e, each as four partial sums. After the quad
  // reduce-scatter lane c4 holds values c4 kLaneValues .. + kLaneValues - 1 complete, and writes
  // them: the row ranges of those values are kept in registers for the whole loop.
  // 256 columns are summed as two 128-column parts with either engine (half the epilogue's
  // registers); only wgmma also splits the product.
  constexpr int kParts = kN == 256 ? 2 : 1, kPartCols = kN / kParts, kPartRows = kPartCols / kHp;
  static_assert(!kSplit || kParts == 2);
  constexpr int kValues = 2 * kPartRows, kLaneValues = kValues / 4, kLaneRows = kLaneValues >= 2 ? kLaneValues / 2 : 1;
  static_assert(kValues >= 4, "the quad reduce-scatter needs 4 values per part");
  const int g4 = lane >> 2, c4 = lane & 3;
  // Up to two row ranges stay in registers (64 and 32 heads); more (16 heads) are read from shared
  // memory, where registers would spill.
  constexpr bool kRowsInRegisters = kParts * kLaneRows <= 2;
  auto lane_row_index = [&](int part, int m) { return part * kPartRows + (c4 * kLaneValues) / 2 + m; };
  RowRange lane_rows[kRowsInRegisters ? kParts : 1][kRowsInRegisters ? kLaneRows : 1];
  if constexpr (kRowsInRegisters) {
#pragma unroll
    for (int part = 0; part < kParts; ++part)
#pragma unroll
      for (int m = 0; m < kLaneRows; ++m) lane_rows[part][m] = rr[lane_row_index(part, m)];
  }

  // Sums part `part` of the product of the tile at tile_k (ring slot `stage`) into its logits.
  // Keys kt[e] = 16 warp + g4 + 8 e of the tile; the part's columns 8 j + 2 c4 + {0, 1}.
  auto epilogue = [&](const float (&acc)[kPartCols / 8][4], int part, int32_t tile_k, int stage) {
    constexpr int kBlocksPerRow = kHp / 8;
    float vals[kValues];
#pragma unroll
    for (int v = 0; v < kValues; ++v) vals[v] = 0.0f;
#pragma unroll
    for (int jj = 0; jj < kPartCols / 16; ++jj) {
      const float4 w = *reinterpret_cast<const float4*>(sw + 4 * (4 * (part * kPartCols / 16 + jj) + c4));
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int j = 2 * jj + h, r = j / kBlocksPerRow;
        const float wx = h ? w.z : w.x, wy = h ? w.w : w.y;
        vals[2 * r] = fmaf(wx, fmaxf(acc[j][0], 0.0f), vals[2 * r]);
        vals[2 * r] = fmaf(wy, fmaxf(acc[j][1], 0.0f), vals[2 * r]);
        vals[2 * r + 1] = fmaf(wx, fmaxf(acc[j][2], 0.0f), vals[2 * r + 1]);
        vals[2 * r + 1] = fmaf(wy, fmaxf(acc[j][3], 0.0f), vals[2 * r + 1]);
      }
    }
    float send[kValues / 2];
    quad_split<kValues / 2>(vals, (c4 & 2) != 0, send);
#pragma unroll
    for (int i = 0; i < kValues / 2; ++i) vals[i] += __shfl_xor_sync(0xFFFFFFFFu, send[i], 2);
    quad_split<kValues / 4>(vals, (c4 & 1) != 0, send);
#pragma unroll
    for (int i = 0; i < kLaneValues; ++i) vals[i] += __shfl_xor_sync(0xFFFFFFFFu, send[i], 1);
    const float* sc = scale_ring + stage * kTileKeys;
#pragma unroll
    for (int i = 0; i < kLaneValues; ++i) {
      const int e = (c4 * kLaneValues + i) & 1;
      const int m = kLaneValues >= 2 ? i / 2 : 0;
      const RowRange x = kRowsInRegisters ? lane_rows[kRowsInRegisters ? part : 0][kRowsInRegisters ? m : 0] : rr[lane_row_index(part, m)];
      const int kt = 16 * warp + g4 + 8 * e;
      // Relative to the tile (tile_k + kt may pass INT32_MAX near the end of a 2^31-key buffer).
      if (kt >= x.lo - tile_k && kt < x.hi - tile_k) p.logits[x.out_off + tile_k + kt] = sc[kt] * vals[i];
    }
  };

  // Ring slot of tile `it`: it % kStg, counted rather than divided for 3 stages (a modulo by 3
  // costs the mma.sync kernels spills).
  constexpr bool kPow2 = (kStg & (kStg - 1)) == 0;
  for (int it = 0, slot = 0; comp_k != INT_MAX; ++it, slot = slot + 1 == kStg ? 0 : slot + 1) {
    const int stage = kPow2 ? it % kStg : slot;
    ptx::cp_async_wait_group<kAhead - 1>();
    wgmma::fence_proxy_async_smem();
    ptx::named_barrier_sync(1 + group, 128);  // tile `it` landed; tile it-1 fully consumed
    if (load_k != INT_MAX) {
      const int ls = kPow2 ? (it + kAhead) % kStg : (slot == 0 ? kStg - 1 : slot - 1);  // (it + kAhead) % kStg
      loader.load(load_k, ahead_page, span.hi, ring + ls * kTileBytes, scale_ring + ls * kTileKeys);
      load_k = walk.advance(load_k);
      ahead_page = loader.tile_page(load_k, span.hi);
    }
    ptx::cp_async_commit();

    const uint8_t* tile = ring + stage * kTileBytes;
    if constexpr (kSplit) {
      float first[kPartCols / 8][4], second[kPartCols / 8][4];
      issue_product<kPartCols>(first, tile, sq);
      issue_product<kPartCols>(second, tile, sq + kPartCols * kDim);
      wgmma::wait<1>();
      wgmma::fence_operand(first);
      epilogue(first, 0, comp_k, stage);
      wgmma::wait<0>();
      wgmma::fence_operand(second);
      epilogue(second, 1, comp_k, stage);
    } else {
      float whole[kN / 8][4];
      tile_product<E, kN>(whole, tile, sq, warp, lane);
#pragma unroll
      for (int part = 0; part < kParts; ++part)
        epilogue(*reinterpret_cast<const float(*)[kPartCols / 8][4]>(&whole[part * kPartCols / 8][0]), part, comp_k, stage);
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
#include "device/per_device.h"
#include "nvfp4mla/error.h"

namespace nvfp4mla::cuda::indexer_kernels {

template <Mma E, Source S, int kHp, int kN>
void launch_one(const Params& p, dim3 grid, cudaStream_t stream) {
  constexpr int bytes = Layout<kN, kStages<E, kN>>::bytes(kN / kHp);
  static_assert(E != Mma::mma_sync || bytes <= kMmaSyncSmemLimit, "the mma.sync kernels fit sm_89 and sm_120");
  static PerDevice<bool> opted_in;
  opt_in_shared_memory(opted_in, indexer_logits_kernel<E, S, kHp, kN>, bytes, "indexer logits: shared memory attribute");
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
