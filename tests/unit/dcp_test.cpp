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
#include "nvfp4mla/codec.h"
#include "support/attention_problem.h"
#include "support/dcp_data.h"
#include "support/expect_error.h"
#include "nvfp4mla/testing/random_tokens.h"
#include "nvfp4mla/record.h"
#include "support/topk_data.h"

using namespace nvfp4mla;
using nvfp4mla::testing::expect_error_containing;
namespace nt = nvfp4mla::testing;

namespace {

constexpr int kRanks[] = {2, 4, 8};
constexpr int kInterleaves[] = {1, 16, 64};

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
  dcp_global_positions(p, 2, pos.data(), int64_t(pos.size()));
  for (size_t i = 0; i < pos.size(); ++i) EXPECT_EQ(pos[i], dcp_global_position(p, 2, int64_t(i)));
  std::vector<int32_t> one(1, 7);  // rank 63's first position is 63 * 2^26 > 2^31-1
  expect_error_containing([&] { dcp_global_positions({64, 1 << 26}, 63, one.data(), 1); }, "out holds int32 global positions");
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
        dcp_local_slot_mapping(p, page, r, global.data(), int64_t(global.size()), local.data());
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
  expect_error_containing([] { dcp_locate({0, 1}, 0); }, "ranks");
  expect_error_containing([] { dcp_locate({-2, 1}, 0); }, "ranks");
  expect_error_containing([] { dcp_locate({2, 0}, 0); }, "interleave");
  expect_error_containing([] { dcp_locate({2, 3}, 0); }, "interleave");
  expect_error_containing([] { dcp_locate({2, -4}, 0); }, "interleave");
  expect_error_containing([] { dcp_locate({2, 1}, -1); }, "global");
  expect_error_containing([] { dcp_global_position({2, 1}, 2, 0); }, "rank");
  expect_error_containing([] { dcp_global_position({2, 1}, -1, 0); }, "rank");
  expect_error_containing([] { dcp_global_position({2, 1}, 0, -1); }, "local");
  expect_error_containing([] { dcp_global_position({8, 64}, 7, std::numeric_limits<int64_t>::max() / 4); }, "local");
  expect_error_containing([] { dcp_local_length({2, 1}, 5, 10); }, "rank");
  expect_error_containing([] { dcp_local_length({2, 1}, 0, -1); }, "context_length");
  std::vector<int64_t> g(4, 0), l(4, 7);
  expect_error_containing([&] { dcp_local_slot_mapping({2, 16}, 8, 0, g.data(), 4, l.data()); }, "page_size");
  expect_error_containing([&] { dcp_local_slot_mapping({2, 16}, 0, 0, g.data(), 4, l.data()); }, "page_size");
  expect_error_containing([&] { dcp_local_slot_mapping({2, 16}, 64, 2, g.data(), 4, l.data()); }, "rank");
  expect_error_containing([&] { dcp_local_slot_mapping({2, 16}, 64, 0, g.data(), -1, l.data()); }, "n must");
  EXPECT_TRUE(std::all_of(l.begin(), l.end(), [](int64_t v) { return v == 7; }));  // nothing written
}

// ---- merge of partial attention ----

namespace {

// Runs the CPU merge into NaN-poisoned outputs; out as floats.
void merge_on_cpu(const nt::MergeProblem& p, DcpPartialType out_type, std::vector<float>& out, std::vector<float>& lse) {
  const size_t n = size_t(p.row_heads()) * kDcpLatentDim;
  std::vector<float> out_f32(n, std::numeric_limits<float>::quiet_NaN());
  std::vector<uint16_t> out_bf16(n, 0x7FC1);
  lse.assign(p.row_heads(), std::numeric_limits<float>::quiet_NaN());
  DcpMergeOutputs o;
  o.out_type = out_type;
  o.out = out_type == DcpPartialType::f32 ? static_cast<void*>(out_f32.data()) : out_bf16.data();
  o.lse = lse.data();
  dcp_merge_reference(p.args(), o);
  out = out_f32;
  if (out_type == DcpPartialType::bf16)
    for (size_t i = 0; i < n; ++i) out[i] = codec::bf16_decode(out_bf16[i]);
}

}  // namespace

