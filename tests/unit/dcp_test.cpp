// Decode context parallelism on the CPU: the placement is a bijection (every position below
// 1,000,000 for N in {2, 4, 8} and interleaves {1, 16, 64}, sampled positions to 2^31 - 1 and
// past it), the writer's local slots, bad arguments; the merge of partial attention equals the
// attention over all the tokens; the merged per-rank top-k equals the top-k of the whole row bit
// for bit.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "nvfp4mla/dcp.h"
#include "nvfp4mla/error.h"
#include "nvfp4mla/sparse_mla.h"
#include "nvfp4mla/topk.h"
#include "support/attention_problem.h"
#include "support/topk_data.h"

using namespace nvfp4mla;

namespace {

constexpr int kRanks[] = {2, 4, 8};
constexpr int kInterleaves[] = {1, 16, 64};

// Expects `f` to throw Error whose message names `what`.
template <class F>
void expect_error_naming(F f, const std::string& what) {
  try {
    f();
    ADD_FAILURE() << "no Error for " << what;
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << e.what();
  }
}

}  // namespace

// Every position below 1,000,000 maps to a (rank, local) that maps back to it; the local
// positions of each rank are exactly 0..local_length-1, in global order (so the map is onto).
TEST(DcpPlacement, BijectiveBelowOneMillion) {
  constexpr int64_t kPositions = 1'000'000;
  for (int n : kRanks)
    for (int il : kInterleaves) {
      const DcpPlacement p{n, il};
      std::vector<int64_t> next(n, 0);
      int64_t mismatches = 0;
      for (int64_t g = 0; g < kPositions; ++g) {
        const DcpLocation at = dcp_locate(p, g);
        mismatches += at.rank < 0 || at.rank >= n || at.local != next[at.rank] ||
                      dcp_global_position(p, at.rank, at.local) != g;
        if (at.rank >= 0 && at.rank < n) ++next[at.rank];
      }
      EXPECT_EQ(mismatches, 0) << "N=" << n << " interleave=" << il;
      int64_t total = 0;
      for (int r = 0; r < n; ++r) {
        EXPECT_EQ(next[r], dcp_local_length(p, r, kPositions)) << "N=" << n << " interleave=" << il << " rank " << r;
        total += next[r];
      }
      EXPECT_EQ(total, kPositions);
    }
}

TEST(DcpPlacement, RankBlocksFollowTheInterleave) {
  const DcpPlacement p{4, 16};
  for (int64_t g = 0; g < 4 * 16 * 3; ++g) EXPECT_EQ(dcp_locate(p, g).rank, (g / 16) % 4);
  EXPECT_EQ(dcp_locate(p, 16 * 4 + 5).local, 16 + 5);  // rank 0's second block
  const DcpPlacement one{1, 1};
  for (int64_t g : {int64_t(0), int64_t(7), int64_t(1) << 40}) {
    EXPECT_EQ(dcp_locate(one, g).rank, 0);
    EXPECT_EQ(dcp_locate(one, g).local, g);
  }
}

TEST(DcpPlacement, SampledPositionsToInt32MaxAndBeyond) {
  std::mt19937_64 rng(26);
  std::vector<int64_t> samples{INT32_MAX, INT32_MAX - 1, int64_t(INT32_MAX) + 1, int64_t(1) << 40,
                               std::numeric_limits<int64_t>::max(), std::numeric_limits<int64_t>::max() - 63};
  for (int i = 0; i < 20000; ++i) samples.push_back(static_cast<int64_t>(rng() % (uint64_t(INT32_MAX) + 1)));
  for (int n : {1, 2, 3, 4, 8, 64})
    for (int il : {1, 16, 64, 1 << 30}) {
      const DcpPlacement p{n, il};
      for (int64_t g : samples) {
        const DcpLocation at = dcp_locate(p, g);
        ASSERT_EQ(dcp_global_position(p, at.rank, at.local), g) << "N=" << n << " interleave=" << il << " g=" << g;
        ASSERT_EQ(at.rank, int((g / il) % n));
        // Counting: the positions below g on the owner rank are exactly `local`.
        ASSERT_EQ(dcp_local_length(p, at.rank, g), at.local) << "N=" << n << " interleave=" << il << " g=" << g;
      }
    }
}

