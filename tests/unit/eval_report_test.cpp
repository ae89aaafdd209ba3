// The evaluation report: what it claims about the formats, and that the JSON carries every
// number the table shows.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <tuple>
#include <vector>

#include "nvfp4mla/error.h"
#include "nvfp4mla/eval/evaluation.h"
#include "nvfp4mla/eval/plot.h"
#include "support/cli_child.h"
#include "support/cli_runner.h"
#include "support/eval_small.h"
#include "support/temp_dir.h"

using namespace nvfp4mla;
using namespace nvfp4mla::eval;
using nlohmann::json;

namespace {

using nvfp4mla::testing::mode_of;
using nvfp4mla::testing::small_eval_options;

const EvalReport& small_report() { return nvfp4mla::testing::small_eval_report(); }
const ModeResult& mode(const EvalReport& r, const std::string& key) { return mode_of(r, key); }

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
  EvalOptions o = small_eval_options();
  o.threads = 1;
  o.needle.layers = {0};
  const EvalReport one = run_evaluation(o);
  for (size_t i = 0; i < one.modes.size(); ++i) {
    EXPECT_EQ(one.modes[i].latent_relative_error, small_report().modes[i].latent_relative_error);
    EXPECT_EQ(one.modes[i].group_scales_total.subnormal, small_report().modes[i].group_scales_total.subnormal);
    EXPECT_EQ(one.modes[i].attention_kld, small_report().modes[i].attention_kld);
    EXPECT_EQ(one.modes[i].sweep_relative_error, small_report().modes[i].sweep_relative_error);
    ASSERT_FALSE(one.modes[i].needle.empty());
    for (size_t c = 0; c < one.modes[i].needle[0].cells.size(); ++c)
      EXPECT_EQ(one.modes[i].needle[0].cells[c].mass, small_report().modes[i].needle[0].cells[c].mass);
  }
}

