// nvfp4mla dcp union: the table and the JSON cells of a small run; bad options are one-line
// errors.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <string>

#include "support/cli_child.h"
#include "support/cli_runner.h"
#include "support/temp_dir.h"

#ifdef NVFP4MLA_CLI_PATH
using nvfp4mla::testing::expect_cli_error;
using nvfp4mla::testing::run_cli;
using nvfp4mla::testing::slurp;
using nvfp4mla::testing::TempDir;

TEST(CliDcp, UnionWritesTheCellsAsJson) {
  TempDir dir;
  const auto r = run_cli(dir, "dcp union --context 2048 --rows 2 -k 64 --ranks 1,2 --interleaves 1 --threads 1 --json u.json");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("recall"), std::string::npos) << r.out;
  const auto j = nlohmann::json::parse(slurp(dir / "u.json"));
  EXPECT_EQ(j["context"], 2048);
  ASSERT_EQ(j["cells"].size(), 3u);  // N = 1 (k); N = 2 (k and k / 2)
  EXPECT_EQ(j["cells"][0]["ranks"], 1);
  EXPECT_EQ(j["cells"][0]["max_rel_l2"], 0.0);
  EXPECT_EQ(j["cells"][1]["k_rank"], 64);
  EXPECT_EQ(j["cells"][1]["min_recall"], 1.0);
  EXPECT_EQ(j["cells"][2]["k_rank"], 32);
  EXPECT_LE(j["cells"][2]["union_size_over_k"].get<double>(), 1.0);
}

// A failed write of --json (here: past the file size limit) left a truncated file and exited 0:
// the stream was checked before it was flushed and closed.
TEST(CliDcp, UnionJsonWriteFailureIsAnErrorAndLeavesNothing) {
  TempDir dir;
  const std::vector<std::string> args{"dcp", "union", "--context", "2048", "--rows", "2", "-k", "64", "--ranks", "1,2,4",
                                      "--interleaves", "1", "--threads", "1", "--json", "u.json"};
  const auto full = nvfp4mla::testing::run_cli_child(dir.path(), args);
  ASSERT_EQ(full.exit_code, 0) << full.err;
  const size_t json_bytes = slurp(dir / "u.json").size();
  std::filesystem::remove(dir / "u.json");
  // A limit the table and the error line fit under but the JSON does not.
  const size_t limit = full.out.size() + 200;
  ASSERT_GT(json_bytes, limit + 100);
  const auto before = nvfp4mla::testing::dir_listing(dir);
  const auto r = nvfp4mla::testing::run_cli_child(dir.path(), args, {.file_size_bytes = limit});
  nvfp4mla::testing::expect_clean_failure(r, "File too large");
  EXPECT_NE(r.err.find("u.json"), std::string::npos) << r.err;
  EXPECT_EQ(nvfp4mla::testing::dir_listing(dir), before);
}

TEST(CliDcp, BadOptionsAreOneLineErrors) {
  TempDir dir;
  // Each option's own check, not a later one that happens to reject the same value.
  expect_cli_error(dir, "dcp union --context 0", "dcp union: context must be in 1..2^31-1");
  expect_cli_error(dir, "dcp union -k 5000", "dcp union: k must be in 1..4096");
  expect_cli_error(dir, "dcp union --interleaves 3", "interleave must be a power of two in 1..2^30 (got 3)");
  expect_cli_error(dir, "dcp", "A subcommand is required");
}
#endif
