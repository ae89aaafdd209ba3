// The indexer logits kernel's bookkeeping (ops/indexer/indexer_schedule.h), run on the CPU:
// over every chunk of a row every output column is written exactly once (a logit of the right
// key below the row's length, -inf past it); the two warpgroups' tiles cover every needed key
// exactly once, in increasing order, and no tile is wholly unneeded; operand pieces map
// one-to-one onto the 128-byte-swizzled layout, a quarter warp's pieces in eight different bank
// groups.
#include <gtest/gtest.h>

#include <algorithm>
#include <climits>
#include <map>
#include <random>
#include <set>
#include <vector>

#include "lib/ops/indexer/indexer_schedule.h"

using namespace nvfp4mla::indexer_schedule;

namespace {

struct Row {
  int64_t start, len;
};

struct Writes {
  std::vector<std::vector<int>> logits, tails;  // [row][column]
};

// Runs one block (rows `rows`, chunk [c0, c1)) and counts, per row and column, the logits and
// the -inf tail values written there; a logit's key must be the row's start + column.
// kStep, kWalkers: the tile walk of the two-warpgroup kernel (64-key tiles, two walkers) or the
// warp-specialized one (kWsBlockKeys-key blocks, one walk).
template <int kRows, int kStep = kTileKeys, int kWalkers = kGroups>
void run_block(const std::vector<Row>& rows, int64_t c0, int64_t c1, int64_t stride, Writes& writes) {
  RowRange rr[kRows];
  for (int r = 0; r < kRows; ++r)
    rr[r] = r < static_cast<int>(rows.size()) ? row_range(rows[r].start, rows[r].len, c0, c1, r, stride) : RowRange{0, 0, 0};
  for (size_t r = 0; r < rows.size(); ++r)
    for (int64_t j = first_tail_column(rr[r], c0); j < c1; ++j) ++writes.tails[r][j];
  const Span span = span_of<kRows>(rr);
  if (span.lo >= span.hi) return;
  const TileWalk<kRows, kStep, kWalkers> walk{rr, span};
  std::vector<int32_t> tiles;
  for (int g = 0; g < kWalkers; ++g)
    for (int32_t k = walk.first(g); k != INT_MAX; k = walk.advance(k)) tiles.push_back(k);
  std::sort(tiles.begin(), tiles.end());
  for (size_t i = 1; i < tiles.size(); ++i) ASSERT_GE(tiles[i], tiles[i - 1] + kStep) << "tiles overlap";
  for (int32_t k : tiles) {
    bool needed = false;
    for (int32_t key = k; key < k + kStep; ++key)
      for (size_t r = 0; r < rows.size(); ++r)
        if (key >= rr[r].lo && key < rr[r].hi) {
          needed = true;
          const int64_t col = rr[r].out_off + key - int64_t(r) * stride;  // out_off + key = row * stride + column
          ASSERT_GE(col, c0);
          ASSERT_LT(col, c1);
          ASSERT_EQ(key, rows[r].start + col) << "row " << r << " column " << col << " scored the wrong key";
          ++writes.logits[r][col];
        }
    ASSERT_TRUE(needed) << "tile at " << k << " holds no needed key";
  }
}

template <int kRows, int kStep = kTileKeys, int kWalkers = kGroups>
void random_blocks(uint64_t seed, bool same_start) {
  std::mt19937_64 rng(seed);
  for (int trial = 0; trial < 200; ++trial) {
    const int64_t stride = std::uniform_int_distribution<int64_t>(1, 900)(rng);
    const int64_t chunk = kStep * std::uniform_int_distribution<int64_t>(1, 6)(rng);
    const int nrows = std::uniform_int_distribution<int>(1, kRows)(rng);
    std::vector<Row> rows;
    const int64_t shared_start = std::uniform_int_distribution<int64_t>(0, 5000)(rng);
    for (int r = 0; r < nrows; ++r) {
      const int64_t len = std::uniform_int_distribution<int64_t>(0, stride)(rng);
      const int64_t start = same_start ? shared_start : std::uniform_int_distribution<int64_t>(0, 5000)(rng);
      rows.push_back({start, trial % 7 == 0 ? stride - (r % 2) : len});
    }
    Writes writes{std::vector<std::vector<int>>(nrows, std::vector<int>(stride, 0)), std::vector<std::vector<int>>(nrows, std::vector<int>(stride, 0))};
    for (int64_t c0 = 0; c0 < stride; c0 += chunk) run_block<kRows, kStep, kWalkers>(rows, c0, std::min(c0 + chunk, stride), stride, writes);
    for (int r = 0; r < nrows; ++r)
      for (int64_t j = 0; j < stride; ++j) {
        // Columns below the row's length get exactly one logit, the rest exactly one -inf.
        const bool key_column = j < rows[r].len;
        ASSERT_EQ(writes.logits[r][j], key_column ? 1 : 0) << "trial " << trial << " row " << r << " column " << j;
        ASSERT_EQ(writes.tails[r][j], key_column ? 0 : 1) << "trial " << trial << " row " << r << " column " << j;
      }
  }
}

TEST(IndexSchedule, EveryColumnOnceSharedStarts) {
  random_blocks<2>(1, true);
  random_blocks<4>(2, true);
  random_blocks<8>(3, true);
  random_blocks<16>(4, true);
}

TEST(IndexSchedule, EveryColumnOnceUnrelatedStarts) {
  random_blocks<2>(5, false);
  random_blocks<4>(6, false);
  random_blocks<16>(7, false);
}

TEST(IndexSchedule, WarpSpecializedWalkCoversEveryColumnOnce) {
  // One walk of kWsBlockKeys-key blocks over the query block's kWsQueryCols / 64 rows.
  random_blocks<kWsQueryCols / 64, kWsBlockKeys, 1>(8, true);
  random_blocks<kWsQueryCols / 64, kWsBlockKeys, 1>(9, false);
}

TEST(IndexSchedule, PartialSlotsAreConflictFree) {
  // The epilogue buffer's slots: one per (warp, quad, lane), eight bank groups per quarter warp
  // of writers (lanes 8 u .. 8 u + 7 of a math warp) and of readers (fixed lane c4, quads 0..7).
  std::set<int> all;
  for (int w = 0; w < 4; ++w)
    for (int lane = 0; lane < 32; ++lane) all.insert(ws_partial_slot(w, lane >> 2, lane & 3));
  EXPECT_EQ(all.size(), 128u);
  EXPECT_EQ(*all.rbegin(), 127);
  for (int w = 0; w < 4; ++w) {
    for (int u = 0; u < 4; ++u) {
      std::set<int> groups;
      for (int lane = 8 * u; lane < 8 * u + 8; ++lane) groups.insert(ws_partial_slot(w, lane >> 2, lane & 3) % 8);
      EXPECT_EQ(groups.size(), 8u) << "writers w " << w << " quarter " << u;
    }
    for (int c4 = 0; c4 < 4; ++c4) {
      std::set<int> groups;
      for (int g4 = 0; g4 < 8; ++g4) groups.insert(ws_partial_slot(w, g4, c4) % 8);
      EXPECT_EQ(groups.size(), 8u) << "readers w " << w << " lane " << c4;
    }
  }
}

// The warp-specialized kernel's partial sums: every accumulator element of every math thread
// (wgmma layout: warp w holds keys 16 w + g4 + 8 e of its warpgroup's 64-key slice, columns
// 8 j + 2 c4 + b of each 64-column half) adds into a value of its own key and of its column's
// row, and the epilogue reads, for every (key, row) of a block exactly once, the four slots and
// values the four quad lanes wrote.
template <int kHp>
void check_ws_values() {
  constexpr int kRows = kWsQueryCols / kHp, kValues = 2 * 128 / kHp;
  using Cell = std::pair<int, int>;  // (key in the block, row in the query block)
  std::map<Cell, std::set<std::pair<int, int>>> written, read;  // cell -> (warpgroup slot, value)
  for (int g = 0; g < kWsMathGroups; ++g)
    for (int w = 0; w < 4; ++w)
      for (int lane = 0; lane < 32; ++lane) {
        const int g4 = lane >> 2, c4 = lane & 3;
        for (int half = 0; half < 2; ++half)
          for (int j = 0; j < 8; ++j)
            for (int b = 0; b < 2; ++b)
              for (int e = 0; e < 2; ++e) {
                const int column = 128 * (g / kWsKeySlices) + 64 * half + 8 * j + 2 * c4 + b;
                const int v = ws_value_of<kHp>(half, j, e);
                ASSERT_GE(v, 0);
                ASSERT_LT(v, kValues);
                ASSERT_EQ(ws_value_row<kHp>(g, v), column / kHp);
                ASSERT_EQ(ws_value_key(g, w, g4, v), kTileKeys * (g % kWsKeySlices) + 16 * w + g4 + 8 * e);
              }
        for (int v = 0; v < kValues; ++v)
          written[{ws_value_key(g, w, g4, v), ws_value_row<kHp>(g, v)}].insert({128 * g + ws_partial_slot(w, g4, c4), v});
      }
  for (int gtid = 0; gtid < 128; ++gtid) {
    int g, w, q;
    ws_epilogue_item(gtid, g, w, q);
    for (int v = 0; v < kValues; ++v) {
      const Cell cell{ws_value_key(g, w, q, v), ws_value_row<kHp>(g, v)};
      ASSERT_TRUE(read.find(cell) == read.end() || read[cell].size() < 4) << "a cell finished twice";
      for (int c = 0; c < 4; ++c) read[cell].insert({128 * g + ws_partial_slot(w, q, c), v});
    }
  }
  EXPECT_EQ(written.size(), size_t(kWsBlockKeys) * kRows);
  for (const auto& [cell, parts] : written) EXPECT_EQ(parts.size(), 4u) << "key " << cell.first << " row " << cell.second;
  EXPECT_TRUE(read == written);
}

TEST(IndexSchedule, WarpSpecializedValuesMeetInTheEpilogue) {
  check_ws_values<64>();
  check_ws_values<32>();
}

TEST(IndexSchedule, GapsAreSkipped) {
  // Two rows a million keys apart: the walk visits only tiles that hold needed keys.
  RowRange rr[2] = {row_range(0, 100, 0, 4096, 0, 4096), row_range(1000000, 100, 0, 4096, 1, 4096)};
  const Span span = span_of<2>(rr);
  EXPECT_FALSE(span.gapless);
  const TileWalk<2> walk{rr, span};
  std::vector<int32_t> tiles;
  for (int g = 0; g < kGroups; ++g)
    for (int32_t k = walk.first(g); k != INT_MAX; k = walk.advance(k)) tiles.push_back(k);
  std::sort(tiles.begin(), tiles.end());
  EXPECT_EQ(tiles, (std::vector<int32_t>{0, 64, 1000000, 1000064}));
  // Touching and overlapping ranges are gapless.
  RowRange touching[3] = {row_range(0, 10, 0, 64, 0, 64), row_range(10, 5, 0, 64, 1, 64), row_range(3, 40, 0, 64, 2, 64)};
  EXPECT_TRUE(span_of<3>(touching).gapless);
}

TEST(IndexSchedule, OperandPiecesTileSharedMemory) {
  for (int rows : {64, 128, 256}) {
    std::set<int> offsets;
    for (int idx = 0; idx < rows * 8; ++idx) {
      int t, c;
      piece_of(idx, t, c);
      ASSERT_LT(t, rows);
      ASSERT_LT(c, 8);
      const int off = core_offset(t, c);
      ASSERT_EQ(off % 16, 0);
      ASSERT_LT(off, rows * 128);
      offsets.insert(off);
    }
    EXPECT_EQ(static_cast<int>(offsets.size()), rows * 8);
    // A quarter warp stores one piece of 8 rows of one atom, in 8 different bank groups.
    for (int q = 0; q < rows; ++q) {
      std::set<int> groups;
      int atom = -1;
      for (int idx = 8 * q; idx < 8 * q + 8; ++idx) {
        int t, c;
        piece_of(idx, t, c);
        const int off = core_offset(t, c);
        groups.insert(off % 128 / 16);
        if (atom < 0) atom = off / 1024;
        ASSERT_EQ(off / 1024, atom);
      }
      ASSERT_EQ(groups.size(), 8u);
    }
  }
  // The layout is the tensor cores' 128-byte swizzle (CUTLASS Swizzle<3,4,3>): address bits 4-6
  // of the row-major offset xor bits 7-9.
  for (int t = 0; t < 256; ++t)
    for (int c = 0; c < 8; ++c) {
      const int plain = t * 128 + c * 16;
      ASSERT_EQ(core_offset(t, c), plain ^ (((plain >> 7) & 7) << 4)) << t << " " << c;
    }
  EXPECT_EQ(core_offset(0, 0), 0);
  EXPECT_EQ(core_offset(1, 0), 128 + 16);
  EXPECT_EQ(core_offset(0, 1), 16);
  EXPECT_EQ(core_offset(8, 0), 1024);
  EXPECT_EQ(core_offset(63, 7), 7 * 1024 + 7 * 128);
}

// A thread's four pieces of a tile are one piece of rows t0 + 16 u, at offsets 2048 u apart: the
// kernel computes them from the first (TileLoader).
TEST(IndexSchedule, ThreadPiecesStepByFixedRowsAndOffsets) {
  for (int tid = 0; tid < 128; ++tid) {
    int t0, c0;
    piece_of(tid, t0, c0);
    for (int u = 0; u < kPiecesPerThread; ++u) {
      int t, c;
      piece_of(tid + 128 * u, t, c);
      ASSERT_EQ(t, t0 + kPieceRowStep * u) << tid << " " << u;
      ASSERT_EQ(c, c0) << tid << " " << u;
      ASSERT_EQ(core_offset(t, c), core_offset(t0, c0) + kPieceOffsetStep * u) << tid << " " << u;
    }
  }
}

// The weights' slots are a permutation, and one 16-byte load at 4 (4 jj + c) gives lane c of a quad
// the weights of columns 8 j + 2 c, 8 j + 2 c + 1 for j = 2 jj and 2 jj + 1.
TEST(IndexSchedule, WeightSlotsGiveEachLaneItsColumns) {
  for (int n_cols : {128, 256}) {
    std::vector<int> owner(n_cols, -1);
    for (int n = 0; n < n_cols; ++n) {
      const int slot = weight_slot(n);
      ASSERT_GE(slot, 0);
      ASSERT_LT(slot, n_cols);
      ASSERT_EQ(owner[slot], -1) << "slot " << slot << " taken twice";
      owner[slot] = n;
    }
    for (int jj = 0; jj < n_cols / 16; ++jj)
      for (int c = 0; c < 4; ++c) {
        const int base = 4 * (4 * jj + c);
        EXPECT_EQ(owner[base + 0], 8 * (2 * jj) + 2 * c);
        EXPECT_EQ(owner[base + 1], 8 * (2 * jj) + 2 * c + 1);
        EXPECT_EQ(owner[base + 2], 8 * (2 * jj + 1) + 2 * c);
        EXPECT_EQ(owner[base + 3], 8 * (2 * jj + 1) + 2 * c + 1);
      }
  }
}

// The quad reduce-scatter, with the shuffles played out over four simulated lanes: lane c ends with
// the complete sums of quantities c n/4 .. (c + 1) n/4 - 1 (integers, so every order is exact).
template <int kValues>
void check_quad_reduce_scatter(uint64_t seed) {
  std::mt19937_64 rng(seed);
  float v[4][kValues], want[kValues] = {};
  for (int lane = 0; lane < 4; ++lane)
    for (int i = 0; i < kValues; ++i) {
      v[lane][i] = static_cast<float>(static_cast<int>(rng() % 2001) - 1000);
      want[i] += v[lane][i];
    }
  auto exchange = [&](int half, int partner_mask) {
    float send[4][kValues];
    for (int lane = 0; lane < 4; ++lane) {
      const bool upper = (lane & partner_mask) != 0;
      if (half == kValues / 2) quad_split<kValues / 2>(v[lane], upper, send[lane]);
      else quad_split<kValues / 4>(v[lane], upper, send[lane]);
    }
    for (int lane = 0; lane < 4; ++lane)
      for (int i = 0; i < half; ++i) v[lane][i] += send[lane ^ partner_mask][i];
  };
  exchange(kValues / 2, 2);
  exchange(kValues / 4, 1);
  for (int lane = 0; lane < 4; ++lane)
    for (int i = 0; i < kValues / 4; ++i) EXPECT_EQ(v[lane][i], want[lane * (kValues / 4) + i]) << lane << " " << i;
}

TEST(IndexSchedule, QuadReduceScatterGivesEachLaneItsSums) {
  check_quad_reduce_scatter<4>(1);   // 2 rows per block (64 heads, 128 columns)
  check_quad_reduce_scatter<8>(2);   // 4 rows
  check_quad_reduce_scatter<16>(3);  // 8 rows
  check_quad_reduce_scatter<32>(4);  // 16 rows (16 heads, 256 columns)
}

}  // namespace
