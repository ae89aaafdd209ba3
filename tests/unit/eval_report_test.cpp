// The evaluation report: what it claims about the formats, and that the JSON carries every
// number the table shows.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "nvfp4mla/error.h"
#include "nvfp4mla/eval/evaluation.h"
#include "support/temp_dir.h"

using namespace nvfp4mla;
using namespace nvfp4mla::eval;
using nlohmann::json;

namespace {

// A small deterministic configuration: few layers spanning the same magnitudes, few tokens.
EvalOptions small_options() {
  EvalOptions o;
  o.shape.num_layers = 6;
  o.tokens_per_layer = 96;
  o.calibration_tokens = 96;
  o.threads = 2;
  return o;
}

const EvalReport& small_report() {
  static const EvalReport r = run_evaluation(small_options());
  return r;
}

const ModeResult& mode(const EvalReport& r, const std::string& key) {
  for (const auto& m : r.modes)
    if (m.mode.key == key) return m;
  throw std::runtime_error("no mode " + key);
}

// JSON null stands for an infinite value.
double number_or_inf(const json& j) { return j.is_null() ? std::numeric_limits<double>::infinity() : j.get<double>(); }

void expect_summary(const json& j, const Summary& s) {
  EXPECT_DOUBLE_EQ(number_or_inf(j.at("mean")), s.mean);
  EXPECT_DOUBLE_EQ(number_or_inf(j.at("worst")), s.worst);
  EXPECT_EQ(j.at("worst_layer").get<int>(), s.worst_layer);
}

}  // namespace

TEST(EvalReport, AllModesInOrderWithTheirSizes) {
  const EvalReport& r = small_report();
  ASSERT_EQ(r.modes.size(), 7u);
  const int bytes[7] = {1152, 656, 432, 432, 368, 368, 368};
  for (size_t i = 0; i < 7; ++i) {
    EXPECT_EQ(r.modes[i].record_bytes, bytes[i]);
    EXPECT_EQ(r.modes[i].bytes_per_token, bytes[i] * 6);
    EXPECT_EQ(r.modes[i].tokens_per_capacity[0], static_cast<int64_t>(80e9 / (bytes[i] * 6)));
    EXPECT_EQ(r.modes[i].tokens_per_capacity[1], static_cast<int64_t>(141e9 / (bytes[i] * 6)));
  }
  EXPECT_EQ(mode(r, "nvfp4_368_dynamic").identity, "nvfp4_ds_mla:fp8-rope-368:dynamic-token-v1");
  EXPECT_EQ(mode(r, "nvfp4_432_static").identity, "nvfp4_ds_mla:bf16-rope-432:static-calibrated-v1:" + r.calibration_sha256);
  EXPECT_EQ(r.calibration_sha256.size(), 64u);
}

TEST(EvalReport, Bf16IsExact) {
  const ModeResult& m = mode(small_report(), "bf16_1152");
  for (int l = 0; l < 6; ++l) {
    EXPECT_EQ(m.latent_relative_error[l], 0.0);
    EXPECT_TRUE(std::isinf(m.latent_snr_db[l]));
  }
}

TEST(EvalReport, UnitScaleLosesTheShallowLayersAndCalibratedScalesDoNot) {
  const EvalReport& r = small_report();
  const ModeResult& implicit = mode(r, "nvfp4_368_implicit");
  // Layer 0 (max |kv_c| ~0.02): most group scales are subnormal or zero and the latent is gone.
  const GroupScaleCounts& g0 = implicit.group_scales[0];
  EXPECT_GT(static_cast<double>(g0.subnormal + g0.zero) / g0.groups, 0.5);
  EXPECT_GT(implicit.latent_relative_error[0], 0.5);
  // Deep layers are fine in every NVFP4 mode.
  EXPECT_LT(implicit.latent_relative_error[5], 0.15);
  for (const char* key : {"nvfp4_432_static", "nvfp4_368_static", "nvfp4_368_dynamic"}) {
    const ModeResult& m = mode(r, key);
    for (int l = 0; l < 6; ++l) EXPECT_LT(m.latent_relative_error[l], 0.15) << key << " layer " << l;
    EXPECT_EQ(m.group_scales_total.zero, 0) << key;
  }
  // fp8 with power-of-two tile scales: a few percent everywhere.
  EXPECT_LT(mode(r, "fp8_ds_mla_656").latent_relative_error_summary.worst, 0.05);
}

TEST(EvalReport, SameReportForAnyThreadCount) {
  EvalOptions o = small_options();
  o.threads = 1;
  const EvalReport one = run_evaluation(o);
  for (size_t i = 0; i < one.modes.size(); ++i) {
    EXPECT_EQ(one.modes[i].latent_relative_error, small_report().modes[i].latent_relative_error);
    EXPECT_EQ(one.modes[i].group_scales_total.subnormal, small_report().modes[i].group_scales_total.subnormal);
  }
}