// The defining property: attention over all selected tokens equals the merge of the attention
// each rank computes over the tokens it holds (ranks own slots round-robin; some rows leave
// ranks empty, the last row has no valid index at all).
TEST(DcpMerge, MergedRanksEqualAttentionOverAllTokens) {
  const RecordSpec spec{CacheDtype::bf16, RopeEncoding::bf16, ScaleMode::implicit};
  for (LseBase base : {LseBase::natural, LseBase::base2})
    for (int ranks : {1, 2, 4, 8}) {
      nt::ProblemOptions opt;
      opt.lengths = true;
      auto prob = nt::make_problem(spec, 6, 4, 24, 100 + ranks, opt);
      SparseMlaArgs whole = prob.host_args();
      whole.lse_base = base;
      const size_t rh = size_t(prob.rows) * prob.heads;
      std::vector<float> out(rh * kDcpLatentDim), lse(rh);
      sparse_mla_reference(spec, whole, out.data(), lse.data());
      nt::MergeProblem parts;
      parts.ranks = ranks;
      parts.rows = prob.rows;
      parts.heads = prob.heads;
      parts.base = base;
      parts.out_f32.resize(ranks * rh * kDcpLatentDim);
      parts.lse.resize(ranks * rh);
      for (int r = 0; r < ranks; ++r) {
        std::vector<int32_t> mine = prob.indices;
        for (auto& idx : mine)
          if (idx >= 0 && idx % ranks != r) idx = -1;
        SparseMlaArgs a = whole;
        a.indices = mine.data();
        sparse_mla_reference(spec, a, parts.out_f32.data() + r * rh * kDcpLatentDim, parts.lse.data() + r * rh);
      }
      std::vector<float> merged, merged_lse;
      merge_on_cpu(parts, DcpPartialType::f32, merged, merged_lse);
      EXPECT_TRUE(std::isinf(merged_lse[rh - 1]) && merged_lse[rh - 1] < 0);  // the empty last row
      for (size_t i = 0; i < rh; ++i) {
        if (std::isinf(lse[i])) {
          EXPECT_EQ(merged_lse[i], lse[i]);
        } else {
          EXPECT_NEAR(merged_lse[i], lse[i], 1e-5 * (1 + std::fabs(lse[i]))) << "ranks " << ranks << " row-head " << i;
        }
        for (int d = 0; d < kDcpLatentDim; ++d)
          ASSERT_NEAR(merged[i * kDcpLatentDim + d], out[i * kDcpLatentDim + d], 1e-5)
              << "ranks " << ranks << " row-head " << i << " dim " << d;
      }
    }
}

TEST(DcpMerge, HandComputedWeights) {
  nt::MergeProblem p;
  p.ranks = 3;
  p.rows = 1;
  p.heads = 1;
  p.out_f32.resize(3 * kDcpLatentDim);
  for (int d = 0; d < kDcpLatentDim; ++d) {
    p.out_f32[d] = 1.0f;
    p.out_f32[kDcpLatentDim + d] = std::numeric_limits<float>::quiet_NaN();  // empty rank: never read
    p.out_f32[2 * kDcpLatentDim + d] = 5.0f;
  }
  p.lse = {0.0f, -std::numeric_limits<float>::infinity(), std::log(3.0f)};
  std::vector<float> out, lse;
  merge_on_cpu(p, DcpPartialType::f32, out, lse);
  EXPECT_NEAR(lse[0], std::log(4.0), 1e-6);
  EXPECT_NEAR(out[7], 0.25 * 1 + 0.75 * 5, 1e-6);
  p.base = LseBase::base2;
  p.lse = {3.0f, -std::numeric_limits<float>::infinity(), 3.0f};
  merge_on_cpu(p, DcpPartialType::f32, out, lse);
  EXPECT_FLOAT_EQ(lse[0], 4.0f);
  EXPECT_FLOAT_EQ(out[100], 3.0f);
  // A NaN or +inf LSE makes the (row, head) NaN.
  for (float poison : {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity()}) {
    p.lse = {0.0f, poison, 1.0f};
    merge_on_cpu(p, DcpPartialType::bf16, out, lse);
    EXPECT_TRUE(std::isnan(lse[0]));
    EXPECT_TRUE(std::isnan(out[0]));
  }
}

