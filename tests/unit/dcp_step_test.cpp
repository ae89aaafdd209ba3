// The DCP decode step on the CPU (dcp_decode_step_reference): over 2, 4 and 8 ranks, interleaves
// 1 and 64, MTP rows, a rank without tokens of a request, every record format, the selection
// equals the single-GPU top-k of the whole rows bit for bit and the merged attention equals
// single-GPU attention; union mode attends a superset of the exact selection; the local row
// lengths of MTP rows; bad arguments.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "nvfp4mla/dcp.h"
#include "nvfp4mla/error.h"
#include "nvfp4mla/eval/dcp_union.h"
#include "nvfp4mla/sparse_mla.h"
#include "nvfp4mla/topk.h"
#include "nvfp4mla/testing/dcp_step_problem.h"
#include "support/record_specs.h"
#include "support/expect_error.h"

using namespace nvfp4mla;
namespace nt = nvfp4mla::testing;

namespace {

struct StepResult {
  std::vector<std::vector<float>> out, lse, values;
  std::vector<std::vector<int32_t>> indices, length;
};

StepResult run_reference(const nt::DcpStepProblem& p, DcpSelection selection) {
  const int n = p.shape.place.ranks;
  const size_t rh = size_t(p.rows) * p.shape.heads, rk = size_t(p.rows) * p.shape.k;
  StepResult r;
  r.out.assign(n, std::vector<float>(rh * kLatentDim));
  r.lse.assign(n, std::vector<float>(rh));
  r.values.assign(n, std::vector<float>(rk));
  r.indices.assign(n, std::vector<int32_t>(rk));
  r.length.assign(n, std::vector<int32_t>(p.rows));
  std::vector<DcpRankStepReference> steps(n);
  for (int i = 0; i < n; ++i) {
    DcpRankStepReference& s = steps[i];
    s.logits = p.rank_logits[i].data();
    s.lengths = p.rank_lengths[i].data();
    s.q = p.q.data();
    s.cache = p.rank_caches[i].data();
    s.block_table = p.table.data();
    s.out = r.out[i].data();
    s.lse = r.lse[i].data();
    s.indices = r.indices[i].data();
    s.topk_length = r.length[i].data();
    s.values = r.values[i].data();
    if (p.shape.indexer) {
      s.logits = nullptr;
      s.lengths = nullptr;
      s.index_cache = p.rank_index[i].data();
      s.index_q = p.index_q.data();
      s.index_w = p.index_w.data();
      s.context_lens = p.shape.context_lens.data();
    }
  }
  dcp_decode_step_reference(p.step_args(selection), steps.data());
  return r;
}

// Single-GPU attention (fp64 reference) over the whole-row selection.
void single_attention(const nt::DcpStepProblem& p, std::vector<float>& out, std::vector<float>& lse) {
  std::vector<int32_t> slots(p.want_indices.size());
  const TopkSlotMap m = p.single_slots(p.table.data());
  for (size_t i = 0; i < slots.size(); ++i)
    slots[i] = p.want_indices[i] < 0 ? -1 : static_cast<int32_t>(topk_slot(m, int64_t(i) / p.shape.k, p.want_indices[i]));
  out.resize(size_t(p.rows) * p.shape.heads * kLatentDim);
  lse.resize(size_t(p.rows) * p.shape.heads);
  sparse_mla_reference(p.shape.spec, p.single_attention_args(p.q.data(), p.single_cache.data(), slots.data(), p.want_length.data()),
                       out.data(), lse.data());
}

void check_step_equals_single(const nt::DcpStepShape& shape) {
  const nt::DcpStepProblem p = nt::make_dcp_step_problem(shape);
  const StepResult got = run_reference(p, DcpSelection::exact);
  std::vector<float> out, lse;
  single_attention(p, out, lse);
  for (int r = 0; r < shape.place.ranks; ++r) {
    SCOPED_TRACE(::testing::Message() << "rank " << r);
    ASSERT_EQ(got.indices[r], p.want_indices);
    ASSERT_EQ(got.length[r], p.want_length);
    ASSERT_EQ(0, std::memcmp(got.values[r].data(), p.want_values.data(), p.want_values.size() * 4));
    for (size_t i = 0; i < lse.size(); ++i) {
      if (std::isinf(lse[i])) {
        ASSERT_EQ(got.lse[r][i], lse[i]) << "row-head " << i;
        continue;
      }
      ASSERT_NEAR(got.lse[r][i], lse[i], 1e-5 * (1 + std::fabs(lse[i]))) << "row-head " << i;
      for (int d = 0; d < kLatentDim; ++d) {
        const float w = out[i * kLatentDim + d];
        ASSERT_NEAR(got.out[r][i * kLatentDim + d], w, 1e-5 * (1 + std::fabs(w))) << "row-head " << i << " dim " << d;
      }
    }
  }
}

}  // namespace

