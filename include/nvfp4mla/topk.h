#pragma once
// Exact top-k selection (the selection half of DeepSeek Sparse Attention):
//   values fp32 [rows, stride] (int64 stride); row r has lengths[r] entries (`columns` when
//   lengths is null); entry c of a row stands for the position positions[r, c] (c +
//   position_offset when positions is null).
//   An entry is selectable unless its value is NaN or -inf (+inf is selectable). Entries are
//   ordered by value, larger first, and equal values by position, smaller first; -0.0 equals
//   +0.0. A row selects the first min(k, selectable entries) entries of that order: the k
//   largest, ties broken by the smaller position.
//   indices [rows, k] int32: the selected positions in ascending order, then -1 up to k;
//   topk_length [rows] int32: how many were selected; optional values [rows, k] fp32: the
//   selected entries' values (the input bits) in the same order, -inf in the padding.
// The result depends only on the values and positions, never on the kernel, the plan or the
// device: the GPU kernels (cuda/topk.h) equal topk_reference bit for bit.
//
// Positions (the fold): with a positions array, the selectable entries of each row must have
// strictly increasing, non-negative positions. Concatenating, in position order, the top-k
// outputs of chunks of a row (their values and indices, padding included: -inf is never
// selectable) gives such a list, and its top-k equals the top-k of the whole row
// (docs/SELECTION.md proves it).
//
// Slot transform (slots.block_table set): each selected position p of row r is written as the
// cache slot table[r / rows_per_request][p / page_size] * page_size + p % page_size (int64
// arithmetic), the layout of SparseMlaArgs::indices (sparse_mla.h), in ascending position
// order; the padding stays -1. A selected position without a valid slot (negative, its page at
// or past `pages`, a negative table entry, or a slot >= capacity or >= 2^31) is an error:
// topk_reference throws Error naming block_table before writing anything; the GPU kernels
// write -1 for it (sparse_decode masks it; topk_length still counts it) and count it in their
// error counter.
#include <cstddef>
#include <cstdint>

#include "nvfp4mla/hd.h"