TEST(EvalReport, JsonCarriesEveryNumber) {
  const EvalReport& r = small_report();
  const json doc = json::parse(report_to_json(r));
  EXPECT_EQ(doc.at("workload").at("seed").get<uint64_t>(), r.options.seed);
  EXPECT_EQ(doc.at("workload").at("layer_max_abs").get<std::vector<double>>(), r.layer_max_abs);
  EXPECT_EQ(doc.at("workload").at("calibration_max_abs").get<std::vector<double>>(), r.calibration_max_abs);
  ASSERT_EQ(doc.at("modes").size(), r.modes.size());
  for (size_t i = 0; i < r.modes.size(); ++i) {
    const json& j = doc.at("modes")[i];
    const ModeResult& m = r.modes[i];
    SCOPED_TRACE(m.mode.key);
    EXPECT_EQ(j.at("key"), m.mode.key);
    EXPECT_EQ(j.at("identity"), m.identity);
    EXPECT_EQ(j.at("record_bytes").get<int>(), m.record_bytes);
    EXPECT_EQ(j.at("bytes_per_token").get<int64_t>(), m.bytes_per_token);
    EXPECT_EQ(j.at("capacity").at("tokens_per_80_gb").get<int64_t>(), m.tokens_per_capacity[0]);
    EXPECT_EQ(j.at("capacity").at("tokens_per_141_gb").get<int64_t>(), m.tokens_per_capacity[1]);
    expect_summary(j.at("latent").at("relative_error"), m.latent_relative_error_summary);
    expect_summary(j.at("latent").at("snr_db"), m.latent_snr_summary);
    const json& pl = j.at("latent").at("per_layer");
    for (int l = 0; l < r.num_layers; ++l) {
      EXPECT_DOUBLE_EQ(pl.at("relative_error")[l].get<double>(), m.latent_relative_error[l]);
      EXPECT_DOUBLE_EQ(number_or_inf(pl.at("snr_db")[l]), m.latent_snr_db[l]);
    }
    if (m.mode.is_nvfp4()) {
      const json& t = j.at("group_scales").at("total");
      EXPECT_EQ(t.at("groups").get<int64_t>(), m.group_scales_total.groups);
      EXPECT_EQ(t.at("subnormal").get<int64_t>(), m.group_scales_total.subnormal);
      EXPECT_EQ(t.at("zero").get<int64_t>(), m.group_scales_total.zero);
      EXPECT_EQ(t.at("saturated").get<int64_t>(), m.group_scales_total.saturated);
      EXPECT_EQ(j.at("group_scales").at("per_layer").at("subnormal").size(), static_cast<size_t>(r.num_layers));
    } else {
      EXPECT_TRUE(j.at("group_scales").is_null());
    }
  }
}

TEST(EvalReport, TableNamesEveryModeAndTheCapacityDefinition) {
  const std::string text = report_to_text(small_report());
  for (const auto& m : small_report().modes) EXPECT_NE(text.find(m.mode.label), std::string::npos) << m.mode.label;
  EXPECT_NE(text.find("GB = 1e9 bytes"), std::string::npos);
}

TEST(EvalReport, InvalidOptionsAreErrors) {
  EvalOptions o = small_options();
  o.tokens_per_layer = 0;
  EXPECT_THROW(run_evaluation(o), Error);
  o = small_options();
  o.shape.num_layers = 0;
  EXPECT_THROW(run_evaluation(o), Error);
}

#ifdef NVFP4MLA_CLI_PATH
TEST(EvalCli, WritesJsonAndTable) {
  nvfp4mla::testing::TempDir dir;
  const auto json_path = dir / "report.json";
  const auto out_path = dir / "stdout.txt";
  const std::string cmd = std::string(NVFP4MLA_CLI_PATH) + " eval --tokens-per-layer 16 --calibration-tokens 16 " +
                          "--no-progress --json " + json_path.string() + " > " + out_path.string() + " 2>&1";
  ASSERT_EQ(std::system(cmd.c_str()), 0);
  std::ifstream in(json_path);
  const json doc = json::parse(in);
  EXPECT_EQ(doc.at("modes").size(), 7u);
  EXPECT_EQ(doc.at("workload").at("tokens_per_layer").get<int>(), 16);
  std::stringstream text;
  text << std::ifstream(out_path).rdbuf();
  EXPECT_NE(text.str().find("nvfp4-368 dynamic"), std::string::npos);
  EXPECT_NE(text.str().find("2,787,068"), std::string::npos);  // 368-byte tokens in 80 GB, 78 layers
}

TEST(EvalCli, BadFlagIsAClearError) {
  nvfp4mla::testing::TempDir dir;
  const auto out_path = dir / "out.txt";
  const std::string cmd = std::string(NVFP4MLA_CLI_PATH) + " eval --tokens-per-layer 0 --no-progress > " +
                          out_path.string() + " 2>&1";
  EXPECT_NE(std::system(cmd.c_str()), 0);
  std::stringstream text;
  text << std::ifstream(out_path).rdbuf();
  EXPECT_NE(text.str().find("--tokens-per-layer"), std::string::npos) << text.str();
}
#endif
