// nvfp4mla info: the decode kernel the planner runs for every record format and head count on a
// GPU named by its compute capability (JSON and table), and bad input.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <string>

#include "nvfp4mla/format.h"
#include "support/cli_runner.h"
#include "support/temp_dir.h"

#ifdef NVFP4MLA_CLI_PATH

using nvfp4mla::testing::expect_cli_error;
using nvfp4mla::testing::run_cli;
using nvfp4mla::testing::TempDir;

TEST(CliInfo, DecodeKernelOfEveryFormatAndHeadCountOnANamedGpu) {
  TempDir dir;
  const auto r = run_cli(dir, "info --compute-capability 120 --sm-count 188 --json");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["arch"]["compute_capability"], 120);
  EXPECT_EQ(j["arch"]["sm_count"], 188);
  EXPECT_EQ(j["arch"]["smem_per_block"], 99 * 1024);
  ASSERT_EQ(j["decode_kernels"].size(), std::size(nvfp4mla::kAllRecordSpecs));
  for (const auto& f : j["decode_kernels"]) {
    const std::string format = f["format"];
    for (const char* heads : {"8", "16", "32", "64", "128"}) {
      SCOPED_TRACE(format + " " + heads);
      const auto& c = f["heads"][heads];
      ASSERT_TRUE(c["kernel"].is_string()) << c.dump();  // every shape has a kernel on sm_120
      EXPECT_EQ(c["kernel"], format.rfind("nvfp4", 0) == 0 ? "sm80_h16" : "sm80_mma");
    }
    // The 99 KB of sm_120: 32-head groups of sm80_mma above 32 heads, 4 stages for 432-byte records.
    if (format.rfind("nvfp4", 0) != 0) EXPECT_EQ(f["heads"]["128"]["head_group"], 32) << format;
    if (format.rfind("nvfp4_ds_mla-432", 0) == 0) EXPECT_EQ(f["heads"]["16"]["stages"], 4) << format;
  }
  const auto table = run_cli(dir, "info --compute-capability 120 --sm-count 188");
  ASSERT_EQ(table.exit_code, 0) << table.err;
  EXPECT_NE(table.out.find("sm80_mma/32"), std::string::npos) << table.out;
  EXPECT_NE(table.out.find("nvfp4_ds_mla-368-dynamic"), std::string::npos) << table.out;
  const auto h200 = nlohmann::json::parse(run_cli(dir, "info --compute-capability 90 --sm-count 132 --json").out);
  EXPECT_EQ(h200["decode_kernels"][0]["heads"]["64"]["kernel"], "sm90_ws_wide");
}

TEST(CliInfo, RejectsAnUnknownGpu) {
  TempDir dir;
  expect_cli_error(dir, "info --compute-capability 75", "compute capability 7.5 is not known");
  expect_cli_error(dir, "info --compute-capability -1", "--compute-capability");
}

#endif