TEST(DcpMerge, ReferenceOnAdversarialDataSkipsEmptyRanks) {
  for (auto kind : {nt::MergeData::random, nt::MergeData::wide, nt::MergeData::mostly_empty}) {
    const auto p = nt::make_merge_problem(4, 3, 5, DcpPartialType::bf16, LseBase::natural, kind, 3);
    std::vector<float> out, lse;
    merge_on_cpu(p, DcpPartialType::f32, out, lse);
    for (int64_t rh = 0; rh < p.row_heads(); ++rh) {
      bool any = false;
      for (int r = 0; r < p.ranks; ++r) any |= !std::isinf(p.lse[r * p.row_heads() + rh]);
      EXPECT_EQ(std::isinf(lse[rh]), !any);
      for (int d = 0; d < kDcpLatentDim; ++d) {
        const float v = out[rh * kDcpLatentDim + d];
        ASSERT_TRUE(any ? std::isfinite(v) : v == 0.0f && !std::signbit(v)) << rh << " " << d << " " << v;
      }
    }
  }
}

TEST(DcpMerge, BadArgumentsNameTheArgument) {
  auto p = nt::make_merge_problem(2, 2, 2, DcpPartialType::f32, LseBase::natural, nt::MergeData::random, 1);
  std::vector<float> out(4 * kDcpLatentDim, 7.0f), lse(4, 7.0f);
  auto run = [&](auto edit) {
    DcpMergeArgs a = p.args();
    DcpMergeOutputs o{out.data(), DcpPartialType::f32, lse.data()};
    edit(a, o);
    dcp_merge_reference(a, o);
  };
  expect_error_containing([&] { run([](DcpMergeArgs& a, DcpMergeOutputs&) { a.ranks = 0; }); }, "ranks");
  expect_error_containing([&] { run([](DcpMergeArgs& a, DcpMergeOutputs&) { a.rows = -1; }); }, "rows");
  expect_error_containing([&] { run([](DcpMergeArgs& a, DcpMergeOutputs&) { a.heads = -1; }); }, "heads");
  expect_error_containing([&] { run([](DcpMergeArgs& a, DcpMergeOutputs&) { a.partial_out = nullptr; }); }, "partial_out");
  expect_error_containing([&] { run([](DcpMergeArgs& a, DcpMergeOutputs&) { a.partial_lse = nullptr; }); }, "partial_lse");
  expect_error_containing([&] { run([](DcpMergeArgs&, DcpMergeOutputs& o) { o.out = nullptr; }); }, "merge: out is null");
  expect_error_containing([&] {
    run([](DcpMergeArgs& a, DcpMergeOutputs&) { a.partial_out = static_cast<const char*>(a.partial_out) + 4; });
  }, "partial_out");
  expect_error_containing([&] { run([](DcpMergeArgs& a, DcpMergeOutputs&) { a.partial_type = DcpPartialType(9); }); },
                      "partial_type");
  EXPECT_TRUE(std::all_of(out.begin(), out.end(), [](float v) { return v == 7.0f; }));
  EXPECT_TRUE(std::all_of(lse.begin(), lse.end(), [](float v) { return v == 7.0f; }));
}

