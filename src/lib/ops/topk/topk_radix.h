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
NVFP4MLA_HD uint32_t order_key(uint32_t bits) {
  if ((bits & 0x7FFFFFFFu) > 0x7F800000u || bits == 0xFF800000u) return 0;  // NaN, -inf
  if (bits == 0x80000000u) bits = 0;                                         // -0.0
  return (bits & 0x80000000u) ? ~bits : (bits | 0x80000000u);
}

// Three passes of most-significant-digit radix select over the 32-bit keys.
inline constexpr int kPasses = 3;
inline constexpr int kBins = 2048;  // the widest digit
NVFP4MLA_HD constexpr int digit_bits(int pass) { return pass == 2 ? 10 : 11; }
NVFP4MLA_HD constexpr int digit_shift(int pass) { return pass == 0 ? 21 : pass == 1 ? 10 : 0; }

// Workspace of a split_rows plan. Per row, zeroed before every call: one histogram per pass
// and the row's state. Per row and segment: the segment's counts of the last pass as suffix
// sums (entries above the last pass's prefix plus those with the prefix and digit >= d, for d
// in 0..1024), then the segment's offsets (entries above the threshold and equal to it in the
// segments before it).
struct RowState {
  uint32_t arrived[kPasses];  // segments that finished each pass
  uint32_t prefix;            // key bits chosen so far
  uint32_t k_rem;             // entries still to take among those with the prefix
  uint32_t threshold;         // the key of the last selected entry (0: every selectable entry)
  uint32_t need;              // entries equal to the threshold to take, smallest positions first
  uint32_t count;             // topk_length
};
inline constexpr size_t kRowWords = size_t(kPasses) * kBins + 8;
static_assert(sizeof(RowState) <= 8 * sizeof(uint32_t));
inline constexpr size_t kSegmentSuffixWords = 1028;  // 1025 used, padded to 16 bytes
inline constexpr size_t kSegmentOffsetWords = 2;

struct SplitLayout {
  size_t zeroed_bytes = 0;     // [rows][kRowWords] at offset 0
  size_t suffix_offset = 0;    // [rows][segments][kSegmentSuffixWords]
  size_t offsets_offset = 0;   // [rows][segments][kSegmentOffsetWords]
  size_t total_bytes = 0;
};
NVFP4MLA_HD constexpr size_t align256(size_t n) { return (n + 255) / 256 * 256; }
NVFP4MLA_HD SplitLayout split_layout(int rows, int segments) {
  SplitLayout l;
  const size_t r = static_cast<size_t>(rows), s = static_cast<size_t>(segments);
  l.zeroed_bytes = align256(r * kRowWords * 4);
  l.suffix_offset = l.zeroed_bytes;
  l.offsets_offset = l.suffix_offset + align256(r * s * kSegmentSuffixWords * 4);
  l.total_bytes = l.offsets_offset + align256(r * s * kSegmentOffsetWords * 4);
  return l;
}

}  // namespace nvfp4mla::topk_radix
