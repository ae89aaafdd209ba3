#pragma once
// What the top-k kernels and the host code that sizes and checks their work share: the
// order-preserving keys, the radix digits, and the workspace layout of split_rows plans.
#include <cstddef>
#include <cstdint>

#include "nvfp4mla/hd.h"
#include "nvfp4mla/topk.h"

namespace nvfp4mla::topk_radix {

// An unsigned key whose order is the order of the selection: a > b as keys exactly when a's
// value is larger. -0.0 becomes +0.0 first (equal keys); NaN and -inf, which are never
// selected, get key 0, below every selectable value (the smallest, -FLT_MAX, gets 0x00800000).
// Branch-free (the kernels compute it once per entry per walk): flip the sign bit of positive
// values and every bit of negative ones; -inf and negative NaNs then fall below the key of
// -FLT_MAX (0x00800000), positive NaNs above that of +inf (0xFF800000), and both become 0.
NVFP4MLA_HD uint32_t order_key(uint32_t bits) {
  bits = bits == 0x80000000u ? 0u : bits;  // -0.0
  const uint32_t key = bits ^ (static_cast<uint32_t>(static_cast<int32_t>(bits) >> 31) | 0x80000000u);
  return key - 0x00800000u <= 0xFF000000u ? key : 0u;
}

// Up to three passes of most-significant-digit radix select over the 32-bit keys.
inline constexpr int kPasses = 3;
inline constexpr int kBins = 2048;  // the widest digit
NVFP4MLA_HD constexpr int digit_bits(int pass) { return pass == 2 ? 10 : 11; }
NVFP4MLA_HD constexpr int digit_shift(int pass) { return pass == 0 ? 21 : pass == 1 ? 10 : 0; }

// Workspace of a split_rows or resident_rows plan. Per row, zeroed before every call: one histogram per pass
// and the row's state. Per row and segment: the segment's counts of the latest pass as suffix
// sums (entries above the pass's prefix plus those with the prefix and digit >= d, for d in
// 0..2048), then the segment's offsets (entries above the chosen digit and with it in the
// segments before it). Per row: the filter's candidates (column, key) and its sure entries
// (columns of entries above the candidates' bin, fewer than k).
//
// A row's stage after the histogram passes: kStageFilter11 / kStageFilter22 when the candidates
// sharing the k-th entry's top 11 / 22 key bits fit the candidate buffer (the filter keeps them
// and the finisher resolves the rest), kStageThreshold when the third pass fixed the threshold
// (the compaction writes the row in column order). 0 while undecided (and for empty rows).
inline constexpr uint32_t kStageFilter11 = 1, kStageFilter22 = 2, kStageThreshold = 3;
struct RowState {
  uint32_t arrived[kPasses];  // segments that finished each pass
  uint32_t prefix;            // key bits chosen so far
  uint32_t k_rem;             // entries still to take among those with the prefix
  uint32_t threshold;         // the key of the last selected entry (0: every selectable entry)
  uint32_t need;              // entries equal to the threshold to take, smallest positions first
  uint32_t count;             // topk_length
  uint32_t stage;             // kStage*
  uint32_t sure;              // sure entries the filter wrote
  uint32_t candidates;        // candidates the filter wrote
};
inline constexpr size_t kRowWords = size_t(kPasses) * kBins + 16;
static_assert(sizeof(RowState) <= 16 * sizeof(uint32_t));
inline constexpr size_t kSegmentSuffixWords = 2052;  // 2049 used, padded to 16 bytes
inline constexpr size_t kSegmentOffsetWords = 2;

struct SplitLayout {
  size_t zeroed_bytes = 0;       // [rows][kRowWords] at offset 0
  size_t suffix_offset = 0;      // [rows][segments][kSegmentSuffixWords]
  size_t offsets_offset = 0;     // [rows][segments][kSegmentOffsetWords]
  size_t candidate_offset = 0;   // [rows][candidates] (column, key) pairs
  size_t sure_offset = 0;        // [rows][kTopkMaxK] columns
  size_t total_bytes = 0;
};
NVFP4MLA_HD constexpr size_t align256(size_t n) { return (n + 255) / 256 * 256; }
NVFP4MLA_HD SplitLayout split_layout(int rows, int segments, int64_t candidates) {
  SplitLayout l;
  const size_t r = static_cast<size_t>(rows), s = static_cast<size_t>(segments);
  const size_t c = static_cast<size_t>(candidates);
  l.zeroed_bytes = align256(r * kRowWords * 4);
  l.suffix_offset = l.zeroed_bytes;
  l.offsets_offset = l.suffix_offset + align256(r * s * kSegmentSuffixWords * 4);
  l.candidate_offset = l.offsets_offset + align256(r * s * kSegmentOffsetWords * 4);
  l.sure_offset = l.candidate_offset + align256(r * c * 8);
  l.total_bytes = l.sure_offset + (c ? align256(r * kTopkMaxK * 4) : 0);
  return l;
}

}  // namespace nvfp4mla::topk_radix
