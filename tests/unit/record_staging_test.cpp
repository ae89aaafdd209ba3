// The staged extend's CPU reference (sparse_mla.h: stage_records_reference): the attended slots
// in slot order, each once, as bf16 records of the K row rounded to BF16; every valid entry points
// at its slot's staged record, every masked one (invalid index, past topk_length) at -1. Attention
// over the staged records equals attention over the originals on BF16 operands.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <set>
#include <vector>

#include "nvfp4mla/codec.h"
#include "nvfp4mla/error.h"
#include "nvfp4mla/record.h"
#include "nvfp4mla/sparse_mla.h"
#include "support/attention_problem.h"
#include "support/record_specs.h"

using namespace nvfp4mla;
using nvfp4mla::testing::make_problem;
using nvfp4mla::testing::ProblemOptions;

TEST(RecordStaging, AttendedSlotsOnceInSlotOrderWithTheirBf16Rows) {
  ProblemOptions opt;
  opt.lengths = true;
  uint64_t seed = 40;
  for (const auto& spec : nvfp4mla::testing::kAllRecordSpecs) {
    SCOPED_TRACE(nvfp4mla::testing::spec_name(spec));
    const auto p = make_problem(spec, 5, 1, 300, seed++, opt);
    const SparseMlaArgs a = p.host_args();
    const auto s = stage_records_reference(spec, a);
    std::set<int32_t> attended;
    for (int r = 0; r < p.rows; ++r)
      for (int k = 0; k < p.topk; ++k)
        if (sparse_entry_valid(a, r, k)) attended.insert(p.indices[size_t(r) * p.topk + k]);
    ASSERT_EQ(s.count, int64_t(attended.size()));
    ASSERT_EQ(s.records.size(), size_t(s.count) * layout::bf16::kRecordBytes);
    ASSERT_EQ(s.indices.size(), p.indices.size());
    const std::vector<int32_t> order(attended.begin(), attended.end());  // slot order
    for (int r = 0; r < p.rows; ++r)
      for (int k = 0; k < p.topk; ++k) {
        const size_t e = size_t(r) * p.topk + k;
        if (!sparse_entry_valid(a, r, k)) {
          EXPECT_EQ(s.indices[e], -1) << r << " " << k;
          continue;
        }
        ASSERT_GE(s.indices[e], 0);
        ASSERT_LT(s.indices[e], s.count);
        EXPECT_EQ(order[s.indices[e]], p.indices[e]) << r << " " << k;
      }
    // Each staged record decodes to its slot's K row rounded to BF16.
    float latent[kLatentDim], rope[kRopeDim], staged_latent[kLatentDim], staged_rope[kRopeDim];
    for (size_t j = 0; j < order.size(); ++j) {
      record::decode(spec, &p.cache[size_t(order[j]) * spec.record_bytes()], p.layer_scale, latent, rope);
      record::decode(kSpecBf16, &s.records[j * layout::bf16::kRecordBytes], 1.0f, staged_latent, staged_rope);
      for (int d = 0; d < kLatentDim; ++d)
        ASSERT_EQ(staged_latent[d], codec::bf16_decode(codec::bf16_encode_rn(latent[d]))) << j << " " << d;
      for (int d = 0; d < kRopeDim; ++d)
        ASSERT_EQ(staged_rope[d], codec::bf16_decode(codec::bf16_encode_rn(rope[d]))) << j << " " << d;
    }
  }
}

TEST(RecordStaging, AttentionOverStagedRecordsEqualsAttentionOnBf16Operands) {
  ProblemOptions opt;
  opt.lengths = true;
  for (const auto& spec : {nvfp4mla::testing::kAllRecordSpecs[1], nvfp4mla::testing::kAllRecordSpecs[6]}) {
    SCOPED_TRACE(nvfp4mla::testing::spec_name(spec));
    const auto p = make_problem(spec, 4, 8, 200, 71, opt);
    const SparseMlaArgs a = p.host_args();
    const auto s = stage_records_reference(spec, a);
    SparseMlaArgs b = a;
    b.cache = s.records.data();
    b.capacity = s.count;
    b.indices = s.indices.data();
    b.topk_length = nullptr;
    b.layer_scale = 1.0f;
    const size_t n = size_t(p.rows) * p.heads;
    std::vector<float> out_a(n * kLatentDim), lse_a(n), out_b(n * kLatentDim), lse_b(n);
    sparse_mla_reference(spec, a, out_a.data(), lse_a.data(), {.bf16_operands = true});
    sparse_mla_reference(kSpecBf16, b, out_b.data(), lse_b.data());
    for (size_t i = 0; i < out_a.size(); ++i) ASSERT_EQ(out_a[i], out_b[i]) << i;
    for (size_t i = 0; i < n; ++i)
      if (std::isinf(lse_a[i])) EXPECT_TRUE(std::isinf(lse_b[i]));
      else ASSERT_EQ(lse_a[i], lse_b[i]) << i;
  }
}

TEST(RecordStaging, NothingAttendedAndBadArguments) {
  auto p = make_problem(nvfp4mla::testing::kAllRecordSpecs[6], 3, 1, 64, 9);
  std::fill(p.indices.begin(), p.indices.end(), -1);
  p.indices[5] = static_cast<int32_t>(p.capacity);  // one past the end: masked too
  const auto s = stage_records_reference(p.spec, p.host_args());
  EXPECT_EQ(s.count, 0);
  EXPECT_TRUE(s.records.empty());
  EXPECT_TRUE(std::all_of(s.indices.begin(), s.indices.end(), [](int32_t i) { return i == -1; }));
  SparseMlaArgs bad = p.host_args();
  bad.topk = 0;
  EXPECT_THROW(stage_records_reference(p.spec, bad), Error);
}
