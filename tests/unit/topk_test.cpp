// Top-k on the CPU: the reference's semantics on hand-made rows, the fold, the slot transform,
// argument checks, the radix keys and the planner.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <random>
#include <vector>

#include "nvfp4mla/error.h"
#include "nvfp4mla/topk.h"
#include "lib/ops/topk/topk_radix.h"
#include "support/topk_data.h"

using namespace nvfp4mla;
using nvfp4mla::testing::float_of_bits;
using nvfp4mla::testing::TopkProblem;
using nvfp4mla::testing::TopkResult;

namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();
const float kNaN = std::numeric_limits<float>::quiet_NaN();

TopkResult run(const TopkProblem& p, int k) { return nvfp4mla::testing::reference(p.args(k)); }

TopkProblem one_row(const std::vector<float>& v) {
  TopkProblem p(1, static_cast<int64_t>(v.size()));
  p.values = v;
  return p;
}

}  // namespace

TEST(TopkReference, LargestFirstTiesBySmallerPositionOutputAscending) {
  const auto r = run(one_row({1.0f, 3.0f, 2.0f, 3.0f, 0.5f, 3.0f, 2.0f}), 4);
  EXPECT_EQ(r.indices, (std::vector<int32_t>{1, 2, 3, 5}));
  EXPECT_EQ(r.length, std::vector<int32_t>{4});
  EXPECT_EQ(r.values, (std::vector<float>{3.0f, 2.0f, 3.0f, 3.0f}));
  // k = 5: the second 2.0 (position 6) loses its tie to position 2 only when k is 4.
  EXPECT_EQ(run(one_row({1.0f, 3.0f, 2.0f, 3.0f, 0.5f, 3.0f, 2.0f}), 5).indices, (std::vector<int32_t>{1, 2, 3, 5, 6}));
}

TEST(TopkReference, SignedZerosAreEqual) {
  const auto r = run(one_row({-1.0f, -0.0f, 0.0f, -0.0f, 0.0f}), 2);
  EXPECT_EQ(r.indices, (std::vector<int32_t>{1, 2}));
  EXPECT_TRUE(std::signbit(r.values[0]));  // the input's bits, -0.0 kept
}

TEST(TopkReference, NanAndNegativeInfinityNeverSelected) {
  const auto r = run(one_row({kNaN, -kInf, 2.0f, kInf, -kNaN, -3.0e38f, -kInf}), 5);
  EXPECT_EQ(r.indices, (std::vector<int32_t>{2, 3, 5, -1, -1}));
  EXPECT_EQ(r.length, std::vector<int32_t>{3});
  EXPECT_EQ(r.values[3], -kInf);
  EXPECT_EQ(r.values[4], -kInf);
}

TEST(TopkReference, LengthsAndPadding) {
  TopkProblem p(3, 5, 8);
  for (int r = 0; r < 3; ++r) nvfp4mla::testing::fill_random(p.row(r), 8, 10 + r);
  p.row(1)[4] = kNaN;
  p.lengths = {0, 5, 2};
  const auto r = run(p, 3);
  EXPECT_EQ(r.length, (std::vector<int32_t>{0, 3, 2}));
  EXPECT_EQ(std::vector<int32_t>(r.indices.begin(), r.indices.begin() + 3), (std::vector<int32_t>{-1, -1, -1}));
  EXPECT_EQ(r.indices[8], -1);
  for (int i = 3; i < 6; ++i) EXPECT_LT(r.indices[i], 4);  // entry 4 of row 1 is NaN: in none of its 3 slots
}

