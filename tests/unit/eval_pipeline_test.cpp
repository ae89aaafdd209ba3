// The DSA workload (eval/dsa_workload.h), the DCP mapping check and the eval's pipeline section.
#include <gtest/gtest.h>

#include <algorithm>
#include <nlohmann/json.hpp>
#include <vector>

#include "nvfp4mla/error.h"
#include "nvfp4mla/eval/dsa_workload.h"
#include "nvfp4mla/eval/evaluation.h"
#include "support/eval_small.h"

using namespace nvfp4mla;
using namespace nvfp4mla::eval;

namespace {

// Rank of position `pos` in the row's fp32 logits with the needle's key at `pos` (0 = best).
int64_t needle_rank(const DsaWorkload& w, int64_t length, int64_t pos) {
  const DsaTokens base = w.tokens(0, length);
  const DsaTokens needle = w.needle(0, pos);
  const DsaQueryRow row = w.query(0, needle, length);
  std::vector<float> logits(static_cast<size_t>(length));
  DsaWorkload::exact_index_logits(row, w.options().index_heads, base.index_k.data(), length, logits.data());
  DsaWorkload::exact_index_logits(row, w.options().index_heads, needle.index_k.data(), 1, &logits[static_cast<size_t>(pos)]);
  const float v = logits[static_cast<size_t>(pos)];
  return std::count_if(logits.begin(), logits.end(), [v](float x) { return x > v; });
}

// Share of the top-k of the fp32 logits (no needle) per quarter of the context.
std::vector<double> quarter_shares(const DsaWorkload& w, int64_t length, int k) {
  const DsaTokens base = w.tokens(0, length);
  const DsaQueryRow row = w.query(0, w.needle(0, 0), length);
  std::vector<float> logits(static_cast<size_t>(length));
  DsaWorkload::exact_index_logits(row, w.options().index_heads, base.index_k.data(), length, logits.data());
  std::vector<int64_t> order(static_cast<size_t>(length));
  for (int64_t i = 0; i < length; ++i) order[static_cast<size_t>(i)] = i;
  std::partial_sort(order.begin(), order.begin() + k, order.end(),
                    [&](int64_t a, int64_t b) { return logits[size_t(a)] > logits[size_t(b)]; });
  std::vector<double> share(4, 0.0);
  for (int i = 0; i < k; ++i) share[static_cast<size_t>(order[size_t(i)] * 4 / length)] += 1.0 / k;
  return share;
}

DsaWorkloadOptions small_options() {
  DsaWorkloadOptions o;
  o.index_heads = 16;
  o.heads = 2;
  return o;
}

}  // namespace

TEST(DsaWorkload, TokensAreDeterministicPerPosition) {
  const SyntheticWorkload model(7);
  const DsaWorkload w(model, small_options());
  const DsaTokens a = w.tokens(0, 300, 2), b = w.tokens(100, 200, 1);
  EXPECT_TRUE(std::equal(b.latents.kv_c.begin(), b.latents.kv_c.end(), a.latents.kv_c.begin() + 100 * kLatentDim));
  EXPECT_TRUE(std::equal(b.index_k.begin(), b.index_k.end(), a.index_k.begin() + 100 * index_key::kDim));
  const SyntheticWorkload other(8);
  EXPECT_NE(DsaWorkload(other, small_options()).tokens(0, 300).index_k, a.index_k);
  EXPECT_EQ(w.query(3, w.needle(3, 17), 300).index_q_e4m3, w.query(3, w.needle(3, 17), 300).index_q_e4m3);
}

TEST(DsaWorkload, IndexMarginDecidesWhetherAnOldNeedleIsSelected) {
  const SyntheticWorkload model(52);
  DsaWorkloadOptions o = small_options();
  const int64_t length = 8192;
  const int k = 256;
  o.index_margin = 9.0;
  EXPECT_LT(needle_rank(DsaWorkload(model, o), length, 0), k);
  o.index_margin = 0.0;  // an ordinary token that is also the oldest: far from the top-k
  EXPECT_GT(needle_rank(DsaWorkload(model, o), length, 0), 4 * k);
  // The newest position needs less margin than the oldest (recency).
  o.index_margin = 3.0;
  const DsaWorkload w(model, o);
  EXPECT_LT(needle_rank(w, length, length - 1), needle_rank(w, length, 0));
}

