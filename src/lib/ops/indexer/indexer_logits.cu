// Host side of the GPU indexer logits: argument checks, the device-side metadata check, the
// work split, and the choice of instantiation (indexer_logits.cuh has the kernel).
#include <cuda_runtime.h>

#include <algorithm>
#include <climits>
#include <cstdint>
#include <string>

#include "device/alignment.h"
#include "device/cuda_check.h"
#include "device/tensor_map.cuh"
#include "nvfp4mla/cuda/indexer.h"
#include "nvfp4mla/cuda/sparse_decode.h"
#include "nvfp4mla/error.h"
#include "nvfp4mla/index_key.h"
#include "nvfp4mla/indexer.h"
#include "ops/indexer/indexer_logits.cuh"
#include "ops/indexer/indexer_logits_ws.cuh"

namespace nvfp4mla::cuda {
namespace {

namespace ik = indexer_kernels;

constexpr int kCheckBlocks = 256, kCheckThreads = 256;
constexpr unsigned kFull = 0xFFFFFFFFu;

__device__ __forceinline__ void add_bad(unsigned bad, unsigned long long* count) {
  bad = __reduce_add_sync(kFull, bad);
  if ((threadIdx.x & 31) == 0 && bad) atomicAdd(count, static_cast<unsigned long long>(bad));
}

// One count per row whose range leaves the key buffer or is longer than the stride.
__global__ void check_ragged(const int32_t* __restrict__ starts, const int32_t* __restrict__ ends, int64_t rows,
                             int64_t num_keys, int64_t stride, unsigned long long* count) {
  const int64_t step = int64_t(gridDim.x) * blockDim.x;
  // Every thread runs the same number of iterations, so the warp reduction sees all lanes.
  for (int64_t base = int64_t(blockIdx.x) * blockDim.x; base < rows; base += step) {
    const int64_t r = base + threadIdx.x;
    unsigned bad = 0;
    if (r < rows) {
      const int64_t s = starts[r], e = ends[r];
      bad = (s < 0 || s > e || e > num_keys || e - s > stride) ? 1u : 0u;
    }
    add_bad(bad, count);
  }
}

// Over (request, table entry) pairs: one count per request whose context length is negative,
// past the stride or past the table's width, and one per entry the request needs that lies
// outside the cache.
__global__ void check_paged(const int32_t* __restrict__ context_lens, const int32_t* __restrict__ table, int64_t requests,
                            int64_t table_stride, int64_t page_size, int64_t num_pages, int64_t stride,
                            unsigned long long* count) {
  const int64_t width = table_stride > 0 ? table_stride : 1, items = requests * width;
  const int64_t step = int64_t(gridDim.x) * blockDim.x;
  for (int64_t base = int64_t(blockIdx.x) * blockDim.x; base < items; base += step) {
    const int64_t i = base + threadIdx.x;
    unsigned bad = 0;
    if (i < items) {
      const int64_t b = i / width, e = i % width;
      const int64_t len = context_lens[b];
      const int64_t pages = len < 0 ? 0 : (len + page_size - 1) / page_size;
      if (e == 0 && (len < 0 || len > stride || pages > table_stride)) bad = 1;
      if (e < table_stride && e < pages) {
        const int64_t page = table[b * table_stride + e];
        bad += (page < 0 || page >= num_pages) ? 1u : 0u;
      }
    }
    add_bad(bad, count);
  }
}

unsigned check_blocks(int64_t items) {
  return static_cast<unsigned>(std::max<int64_t>(1, std::min<int64_t>(kCheckBlocks, (items + kCheckThreads - 1) / kCheckThreads)));
}

[[noreturn]] void fail(const char* op, const std::string& what) { throw Error(std::string(op) + ": " + what); }

// The tensor-core path for the current device.
ik::Mma pick_mma(IndexerMma requested, const char* op) {
  int dev = 0, major = 0, minor = 0;
  check(cudaGetDevice(&dev), "cudaGetDevice");
  check(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev), "compute capability");
  check(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev), "compute capability");
  const bool sm90 = major == 9 && minor == 0, fp8_mma = major * 10 + minor >= 89;
  switch (requested) {
    case IndexerMma::wgmma:
    case IndexerMma::wgmma_ws:
      if (!sm90) fail(op, "the wgmma kernels need an sm_90 GPU");
      return ik::Mma::wgmma;
    case IndexerMma::mma_sync:
      if (!fp8_mma) fail(op, "FP8 mma.sync needs an sm_89 or later GPU");
      return ik::Mma::mma_sync;
    default:
      if (sm90) return ik::Mma::wgmma;
      if (!fp8_mma) fail(op, "the GPU indexer logits need FP8 tensor cores (sm_89 or later)");
      return ik::Mma::mma_sync;
  }
}

int padded_heads(int heads) { return heads <= 16 ? 16 : heads <= 32 ? 32 : 64; }

