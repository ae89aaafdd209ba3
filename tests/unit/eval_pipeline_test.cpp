// The DSA workload (eval/dsa_workload.h), the DCP mapping check and the eval's pipeline section.
#include <gtest/gtest.h>

#include <algorithm>
#include <limits>
#include <nlohmann/json.hpp>
#include <vector>

#include "nvfp4mla/codec.h"
#include "nvfp4mla/error.h"
#include "nvfp4mla/eval/dump.h"
#include "nvfp4mla/layer_tensors.h"
#include "nvfp4mla/safetensors.h"
#include "nvfp4mla/eval/dsa_workload.h"
#include "nvfp4mla/eval/evaluation.h"
#include "support/eval_small.h"
#include "support/expect_error.h"
#include "support/temp_dir.h"

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
  EXPECT_TRUE(check_dcp_mapping(1001, 3, 8).bijective);
  EXPECT_TRUE(check_dcp_mapping(0, 4, 1).bijective);
  EXPECT_THROW(check_dcp_mapping(10, 0, 1), Error);
  EXPECT_THROW(check_dcp_mapping(1001, 3, 7), Error);  // the library's placements only
  EXPECT_THROW(check_dcp_mapping(-1, 4, 1), Error);
}

TEST(EvalPipeline, SmallReportHasTheGridTheSelectionAndTheChecks) {
  const EvalReport& r = nvfp4mla::testing::small_eval_report();
  ASSERT_EQ(r.pipeline_lengths, (std::vector<int64_t>{1024, 3000}));
  ASSERT_EQ(r.selection.size(), 2u);
  const size_t cells = r.pipeline_lengths.size() * r.pipeline_depths.size();
  for (const ModeResult& m : r.modes) {
    ASSERT_EQ(m.pipeline.cells.size(), cells) << m.mode.key;
    // The same count in every format (on the CPU the selection is computed once and shared; that
    // it is format-independent is DsaPipeline.SelectionDoesNotDependOnTheRecordFormat's check).
    EXPECT_EQ(m.pipeline.selected, r.modes.front().pipeline.selected) << m.mode.key;
    ASSERT_EQ(m.verifier.cells.size(), cells) << m.mode.key;
    EXPECT_FALSE(m.verifier.route.empty());
  }
  const ModeResult& bf16 = r.modes.front();
  EXPECT_EQ(bf16.pipeline.selected, static_cast<int>(cells));
  EXPECT_EQ(bf16.pipeline.top, static_cast<int>(cells));
  EXPECT_EQ(bf16.verifier.top, static_cast<int>(cells));
  EXPECT_EQ(nvfp4mla::testing::mode_of(r, "fp8_ds_mla_656").pipeline.top, static_cast<int>(cells));
  EXPECT_GT(nvfp4mla::testing::mode_of(r, "fp8_ds_mla_656").pipeline.min_mass_ratio, 0.9);
  EXPECT_EQ(r.verifier_lengths, r.pipeline_lengths);
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
  EXPECT_EQ(doc.at("modes")[0].at("verifier").at("top").size(), 2u);
  const std::string text = report_to_text(r);
  EXPECT_NE(text.find("DSA pipeline"), std::string::npos);
  EXPECT_NE(text.find("bijective through 1,048,576 positions"), std::string::npos);
}

namespace {

// A 2-layer dump from the DSA workload: latents and index keys of `tokens` tokens, `rows` index
// query rows of `heads` heads (rows of the workload's queries for needles at a few depths).
nvfp4mla::TensorMap index_dump(int64_t tokens, int rows, int heads) {
  using nvfp4mla::DType;
  using nvfp4mla::Tensor;
  const SyntheticWorkload model(3, WorkloadShape{.num_layers = 2});
  DsaWorkloadOptions o;
  o.layer = 1;
  o.index_heads = heads;
  const DsaWorkload w(model, o);
  const DsaTokens t = w.tokens(0, tokens);
  nvfp4mla::TensorMap m;
  auto f32 = [](std::vector<int64_t> shape, const auto& values, auto convert) {
    Tensor x = Tensor::zeros(DType::F32, std::move(shape));
    for (int64_t i = 0; i < x.numel(); ++i) x.as<float>()[i] = convert(values[static_cast<size_t>(i)]);
    return x;
  };
  const auto bf16 = [](uint16_t b) { return codec::bf16_decode(b); };
  const auto same = [](float v) { return v; };
  std::vector<float> q, wt;
  for (int r = 0; r < rows; ++r) {
    const DsaQueryRow row = w.query(r, w.needle(r, r * tokens / (rows + 1)), tokens);
    q.insert(q.end(), row.index_q.begin(), row.index_q.end());
    wt.insert(wt.end(), row.index_w.begin(), row.index_w.end());
  }
  for (int l = 0; l < 2; ++l) {
    m[nvfp4mla::layer_tensor_name(l, "kv_c")] = f32({tokens, kLatentDim}, t.latents.kv_c, bf16);
    m[nvfp4mla::layer_tensor_name(l, "k_pe")] = f32({tokens, kRopeDim}, t.latents.k_pe, bf16);
    m[nvfp4mla::layer_tensor_name(l, "index_k")] = f32({tokens, 128}, t.index_k, bf16);
    m[nvfp4mla::layer_tensor_name(l, "index_q")] = f32({rows, heads, 128}, q, same);
    m[nvfp4mla::layer_tensor_name(l, "index_w")] = f32({rows, heads}, wt, same);
  }
  return m;
}

EvalOptions dump_pipeline_options(const std::filesystem::path& dump) {
  EvalOptions o = nvfp4mla::testing::small_eval_options();
  o.dump = dump;
  o.latent = o.attention.enabled = o.sweep.enabled = o.needle.enabled = false;
  o.device = Device::cpu;
  return o;
}

}  // namespace