TEST(DsaWorkload, RecencyPutsMostOfTheBudgetOnRecentTokensWithATail) {
  const SyntheticWorkload model(52);
  DsaWorkloadOptions o = small_options();
  const auto s = quarter_shares(DsaWorkload(model, o), 16384, 2048);
  EXPECT_GT(s[3], 0.4);
  EXPECT_GT(s[0], 0.0);
  EXPECT_LT(s[0], s[1]);
  EXPECT_LT(s[1], s[2]);
  o.recency = 0.0;
  for (double q : quarter_shares(DsaWorkload(model, o), 16384, 2048)) EXPECT_NEAR(q, 0.25, 0.06);
}

TEST(DsaWorkload, RecencyPairCoversTheContext) {
  EXPECT_EQ(dsa_recency_pair(1), 0);
  EXPECT_EQ(dsa_recency_pair(1024), 0);
  EXPECT_EQ(dsa_recency_pair(1025), 1);
  EXPECT_EQ(dsa_recency_pair(1048576), 10);
  EXPECT_EQ(dsa_recency_pair(int64_t(1) << 30), kDsaRecencyPairs - 1);
  const SyntheticWorkload model(1);
  DsaWorkloadOptions bad = small_options();
  bad.index_heads = 65;
  EXPECT_THROW(DsaWorkload(model, bad), Error);
}

TEST(DcpMapping, BijectiveThroughTheSeedsPositions) {
  for (int interleave : {1, 64}) {
    EXPECT_TRUE(check_dcp_mapping(475000, 4, interleave).bijective);
    EXPECT_TRUE(check_dcp_mapping(1048576, 4, interleave).bijective);
  }
  EXPECT_TRUE(check_dcp_mapping(1001, 3, 7).bijective);
  EXPECT_TRUE(check_dcp_mapping(0, 4, 1).bijective);
  EXPECT_THROW(check_dcp_mapping(10, 0, 1), Error);
}

TEST(EvalPipeline, SmallReportHasTheGridTheSelectionAndTheChecks) {
  const EvalReport& r = nvfp4mla::testing::small_eval_report();
  ASSERT_EQ(r.pipeline_lengths, (std::vector<int64_t>{1024, 3000}));
  ASSERT_EQ(r.selection.size(), 2u);
  const size_t cells = r.pipeline_lengths.size() * r.pipeline_depths.size();
  for (const ModeResult& m : r.modes) {
    ASSERT_EQ(m.pipeline.size(), cells) << m.mode.key;
    EXPECT_EQ(m.pipeline_selected, r.modes.front().pipeline_selected) << "the selection does not depend on the format";
  }
  const ModeResult& bf16 = r.modes.front();
  EXPECT_EQ(bf16.pipeline_selected, static_cast<int>(cells));
  EXPECT_EQ(bf16.pipeline_top, static_cast<int>(cells));
  EXPECT_EQ(nvfp4mla::testing::mode_of(r, "fp8_ds_mla_656").pipeline_top, static_cast<int>(cells));
  EXPECT_GT(nvfp4mla::testing::mode_of(r, "fp8_ds_mla_656").pipeline_min_mass_ratio, 0.9);
  for (const SelectionStats& s : r.selection) {
    double sum = 0, exact = 0;
    for (int q = 0; q < 4; ++q) {
      sum += s.share[q];
      exact += s.exact_share[q];
    }
    EXPECT_NEAR(sum, 1.0, 1e-9);
    EXPECT_NEAR(exact, 1.0, 1e-9);
    EXPECT_GT(s.share[3], s.share[0]);
    EXPECT_GT(s.exact_overlap, 0.8);
  }
  ASSERT_EQ(r.dcp.size(), 4u);
  for (const DcpMappingCheck& d : r.dcp) EXPECT_TRUE(d.bijective);
  const auto doc = nlohmann::json::parse(report_to_json(r));
  EXPECT_EQ(doc.at("pipeline").at("lengths")[1].get<int64_t>(), 3000);
  EXPECT_EQ(doc.at("modes")[0].at("pipeline").at("selected").size(), 2u);
  const std::string text = report_to_text(r);
  EXPECT_NE(text.find("DSA pipeline"), std::string::npos);
  EXPECT_NE(text.find("bijective through 1,048,576 positions"), std::string::npos);
}
