// nvfp4mla bench plot: figures from small bench JSON files, and clear errors for bad files; the
// bench commands' own flags are checked before any GPU work.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <string>

#include "nvfp4mla/eval/plot.h"
#include "support/cli_runner.h"
#include "support/temp_dir.h"

#ifdef NVFP4MLA_CLI_PATH

using nvfp4mla::testing::expect_cli_error;
using nvfp4mla::testing::run_cli;
using nvfp4mla::testing::slurp;
using nvfp4mla::testing::TempDir;
using nlohmann::json;

namespace {

const json kCeilings = {{"device", "Test GPU (sm_90)"}, {"copy_gbps", 4000.0}, {"bf16_tflops", 800.0}};

json decode_file() {
  json rows = json::array();
  for (const char* f : {"bf16-1152", "nvfp4_ds_mla-368-dynamic"})
    for (int r : {256, 128})
      rows.push_back({{"format", f}, {"rows", r}, {"heads", 128}, {"topk", 2048}, {"median_us", 2.5 * r}});
  return {{"ceilings", kCeilings}, {"decode", rows}};
}

json write_file() {
  return {{"ceilings", kCeilings},
          {"write", {{{"format", "fp8_ds_mla-656"}, {"frac_copy", 0.8}}, {{"format", "nvfp4_ds_mla-432-static"}, {"frac_copy", 0.6}}}}};
}

void expect_png(const std::filesystem::path& p) {
  ASSERT_TRUE(std::filesystem::exists(p)) << p;
  EXPECT_EQ(slurp(p).substr(0, 8), std::string("\x89PNG\r\n\x1a\n", 8)) << p;
}

}  // namespace

TEST(CliBenchPlot, DecodeAndWriterFigures) {
  TempDir dir;
  dir.write("decode.json", decode_file().dump());
  dir.write("write.json", write_file().dump());
  const std::string args = "bench plot --json decode.json --json write.json --out figs";
  if (!nvfp4mla::eval::plotting_available()) {
    expect_cli_error(dir, args, "libcairo2-dev");
    GTEST_SKIP() << "built without cairo";
  }
  const auto r = run_cli(dir, args);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("figs/decode_time.png\n"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("figs/writer_bandwidth.png\n"), std::string::npos) << r.out;
  expect_png(dir / "figs/decode_time.png");
  expect_png(dir / "figs/writer_bandwidth.png");
}

TEST(CliBenchPlot, OnlyTheFiguresWithResults) {
  if (!nvfp4mla::eval::plotting_available()) GTEST_SKIP() << "built without cairo";
  TempDir dir;
  json extend = decode_file();
  extend["decode"][0]["topk"] = 16384;  // a second top-k becomes part of the shape labels
  dir.write("extend.json", extend.dump());
  const auto r = run_cli(dir, "bench plot --json extend.json --out figs");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  expect_png(dir / "figs/decode_time.png");
  EXPECT_FALSE(std::filesystem::exists(dir / "figs/writer_bandwidth.png"));
}

TEST(CliBenchPlot, BadFilesNameTheFileAndField) {
  if (!nvfp4mla::eval::plotting_available()) GTEST_SKIP() << "built without cairo";
  TempDir dir;
  dir.write("broken.json", "{\"ceilings\": ");
  expect_cli_error(dir, "bench plot --json broken.json --out figs", "'broken.json': not valid JSON");
  expect_cli_error(dir, "bench plot --json absent.json --out figs", "cannot read 'absent.json'");
  json no_device = decode_file();
  no_device["ceilings"].erase("device");
  dir.write("no_device.json", no_device.dump());
  expect_cli_error(dir, "bench plot --json no_device.json --out figs", "'no_device.json': missing field 'ceilings.device'");
  json no_median = decode_file();
  no_median["decode"][1].erase("median_us");
  dir.write("no_median.json", no_median.dump());
  expect_cli_error(dir, "bench plot --json no_median.json --out figs", "missing field 'decode[1].median_us'");
  dir.write("other.json", json{{"ceilings", kCeilings}, {"tool", "nvfp4mla eval"}}.dump());
  expect_cli_error(dir, "bench plot --json other.json --out figs", "'other.json': missing field 'decode' or 'write'");
  // A good file first does not hide a bad one after it, and nothing is written.
  dir.write("decode.json", decode_file().dump());
  expect_cli_error(dir, "bench plot --json decode.json --json no_median.json --out figs", "no_median.json");
}

TEST(CliBench, BadTimingFlagsAreRejectedBeforeAnyGpuWork) {
  TempDir dir;
  for (const char* cmd : {"decode", "write", "extend"})
    expect_cli_error(dir, std::string("bench ") + cmd + " --l2-flush sometimes --json out.json", "--l2-flush");
  expect_cli_error(dir, "bench decode --warmup-seconds -1", "--warmup-seconds");
  // An unknown decode kernel is named, with the names there are.
  expect_cli_error(dir, "bench decode --kernel sm99", "unknown name 'sm99' (one of automatic, sm80_mma");
}

#endif
