#pragma once
// The integer bookkeeping of the indexer logits kernel (indexer_logits.cuh), host-and-device so
// that the CPU suite can check it (tests/unit/index_schedule_test.cpp): which keys each row of a
// block needs in its chunk of columns, which 64-key tiles each warpgroup takes, where a thread's
// 16-byte piece of an operand goes in shared memory.
#include <climits>
#include <cstdint>

#include "nvfp4mla/hd.h"

namespace nvfp4mla::indexer_schedule {

inline constexpr int kTileKeys = 64;            // keys per warpgroup tile (M of one MMA)
inline constexpr int kGroups = 2;               // warpgroups per block, taking alternate tiles
inline constexpr int kOperandRowBytes = 128;    // one operand row: 128 E4M3 values along K
inline constexpr int kSwizzleAtomBytes = 1024;  // 8 rows x 128 bytes

// A row's key range within the block's chunk ([lo, hi), empty when lo == hi) and the offset that
// turns a key index into its output element (out_row * stride - start).
struct RowRange {
  int32_t lo, hi;
  int64_t out_off;
};

// Row `out_row` scores keys start .. start + len - 1 as columns 0 .. len - 1; the block owns
// columns [c0, c1). Keys are int32 (the callers check that start + len fits).
NVFP4MLA_HD RowRange row_range(int64_t start, int64_t len, int64_t c0, int64_t c1, int64_t out_row, int64_t stride) {
  RowRange x{0, 0, out_row * stride - start};
  if (len > c0) {
    x.lo = static_cast<int32_t>(start + c0);
    x.hi = static_cast<int32_t>(start + (len < c1 ? len : c1));
  }
  return x;
}
// The first column past the row's keys in the chunk: [c0, first) hold logits, [first, c1) -inf.
NVFP4MLA_HD int64_t first_tail_column(const RowRange& x, int64_t c0) { return c0 + (x.hi - x.lo); }

// Byte offset of row t's 16-byte piece c in an operand stored in the 128-byte-swizzled layout
// of the tensor cores (wgmma layout type 1, TMA's SWIZZLE_128B): rows of 128 bytes, 8-row atoms
// of 1024 bytes (1024-byte aligned), piece c of row t at slot c xor (t % 8) of its row. The eight
// rows of an atom hold any given piece in eight different 16-byte bank groups, so the MMA's reads
// of a piece across rows do not conflict (in the plain layout, with every row's piece c in the
// same banks, they conflicted 8 ways; the swizzle took the H200 prefill from 2496 to 2305 us).
NVFP4MLA_HD int core_offset(int t, int c) {
  return (t >> 3) * kSwizzleAtomBytes + (t & 7) * kOperandRowBytes + ((c ^ (t & 7)) << 4);
}

// The piece cooperative thread `idx` moves: 32 consecutive idx (a warp) cover 8 rows x 64 bytes,
// each quarter warp one piece of 8 rows of an atom (eight different bank groups: conflict-free
// stores), the warp whole 32-byte sectors of 8 rows (coalesced reads).
NVFP4MLA_HD void piece_of(int idx, int& row, int& chunk) {
  const int unit = idx >> 5, lane = idx & 31;
  row = (unit >> 1) * 8 + (lane & 7);
  chunk = (unit & 1) * 4 + (lane >> 3);
}

// A warpgroup's 128 threads move a tile's 64 rows x 8 pieces, four pieces each: thread `tid`'s
// pieces are piece_of(tid + 128 u), u < 4, which are one piece c of the rows t + 16 u (t, c from
// piece_of(tid)), so their shared-memory offsets are core_offset(t, c) + u * kPieceOffsetStep.
inline constexpr int kPiecesPerThread = kTileKeys * 8 / 128;
inline constexpr int kPieceRowStep = 16;
inline constexpr int kPieceOffsetStep = 2 * kSwizzleAtomBytes;

// Where the weight of query column n is kept in shared memory: lane c (0..3) of a quad needs the
// weights of columns 8 j + 2 c and 8 j + 2 c + 1 (its accumulator columns of 8-column block j);
// those of blocks 2 jj and 2 jj + 1 sit together at floats 4 (4 jj + c) .. + 3, one 16-byte load.
NVFP4MLA_HD int weight_slot(int n) {
  const int j = n >> 3, c = (n & 7) >> 1, b = n & 1;
  return ((j >> 1) * 4 + c) * 4 + (j & 1) * 2 + b;
}

// One exchange of the epilogue's quad reduce-scatter. The four lanes of a quad each hold partial
// sums of the same 2 kHalf quantities; a lane keeps the half chosen by `upper` in v[0, kHalf) and
// puts the other half in `send` for its partner, which adds it to its own kept half. Two exchanges
// (partners lane ^ 2 with upper = lane & 2, then lane ^ 1 with upper = lane & 1, halving each time)
// leave lane c with the complete sums of quantities c n / 4 .. (c + 1) n / 4 - 1 of the n.
template <int kHalf>
NVFP4MLA_HD void quad_split(float* v, bool upper, float* send) {
  for (int i = 0; i < kHalf; ++i) {
    const float lo = v[i], hi = v[i + kHalf];
    send[i] = upper ? lo : hi;
    v[i] = upper ? hi : lo;
  }
}

// The smallest key >= k that some row needs, INT_MAX if none.
template <int kRows>
NVFP4MLA_HD int32_t next_needed(const RowRange* rr, int32_t k) {
  int32_t best = INT_MAX;
  for (int r = 0; r < kRows; ++r) {
    const int32_t lo = rr[r].lo, hi = rr[r].hi;
    if (hi > k) {
      const int32_t start = k > lo ? k : lo;
      best = start < best ? start : best;
    }
  }
  return best;
}

// The union [lo, hi) of the rows' ranges (lo >= hi when all are empty) and whether it has gaps.
struct Span {
  int32_t lo, hi;
  bool gapless;
};
template <int kRows>
NVFP4MLA_HD Span span_of(const RowRange* rr) {
  Span s{INT_MAX, INT_MIN, true};
  for (int r = 0; r < kRows; ++r)
    if (rr[r].hi > rr[r].lo) {
      s.lo = rr[r].lo < s.lo ? rr[r].lo : s.lo;
      s.hi = rr[r].hi > s.hi ? rr[r].hi : s.hi;
    }
  // Gapless when every range but the lowest starts inside (or at the end of) one that starts
  // before it: a gap's first key would be the start of no range reached from below.
  for (int r = 0; r < kRows; ++r) {
    if (rr[r].hi <= rr[r].lo || rr[r].lo == s.lo) continue;
    bool covered = false;
    for (int o = 0; o < kRows; ++o) covered |= rr[o].hi > rr[o].lo && rr[o].lo < rr[r].lo && rr[o].hi >= rr[r].lo;
    s.gapless &= covered;
  }
  return s;
}

// The tiles of a block form one sequence, starting at span.lo: lo + kStep i when gapless, else
// each tile starts at the next key some row needs. kWalkers consumers take turns: walker g takes
// tiles g, g + kWalkers, ... (the two-warpgroup kernel: 64-key tiles, two walkers; the
// warp-specialized kernel: one walk of kWsBlockKeys-key blocks that every role follows).
template <int kRows, int kStep = kTileKeys, int kWalkers = kGroups>
struct TileWalk {
  const RowRange* rr;
  Span span;
  NVFP4MLA_HD int32_t step(int32_t k) const {  // the tile after the one at k
    if (span.gapless) return int64_t(k) + kStep < span.hi ? k + kStep : INT_MAX;
    return k > INT_MAX - kStep ? INT_MAX : next_needed<kRows>(rr, k + kStep);
  }
  NVFP4MLA_HD int32_t first(int walker) const {
    int32_t k = span.lo < span.hi ? span.lo : INT_MAX;
    for (int g = 0; g < walker && k != INT_MAX; ++g) k = step(k);
    return k;
  }
  NVFP4MLA_HD int32_t advance(int32_t k) const {  // the same walker's next tile
    // Gapless: kWalkers steps, or the end (one compare instead of kWalkers).
    if (span.gapless) return int64_t(k) + kWalkers * kStep < span.hi ? k + kWalkers * kStep : INT_MAX;
    for (int i = 0; i < kWalkers && k != INT_MAX; ++i) k = step(k);
    return k;
  }
};

// ---- the warp-specialized kernel (indexer_logits_ws.cuh) ----------------------------------
// Key blocks of kWsKeySlices 64-key slices, one per math warpgroup of a slice; query blocks of
// kWsColGroups groups of 128 columns, one per math warpgroup of a column group.
inline constexpr int kWsKeySlices = 2;
inline constexpr int kWsColGroups = 2;
inline constexpr int kWsMathGroups = kWsKeySlices * kWsColGroups;
inline constexpr int kWsBlockKeys = kWsKeySlices * kTileKeys;
inline constexpr int kWsQueryCols = kWsColGroups * 128;

// Where the partial head sums of math thread (warp-in-group w, quad g4 = lane / 4, c4 = lane % 4)
// go in a plane of the epilogue buffer (16-byte slots): epilogue thread (w, g4) reads the four
// slots of c4 = 0..3. Slot 32 w + 8 c4 + (g4 ^ 2 c4): a quarter warp of writers (g4 in {2q,
// 2q + 1}, all c4) and a quarter warp of readers (fixed c4, g4 = 0..7) each touch eight
// different slots modulo 8, i.e. all 32 banks once (no conflicts).
NVFP4MLA_HD int ws_partial_slot(int w, int g4, int c4) { return 32 * w + 8 * c4 + (g4 ^ (2 * c4)); }

// A math thread (warpgroup g, warp w of it, quad g4) holds 2 x 128 / kHp partial sums per block:
// value v belongs to the key ws_value_key (of the block's kWsBlockKeys) and the row ws_value_row
// (of the query block). Its accumulator element of 64-column half `half`, 8-column block j, key
// e (the warp's rows g4 and g4 + 8) adds into value ws_value_of. The epilogue thread gtid
// finishes the values of quad g4 of warp w of math warpgroup g (ws_epilogue_item).
NVFP4MLA_HD int ws_value_key(int g, int w, int g4, int v) { return kTileKeys * (g % kWsKeySlices) + 16 * w + g4 + 8 * (v & 1); }
template <int kHp>
NVFP4MLA_HD int ws_value_row(int g, int v) {
  return (g / kWsKeySlices) * (128 / kHp) + (v >> 1);
}
template <int kHp>
NVFP4MLA_HD int ws_value_of(int half, int j, int e) {
  return 2 * (half * (64 / kHp) + (8 * j) / kHp) + e;
}
NVFP4MLA_HD void ws_epilogue_item(int gtid, int& g, int& w, int& g4) {
  g = gtid >> 5;
  w = (gtid >> 3) & 3;
  g4 = gtid & 7;
}

}  // namespace nvfp4mla::indexer_schedule