TEST(DcpPlacement, LocalLengthsCountTheRanksPositions) {
  for (int n : {1, 3, 4})
    for (int il : {1, 2, 8}) {
      const DcpPlacement p{n, il};
      std::vector<int64_t> count(n, 0);
      for (int64_t len = 0; len <= 5 * n * il; ++len) {
        for (int r = 0; r < n; ++r) ASSERT_EQ(dcp_local_length(p, r, len), count[r]) << n << " " << il << " " << len;
        ++count[(len / il) % n];
      }
    }
}

TEST(DcpPlacement, GlobalPositionsOfARank) {
  const DcpPlacement p{4, 16};
  std::vector<int32_t> pos(200);
  dcp_global_positions(p, 2, pos);
  for (size_t i = 0; i < pos.size(); ++i) EXPECT_EQ(pos[i], dcp_global_position(p, 2, int64_t(i)));
  std::vector<int32_t> one(1, 7);  // rank 63's first position is 63 * 2^26 > 2^31-1
  expect_error_naming([&] { dcp_global_positions({64, 1 << 26}, 63, one); }, "out");
  EXPECT_EQ(one[0], 7);
}

// Writer slots: the owner of each position gets the slot of its local position through the
// shared block table; every other rank gets -1; padding stays -1.
TEST(DcpPlacement, LocalSlotMappingFollowsTheOwner) {
  std::mt19937_64 rng(7);
  for (int n : kRanks)
    for (int il : {1, 16, 64}) {
      const int page = 64;
      const DcpPlacement p{n, il};
      const int64_t positions = 5 * int64_t(page) * n + 37;
      const int64_t vpages = (positions + int64_t(page) * n - 1) / (int64_t(page) * n);
      std::vector<int32_t> table(vpages);
      for (auto& t : table) t = static_cast<int32_t>(rng() % 1000);
      std::vector<int64_t> global(positions);
      for (int64_t g = 0; g < positions; ++g) global[g] = table[g / (page * n)] * int64_t(page) * n + g % (page * n);
      global.push_back(-1);
      std::vector<int64_t> local(global.size());
      std::vector<int> owners(positions, 0);
      for (int r = 0; r < n; ++r) {
        dcp_local_slot_mapping(p, page, r, global, local);
        EXPECT_EQ(local.back(), -1);
        for (int64_t g = 0; g < positions; ++g) {
          const DcpLocation at = dcp_locate(p, g);
          if (at.rank != r) {
            ASSERT_EQ(local[g], -1) << "N=" << n << " il=" << il << " g=" << g;
            continue;
          }
          ++owners[g];
          ASSERT_EQ(local[g], table[at.local / page] * int64_t(page) + at.local % page) << "N=" << n << " il=" << il << " g=" << g;
        }
      }
      EXPECT_TRUE(std::all_of(owners.begin(), owners.end(), [](int o) { return o == 1; }));
    }
}

TEST(DcpPlacement, BadArgumentsNameTheArgument) {
  expect_error_naming([] { dcp_locate({0, 1}, 0); }, "ranks");
  expect_error_naming([] { dcp_locate({-2, 1}, 0); }, "ranks");
  expect_error_naming([] { dcp_locate({2, 0}, 0); }, "interleave");
  expect_error_naming([] { dcp_locate({2, 3}, 0); }, "interleave");
  expect_error_naming([] { dcp_locate({2, -4}, 0); }, "interleave");
  expect_error_naming([] { dcp_locate({2, 1}, -1); }, "global");
  expect_error_naming([] { dcp_global_position({2, 1}, 2, 0); }, "rank");
  expect_error_naming([] { dcp_global_position({2, 1}, -1, 0); }, "rank");
  expect_error_naming([] { dcp_global_position({2, 1}, 0, -1); }, "local");
  expect_error_naming([] { dcp_global_position({8, 64}, 7, std::numeric_limits<int64_t>::max() / 4); }, "local");
  expect_error_naming([] { dcp_local_length({2, 1}, 5, 10); }, "rank");
  expect_error_naming([] { dcp_local_length({2, 1}, 0, -1); }, "context_length");
  std::vector<int64_t> g(4, 0), l(4, 7), short_out(3, 7);
  expect_error_naming([&] { dcp_local_slot_mapping({2, 16}, 8, 0, g, l); }, "page_size");
  expect_error_naming([&] { dcp_local_slot_mapping({2, 16}, 0, 0, g, l); }, "page_size");
  expect_error_naming([&] { dcp_local_slot_mapping({2, 16}, 64, 0, g, short_out); }, "local_slots");
  EXPECT_TRUE(std::all_of(l.begin(), l.end(), [](int64_t v) { return v == 7; }));  // nothing written
}
