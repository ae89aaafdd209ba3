// Fused selection (fused_select.h), CPU reference: chunked logits + chunk top-k + fold equals
// materialized logits + top-k bit for bit (indices, lengths, values, slot ids), for chunks of
// one page, chunks not dividing the context, one chunk covering everything and the planner's
// choice; contexts 0, 1, k-1, k, k+1 and longer; verifier rows (next_n > 1); tie-heavy
// small-integer data (ties across chunk boundaries) and random data; the planner's layout; and
// bad input rejected with nothing written.
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "nvfp4mla/error.h"
#include "nvfp4mla/fused_select.h"
#include "nvfp4mla/indexer.h"
#include "nvfp4mla/topk.h"
#include "support/fused_select_problems.h"

using namespace nvfp4mla;
using nvfp4mla::testing::fused_args;
using nvfp4mla::testing::fused_slot_map;
using nvfp4mla::testing::PagedProblem;
using nvfp4mla::testing::Selection;
using nvfp4mla::testing::selection_problem;
using nvfp4mla::testing::Values;

namespace {

// Materialized logits [rows, max_context], then top-k of each row.
Selection unfused(PagedProblem& p, int k, bool slot_ids) {
  indexer_logits_reference(p.args());
  TopkArgs t;
  t.values = p.out.data();
  t.rows = static_cast<int>(p.requests * p.next_n);
  t.columns = p.stride;
  t.stride = p.stride;
  t.k = k;
  if (slot_ids) t.slots = fused_slot_map(p);
  Selection s(t.rows, k);
  topk_reference(t, s.outputs());
  return s;
}

Selection fused(PagedProblem& p, int k, bool slot_ids, int64_t chunk) {
  Selection s(p.requests * p.next_n, k);
  fused_select_reference(fused_args(p, k, slot_ids), chunk, s.outputs());
  return s;
}

struct Case {
  int next_n;
  std::vector<int32_t> lengths;
  int64_t max_context;
};

TEST(FusedSelect, EqualsLogitsThenTopkForEveryChunking) {
  constexpr int k = 8;
  constexpr int64_t page = 16;
  const std::vector<Case> cases = {
      {1, {0, 1, k - 1, k, k + 1, 200, 333}, 333},
      {3, {0, 2, k + 2, 97, 160, 301}, 320},
  };
  for (Values v : {Values::small_integers, Values::random})
    for (const Case& c : cases)
      for (bool slots : {false, true}) {
        PagedProblem p = selection_problem(4, c.next_n, page, c.lengths, c.max_context, 7 + c.next_n, v);
        const Selection expected = unfused(p, k, slots);
        for (int64_t chunk : {int64_t(0), page, 2 * page, 3 * page, 7 * page, int64_t(336)}) {
          SCOPED_TRACE("next_n " + std::to_string(c.next_n) + " chunk " + std::to_string(chunk) + " slots " +
                       std::to_string(slots) + (v == Values::random ? " random" : " small integers"));
          EXPECT_EQ(fused(p, k, slots, chunk), expected);
        }
      }
}

// Every row's candidates tie (one key repeated): the fold must keep the smallest positions,
// which lie in the first chunk, against k candidates from every later chunk.
TEST(FusedSelect, TiesAcrossChunksKeepTheSmallestPositions) {
  PagedProblem p = selection_problem(2, 2, 16, {150, 64}, 160, 3, Values::small_integers);
  for (int64_t s = 0; s < p.num_pages * p.page_size; ++s) {
    std::copy_n(&p.cache[index_key::value_offset(0, p.page_size)], 128, &p.cache[index_key::value_offset(s, p.page_size)]);
    std::copy_n(&p.cache[index_key::scale_offset(0, p.page_size)], 4, &p.cache[index_key::scale_offset(s, p.page_size)]);
  }
  const Selection expected = unfused(p, 5, false);
  for (int64_t chunk : {int64_t(16), int64_t(48)}) EXPECT_EQ(fused(p, 5, false, chunk), expected) << chunk;
  for (int r = 0; r < 4; ++r) {
    EXPECT_EQ(expected.topk_length[r], 5) << r;
    EXPECT_EQ(std::vector<int32_t>(&expected.indices[r * 5], &expected.indices[r * 5 + 5]), (std::vector<int32_t>{0, 1, 2, 3, 4}))
        << r;
  }
}

TEST(FusedSelect, RaggedEqualsLogitsThenTopkForEveryChunking) {
  for (Values v : {Values::small_integers, Values::random}) {
    nvfp4mla::testing::RaggedProblem p = nvfp4mla::testing::ragged_problem(4, 12, 500, 300, 21, v);
    const FusedSelectRaggedArgs a = nvfp4mla::testing::fused_ragged_args(p, 8);
    indexer_logits_reference(p.args());
    TopkArgs t;
    t.values = p.out.data();
    t.rows = static_cast<int>(p.rows);
    t.columns = p.stride;
    t.stride = p.stride;
    t.k = 8;
    Selection expected(p.rows, 8);
    topk_reference(t, expected.outputs());
    for (int64_t chunk : {int64_t(0), int64_t(1), int64_t(7), int64_t(8), int64_t(64), int64_t(299), int64_t(300)}) {
      Selection got(p.rows, 8);
      fused_select_reference(a, chunk, got.outputs());
      EXPECT_EQ(got, expected) << "chunk " << chunk;
    }
    FusedSelectRaggedArgs bad = a;
    bad.max_length = 2;  // rows are longer
    Selection s(p.rows, 8);
    const Selection before = s;
    EXPECT_THROW(fused_select_reference(bad, 0, s.outputs()), Error);
    EXPECT_EQ(s, before);
  }
}

TEST(FusedSelect, PlannerLayout) {
  PagedProblem p = selection_problem(4, 2, 64, {1000, 3000}, 3000, 1, Values::small_integers);
  FusedSelectArgs a = fused_args(p, 16, false);
  const FusedSelectPlan plan = plan_fused_select(a, 0, 132);
  EXPECT_EQ(plan.chunk, 3008);  // the whole context, rounded up to a page
  EXPECT_EQ(plan.chunks, 1);
  EXPECT_EQ(plan.logits_stride, 3012);  // chunk + next_n - 1, rounded up to 4
  const FusedSelectPlan small = plan_fused_select(a, 640, 132);
  EXPECT_EQ(small.chunks, 5);
  EXPECT_EQ(small.candidate_values_offset - small.candidate_positions_offset, size_t(4 * 5 * 16 * 4));
  EXPECT_GE(small.workspace_bytes, small.topk_workspace_offset + small.topk_workspace_bytes);
  EXPECT_EQ(small.workspace_bytes % 256, 0u);
  // Few rows: one chunk however long the context. Many rows: the chunk minimizing a row's
  // workspace, sqrt(2 k context) in pages, an eighth of the materialized logits here.
  a.max_context = 1 << 20;
  EXPECT_EQ(plan_fused_select(a, 0, 132).chunks, 1);
  a.keys.requests = 1024;  // 2048 rows
  const FusedSelectPlan big = plan_fused_select(a, 0, 132);
  EXPECT_EQ(big.chunk, 5824);  // sqrt(2 x 16 x 2^20) = 5792.6, rounded up to a page
  EXPECT_EQ(big.chunks, 181);
  EXPECT_LT(big.workspace_bytes, size_t(2048) * (1 << 20) * 4 / 8);
}

TEST(FusedSelect, BadInputThrowsAndWritesNothing) {
  PagedProblem p = selection_problem(4, 1, 16, {40, 70}, 80, 2, Values::small_integers);
  auto expect_rejected = [&](FusedSelectArgs a, int64_t chunk, const std::string& needle) {
    Selection s(p.requests, 4);
    const Selection before = s;
    try {
      fused_select_reference(a, chunk, s.outputs());
      ADD_FAILURE() << "accepted: " << needle;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
    EXPECT_EQ(s, before) << needle;
  };
  FusedSelectArgs a = fused_args(p, 4, false);
  expect_rejected(a, 24, "chunk");
  expect_rejected(a, -16, "chunk");
  FusedSelectArgs b = a;
  b.k = kTopkMaxK + 1;
  expect_rejected(b, 0, "k must be");
  b = a;
  b.max_context = 60;  // request 1 has 70
  expect_rejected(b, 0, "context_lens 70");
  b = a;
  b.keys.logits = p.out.data();
  b.keys.logits_stride = p.stride;
  expect_rejected(b, 0, "keys.logits");
  p.table[1 * p.table_stride + 2] = static_cast<int32_t>(p.num_pages);  // a page past the cache
  expect_rejected(fused_args(p, 4, false), 16, "block_table");
}

}  // namespace
