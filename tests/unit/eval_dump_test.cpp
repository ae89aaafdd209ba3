// `nvfp4mla eval --dump`: a user's activation dump as the workload (eval/dump.h). Small dumps
// are written with the project's safetensors writer from the synthetic generator's tokens.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <string>

#include "nvfp4mla/codec.h"
#include "nvfp4mla/error.h"
#include "nvfp4mla/eval/dump.h"
#include "nvfp4mla/eval/evaluation.h"
#include "nvfp4mla/layer_tensors.h"
#include "nvfp4mla/safetensors.h"
#include "support/cli_runner.h"
#include "support/eval_small.h"
#include "support/expect_error.h"
#include "support/sweep_claims.h"
#include "support/temp_dir.h"

using namespace nvfp4mla;
using nvfp4mla::testing::TempDir;

namespace {

constexpr int kLayers = 3;
constexpr int64_t kTokens = 96;

Tensor bf16_tensor(std::vector<int64_t> shape, const std::vector<uint16_t>& bits) {
  Tensor t = Tensor::zeros(DType::BF16, std::move(shape));
  std::memcpy(t.data.data(), bits.data(), t.data.size());
  return t;
}

// Layers of increasing magnitude from the synthetic generator; optional F32 queries.
TensorMap make_dump(int q_rows = 0, int q_heads = 0) {
  eval::WorkloadShape shape;
  shape.num_layers = kLayers;
  const eval::SyntheticWorkload w(7, shape);
  TensorMap m;
  for (int l = 0; l < kLayers; ++l) {
    const eval::TokenBlock b = w.tokens(l, eval::Sample::evaluation, 0, 0, kTokens);
    m[layer_tensor_name(l, "kv_c")] = bf16_tensor({kTokens, kLatentDim}, b.kv_c);
    m[layer_tensor_name(l, "k_pe")] = bf16_tensor({kTokens, kRopeDim}, b.k_pe);
    if (q_rows > 0) {
      Tensor q = Tensor::zeros(DType::F32, {q_rows, q_heads, kQkDim});
      float* v = q.as<float>();
      for (int64_t i = 0; i < q.numel(); ++i) v[i] = static_cast<float>(std::sin(0.37 * static_cast<double>(i + l)));
      m[layer_tensor_name(l, "q")] = q;
    }
  }
  return m;
}

eval::EvalOptions dump_options(const std::filesystem::path& dump) {
  eval::EvalOptions o = nvfp4mla::testing::small_eval_options();
  o.dump = dump;
  o.sweep.enabled = o.needle.enabled = false;
  o.device = eval::Device::cpu;
  return o;
}

void expect_rejected(const TempDir& dir, const TensorMap& m, const std::string& message) {
  const auto path = dir / "bad.safetensors";
  write_safetensors(path, m);
  try {
    eval::read_dump(path);
    ADD_FAILURE() << "accepted a dump that should fail with: " << message;
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(message), std::string::npos) << e.what();
  }
}

// The sweep and the needle grid on the dump's own tokens (sweep: the middle layer's; needle
// contexts: each layer's evaluation half, the longer one drawn with replacement).
const eval::EvalReport& dump_sweep_needle_report() {
  static const eval::EvalReport r = [] {
    const TempDir dir;
    const auto path = dir / "acts_sn.safetensors";
    write_safetensors(path, make_dump());
    eval::EvalOptions o = dump_options(path);
    o.latent = o.attention.enabled = false;
    o.sweep.enabled = o.needle.enabled = true;
    o.sweep.tokens = 256;  // capped at the 48 tokens of a half
    o.sweep.points_per_decade = 4;
    o.needle.layers.clear();
    o.needle.lengths = {32, 128};
    o.attention.topk = 32;
    return eval::run_evaluation(o);
  }();
  return r;
}

}  // namespace

TEST(EvalDump, SweepScalesTheDumpsTokens) {
  const eval::EvalReport& r = dump_sweep_needle_report();
  EXPECT_EQ(r.sweep_layer, kLayers / 2);
  EXPECT_EQ(r.options.sweep.tokens, kTokens / 2);
  ASSERT_EQ(r.sweep_token_indices.size(), static_cast<size_t>(kTokens / 2));
  ASSERT_EQ(r.sweep_calibration_indices.size(), static_cast<size_t>(kTokens / 2));
  // Evaluated on the second half, calibrated on the first (out of sample).
  for (int64_t i : r.sweep_token_indices) EXPECT_GE(i, kTokens / 2);
  for (int64_t i : r.sweep_calibration_indices) EXPECT_LT(i, kTokens / 2);
  EXPECT_NE(r.sweep_source.find("dump layer 1"), std::string::npos) << r.sweep_source;
  EXPECT_GT(r.sweep_source_rms, 0.0);
  ASSERT_EQ(r.sweep_rms.size(), 25u);
  for (double e : nvfp4mla::testing::mode_of(r, "bf16_1152").sweep_relative_error) EXPECT_EQ(e, 0.0);
  nvfp4mla::testing::expect_unit_scale_rises_at_small_magnitudes(r);
  nvfp4mla::testing::expect_calibrated_and_dynamic_scales_flat(r);
}