namespace nvfp4mla {

inline constexpr int kTopkMaxK = 4096;

// Positions -> cache slots through a block table (see above).
struct TopkSlotMap {
  const int32_t* block_table = nullptr;  // [requests, table_stride] page ids; null = no transform
  int64_t requests = 0;
  int64_t pages = 0;          // page entries per request
  int64_t table_stride = 0;   // elements between requests (>= pages)
  int page_size = 0;          // positions per page
  int rows_per_request = 1;   // row r belongs to request r / rows_per_request
  int64_t capacity = 0;       // cache slots
};

struct TopkArgs {
  const float* values = nullptr;       // [rows, stride]
  int rows = 0;
  int64_t columns = 0;                 // entries per row; the longest row when lengths are given
  int64_t stride = 0;                  // elements between rows (>= columns)
  const int32_t* lengths = nullptr;    // [rows], each in 0..columns, or null
  const int32_t* positions = nullptr;  // [rows, stride] or null
  int64_t position_offset = 0;         // with positions null: position = column + position_offset
  int k = 0;                           // 1..kTopkMaxK
  TopkSlotMap slots;
};

struct TopkOutputs {
  int32_t* indices = nullptr;      // [rows, k]
  int32_t* topk_length = nullptr;  // [rows]
  float* values = nullptr;         // [rows, k] or null
};

// The slot of position `pos` of row `row`, or -1 when it has no valid slot (see above).
NVFP4MLA_HD int64_t topk_slot(const TopkSlotMap& m, int64_t row, int64_t pos) {
  if (pos < 0) return -1;
  const int64_t page = pos / m.page_size;
  if (page >= m.pages) return -1;
  const int32_t entry = m.block_table[(row / m.rows_per_request) * m.table_stride + page];
  if (entry < 0) return -1;
  const int64_t slot = static_cast<int64_t>(entry) * m.page_size + pos % m.page_size;
  return slot < m.capacity && slot <= INT32_MAX ? slot : -1;
}

// The checks every implementation makes on what the host can see (shapes, k, strides, pointer
// alignment, the block table's shape); throws Error naming the argument.
void validate_topk_args(const TopkArgs& args, const TopkOutputs& out);

// CPU reference: a full stable sort of each row. Host pointers. Also checks the lengths, the
// positions and the slots of the selected entries, and throws Error naming the argument before
// writing any output.
void topk_reference(const TopkArgs& args, const TopkOutputs& out);

// How the GPU divides the work (host-only, CUDA-free, so tests and callers size workspaces with
// exactly what the kernels use).
//   row_per_cta: one CTA per row, one launch (many rows, or short rows).
//   split_rows:  each row cut into `segments` segments of `segment_len` entries, one CTA each,
//                in a few launches that share per-row histograms in the workspace (few long
//                rows: 1 x 1,048,576 runs on 256 CTAs). Usually the rows are read twice: a
//                histogram of the keys' top 11 bits, then a filter that keeps the entries above
//                the k-th entry's bin and, as candidates, those in it; one CTA per row finishes
//                on the candidates. A row whose bin holds more than `candidates` entries takes
//                more histogram passes over the whole row first, so no buffer can overflow.
//   resident_rows: split rows whose CTAs all fit on the GPU at once (rows x segments <=
//                kTopkResidentCtasPerSm x SMs, segments of at most kTopkResidentMaxSegment
//                entries): one cooperative launch; each CTA reads its segment once into
//                registers, and the three histogram passes and the compaction run there, the
//                row's CTAs waiting for the one that decides each pass's digit (few rows:
//                4 x 163,840 and 1 x 1,048,576).
enum class TopkKernel : uint8_t { row_per_cta = 0, split_rows = 1, resident_rows = 2 };
const char* to_string(TopkKernel k);

struct TopkPlan {
  TopkKernel kernel = TopkKernel::row_per_cta;
  int segments = 1;         // CTAs per row
  int64_t segment_len = 0;  // entries per CTA (split_rows, resident_rows)
  int64_t candidates = 0;   // candidate entries a split row may keep (split_rows; 0: never filter)
};

inline constexpr int kTopkCtasPerSm = 2;           // the planner aims at this many CTAs per SM
inline constexpr int64_t kTopkMinSegment = 4096;   // ... without cutting rows finer than this,
inline constexpr int64_t kTopkMaxSegment = 16384;  // ... and, once it splits, not coarser than this
inline constexpr int64_t kTopkCandidates = 32768;  // the most candidates a split row may keep (and the default)
// The planner filters (two reads of the rows and a finisher CTA per row) when rows x columns is
// at least this; below it the finisher's fixed cost outweighs the two reads it saves (H200, as
// split_rows: 1 x 1,048,576 and 4 x 163,840 are faster with the three histogram passes, 64 x
// 131,072 and 16 x 1,048,576 with the filter).
inline constexpr int64_t kTopkFilterMinEntries = int64_t(1) << 23;
// Filtering plans take fewer, longer segments: about kTopkCtasPerSm CTAs per SM (rounded down) and
// at most this many entries each (H200: 64 x 131,072 took 57.3 us in 4 segments, 74.0 in 5 and
// 64.3 in 8; 16 x 1,048,576 took 90.0 us in 32, 101.2 in 64 and 122.6 in 128).
inline constexpr int64_t kTopkFilterMaxSegment = 32768;
inline constexpr int kTopkResidentCtasPerSm = 2;            // resident_rows CTAs an SM holds at once
inline constexpr int64_t kTopkResidentMaxSegment = 8192;    // the entries a resident CTA keeps in registers

// The planner: rows x segments ~ kTopkCtasPerSm x sm_count CTAs, segments of at least
// kTopkMinSegment entries; one segment per row means row_per_cta. Split rows that take the three
// passes get segments of at most kTopkMaxSegment entries (without the filter, 16 x 1,048,576 took
// 235 us in 17 segments per row, 204 in 34 and 181 in 66); filtering plans follow
// kTopkFilterMaxSegment. Split rows whose CTAs all fit at once (resident_rows' limits) run
// resident_rows. Throws Error for negative sizes or a non-positive SM count.
TopkPlan plan_topk(int rows, int64_t columns, int sm_count);
// A resident_rows plan with at least `segments` segments per row (more when a segment would pass
// kTopkResidentMaxSegment; segment_len a multiple of 256). The launch fails with an Error when
// rows x segments CTAs do not fit on the GPU at once.
TopkPlan resident_topk_plan(int64_t columns, int segments);
// A split_rows plan with `segments` segments per row (segment_len a multiple of 256) keeping up to
// `candidates` (<= kTopkCandidates) candidate entries per row (-1: min(columns, kTopkCandidates); 0 forces the three
// histogram passes); tests and benchmarks use it to run a chosen split.
TopkPlan split_topk_plan(int64_t columns, int segments, int64_t candidates = -1);
// Workspace bytes the plan needs for `rows` rows (0 for row_per_cta).
size_t topk_workspace_bytes(const TopkPlan& plan, int rows);

}  // namespace nvfp4mla
