// The staged extend (sparse_extend.h): dequantize into bf16-1152 records of the kernels' BF16
// operands (dequant_unit_words, the direct kernels' own dequantization) every slot, or only the
// attended ones (marked, numbered in slot order by a CUB exclusive scan, indices rewritten), then
// attend over the staged records. CPU reference: staging_cpu.cpp.
#include <cuda_runtime.h>

#include <cub/device/device_scan.cuh>

#include <algorithm>
#include <climits>
#include <cstdint>
#include <string>

#include "device/alignment.h"
#include "device/cuda_check.h"
#include "nvfp4mla/cuda/sparse_decode.h"
#include "nvfp4mla/cuda/sparse_extend.h"
#include "nvfp4mla/error.h"
#include "ops/sparse_mla/decode/common/decode_common.cuh"
#include "ops/sparse_mla/decode/kernel_shapes.h"
#include "ops/sparse_mla/format_dispatch.cuh"

namespace nvfp4mla::cuda {
namespace {

constexpr int kStagedBytes = layout::bf16::kRecordBytes;
constexpr int kRecordsPerBlock = 8;  // dequantization: 8 records x 36 units per block
constexpr int kEntryThreads = 256;   // marking and rewriting: one block per row
size_t align256(size_t n) { return (n + 255) / 256 * 256; }

// A staged record is its slot's K row: dequantization unit u is bytes [32u, 32u + 32).
static_assert(layout::bf16::kLatentOffset == 0 && layout::bf16::kRopeOffset == 2 * kLatentDim &&
              kStagedBytes == 32 * kUnitsPerRow);

// The slot entry `pos` of a row attends (decode_common.cuh's rules), reading no index past the
// row's length.
__device__ __forceinline__ int32_t attended_slot(const int32_t* row_indices, int len, int64_t capacity, int pos) {
  return pos < len ? attended_slot_of(capacity, len, pos, row_indices[pos]) : -1;
}

__global__ void mark_attended_kernel(const int32_t* indices, const int32_t* topk_length, int topk, int64_t capacity,
                                     int32_t* marks) {
  const int row = blockIdx.x, len = clamped_row_length(topk_length, topk, row);
  const int32_t* ri = indices + static_cast<int64_t>(row) * topk;
  for (int pos = threadIdx.x; pos < len; pos += kEntryThreads) {
    const int32_t slot = attended_slot(ri, len, capacity, pos);
    if (slot >= 0) marks[slot] = 1;  // every writer writes 1
  }
}

__global__ void rewrite_indices_kernel(const int32_t* indices, const int32_t* topk_length, int topk, int64_t capacity,
                                       const int32_t* positions, int32_t* staged_indices) {
  const int row = blockIdx.x, len = clamped_row_length(topk_length, topk, row);
  const int64_t base = static_cast<int64_t>(row) * topk;
  for (int pos = threadIdx.x; pos < topk; pos += kEntryThreads) {
    const int32_t slot = attended_slot(indices + base, len, capacity, pos);
    staged_indices[base + pos] = slot >= 0 ? positions[slot] : -1;
  }
}

// Block b dequantizes slots 8b..8b+7, one thread per (slot, 16-value unit), so a block's stores
// cover 8 whole staged records. Every slot (marks == nullptr), or the marked ones at their
// positions.
template <class F>
__global__ void __launch_bounds__(kRecordsPerBlock* kUnitsPerRow) dequantize_slots_kernel(
    const uint8_t* cache, int64_t capacity, float layer_scale, const int32_t* marks, const int32_t* positions,
    uint8_t* staged) {
  const int r = threadIdx.x / kUnitsPerRow, u = threadIdx.x % kUnitsPerRow;
  const int64_t slot = static_cast<int64_t>(blockIdx.x) * kRecordsPerBlock + r;
  if (slot >= capacity || (marks && !marks[slot])) return;
  const Words16 w = dequant_unit_words<F>(cache + slot * F::kRecordBytes, u, layer_scale);
  const int64_t to = marks ? positions[slot] : slot;
  uint4* dst = reinterpret_cast<uint4*>(staged + to * kStagedBytes + 32 * u);
  dst[0] = w.lo;
  dst[1] = w.hi;
}

}  // namespace

ExtendStagingLayout extend_staging_layout(int64_t capacity, int rows, int topk) {
  if (capacity < 0 || rows < 0 || topk <= 0) throw Error("staged extend: capacity >= 0, rows >= 0 and topk > 0 required");
  if (capacity >= INT32_MAX) throw Error("staged extend: capacity of 2^31 - 1 slots or more is not supported by int32 positions");
  ExtendStagingLayout w;
  const int64_t entries = static_cast<int64_t>(rows) * topk;
  // Streaming the whole cache costs about as much as the scattered marking and index rewriting
  // once the entries outnumber the slots (most slots are attended then).
  w.every_slot = capacity <= entries;
  if (w.every_slot) {
    w.record_capacity = capacity;
    w.total_bytes = align256(static_cast<size_t>(capacity) * kStagedBytes);
    return w;
  }
  w.record_capacity = entries;
  const size_t slots = static_cast<size_t>(capacity) + 1;
  check(cub::DeviceScan::ExclusiveSum(nullptr, w.scan_bytes, static_cast<const int32_t*>(nullptr),
                                      static_cast<int32_t*>(nullptr), static_cast<int64_t>(slots)),
        "staged extend: scan storage size");
  w.marks_offset = 0;
  w.positions_offset = w.marks_offset + align256(slots * 4);
  w.scan_offset = w.positions_offset + align256(slots * 4);
  w.records_offset = w.scan_offset + align256(w.scan_bytes);
  w.indices_offset = w.records_offset + align256(static_cast<size_t>(w.record_capacity) * kStagedBytes);
  w.total_bytes = w.indices_offset + align256(static_cast<size_t>(entries) * 4);
  return w;
}

StagedRecords stage_records(const RecordSpec& spec, const SparseMlaArgs& a, void* workspace, size_t workspace_bytes,
                            cudaStream_t stream) {
  validate_sparse_mla_args(spec, a);
  const ExtendStagingLayout w = extend_staging_layout(a.capacity, a.rows, a.topk);
  if (!workspace || workspace_bytes < w.total_bytes)
    throw Error("staged extend: workspace of " + std::to_string(w.total_bytes) + " bytes required, got " +
                std::to_string(workspace ? workspace_bytes : 0));
  if (reinterpret_cast<uintptr_t>(workspace) & 255) throw Error("staged extend: the workspace must be 256-byte aligned");
  // The dequantization reads records 16 bytes at a time (sparse_decode refuses the same).
  if (!aligned(a.cache, 16)) throw Error("staged extend: the cache must be 16-byte aligned");
  uint8_t* base = static_cast<uint8_t*>(workspace);
  uint8_t* records = base + w.records_offset;
  auto dequantize = [&](const int32_t* marks, const int32_t* positions) {
    if (a.capacity == 0) return;
    const auto blocks = static_cast<unsigned>((a.capacity + kRecordsPerBlock - 1) / kRecordsPerBlock);
    with_record_format(spec, "staged extend", [&](auto format) {
      dequantize_slots_kernel<decltype(format)><<<blocks, kRecordsPerBlock * kUnitsPerRow, 0, stream>>>(
          a.cache, a.capacity, a.layer_scale, marks, positions, records);
    });
    check_launch("staged extend: dequantize kernel");
  };
  if (w.every_slot) {
    dequantize(nullptr, nullptr);
    return {true, records, a.indices, nullptr, w.record_capacity};
  }
  auto* marks = reinterpret_cast<int32_t*>(base + w.marks_offset);
  auto* positions = reinterpret_cast<int32_t*>(base + w.positions_offset);
  auto* indices = reinterpret_cast<int32_t*>(base + w.indices_offset);
  const int64_t slots = a.capacity + 1;
  check(cudaMemsetAsync(marks, 0, static_cast<size_t>(slots) * 4, stream), "staged extend: clear marks");
  if (a.rows > 0) {
    mark_attended_kernel<<<a.rows, kEntryThreads, 0, stream>>>(a.indices, a.topk_length, a.topk, a.capacity, marks);
    check_launch("staged extend: mark kernel");
  }
  size_t scan_bytes = w.scan_bytes;
  check(cub::DeviceScan::ExclusiveSum(base + w.scan_offset, scan_bytes, marks, positions, slots, stream),
        "staged extend: slot scan");
  dequantize(marks, positions);
  if (a.rows > 0) {
    rewrite_indices_kernel<<<a.rows, kEntryThreads, 0, stream>>>(a.indices, a.topk_length, a.topk, a.capacity, positions,
                                                                 indices);
    check_launch("staged extend: index kernel");
  }
  return {false, records, indices, positions + a.capacity, w.record_capacity};
}

namespace {

// Where the tail's partials go: `out` of the walked rows from its first 256-byte boundary.
struct TailScratch {
  void* base = nullptr;
  size_t bytes = 0;
};
TailScratch tail_scratch(uint16_t* out, int walk_rows, int heads) {
  const uintptr_t at = reinterpret_cast<uintptr_t>(out), aligned_at = (at + 255) & ~uintptr_t(255);
  const size_t bytes = static_cast<size_t>(walk_rows) * heads * kLatentDim * sizeof(uint16_t);
  if (aligned_at - at >= bytes) return {};
  return {reinterpret_cast<void*>(aligned_at), bytes - (aligned_at - at)};
}

}  // namespace

ExtendStagedPlan plan_extend_staged(int rows, int heads, int topk, const ArchSpec& arch) {
  // The planner's kernel for bf16 records (sm90_ws_wide on sm_90a: single CTAs; the copying pairs
  // measured slower, plan.cpp), its CTAs walking the rows: one CTA per SM and head group, each
  // starting its next row (Q's load by TMA, the first records' copies) while it finishes one: faster
  // than one CTA per row at 64 and 128 heads (docs/PERF.md).
  const DecodePlan plan = plan_sparse_decode(kSpecBf16, rows, heads, topk, arch, 1);
  ExtendStagedPlan staged{plan, rows, {}, 0};
  DecodePlan walking = plan;
  walking.row_ctas = std::clamp(arch.sm_count / plan.num_head_groups, 1, std::max(rows, 1));
  if (decode_row_walk_unsupported(walking, kSpecBf16)) return staged;
  staged.walk = walking;
  const int tail_rows = rows % walking.row_ctas;
  if (rows <= walking.row_ctas || tail_rows == 0) return staged;
  // The tail as the planner splits it, in tiles: waves x (tiles per split + a CTA's fixed cost)
  // and about two for the merge, against the walk's one more row.
  DecodePlan tail = plan_sparse_decode(kSpecBf16, tail_rows, heads, topk, arch);
  tail.partial_bytes = 4;  // fp32 partials: only the final outputs are rounded, as in the walk
  constexpr int kMergeTiles = 2;
  const int64_t slots = static_cast<int64_t>(arch.sm_count) * tail.ctas_per_sm;
  const int64_t tail_tiles = (tail.ctas(tail_rows) + slots - 1) / slots * (tail.tiles_per_split + decode::kCtaFixedTiles) + kMergeTiles;
  const size_t scratch = decode_workspace_layout(tail, tail_rows, heads).total_bytes + 256;
  if (tail.splits < 2 || 2 * tail_tiles > plan.num_tiles ||
      scratch > static_cast<size_t>(rows - tail_rows) * heads * kLatentDim * sizeof(uint16_t))
    return staged;
  staged.walk_rows = rows - tail_rows;
  staged.tail = tail;
  staged.tail_rows = tail_rows;
  return staged;
}

void sparse_extend_staged(const RecordSpec& spec, const SparseMlaArgs& a, void* workspace, size_t workspace_bytes,
                          uint16_t* out, float* lse, cudaStream_t stream) {
  sparse_extend_staged(spec, a, plan_extend_staged(a.rows, a.heads, a.topk, current_device_arch()), workspace,
                       workspace_bytes, out, lse, stream);
}

void sparse_extend_staged(const RecordSpec& spec, const SparseMlaArgs& a, const ExtendStagedPlan& plan, void* workspace,
                          size_t workspace_bytes, uint16_t* out, float* lse, cudaStream_t stream) {
  validate_sparse_mla_args(spec, a);
  if (a.rows == 0) return;
  if (!out || !lse) throw Error("staged extend: out and lse are required");
  // What the attention would refuse, refused before the staging runs.
  if (!aligned(a.q, 16) || !aligned(out, 16) || !aligned(lse, 4))
    throw Error("staged extend: q and out must be 16-byte aligned, lse 4-byte");
  if (plan.walk_rows < 0 || plan.tail_rows < 0 || int64_t(plan.walk_rows) + plan.tail_rows != a.rows)
    throw Error("staged extend: the plan's walk_rows + tail_rows must be the rows (" + std::to_string(a.rows) +
                "); build it with plan_extend_staged");
  const TailScratch scratch = tail_scratch(out, plan.walk_rows, a.heads);
  if (plan.tail_rows > 0 &&
      scratch.bytes < decode_workspace_layout(plan.tail, plan.tail_rows, a.heads).total_bytes)
    throw Error("staged extend: the plan's tail partials do not fit the walked rows' outputs; build it with plan_extend_staged");
  const StagedRecords staged = stage_records(spec, a, workspace, workspace_bytes, stream);
  SparseMlaArgs b = a;
  b.cache = staged.record_capacity > 0 ? staged.records : nullptr;
  b.capacity = staged.record_capacity;
  b.indices = staged.indices;
  if (!staged.every_slot) b.topk_length = nullptr;  // the rewritten indices mask what lies past a row's length
  b.layer_scale = 1.0f;
  // The tail first: its partials live in the walked rows' outputs until the walk writes them.
  if (plan.tail_rows > 0) {
    const int64_t r0 = plan.walk_rows;
    sparse_decode(kSpecBf16, sparse_mla_rows(b, plan.walk_rows, plan.tail_rows), plan.tail, scratch.base, scratch.bytes,
                  out + r0 * a.heads * kLatentDim, lse + r0 * a.heads, stream);
  }
  if (plan.walk_rows > 0) sparse_decode(kSpecBf16, sparse_mla_rows(b, 0, plan.walk_rows), plan.walk, nullptr, 0, out, lse, stream);
}

}  // namespace nvfp4mla::cuda