TEST(TopkReference, EqualsSortedPrefixOnRandomRows) {
  // Independent check of the reference: the k best (value, position) pairs by explicit comparison.
  TopkProblem p(4, 3000);
  for (int r = 0; r < 4; ++r) nvfp4mla::testing::fill_random(p.row(r), 3000, 77 + r, r % 2 ? 40 : 0);
  for (int k : {1, 17, 2048, 4096}) {
    const auto got = run(p, k);
    for (int r = 0; r < 4; ++r) {
      std::vector<int> idx(3000);
      std::iota(idx.begin(), idx.end(), 0);
      const float* v = p.row(r);
      std::sort(idx.begin(), idx.end(), [&](int a, int b) { return v[a] > v[b] || (v[a] == v[b] && a < b); });
      idx.resize(std::min(k, 3000));
      std::sort(idx.begin(), idx.end());
      idx.resize(k, -1);
      EXPECT_EQ(std::vector<int32_t>(got.indices.begin() + r * k, got.indices.begin() + (r + 1) * k),
                std::vector<int32_t>(idx.begin(), idx.end()))
          << "k " << k << " row " << r;
    }
  }
}

TEST(TopkFold, FourChunksOf118750EqualDirect) {
  // The seed's fold: 475,000 entries as four 118,750-entry chunks, with ties (quantized values)
  // and with distinct values.
  const int64_t n = 4 * 118750;
  std::vector<float> row(n);
  for (int levels : {0, 300}) {
    nvfp4mla::testing::fill_random(row.data(), n, 5 + levels, levels);
    TopkProblem p(1, n);
    p.values = row;
    const auto direct = run(p, 2048);
    const auto folded = nvfp4mla::testing::fold_row(row.data(), nvfp4mla::testing::even_bounds(n, 4), 2048,
                                                    [](const TopkArgs& a) { return nvfp4mla::testing::reference(a); });
    EXPECT_TRUE(folded == direct) << "levels " << levels;
  }
}

TEST(TopkFold, RandomChunkingsEqualDirect) {
  const int64_t n = 50000;
  std::vector<float> row(n);
  for (int trial = 0; trial < 12; ++trial) {
    const auto kind = nvfp4mla::testing::kAllRowKinds[trial % 10];
    nvfp4mla::testing::fill_row(row.data(), n, kind, 100 + trial);
    TopkProblem p(1, n);
    p.values = row;
    const int k = trial % 3 == 0 ? 1 : trial % 3 == 1 ? 2048 : 4096;
    const auto bounds = nvfp4mla::testing::random_bounds(n, 2 + trial, 300 + trial);
    const auto folded = nvfp4mla::testing::fold_row(row.data(), bounds, k,
                                                    [](const TopkArgs& a) { return nvfp4mla::testing::reference(a); });
    EXPECT_TRUE(folded == run(p, k)) << nvfp4mla::testing::kind_name(kind) << " k " << k;
  }
}

TEST(TopkReference, PositionsMustIncrease) {
  const std::vector<float> v{1.0f, 2.0f, 3.0f};
  std::vector<int32_t> pos{5, 9, 7};
  TopkProblem p = one_row(v);
  TopkArgs a = p.args(2);
  a.positions = pos.data();
  TopkResult r(1, 2);
  EXPECT_THROW(topk_reference(a, r.outputs()), Error);
  EXPECT_EQ(r.length[0], -7);  // nothing written
  pos = {5, 9, 70};
  topk_reference(a, r.outputs());
  EXPECT_EQ(r.indices, (std::vector<int32_t>{9, 70}));
  // Padding entries (-inf, position -1) are ignored.
  const std::vector<float> w{1.0f, -kInf, 3.0f};
  p = one_row(w);
  a = p.args(2);
  pos = {4, -1, 8};
  a.positions = pos.data();
  topk_reference(a, r.outputs());
  EXPECT_EQ(r.indices, (std::vector<int32_t>{4, 8}));
}