TEST(DcpStep, ExactStepEqualsSingleGpuOverRanksAndInterleaves) {
  for (int n : {2, 4, 8})
    for (int il : {1, 64})
      for (int next_n : {1, 3}) {
        SCOPED_TRACE(::testing::Message() << "N=" << n << " interleave=" << il << " next_n=" << next_n);
        nt::DcpStepShape s;
        s.place = {n, il};
        s.next_n = next_n;
        s.context_lens = {900 + 13 * n, 40, 0};  // a short request (ranks without its tokens) and an empty one
        s.heads = 4;
        s.k = 48;
        s.seed = uint64_t(n) * 100 + il + next_n;
        check_step_equals_single(s);
      }
}

TEST(DcpStep, ExactStepEqualsSingleGpuForEveryRecordFormat) {
  for (const RecordSpec& spec : nt::kAllRecordSpecs) {
    SCOPED_TRACE(nt::spec_name(spec));
    nt::DcpStepShape s;
    s.spec = spec;
    s.place = {4, 16};
    s.next_n = 2;
    s.context_lens = {600, 150};
    s.heads = 2;
    s.k = 32;
    s.selected_only = true;  // unselected records are NaN: never read
    check_step_equals_single(s);
  }
}

// With the indexer: each rank's fused selection over its own index key cache (each MTP row its
// own causal local length) merged equals the single-GPU indexer + top-k bit for bit.
TEST(DcpStep, IndexerStepEqualsSingleGpu) {
  for (int n : {2, 4, 8})
    for (int il : {1, 64})
      for (int next_n : {1, 3}) {
        SCOPED_TRACE(::testing::Message() << "N=" << n << " interleave=" << il << " next_n=" << next_n);
        nt::DcpStepShape s;
        s.place = {n, il};
        s.next_n = next_n;
        s.context_lens = {700 + 11 * n, 50, 0};
        s.heads = 2;
        s.k = 40;
        s.indexer = true;
        s.index_heads = 8;
        s.seed = uint64_t(n) * 7 + il + next_n;
        check_step_equals_single(s);
      }
}

// Union mode: each rank's own top-k; the attended set contains the exact selection, so the
// union's attention reads at least the exact tokens, and with k >= every row's length both are
// the whole context and the outputs agree.
TEST(DcpStep, UnionModeAttendsASupersetOfTheExactSelection) {
  nt::DcpStepShape s;
  s.place = {4, 1};
  s.context_lens = {500};
  s.heads = 2;
  s.k = 40;
  const nt::DcpStepProblem p = nt::make_dcp_step_problem(s);
  const StepResult u = run_reference(p, DcpSelection::union_local);
  for (int row = 0; row < p.rows; ++row)
    for (int j = 0; j < p.want_length[row]; ++j) {
      const int32_t pos = p.want_indices[row * s.k + j];
      const int owner = dcp_locate(s.place, pos).rank;
      const auto& mine = u.indices[owner];
      EXPECT_TRUE(std::find(mine.begin() + row * s.k, mine.begin() + (row + 1) * s.k, pos) != mine.begin() + (row + 1) * s.k)
          << "position " << pos << " of the exact top-k is missing from rank " << owner << "'s selection";
    }
  // k covering every row: union = exact = every selectable token.
  s.context_lens = {150};
  s.k = 200;
  const nt::DcpStepProblem all = nt::make_dcp_step_problem(s);
  const StepResult ua = run_reference(all, DcpSelection::union_local), ea = run_reference(all, DcpSelection::exact);
  for (size_t i = 0; i < ea.out[0].size(); ++i) ASSERT_NEAR(ua.out[0][i], ea.out[0][i], 1e-5 * (1 + std::fabs(ea.out[0][i])));
}