// The GPU suite's tolerance check passes the reference itself and fails a merge that drops a rank.
TEST(DcpMerge, ToleranceCheckCatchesAWrongMerge) {
  const auto p = nt::make_merge_problem(4, 2, 3, DcpPartialType::f32, LseBase::natural, nt::MergeData::random, 8);
  std::vector<float> out, lse;
  merge_on_cpu(p, DcpPartialType::f32, out, lse);
  std::string first;
  EXPECT_EQ(nt::merge_mismatches(p, out, lse, out, lse, false, first), 0) << first;
  auto dropped = p;
  for (int64_t rh = 0; rh < p.row_heads(); ++rh) dropped.lse[rh] = -std::numeric_limits<float>::infinity();
  std::vector<float> wrong, wrong_lse;
  merge_on_cpu(dropped, DcpPartialType::f32, wrong, wrong_lse);
  EXPECT_GT(nt::merge_mismatches(p, wrong, wrong_lse, out, lse, false, first), 0);
  EXPECT_NE(first.find("row-head 0"), std::string::npos) << first;
}

// ---- selection ----

namespace {

nt::TopkResult dcp_select(const nt::TopkProblem& prob, const DcpPlacement& place, int k_rank, int k) {
  const nt::DcpCandidates cand(prob, place, k_rank);
  nt::TopkResult out(prob.rows, k);
  dcp_merge_topk_reference(cand.args(k), out.outputs());
  return out;
}

}  // namespace

// Rows of every adversarial kind (ties, NaN, -inf, +inf, signed zeros, few selectable), with
// lengths (some shorter than a rank's first block, so ranks hold nothing), split over N ranks by
// the placement: the merged selection equals topk_reference of the whole rows bit for bit.
TEST(DcpSelection, MergedRankTopkEqualsWholeRowTopk) {
  int checked = 0;
  for (int n : kRanks)
    for (int il : kInterleaves)
      for (int k : {1, 64, 512}) {
        const nt::TopkProblem prob = nt::dcp_selection_rows(uint64_t(1000) * n + il + k);
        for (int k_rank : {k, std::min(k + 37, kTopkMaxK)}) {
          const nt::TopkResult want = nt::reference(prob.args(k));
          const nt::TopkResult got = dcp_select(prob, {n, il}, k_rank, k);
          ASSERT_TRUE(got == want) << "N=" << n << " interleave=" << il << " k=" << k << " k_rank=" << k_rank;
          ++checked;
        }
      }
  EXPECT_EQ(checked, 3 * 3 * 3 * 2);
}

TEST(DcpSelection, MergeRejectsBadCandidates) {
  std::vector<int32_t> idx = {0, 4, -1, 1, 3, 5}, len = {2, 3};
  std::vector<float> val = {1, 2, -INFINITY, 3, 4, 5};
  nt::TopkResult out(1, 2);
  auto run = [&](auto edit) {
    DcpTopkMergeArgs m;
    m.ranks = 2;
    m.rows = 1;
    m.k_rank = 3;
    m.indices = idx.data();
    m.values = val.data();
    m.topk_length = len.data();
    m.k = 2;
    edit(m);
    dcp_merge_topk_reference(m, out.outputs());
  };
  run([](DcpTopkMergeArgs&) {});
  EXPECT_EQ(out.indices, (std::vector<int32_t>{3, 5}));  // values 4 and 5
  EXPECT_EQ(out.length, (std::vector<int32_t>{2}));
  const nt::TopkResult before = out;
  expect_error_containing([&] { run([](DcpTopkMergeArgs& m) { m.ranks = 0; }); }, "ranks");
  expect_error_containing([&] { run([](DcpTopkMergeArgs& m) { m.k = 4; }); }, "k must");
  expect_error_containing([&] { run([](DcpTopkMergeArgs& m) { m.k_rank = 0; }); }, "k_rank");
  expect_error_containing([&] { run([](DcpTopkMergeArgs& m) { m.values = nullptr; }); }, "values");
  len = {2, 4};
  expect_error_containing([&] { run([](DcpTopkMergeArgs&) {}); }, "topk_length");
  len = {2, 3};
  idx = {4, 0, -1, 1, 3, 5};
  expect_error_containing([&] { run([](DcpTopkMergeArgs&) {}); }, "strictly increasing");
  idx = {0, 3, -1, 1, 3, 5};
  expect_error_containing([&] { run([](DcpTopkMergeArgs&) {}); }, "two ranks");
  EXPECT_TRUE(out == before);  // nothing written
}