TEST(EvalReport, JsonCarriesEveryNumber) {
  const EvalReport& r = small_report();
  const json doc = json::parse(report_to_json(r));
  EXPECT_EQ(doc.at("workload").at("seed").get<uint64_t>(), r.options.seed);
  EXPECT_EQ(doc.at("workload").at("layer_max_abs").get<std::vector<double>>(), r.layer_max_abs);
  EXPECT_EQ(doc.at("workload").at("calibration_max_abs").get<std::vector<double>>(), r.calibration_max_abs);
  EXPECT_EQ(doc.at("workload").at("layer_rms").get<std::vector<double>>(), r.layer_rms);
  EXPECT_EQ(doc.at("device").get<std::string>(), r.device);
  EXPECT_EQ(doc.at("sweep").at("rms").get<std::vector<double>>(), r.sweep_rms);
  EXPECT_EQ(doc.at("needle").at("layers").get<std::vector<int>>(), r.needle_layers);
  EXPECT_EQ(doc.at("needle").at("lengths").get<std::vector<int64_t>>(), r.needle_lengths);
  EXPECT_EQ(doc.at("needle").at("depths").get<std::vector<double>>(), r.needle_depths);
  EXPECT_EQ(doc.at("attention").at("topk").get<int>(), r.options.attention.topk);
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
    expect_summary(j.at("attention").at("relative_error"), m.attention_relative_error_summary);
    expect_summary(j.at("attention").at("kld"), m.attention_kld_summary);
    for (int l = 0; l < r.num_layers; ++l) {
      EXPECT_DOUBLE_EQ(j.at("attention").at("per_layer").at("relative_error")[l].get<double>(), m.attention_relative_error[l]);
      EXPECT_DOUBLE_EQ(j.at("attention").at("per_layer").at("kld")[l].get<double>(), m.attention_kld[l]);
    }
    EXPECT_EQ(j.at("sweep").at("relative_error").get<std::vector<double>>(), m.sweep_relative_error);
    EXPECT_EQ(j.at("sweep").at("lost_scale_fraction").get<std::vector<double>>(), m.sweep_lost_scale_fraction);
    const json& n = j.at("needle");
    EXPECT_EQ(n.at("total").get<int>(), m.needles_total);
    EXPECT_EQ(n.at("kept").get<int>(), m.needles_kept);
    EXPECT_EQ(n.at("lost_where_bf16_kept").get<int>(), m.needles_lost_where_reference_kept);
    EXPECT_DOUBLE_EQ(n.at("mean_mass_ratio").get<double>(), m.needle_mean_mass_ratio);
    EXPECT_DOUBLE_EQ(n.at("min_mass_ratio").get<double>(), m.needle_min_mass_ratio);
    ASSERT_EQ(n.at("grids").size(), m.needle.size());
    const size_t depths = r.needle_depths.size();
    for (size_t g = 0; g < m.needle.size(); ++g) {
      const json& grid = n.at("grids")[g];
      EXPECT_EQ(grid.at("layer").get<int>(), m.needle[g].layer);
      for (size_t li = 0; li < r.needle_lengths.size(); ++li)
        for (size_t di = 0; di < depths; ++di) {
          const NeedleCell& c = m.needle[g].cells[li * depths + di];
          EXPECT_EQ(grid.at("kept")[li][di].get<bool>(), c.kept);
          EXPECT_DOUBLE_EQ(grid.at("mass")[li][di].get<double>(), c.mass);
          EXPECT_DOUBLE_EQ(grid.at("mass_ratio")[li][di].get<double>(), c.mass_ratio);
          EXPECT_DOUBLE_EQ(grid.at("margin")[li][di].get<double>(), c.margin);
        }
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
  EvalOptions o = small_eval_options();
  o.tokens_per_layer = 0;
  EXPECT_THROW(run_evaluation(o), Error);
  o = small_eval_options();
  o.shape.num_layers = 0;
  EXPECT_THROW(run_evaluation(o), Error);
  o = small_eval_options();
  o.needle.layers = {6};
  EXPECT_THROW(run_evaluation(o), Error);
  o = small_eval_options();
  o.needle.depths = {1.5};
  EXPECT_THROW(run_evaluation(o), Error);
  o = small_eval_options();
  o.modes = {"nvfp4_999"};
  EXPECT_THROW(run_evaluation(o), Error);
  o = small_eval_options();
  o.attention.topk = 0;
  EXPECT_THROW(run_evaluation(o), Error);
}

#ifdef NVFP4MLA_CLI_PATH
namespace {

// Runs the CLI with `args`; returns the exit status and the combined output.
int run_cli(const std::string& args, std::string& output) {
  nvfp4mla::testing::TempDir dir;
  const auto out_path = dir / "out.txt";
  const std::string cmd = std::string(NVFP4MLA_CLI_PATH) + " " + args + " > " + out_path.string() + " 2>&1";
  const int status = std::system(cmd.c_str());
  std::stringstream text;
  text << std::ifstream(out_path).rdbuf();
  output = text.str();
  return status;
}

}  // namespace

TEST(EvalCli, LatentOnlyWritesJsonAndTable) {
  nvfp4mla::testing::TempDir dir;
  const auto json_path = dir / "report.json";
  std::string out;
  ASSERT_EQ(run_cli("eval --sections latent --tokens-per-layer 16 --calibration-tokens 16 --no-progress --json " +
                        json_path.string(),
                    out),
            0)
      << out;
  std::ifstream in(json_path);
  const json doc = json::parse(in);
  EXPECT_EQ(doc.at("modes").size(), 7u);
  EXPECT_EQ(doc.at("workload").at("tokens_per_layer").get<int>(), 16);
  EXPECT_TRUE(doc.at("modes")[0].at("attention").is_null());
  EXPECT_NE(out.find("nvfp4-368 dynamic"), std::string::npos);
  EXPECT_NE(out.find("2,787,068"), std::string::npos);  // 368-byte tokens in 80 GB, 78 layers
}

TEST(EvalCli, AllSectionsTinyRun) {
  nvfp4mla::testing::TempDir dir;
  std::string out;
  const std::string plot = plotting_available() ? " --plot " + (dir / "figs").string() : "";
  ASSERT_EQ(run_cli("eval --tokens-per-layer 8 --calibration-tokens 8 --context 256 --topk 64 --query-rows 1 "
                    "--heads 2 --sweep-tokens 8 --needle-lengths 256 --needle-depths 0,100 --needle-layers 0,77 "
                    "--pipeline-lengths 512 --pipeline-topk 64 --index-heads 4 "
                    "--modes nvfp4_368_dynamic --no-progress --json " +
                        (dir / "r.json").string() + plot,
                    out),
            0)
      << out;
  const json doc = json::parse(std::ifstream(dir / "r.json"));
  ASSERT_EQ(doc.at("modes").size(), 2u);  // bf16 reference + the requested mode
  EXPECT_EQ(doc.at("needle").at("lengths")[0].get<int>(), 256);
  EXPECT_EQ(doc.at("needle").at("depths")[1].get<double>(), 1.0);
  EXPECT_NE(out.find("Needle retention"), std::string::npos);
  if (plotting_available()) {
    EXPECT_TRUE(std::filesystem::exists(dir / "figs" / "needle_layer77.png"));
    EXPECT_TRUE(std::filesystem::exists(dir / "figs" / "per_layer_error.png"));
  }
}

TEST(EvalCli, BadFlagsAreClearErrors) {
  std::string out;
  EXPECT_NE(run_cli("eval --tokens-per-layer 0 --no-progress", out), 0);
  EXPECT_NE(out.find("--tokens-per-layer"), std::string::npos) << out;
  EXPECT_NE(run_cli("eval --sections latent,bogus --no-progress", out), 0);
  EXPECT_NE(out.find("unknown section 'bogus'"), std::string::npos) << out;
  EXPECT_NE(run_cli("eval --device tpu --no-progress", out), 0);
  EXPECT_NE(out.find("unknown device"), std::string::npos) << out;
  EXPECT_NE(run_cli("eval --needle-lengths 4x --no-progress", out), 0);
  EXPECT_NE(out.find("invalid context length"), std::string::npos) << out;
  EXPECT_NE(run_cli("eval --modes nvfp4_999 --sections latent --tokens-per-layer 4 --no-progress", out), 0);
  EXPECT_NE(out.find("unknown mode"), std::string::npos) << out;
}

// A failed write (here: past the file size limit) of --json left '<json>.partial' behind and
// blamed the folder; of --save-calibration it went unnoticed (the stream was checked before it was
// flushed) and renamed a truncated calibration file into place.
TEST(EvalCli, FailedWritesAreErrorsAndLeaveNothing) {
  nvfp4mla::testing::TempDir dir;
  const std::vector<std::string> small{"eval", "--sections", "latent", "--tokens-per-layer", "16", "--calibration-tokens",
                                       "16", "--no-progress", "--device", "cpu"};
  const auto before = nvfp4mla::testing::dir_listing(dir);
  for (const auto& [extra, limit, file] : std::vector<std::tuple<std::vector<std::string>, rlim_t, std::string>>{
           {{"--modes", "nvfp4_368_dynamic", "--json", "r.json"}, 8 * 1024, "r.json"},
           {{"--save-calibration", "cal.json"}, 1024, "cal.json"}}) {
    SCOPED_TRACE(file);
    std::vector<std::string> args = small;
    args.insert(args.end(), extra.begin(), extra.end());
    const auto r = nvfp4mla::testing::run_cli_child(dir.path(), args, {.file_size_bytes = limit});
    nvfp4mla::testing::expect_clean_failure(r, "File too large");
    EXPECT_NE(r.err.find(file), std::string::npos) << r.err;
    EXPECT_EQ(r.err.find("does the folder exist"), std::string::npos) << r.err;
    EXPECT_EQ(nvfp4mla::testing::dir_listing(dir), before);
  }
}

// `v *= 1024` wrapped: 18014398509481985k (2^54 + 1 thousands) became a context of 1024 tokens.
TEST(EvalCli, ContextLengthsThatOverflowOrAreNegativeAreErrors) {
  nvfp4mla::testing::TempDir dir;
  using nvfp4mla::testing::expect_cli_error;
  // --tokens-per-layer 0 would fail the run's own validation: the length must be refused first.
  const std::string bad_run = " --tokens-per-layer 0 --no-progress --device cpu";
  expect_cli_error(dir, "eval --needle-lengths 4k,18014398509481985k" + bad_run,
                   "invalid context length '18014398509481985k': it is too large");
  expect_cli_error(dir, "eval --pipeline-lengths 17592186044417M" + bad_run,
                   "invalid context length '17592186044417M': it is too large");
  expect_cli_error(dir, "eval --needle-lengths 99999999999999999999" + bad_run, "invalid context length '99999999999999999999'");
  expect_cli_error(dir, "eval --needle-lengths 4k,-4k" + bad_run, "invalid context length '-4k': it is negative");
  expect_cli_error(dir, "eval --pipeline-lengths -5" + bad_run, "invalid context length '-5': it is negative");
}

TEST(EvalCli, CudaIsNeverFaked) {
  std::string why;
  if (cuda_attention_available(&why)) GTEST_SKIP() << "CUDA attention is available in this build";
  std::string out;
  EXPECT_NE(run_cli("eval --device cuda --sections attention --no-progress", out), 0);
  EXPECT_NE(out.find("--device cuda is not available"), std::string::npos) << out;
}
#endif