TEST(DcpStep, LocalRowLengthsOfMtpRows) {
  // N = 2, I = 1: even positions on rank 0. Context 7, next_n 3: rows attend 5, 6 and 7 tokens.
  const int32_t ctx[] = {7, 0};
  int32_t len0[6], len1[6];
  dcp_local_row_lengths({2, 1}, 0, ctx, 2, 3, len0);
  dcp_local_row_lengths({2, 1}, 1, ctx, 2, 3, len1);
  EXPECT_EQ(std::vector<int32_t>(len0, len0 + 6), (std::vector<int32_t>{3, 3, 4, 0, 0, 0}));  // {0,2,4}, {0,2,4}, {0,2,4,6}
  EXPECT_EQ(std::vector<int32_t>(len1, len1 + 6), (std::vector<int32_t>{2, 3, 3, 0, 0, 0}));  // {1,3}, {1,3,5}, {1,3,5}
  const int32_t bad[] = {-1};
  EXPECT_THROW(dcp_local_row_lengths({2, 1}, 0, bad, 1, 1, len0), Error);
  int32_t pos[] = {0, 1, -1, 5};
  dcp_local_to_global({4, 16}, 2, pos, 4);
  EXPECT_EQ(std::vector<int32_t>(pos, pos + 4), (std::vector<int32_t>{32, 33, -1, 37}));
  int32_t far[] = {INT32_MAX / 2};
  EXPECT_THROW(dcp_local_to_global({4, 1}, 3, far, 1), Error);
}

TEST(DcpStep, BadArgumentsThrowAndWriteNothing) {
  nt::DcpStepShape s;
  s.context_lens = {100};
  s.heads = 2;
  s.k = 8;
  const nt::DcpStepProblem p = nt::make_dcp_step_problem(s);
  auto expect_throw = [&](auto mutate, const char* what) {
    DcpStepArgs a = p.step_args(DcpSelection::exact);
    std::vector<float> out(size_t(p.rows) * s.heads * kLatentDim, 7.0f);
    std::vector<int32_t> idx(size_t(p.rows) * s.k, 7), len(p.rows, 7);
    std::vector<DcpRankStepReference> steps(2);
    for (int r = 0; r < 2; ++r) {
      steps[r] = {p.rank_logits[r].data(), p.rank_lengths[r].data(), p.q.data(), p.rank_caches[r].data(), p.table.data(),
                  out.data(), nullptr, idx.data(), len.data(), nullptr, nullptr};
    }
    mutate(a, steps);
    try {
      dcp_decode_step_reference(a, steps.data());
      ADD_FAILURE() << "no Error for " << what;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << e.what();
    }
    EXPECT_TRUE(std::all_of(out.begin(), out.end(), [](float v) { return v == 7.0f; })) << what;
    EXPECT_TRUE(std::all_of(idx.begin(), idx.end(), [](int32_t v) { return v == 7; })) << what;
  };
  using Steps = std::vector<DcpRankStepReference>;
  expect_throw([](DcpStepArgs& a, Steps&) { a.k = 0; }, "k must");
  expect_throw([](DcpStepArgs& a, Steps&) { a.columns = 0; }, "columns");
  expect_throw([](DcpStepArgs& a, Steps&) { a.logits_stride = a.columns - 1; }, "logits_stride");
  expect_throw([](DcpStepArgs& a, Steps&) { a.columns = a.logits_stride = int64_t(1) << 31; }, "2^31-1");
  expect_throw([](DcpStepArgs&, Steps& st) { st[1].cache = nullptr; }, "cache");
  expect_throw([](DcpStepArgs&, Steps& st) { st[0].logits = nullptr; }, "logits");
  expect_throw([&](DcpStepArgs& a, Steps&) { a.slots.block_table = p.table.data(); }, "block_table");
  // A rank's local length past columns: topk_reference rejects it.
  std::vector<int32_t> long_len(p.rows, static_cast<int32_t>(p.columns + 1));
  expect_throw([&](DcpStepArgs&, Steps& st) { st[0].lengths = long_len.data(); }, "length");
}

