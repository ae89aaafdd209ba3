// nvfp4mla dcp union: the table and the JSON cells of a small run; bad options are one-line
// errors.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <string>

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

TEST(CliDcp, BadOptionsAreOneLineErrors) {
  TempDir dir;
  // Each option's own check, not a later one that happens to reject the same value.
  expect_cli_error(dir, "dcp union --context 0", "dcp union: context must be in 1..2^31-1");
  expect_cli_error(dir, "dcp union -k 5000", "dcp union: k must be in 1..4096");
  expect_cli_error(dir, "dcp union --interleaves 3", "interleave must be a power of two in 1..2^30 (got 3)");
  expect_cli_error(dir, "dcp", "A subcommand is required");
}
#endif