// ---- attention under DCP, end to end ----

namespace {

// One request of `context` tokens written into N rank caches through the shared virtual block
// table (dcp_local_slot_mapping), a selection of global positions per row, each rank's
// attention over its own records (dcp_local_indices_reference), then the merge: it must equal
// single-GPU attention over all the tokens.
void check_dcp_attention(int n, int il, int64_t context, uint64_t seed) {
  const RecordSpec spec{CacheDtype::bf16, RopeEncoding::bf16, ScaleMode::implicit};
  const int rb = spec.record_bytes(), page = 64, rows = 3, heads = 4, k = 96;
  const DcpPlacement place{n, il};
  const auto tokens = nt::random_tokens(context, seed, -0.3, 0.3);
  auto encode = [&](int64_t i, uint8_t* dst) {
    record::encode(spec, reinterpret_cast<const Bf16Bits*>(&tokens.kv_c[i * kLatentDim]),
                   reinterpret_cast<const Bf16Bits*>(&tokens.k_pe[i * kRopeDim]), 1.0f, dst);
  };
  // Single GPU: token i at slot i.
  nt::AttentionProblem single;
  single.spec = spec;
  single.rows = rows;
  single.heads = heads;
  single.topk = k;
  single.capacity = context;
  single.sm_scale = 1.0f / 24.0f;
  single.cache.resize(context * rb);
  for (int64_t i = 0; i < context; ++i) encode(i, &single.cache[i * rb]);
  // DCP: virtual pages of page * n positions, shuffled page ids, NaN in unwritten records.
  const int64_t vpage = int64_t(page) * n, vpages = (context + vpage - 1) / vpage, pages_total = vpages + 3;
  std::mt19937_64 rng(seed);
  std::vector<int32_t> table(pages_total);
  for (int64_t b = 0; b < pages_total; ++b) table[b] = static_cast<int32_t>(b);
  std::shuffle(table.begin(), table.end(), rng);
  table.resize(vpages);
  std::vector<int64_t> global_slots(context), local_slots(context);
  for (int64_t i = 0; i < context; ++i) global_slots[i] = table[i / vpage] * vpage + i % vpage;
  std::vector<std::vector<uint8_t>> caches(n, std::vector<uint8_t>(pages_total * page * rb, 0xFF));
  for (int r = 0; r < n; ++r) {
    dcp_local_slot_mapping(place, page, r, global_slots.data(), context, local_slots.data());
    for (int64_t i = 0; i < context; ++i)
      if (local_slots[i] >= 0) encode(i, &caches[r][local_slots[i] * rb]);
  }
  // The selection: sorted distinct positions, the last row shorter (-1 padding, topk_length).
  std::vector<int32_t>& positions = single.indices;
  std::vector<int32_t>& lengths = single.topk_length;
  positions.assign(rows * k, -1);
  lengths = {k, k, k / 3};
  for (int i = 0; i < rows; ++i) {
    std::vector<int32_t> all(context);
    for (int64_t t = 0; t < context; ++t) all[t] = static_cast<int32_t>(t);
    std::shuffle(all.begin(), all.end(), rng);
    std::sort(all.begin(), all.begin() + lengths[i]);
    std::copy(all.begin(), all.begin() + lengths[i], positions.begin() + i * k);
  }
  single.q.resize(size_t(rows) * heads * kQkDim);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (auto& v : single.q) v = codec::bf16_encode_rn(normal(rng));
  const SparseMlaArgs whole = single.host_args();
  const size_t rh = size_t(rows) * heads;
  std::vector<float> out(rh * kDcpLatentDim), lse(rh);
  sparse_mla_reference(spec, whole, out.data(), lse.data());

  TopkSlotMap slots;
  slots.block_table = table.data();
  slots.requests = 1;
  slots.pages = vpages;
  slots.table_stride = vpages;
  slots.page_size = page;
  slots.rows_per_request = rows;
  slots.capacity = pages_total * page;
  nt::MergeProblem parts;
  parts.ranks = n;
  parts.rows = rows;
  parts.heads = heads;
  parts.out_f32.resize(n * rh * kDcpLatentDim);
  parts.lse.resize(n * rh);
  std::vector<int> owners(rows * k, 0);
  for (int r = 0; r < n; ++r) {
    std::vector<int32_t> local(rows * k);
    dcp_local_indices_reference(place, r, positions.data(), rows, k, slots, local.data());
    for (int i = 0; i < rows * k; ++i) owners[i] += local[i] >= 0;
    SparseMlaArgs a = whole;
    a.cache = caches[r].data();
    a.capacity = slots.capacity;
    a.indices = local.data();
    sparse_mla_reference(spec, a, parts.out_f32.data() + r * rh * kDcpLatentDim, parts.lse.data() + r * rh);
  }
  for (int i = 0; i < rows * k; ++i) ASSERT_EQ(owners[i], positions[i] >= 0 ? 1 : 0) << "entry " << i;
  std::vector<float> merged, merged_lse;
  merge_on_cpu(parts, DcpPartialType::f32, merged, merged_lse);
  for (size_t i = 0; i < rh; ++i) {
    EXPECT_NEAR(merged_lse[i], lse[i], 1e-5 * (1 + std::fabs(lse[i]))) << "N=" << n << " il=" << il << " row-head " << i;
    for (int d = 0; d < kDcpLatentDim; ++d)
      ASSERT_NEAR(merged[i * kDcpLatentDim + d], out[i * kDcpLatentDim + d], 1e-5 * (1 + std::fabs(out[i * kDcpLatentDim + d])))
          << "N=" << n << " il=" << il << " row-head " << i << " dim " << d;
  }
}

}  // namespace