TEST(TopkSlots, BlockTableMapsPositionsToSlots) {
  // Two requests of two rows each, pages of 4 positions, tables with permuted pages.
  TopkProblem p(4, 16);
  for (int r = 0; r < 4; ++r) nvfp4mla::testing::fill_random(p.row(r), 16, 40 + r);
  std::vector<int32_t> table{7, 2, 9, 0, /*pad*/ -1, 3, 5, 1, 8, -1};
  TopkArgs a = p.args(5);
  a.slots = {table.data(), 2, 4, 5, 4, 2, 40};
  const auto got = nvfp4mla::testing::reference(a);
  const auto plain = run(p, 5);
  for (int r = 0; r < 4; ++r)
    for (int i = 0; i < 5; ++i) {
      const int32_t pos = plain.indices[r * 5 + i];
      const int32_t want = table[(r / 2) * 5 + pos / 4] * 4 + pos % 4;
      EXPECT_EQ(got.indices[r * 5 + i], want);
    }
  EXPECT_EQ(got.length, plain.length);
}

TEST(TopkSlots, InvalidSlotsThrowNamingBlockTableAndWriteNothing) {
  TopkProblem p(2, 8);
  p.values = {8, 7, 6, 5, 4, 3, 2, 1, 1, 2, 3, 4, 5, 6, 7, 8};
  std::vector<int32_t> table{0, 1, 2, 3};
  TopkArgs a = p.args(2);
  a.slots = {table.data(), 2, 2, 2, 4, 1, 16};
  EXPECT_EQ(nvfp4mla::testing::reference(a).indices, (std::vector<int32_t>{0, 1, 14, 15}));
  for (auto [entry, capacity] : {std::pair<int32_t, int64_t>{-1, 16}, {3, 15}, {INT32_MAX / 2, INT64_MAX}}) {
    table[3] = entry;
    a.slots.capacity = capacity;
    TopkResult r(2, 2);
    try {
      topk_reference(a, r.outputs());
      ADD_FAILURE() << "no error for entry " << entry;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("block_table"), std::string::npos) << e.what();
    }
    EXPECT_EQ(r.indices, (std::vector<int32_t>{-7, -7, -7, -7}));
  }
  // An invalid entry that no selected position uses is no error.
  table = {0, -1, 2, 3};
  a.slots.capacity = 16;
  EXPECT_EQ(nvfp4mla::testing::reference(a).indices, (std::vector<int32_t>{0, 1, 14, 15}));
  // An empty cache (capacity 0, e.g. a CUDA-graph warm-up before any page exists) with nothing
  // selected is no error; a selection from it is.
  std::vector<int32_t> empty_rows{0, 0};
  a.lengths = empty_rows.data();
  a.slots.capacity = 0;
  EXPECT_EQ(nvfp4mla::testing::reference(a).length, (std::vector<int32_t>{0, 0}));
  a.lengths = nullptr;
  TopkResult r(2, 2);
  EXPECT_THROW(topk_reference(a, r.outputs()), Error);
  a.slots.capacity = -1;
  EXPECT_THROW(topk_reference(a, r.outputs()), Error);
}