// Columns per block: at least `waves` waves of blocks (short rows cost little: a block whose
// rows end before its chunk only writes -inf), chunks of at least 1024 columns, in whole key
// tiles (`unit` keys) of the kernel.
int64_t chunk_columns(int64_t qblocks, int64_t stride, int blocks_per_sm, int waves, int unit) {
  const int64_t resident = int64_t(current_sm_count()) * blocks_per_sm;
  const int64_t max_chunks = std::min<int64_t>(65535, std::max<int64_t>(1, (stride + 1023) / 1024));
  const int64_t chunks = std::clamp<int64_t>((waves * resident + qblocks - 1) / qblocks, 1, max_chunks);
  const int64_t per = (stride + chunks - 1) / chunks;
  return (per + unit - 1) / unit * unit;
}
// The two-warpgroup kernel: one block per SM with 256 columns or mma.sync, else two; 8 waves.
int64_t chunk_columns(int64_t qblocks, int64_t stride, int n, ik::Mma mma) {
  return chunk_columns(qblocks, stride, n == 256 || mma == ik::Mma::mma_sync ? 1 : 2, 8, ik::kTileKeys);
}

void launch(ik::Mma mma, ik::Source source, int heads, int n, const ik::Params& p, int64_t qblocks, cudaStream_t stream) {
  const int64_t chunks = (p.stride + p.chunk - 1) / p.chunk;
  const dim3 grid(static_cast<unsigned>(qblocks), static_cast<unsigned>(chunks));
  switch (padded_heads(heads)) {
    case 16: return ik::launch_for_heads<16>(mma, source, n, p, grid, stream);
    case 32: return ik::launch_for_heads<32>(mma, source, n, p, grid, stream);
    default: return ik::launch_for_heads<64>(mma, source, n, p, grid, stream);
  }
}

// ---- the warp-specialized ragged kernel (indexer_logits_ws.cuh) --------------------------------

// Whether TMA can map the key buffer: rows of 128 bytes key_value_stride apart (16-byte aligned
// rows are checked by the caller), strides below 2^40 bytes, at least one row.
bool keys_mappable(const IndexerRaggedArgs& a) {
  return a.num_keys >= 1 && a.key_value_stride >= ik::kDim && a.key_value_stride < (int64_t{1} << 40);
}

// The key buffer as a TMA tensor map: boxes of kWsBlockKeys rows, 128-byte swizzle (the operand
// layout of the MMAs), rows past num_keys read as zero. False when the driver cannot encode it.
bool keys_tensor_map(const IndexerRaggedArgs& a, CUtensorMap& map) {
  const EncodeTiled encode = encode_tiled();
  if (!encode) return false;
  const cuuint64_t dims[2] = {cuuint64_t(ik::kDim), static_cast<cuuint64_t>(a.num_keys)};
  const cuuint64_t strides[1] = {static_cast<cuuint64_t>(a.key_value_stride)};
  const cuuint32_t box[2] = {cuuint32_t(ik::kDim), cuuint32_t(ik::kWsBlockKeys)};
  const cuuint32_t element_strides[2] = {1, 1};
  return encode(&map, CU_TENSOR_MAP_DATA_TYPE_UINT8, 2, const_cast<uint8_t*>(a.key_values), dims, strides, box,
                element_strides, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
}

void check_common(const char* op, const void* q, const void* weights, const void* logits,
                  const unsigned long long* invalid_count) {
  if (!invalid_count) fail(op, "invalid_count (a device word) is required");
  if (!aligned(q, 16)) fail(op, "q must be 16-byte aligned");
  if (!aligned(weights, 4) || !aligned(logits, 4)) fail(op, "weights and logits must be 4-byte aligned");
}

}  // namespace