TEST(EvalDump, NeedlesAmongTheDumpsTokens) {
  const eval::EvalReport& r = dump_sweep_needle_report();
  EXPECT_EQ(r.needle_layers, (std::vector<int>{0, 1, 2}));
  EXPECT_EQ(r.needle_pool_tokens, kTokens - kTokens / 2);
  EXPECT_EQ(r.needle_with_replacement, (std::vector<bool>{false, true}));
  EXPECT_NE(r.needle_source.find("contexts of 128 tokens draw them with replacement"), std::string::npos) << r.needle_source;
  const eval::ModeResult& bf16 = nvfp4mla::testing::mode_of(r, "bf16_1152");
  const eval::ModeResult& dynamic = nvfp4mla::testing::mode_of(r, "nvfp4_368_dynamic");
  ASSERT_EQ(bf16.needles_total, 3 * 2 * 3);  // layers x lengths x depths
  EXPECT_GT(bf16.needles_kept, 0);
  for (size_t g = 0; g < bf16.needle.size(); ++g)
    for (size_t c = 0; c < bf16.needle[g].cells.size(); ++c)
      if (bf16.needle[g].cells[c].kept) EXPECT_TRUE(dynamic.needle[g].cells[c].kept) << "layer " << g << " cell " << c;
  EXPECT_EQ(dynamic.needles_lost_where_reference_kept, 0);
}

TEST(EvalDump, ReportNamesTheSweepAndNeedleSources) {
  const eval::EvalReport& r = dump_sweep_needle_report();
  const std::string json = eval::report_to_json(r);
  for (const char* field : {"\"source\"", "\"source_rms\"", "\"dump_token_indices\"", "\"dump_calibration_token_indices\"",
                            "\"dump_pool_tokens\"", "\"with_replacement\""})
    EXPECT_NE(json.find(field), std::string::npos) << field;
  const std::string text = eval::report_to_text(r);
  EXPECT_NE(text.find("Magnitude sweep: latent relative error of 48 tokens of dump layer 1"), std::string::npos) << text;
  EXPECT_NE(text.find("latent RMS as dumped"), std::string::npos) << text;
  EXPECT_NE(text.find("distractors from each needle layer's 48 evaluated dump tokens"), std::string::npos) << text;
}

TEST(EvalDump, SynthesizedQueriesOutOfSampleCalibration) {
  TempDir dir;
  const auto path = dir / "acts.safetensors";
  write_safetensors(path, make_dump());
  const eval::DumpWorkload d = eval::read_dump(path);
  EXPECT_EQ(d.num_layers(), kLayers);
  EXPECT_FALSE(d.has_queries);
  EXPECT_EQ(d.layers[0].calibration.count, kTokens / 2);
  EXPECT_EQ(d.layers[0].evaluation.count, kTokens - kTokens / 2);

  const eval::EvalReport r = eval::run_evaluation(dump_options(path));
  EXPECT_EQ(r.num_layers, kLayers);
  EXPECT_NE(r.workload.find("queries synthesized"), std::string::npos) << r.workload;
  EXPECT_NE(r.workload.find("out of sample"), std::string::npos) << r.workload;
  EXPECT_EQ(r.options.calibration_tokens, kTokens / 2);
  ASSERT_EQ(r.calibration_max_abs.size(), static_cast<size_t>(kLayers));
  // Calibrated on the first half only.
  for (int l = 0; l < kLayers; ++l)
    EXPECT_FLOAT_EQ(r.calibration_max_abs[l], d.layers[l].calibration.max_abs_kv_c());
  const eval::ModeResult& ref = nvfp4mla::testing::mode_of(r, "bf16_1152");
  const eval::ModeResult& st = nvfp4mla::testing::mode_of(r, "nvfp4_368_static");
  const eval::ModeResult& unit = nvfp4mla::testing::mode_of(r, "nvfp4_368_implicit");
  for (int l = 0; l < kLayers; ++l) {
    EXPECT_EQ(ref.attention_kld[l], 0.0);
    EXPECT_EQ(ref.latent_relative_error[l], 0.0);
    EXPECT_GT(st.attention_kld[l], 0.0);
    EXPECT_LT(st.latent_relative_error[l], 0.2);
  }
  // Layer 0 is small (max |kv_c| ~0.02): the unit scale loses it, the static scale does not.
  EXPECT_GT(unit.latent_relative_error[0], 2 * st.latent_relative_error[0]);
  const std::string json = eval::report_to_json(r);
  EXPECT_NE(json.find("acts.safetensors"), std::string::npos);
}

TEST(EvalDump, QueriesFromTheDumpSetRowsAndHeads) {
  TempDir dir;
  const auto path = dir / "acts_q.safetensors";
  write_safetensors(path, make_dump(/*q_rows=*/5, /*q_heads=*/3));
  eval::EvalOptions o = dump_options(path);
  o.attention.rows = 2;
  const eval::EvalReport r = eval::run_evaluation(o);
  EXPECT_NE(r.workload.find("queries from the dump"), std::string::npos) << r.workload;
  EXPECT_EQ(r.options.attention.heads, 3);
  EXPECT_EQ(r.options.attention.rows, 2);
  EXPECT_EQ(nvfp4mla::testing::mode_of(r, "bf16_1152").attention_kld[1], 0.0);
  EXPECT_GT(nvfp4mla::testing::mode_of(r, "nvfp4_432_implicit").attention_relative_error[0], 0.0);
}