TEST(TopkArgsCheck, BadArgumentsNameTheArgumentAndWriteNothing) {
  TopkProblem p(2, 8, 10);
  nvfp4mla::testing::fill_random(p.values.data(), 20, 3);
  auto expect_error = [&](TopkArgs a, const std::string& needle) {
    TopkResult r(2, std::clamp(a.k, 1, 8));
    try {
      topk_reference(a, r.outputs());
      ADD_FAILURE() << "no error, expected " << needle;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
    EXPECT_EQ(r.length, (std::vector<int32_t>{-7, -7}));
  };
  TopkArgs a = p.args(4);
  a.k = 0;
  expect_error(a, "k must be");
  a.k = kTopkMaxK + 1;
  expect_error(a, "k must be");
  a = p.args(4);
  a.stride = 7;
  expect_error(a, "stride");
  std::vector<int32_t> lengths{3, -1};
  a = p.args(4);
  a.lengths = lengths.data();
  expect_error(a, "lengths[1]");
  lengths = {9, 2};
  expect_error(a, "lengths[0]");
  a = p.args(4);
  std::vector<float> shifted(24);
  a.values = reinterpret_cast<const float*>(reinterpret_cast<const char*>(shifted.data()) + 2);
  expect_error(a, "values is not aligned");
  a = p.args(4);
  a.position_offset = INT32_MAX;
  expect_error(a, "position_offset");
  std::vector<int32_t> table(4, 0);
  a = p.args(4);
  a.slots = {table.data(), 1, 4, 4, 2, 1, 100};
  expect_error(a, "block_table has 1 requests");
  a.slots = {table.data(), 2, 2, 2, 2, 1, 100};
  expect_error(a, "block_table covers 4 positions");
  a.slots = {table.data(), 2, 4, 2, 2, 1, 100};
  expect_error(a, "stride");
  a.slots = {table.data(), 2, 2, 2, 0, 1, 100};
  expect_error(a, "page_size");
}

TEST(TopkRadix, OrderKeysFollowTheSelectionOrder) {
  using topk_radix::order_key;
  std::vector<float> v{-3.4028235e38f, -1e10f, -1.0f, -1.17549435e-38f, -1.4e-45f, 0.0f,
                       1.4e-45f, 1.17549435e-38f, 1.0f, 1.0000001f, 1e10f, 3.4028235e38f, kInf};
  for (size_t i = 0; i + 1 < v.size(); ++i)
    EXPECT_LT(order_key(nvfp4mla::testing::bits_of_float(v[i])), order_key(nvfp4mla::testing::bits_of_float(v[i + 1]))) << v[i];
  EXPECT_EQ(order_key(nvfp4mla::testing::bits_of_float(-0.0f)), order_key(nvfp4mla::testing::bits_of_float(0.0f)));
  EXPECT_GT(order_key(nvfp4mla::testing::bits_of_float(-3.4028235e38f)), 0u);
  for (uint32_t nan : {0x7FC00000u, 0x7F800001u, 0xFFFFFFFFu, 0xFF800001u, 0xFF800000u /* -inf */})
    EXPECT_EQ(order_key(nan), 0u);
  // Every bit pattern: key order == float order among selectable values (sampled).
  std::mt19937 rng(9);
  for (int i = 0; i < 200000; ++i) {
    const uint32_t x = rng(), y = rng();
    const float fx = float_of_bits(x), fy = float_of_bits(y);
    if (std::isnan(fx) || std::isnan(fy) || fx == -kInf || fy == -kInf) continue;
    ASSERT_EQ(fx < fy, order_key(x) < order_key(y)) << fx << " " << fy;
    ASSERT_EQ(fx == fy, order_key(x) == order_key(y)) << fx << " " << fy;
  }
}

TEST(TopkPlan, PlannerSplitsLongRowsAndKeepsManyRowsWhole) {
  const int sms = 132;
  const auto one_m = plan_topk(1, 1 << 20, sms);  // its 256 CTAs fit at once
  EXPECT_EQ(one_m.kernel, TopkKernel::resident_rows);
  EXPECT_GE(int64_t(one_m.segments) * one_m.segment_len, 1 << 20);
  EXPECT_LE(one_m.segments, kTopkResidentCtasPerSm * sms);
  EXPECT_LE(one_m.segment_len, kTopkResidentMaxSegment);
  EXPECT_EQ(one_m.candidates, 0);
  EXPECT_GE(one_m.segments, 128);
  EXPECT_GT(topk_workspace_bytes(one_m, 1), 0u);
  const auto many = plan_topk(2048, 32768, sms);
  EXPECT_EQ(many.kernel, TopkKernel::row_per_cta);
  EXPECT_EQ(topk_workspace_bytes(many, 2048), 0u);
  const auto mid = plan_topk(64, 131072, sms);
  EXPECT_EQ(mid.kernel, TopkKernel::split_rows);
  EXPECT_GE(int64_t(mid.segments) * 64, sms);
  EXPECT_EQ(mid.segments, 4);  // a filtering plan: ~2 CTAs per SM, rounded down
  EXPECT_GT(topk_workspace_bytes(mid, 64), 0u);
  const auto long_rows = plan_topk(16, 1 << 20, sms);
  EXPECT_EQ(long_rows.kernel, TopkKernel::split_rows);
  EXPECT_LE(long_rows.segment_len, kTopkFilterMaxSegment);
  EXPECT_EQ(long_rows.segments, 32);
  EXPECT_EQ(plan_topk(128, 32768, sms).segments, 3);  // below the filter: segments of at most kTopkMaxSegment
  const auto few = plan_topk(4, 163840, sms);
  EXPECT_EQ(few.kernel, TopkKernel::resident_rows);
  EXPECT_EQ(few.segments, 40);
  // Resident only while every CTA fits: 3 rows of 2^21 need 256 segments each.
  EXPECT_EQ(plan_topk(3, 1 << 21, sms).kernel, TopkKernel::split_rows);
  EXPECT_EQ(plan_topk(1, 1 << 21, sms).kernel, TopkKernel::resident_rows);  // 256 segments of 8192
  for (int64_t columns : {int64_t(1), int64_t(8192), int64_t(8193), int64_t(118750), int64_t(1) << 21})
    for (int segments : {1, 2, 3, 64, 300}) {
      const auto p = resident_topk_plan(columns, segments);
      EXPECT_EQ(p.kernel, TopkKernel::resident_rows);
      EXPECT_GE(int64_t(p.segments) * p.segment_len, columns);
      EXPECT_LE(p.segment_len, kTopkResidentMaxSegment);
      EXPECT_EQ(p.segment_len % 256, 0);
    }
  EXPECT_EQ(plan_topk(1, 3000, sms).kernel, TopkKernel::row_per_cta);  // shorter than a segment
  EXPECT_EQ(plan_topk(4, 0, sms).kernel, TopkKernel::row_per_cta);
  for (int64_t columns : {int64_t(1), int64_t(255), int64_t(4097), int64_t(118750), int64_t(1) << 21})
    for (int segments : {1, 2, 3, 64, 1000}) {
      const auto p = split_topk_plan(columns, segments);
      EXPECT_GE(int64_t(p.segments) * p.segment_len, columns);
      EXPECT_LT(int64_t(p.segments - 1) * p.segment_len, std::max<int64_t>(columns, 1));
      EXPECT_EQ(p.segment_len % 256, 0);
    }
  EXPECT_THROW(plan_topk(-1, 10, sms), Error);
  EXPECT_THROW(plan_topk(1, 10, 0), Error);
}

TEST(TopkPlan, FiltersLargeWorkAndSizesTheCandidateBuffers) {
  const int sms = 132;
  // Rows x columns >= kTopkFilterMinEntries filter; smaller work takes the three passes.
  EXPECT_EQ(plan_topk(64, 131072, sms).candidates, kTopkCandidates);
  EXPECT_EQ(plan_topk(16, 1 << 20, sms).candidates, kTopkCandidates);
  EXPECT_EQ(plan_topk(1, 1 << 20, sms).candidates, 0);
  EXPECT_EQ(plan_topk(4, 163840, sms).candidates, 0);
  // split_topk_plan: the default keeps min(columns, kTopkCandidates); explicit counts are kept.
  EXPECT_EQ(split_topk_plan(5000, 3).candidates, 5000);
  EXPECT_EQ(split_topk_plan(1 << 20, 3).candidates, kTopkCandidates);
  EXPECT_EQ(split_topk_plan(1 << 20, 3, 0).candidates, 0);
  EXPECT_EQ(split_topk_plan(1 << 20, 3, 300).candidates, 300);
  EXPECT_THROW(split_topk_plan(1 << 20, 3, kTopkCandidates + 1), Error);
  EXPECT_THROW(split_topk_plan(1 << 20, 3, -2), Error);
  // The candidate buffers (8 bytes per candidate and 16 KB of sure entries per row) are in the
  // workspace only when the plan filters.
  const auto with = split_topk_plan(1 << 20, 64, 1000), without = split_topk_plan(1 << 20, 64, 0);
  EXPECT_GE(topk_workspace_bytes(with, 3), topk_workspace_bytes(without, 3) + 3 * (1000 * 8 + kTopkMaxK * 4));
}