// A plan made for fewer rows (or other heads or k) has smaller gathered regions: the step
// refuses it before anything runs, whatever the workspace size.
TEST(DcpStep, APlanForOtherSizesIsRefused) {
  nt::DcpStepShape s;
  s.context_lens = {300, 200};
  s.heads = 16;
  s.k = 16;
  const nt::DcpStepProblem p = nt::make_dcp_step_problem(s);
  const DcpStepArgs a = p.step_args(DcpSelection::exact);
  EXPECT_NO_THROW(validate_dcp_step_plan(a, plan_dcp_step(a, 132)));
  DcpStepArgs one_row = a;
  one_row.rows = 1;
  EXPECT_THROW(validate_dcp_step_plan(a, plan_dcp_step(one_row, 132)), Error);
  DcpStepArgs fewer_heads = a;
  fewer_heads.heads = 8;
  EXPECT_THROW(validate_dcp_step_plan(a, plan_dcp_step(fewer_heads, 132)), Error);
  DcpStepArgs other_k = a;
  other_k.k = 64;  // larger candidate regions: the offsets after them move
  nt::expect_error_containing([&] { validate_dcp_step_plan(a, plan_dcp_step(other_k, 132)); }, "made for other arguments");
}

// ---- union mode's quality measurement (eval/dcp_union.h) ----

// One rank: the union is the exact selection (no difference); k_rank = k keeps every exact entry
// (recall 1, up to N k tokens); k_rank = k / N attends at most k tokens.
TEST(DcpUnionEval, CellsFollowTheGuarantees) {
  eval::DcpUnionOptions o;
  o.context = 3000;
  o.rows = 2;
  o.k = 128;
  o.ranks = {1, 4};
  o.interleaves = {1, 16};
  o.threads = 2;
  const std::vector<eval::DcpUnionCell> cells = eval::evaluate_dcp_union(o);
  ASSERT_EQ(cells.size(), 6u);  // N = 1: k only; N = 4: k and k / 4
  for (const auto& c : cells) {
    SCOPED_TRACE(::testing::Message() << "N=" << c.ranks << " interleave " << c.interleave << " k_rank " << c.k_rank);
    EXPECT_EQ(c.rows, 2);
    if (c.ranks == 1) {
      EXPECT_EQ(c.recall, 1.0);
      EXPECT_EQ(c.union_size, 1.0);
      EXPECT_EQ(c.max_rel_l2, 0.0);
      EXPECT_EQ(c.needles, 2);
    } else if (c.k_rank == o.k) {
      EXPECT_EQ(c.min_recall, 1.0);
      EXPECT_GT(c.union_size, 1.0);
      EXPECT_LE(c.union_size, 4.0);
      EXPECT_GT(c.max_rel_l2, 0.0);
    } else {
      EXPECT_EQ(c.k_rank, o.k / 4);
      EXPECT_LE(c.union_size, 1.0);
      EXPECT_LE(c.recall, 1.0);
      EXPECT_GT(c.recall, 0.5);
    }
    EXPECT_LE(c.mean_rel_l2, c.max_rel_l2);
    EXPECT_LE(c.mean_cos_diff, c.max_cos_diff);
  }
  o.k = 0;
  EXPECT_THROW(eval::evaluate_dcp_union(o), Error);
  o.k = 128;
  o.ranks = {3};
  EXPECT_NO_THROW(eval::evaluate_dcp_union(o));  // any N >= 1
  o.interleaves = {3};
  EXPECT_THROW(eval::evaluate_dcp_union(o), Error);
}