TEST(EvalDump, BadDumpsAreRejectedNamingTheTensor) {
  TempDir dir;
  {
    TensorMap m = make_dump();
    m.erase("layers.1.k_pe");
    expect_rejected(dir, m, "'layers.1.k_pe' is missing");
  }
  {
    TensorMap m = make_dump();
    m["layers.0.k_pe"] = Tensor::zeros(DType::BF16, {kTokens, 32});
    expect_rejected(dir, m, "layers.0.k_pe");
  }
  {
    TensorMap m = make_dump();
    m["layers.2.kv_c"] = Tensor::zeros(DType::BF16, {kTokens - 1, kLatentDim});
    m["layers.2.k_pe"] = Tensor::zeros(DType::BF16, {kTokens - 1, kRopeDim});
    expect_rejected(dir, m, "'layers.2.kv_c' has 95 tokens but layers.0.kv_c has 96");
  }
  {
    TensorMap m = make_dump();
    m["layers.1.kv_c"] = Tensor::zeros(DType::I32, {kTokens, kLatentDim});
    expect_rejected(dir, m, "layers.1.kv_c");
  }
  {
    TensorMap m = make_dump();
    m.erase("layers.1.kv_c");
    expect_rejected(dir, m, "layers.1.kv_c is missing");
  }
  {
    TensorMap m = make_dump(2, 2);
    m.erase("layers.2.q");
    expect_rejected(dir, m, "give queries for every layer or for none");
  }
  {
    TensorMap m = make_dump(2, 2);
    m["layers.1.q"] = Tensor::zeros(DType::F32, {2, 2, 512});
    expect_rejected(dir, m, "layers.1.q");
  }
  {
    // Fewer query rows than layer 0's: the evaluation read past the end of the layer's queries.
    TensorMap m = make_dump(4, 2);
    m["layers.2.q"] = Tensor::zeros(DType::F32, {2, 2, kQkDim});
    expect_rejected(dir, m, "tensor 'layers.2.q' has 2 query rows but layers.0.q has 4");
  }
  {
    TensorMap m = make_dump();
    Tensor t = Tensor::zeros(DType::F32, {kTokens, kLatentDim});
    t.as<float>()[700] = std::numeric_limits<float>::quiet_NaN();
    m["layers.0.kv_c"] = t;
    expect_rejected(dir, m, "'layers.0.kv_c' holds a non-finite value at row 1");
  }
  {
    TensorMap m;
    m["layers.0.kv_c"] = Tensor::zeros(DType::BF16, {1, kLatentDim});
    m["layers.0.k_pe"] = Tensor::zeros(DType::BF16, {1, kRopeDim});
    expect_rejected(dir, m, "needs at least 2");
  }
  expect_rejected(dir, TensorMap{{"weights", Tensor::zeros(DType::F32, {4})}}, "no tensors named layers.<i>.kv_c");
}

// Layers of different query-row counts: the rows came from layer 0, and the other layers' queries
// were read out of bounds (SIGSEGV) instead of the dump being refused.
TEST(EvalDump, LayersWithOtherQueryRowCountsAreRefused) {
  TempDir dir;
  const auto path = dir / "acts_rows.safetensors";
  TensorMap m = make_dump(/*q_rows=*/8, /*q_heads=*/2);
  m["layers.1.q"] = Tensor::zeros(DType::F32, {1, 2, kQkDim});
  write_safetensors(path, m);
  eval::EvalOptions o = dump_options(path);
  o.attention.rows = 8;
  nvfp4mla::testing::expect_error_containing([&] { (void)eval::run_evaluation(o); },
                                             "tensor 'layers.1.q' has 1 query rows but layers.0.q has 8");
}

#ifdef NVFP4MLA_CLI_PATH
TEST(EvalDump, CommandLine) {
  TempDir dir;
  write_safetensors(dir / "acts.safetensors", make_dump());
  const std::string small = " --device cpu --no-progress --threads 2 --heads 2 --query-rows 1 --topk 32 --modes nvfp4_368_dynamic";
  auto r = nvfp4mla::testing::run_cli(dir, "eval --dump acts.safetensors --json q.json" + small);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("dump acts.safetensors: 3 layers x 96 tokens"), std::string::npos) << r.out;
  EXPECT_TRUE(std::filesystem::exists(dir / "q.json"));
  // Every section by default, the sweep and the needle grid on the dump's tokens.
  EXPECT_NE(r.out.find("Magnitude sweep: latent relative error of 48 tokens of dump layer 1"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("Needle retention"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("evaluated dump tokens"), std::string::npos) << r.out;
  r = nvfp4mla::testing::run_cli(dir, "eval --dump acts.safetensors --sections latent,needle --needle-lengths 32" + small);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out.find("Magnitude sweep"), std::string::npos) << r.out;
}
#endif