TEST(DcpAttention, RankCachesAndLocalIndicesGiveSingleGpuAttention) {
  for (int n : kRanks)
    for (int il : {1, 16, 64}) check_dcp_attention(n, il, 700 + 37 * n, 900 + n + il);
  check_dcp_attention(8, 64, 100, 5);  // ranks 2..7 hold no token of the request
}

TEST(DcpAttention, LocalIndicesErrorsNameTheArgument) {
  std::vector<int32_t> table = {0}, pos = {0, 1, 200}, out = {7, 7, 7};
  TopkSlotMap m;
  m.block_table = table.data();
  m.requests = 1;
  m.pages = 1;
  m.table_stride = 1;
  m.page_size = 64;
  m.capacity = 64;
  m.rows_per_request = 1;
  // Position 200 lives on rank 0 at local 100: page 1, past the table.
  expect_error_containing([&] { dcp_local_indices_reference({2, 1}, 0, pos.data(), 1, 3, m, out.data()); }, "block_table");
  EXPECT_EQ(out, (std::vector<int32_t>{7, 7, 7}));
  expect_error_containing([&] { dcp_local_indices_reference({2, 1}, 2, pos.data(), 1, 3, m, out.data()); }, "rank");
  expect_error_containing([&] { dcp_local_indices_reference({2, 1}, 0, pos.data(), 2, 3, m, out.data()); }, "requests");
  pos[2] = 3;  // rank 1's local 1
  dcp_local_indices_reference({2, 1}, 0, pos.data(), 1, 3, m, out.data());
  EXPECT_EQ(out, (std::vector<int32_t>{0, -1, -1}));
  dcp_local_indices_reference({2, 1}, 1, pos.data(), 1, 3, m, pos.data());  // in place
  EXPECT_EQ(pos, (std::vector<int32_t>{-1, 0, 1}));
}