void indexer_logits(const IndexerRaggedArgs& a, unsigned long long* invalid_count, cudaStream_t stream, IndexerMma mma) {
  constexpr const char* kOp = "indexer logits (ragged, GPU)";
  validate_indexer_args(a);
  check_common(kOp, a.q, a.weights, a.logits, invalid_count);
  if (!aligned(a.key_values, 16) || a.key_value_stride % 16 != 0)
    fail(kOp, "key_values must be 16-byte aligned and key_value_stride a multiple of 16 (split per-token records "
              "into values and scales first)");
  if (!aligned(a.key_scales, 4)) fail(kOp, "key_scales must be 4-byte aligned");
  if (a.num_keys > INT32_MAX) fail(kOp, "num_keys above 2^31 - 1 is not supported (int32 ranges)");
  const ik::Mma engine = pick_mma(mma, kOp);
  check(cudaMemsetAsync(invalid_count, 0, sizeof *invalid_count, stream), kOp);
  if (a.rows == 0) return;
  check_ragged<<<check_blocks(a.rows), kCheckThreads, 0, stream>>>(a.row_starts, a.row_ends, a.rows, a.num_keys,
                                                                   a.logits_stride, invalid_count);
  check_launch(kOp);
  if (a.logits_stride == 0) return;
  ik::Params p{};
  p.q = a.q;
  p.weights = a.weights;
  p.heads = a.heads;
  p.rows = a.rows;
  p.row_starts = a.row_starts;
  p.row_ends = a.row_ends;
  p.key_values = a.key_values;
  p.key_value_stride = a.key_value_stride;
  p.key_scales = a.key_scales;
  p.key_scale_stride = a.key_scale_stride;
  p.logits = a.logits;
  p.stride = a.logits_stride;
  p.invalid_count = invalid_count;
  // The warp-specialized kernel where it applies; asked for explicitly, it must run (so that its
  // tests and benchmarks cannot silently measure the other kernel).
  const bool explicit_ws = mma == IndexerMma::wgmma_ws;
  const int hp = padded_heads(a.heads);
  if (engine == ik::Mma::wgmma && (mma == IndexerMma::automatic || explicit_ws) && hp >= 32 && keys_mappable(a)) {
    CUtensorMap keys_map;
    if (keys_tensor_map(a, keys_map)) {
      const int rows_per_block = ik::kWsQueryCols / hp;
      const int64_t qblocks = (a.rows + rows_per_block - 1) / rows_per_block;
      // One block per SM; two waves at least (each block fills and drains its key ring once).
      p.chunk = chunk_columns(qblocks, a.logits_stride, 1, 2, ik::kWsBlockKeys);
      const dim3 grid(static_cast<unsigned>(qblocks), static_cast<unsigned>((p.stride + p.chunk - 1) / p.chunk));
      if (hp == 64 ? ik::launch_ws<64>(p, keys_map, grid, stream) : ik::launch_ws<32>(p, keys_map, grid, stream)) return;
      if (explicit_ws)
        fail(kOp, "the warp-specialized kernel was compiled with a register count its setmaxnreg split does not fit");
    } else if (explicit_ws) {
      fail(kOp, "the driver could not encode the key buffer's TMA tensor map");
    }
  }
  constexpr int n = 256;
  const int64_t qblocks = (a.rows + n / hp - 1) / (n / hp);
  p.chunk = chunk_columns(qblocks, a.logits_stride, n, engine);
  launch(engine, ik::Source::contiguous, a.heads, n, p, qblocks, stream);
}

void indexer_logits(const IndexerPagedArgs& a, unsigned long long* invalid_count, cudaStream_t stream, IndexerMma mma) {
  constexpr const char* kOp = "indexer logits (paged, GPU)";
  validate_indexer_args(a);
  check_common(kOp, a.q, a.weights, a.logits, invalid_count);
  if (!aligned(a.cache, 16) || a.page_size % 4 != 0)
    fail(kOp, "the cache must be 16-byte aligned and page_size a multiple of 4 (16-byte aligned pages)");
  if (a.page_size > INT32_MAX) fail(kOp, "page_size above 2^31 - 1 is not supported");
  if (!aligned(a.block_table, 4) || !aligned(a.context_lens, 4)) fail(kOp, "block_table and context_lens must be 4-byte aligned");
  const ik::Mma engine = pick_mma(mma, kOp);
  check(cudaMemsetAsync(invalid_count, 0, sizeof *invalid_count, stream), kOp);
  if (a.requests == 0) return;
  const int64_t items = a.requests * std::max<int64_t>(1, a.block_table_stride);
  check_paged<<<check_blocks(items), kCheckThreads, 0, stream>>>(a.context_lens, a.block_table, a.requests,
                                                                 a.block_table_stride, a.page_size, a.num_pages,
                                                                 a.logits_stride, invalid_count);
  check_launch(kOp);
  if (a.logits_stride == 0) return;
  const int hp = padded_heads(a.heads);
  const int n = int64_t(a.next_n) * hp <= 128 ? 128 : 256;
  const int rows_per_block = n / hp;
  ik::Params p{};
  p.q = a.q;
  p.weights = a.weights;
  p.heads = a.heads;
  p.rows = a.rows();
  p.cache = a.cache;
  p.page_size = static_cast<int32_t>(a.page_size);
  p.block_table = a.block_table;
  p.block_table_stride = a.block_table_stride;
  p.context_lens = a.context_lens;
  p.next_n = a.next_n;
  p.qblocks_per_request = (a.next_n + rows_per_block - 1) / rows_per_block;
  p.logits = a.logits;
  p.stride = a.logits_stride;
  const int64_t qblocks = a.requests * p.qblocks_per_request;
  p.chunk = chunk_columns(qblocks, a.logits_stride, n, engine);
  p.invalid_count = invalid_count;
  launch(engine, ik::Source::paged, a.heads, n, p, qblocks, stream);
}

}  // namespace nvfp4mla::cuda