TEST(EvalPipeline, DumpIndexTensorsGiveTheSelectionReport) {
  nvfp4mla::testing::TempDir dir;
  const auto path = dir / "acts.safetensors";
  nvfp4mla::write_safetensors(path, index_dump(2000, 3, 8));
  const EvalReport r = run_evaluation(dump_pipeline_options(path));
  ASSERT_EQ(r.selection.size(), 1u);
  EXPECT_EQ(r.selection[0].length, 2000);
  EXPECT_GT(r.selection[0].share[3], r.selection[0].share[0]);
  EXPECT_GT(r.selection[0].exact_overlap, 0.8);
  EXPECT_NE(r.pipeline_note.find("dump layer 1: its 3 index query rows (8 heads)"), std::string::npos) << r.pipeline_note;
  EXPECT_TRUE(r.pipeline_lengths.empty());
  EXPECT_NE(report_to_text(r).find("Selection distribution"), std::string::npos);
}

TEST(EvalPipeline, DumpIndexTensorsAreValidatedByName) {
  nvfp4mla::testing::TempDir dir;
  const auto path = dir / "acts.safetensors";
  auto expect_error = [&](nvfp4mla::TensorMap m, const std::string& message) {
    nvfp4mla::write_safetensors(path, m);
    try {
      (void)read_dump(path);
      ADD_FAILURE() << "accepted; expected: " << message;
    } catch (const nvfp4mla::Error& e) {
      EXPECT_NE(std::string(e.what()).find(message), std::string::npos) << e.what();
    }
  };
  auto m = index_dump(64, 2, 4);
  m.erase("layers.1.index_w");
  expect_error(m, "tensor 'layers.1.index_w' is missing; the dump has DSA indexer tensors");
  m = index_dump(64, 2, 4);
  m.erase("layers.0.index_k");
  expect_error(m, "tensor 'layers.0.index_k' is missing");
  m = index_dump(64, 2, 4);
  m["layers.1.index_k"] = nvfp4mla::Tensor::zeros(nvfp4mla::DType::F32, {63, 128});
  expect_error(m, "layers.1.index_k");
  m = index_dump(64, 2, 4);
  m["layers.0.index_w"] = nvfp4mla::Tensor::zeros(nvfp4mla::DType::F32, {2, 5});
  expect_error(m, "layers.0.index_w");
  m = index_dump(64, 2, 4);
  m["layers.0.index_q"].as<float>()[5] = std::numeric_limits<float>::infinity();
  expect_error(m, "tensor 'layers.0.index_q' holds a non-finite value at row 0");
  // Without index tensors the section says so.
  m = index_dump(64, 2, 4);
  for (const char* n : {"layers.0.index_k", "layers.0.index_q", "layers.0.index_w", "layers.1.index_k", "layers.1.index_q",
                        "layers.1.index_w"})
    m.erase(n);
  nvfp4mla::write_safetensors(path, m);
  EXPECT_NE(run_evaluation(dump_pipeline_options(path)).pipeline_note.find("skipped: the dump has no DSA indexer tensors"),
            std::string::npos);
}

// Two depths that round to the same position would share one needle slot in the step's cache: one
// needle overwrites the other and every format, bf16 included, misses it. Refused up front.
TEST(EvalPipeline, DepthsSharingANeedlePositionAreRefused) {
  EvalOptions o = nvfp4mla::testing::small_eval_options();
  o.latent = o.attention.enabled = o.sweep.enabled = o.needle.enabled = false;
  o.device = Device::cpu;
  o.needle.depths = {0.0, 0.001};  // both at position 0 of a 256-token context
  o.pipeline.lengths = {256};
  o.pipeline.topk = 8;
  o.pipeline.verifier_width = 0;
  nvfp4mla::testing::expect_error_containing([&] { run_evaluation(o); }, "two needle depths fall on position 0");
  o.needle.depths = {0.0, 0.05};  // positions 0 and 13
  EXPECT_NO_THROW(run_evaluation(o));
}
