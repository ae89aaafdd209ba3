// nvfp4mla plan: the seed's scratch example through the CLI, route decisions and bad input.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "support/cli_runner.h"
#include "support/temp_dir.h"

#ifdef NVFP4MLA_CLI_PATH

using nvfp4mla::testing::expect_cli_error;
using nvfp4mla::testing::run_cli;
using nvfp4mla::testing::TempDir;

TEST(CliPlan, ScratchSeedExampleAndRoute) {
  TempDir dir;
  const std::string base = "plan scratch --heads 64 --max-num-seqs 16 --max-batched-tokens 8192 --mtp 3 --splits 32 "
                           "--partials bf16 --rope fp8 --json --mode ";
  const auto on = run_cli(dir, base + "1"), off = run_cli(dir, base + "0");
  ASSERT_EQ(on.exit_code, 0) << on.err;
  ASSERT_EQ(off.exit_code, 0) << off.err;
  const auto a = nlohmann::json::parse(on.out), b = nlohmann::json::parse(off.out);
  EXPECT_EQ(a["decode_rows"], 64);
  EXPECT_EQ(b["decode_rows"], 16);
  const double diff = (a["tmp_output_bytes"].get<double>() + a["tmp_lse_bytes"].get<double>() + a["output_bytes"].get<double>()) -
                      (b["tmp_output_bytes"].get<double>() + b["tmp_lse_bytes"].get<double>() + b["output_bytes"].get<double>());
  EXPECT_EQ(diff / (1024.0 * 1024.0), 99.375);
  const auto r = run_cli(dir, "plan route --mode auto --rope fp8 --spec-tokens 3 --max-query-len 4 --decode-rows 64 --json");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(nlohmann::json::parse(r.out)["route"], "decode");  // NVFP4 is decode-qualified
  // Longer than 1 + k (within the kernel's 8 query tokens): not a verifier batch.
  const auto not_verifier = run_cli(dir, "plan route --mode auto --rope fp8 --spec-tokens 3 --max-query-len 6 --decode-rows 64 --json");
  ASSERT_EQ(not_verifier.exit_code, 0) << not_verifier.err;
  const auto nv = nlohmann::json::parse(not_verifier.out);
  EXPECT_EQ(nv["route"], "extend");
  EXPECT_NE(nv["reason"].get<std::string>().find("exceeds 1 + speculative tokens"), std::string::npos) << nv["reason"];
  // Over the kernel's limit of query tokens per request.
  const auto too_long = run_cli(dir, "plan route --mode auto --rope fp8 --spec-tokens 3 --max-query-len 9 --decode-rows 64 --json");
  ASSERT_EQ(too_long.exit_code, 0) << too_long.err;
  const auto tl = nlohmann::json::parse(too_long.out);
  EXPECT_EQ(tl["route"], "extend");
  EXPECT_NE(tl["reason"].get<std::string>().find("9 query tokens (limit 8)"), std::string::npos) << tl["reason"];
  const auto env = run_cli(dir, "plan route --cache-dtype fp8_ds_mla --spec-tokens 3 --max-query-len 4 --decode-rows 64 --json",
                           "VLLM_B12X_MLA_SPEC_EXTEND_AS_DECODE=0");
  ASSERT_EQ(env.exit_code, 0) << env.err;
  EXPECT_EQ(nlohmann::json::parse(env.out)["route"], "extend");
}

TEST(CliPlan, RejectsBadInput) {
  TempDir dir;
  expect_cli_error(dir, "plan route --mode sometimes", "0, false, off or no");
  // Issue 20 item 9: an empty --mode meant auto while the variable set to '' is an error.
  expect_cli_error(dir, "plan route --mode ''", "invalid verifier route mode ''");
  expect_cli_error(dir, "plan route", "invalid verifier route mode ''", "VLLM_B12X_MLA_SPEC_EXTEND_AS_DECODE=");
  expect_cli_error(dir, "plan capacity --memory-gib 1 --reserved-gib 2 --layers 78", "reserved memory");
  expect_cli_error(dir, "plan route --cache-dtype fp8_ds_mla --rope fp8", "--rope applies to nvfp4_ds_mla only");
}

// Negative sizes were accepted: --max-batched-tokens -5 silently became the default, and
// --decode-rows -5 --decode-row-budget -9 was planned as a batch. 0 still means the default.
TEST(CliPlan, RejectsNegativeSizes) {
  TempDir dir;
  expect_cli_error(dir, "plan scratch --heads 8 --max-num-seqs 4 --max-batched-tokens -5",
                   "--max-batched-tokens must not be negative, got -5");
  expect_cli_error(dir, "plan route --decode-rows -5", "--decode-rows must not be negative, got -5");
  expect_cli_error(dir, "plan route --decode-rows 4 --decode-row-budget -9", "--decode-row-budget must not be negative, got -9");
  EXPECT_EQ(run_cli(dir, "plan scratch --heads 8 --max-num-seqs 4 --max-batched-tokens 0").exit_code, 0);
  EXPECT_EQ(run_cli(dir, "plan route --decode-rows 0 --decode-row-budget 0").exit_code, 0);
}

// --memory-gib 1e300: the page count did not fit int64 (an undefined cast: negative pages, exit
// 0); a negative or NaN --reserved-gib was reported as a bad memory budget.
TEST(CliPlan, CapacityRejectsBudgetsItCannotCount) {
  TempDir dir;
  expect_cli_error(dir, "plan capacity --memory-gib 1e300 --layers 78", "does not fit");
  expect_cli_error(dir, "plan capacity --memory-gib 1e300 --layers 1 --indexer-bytes 0 --page-size 1", "does not fit");
  expect_cli_error(dir, "plan capacity --memory-gib 10 --reserved-gib -5 --layers 78",
                   "the reserved memory must be finite and not negative, got -5");
  expect_cli_error(dir, "plan capacity --memory-gib 10 --reserved-gib nan --layers 78",
                   "the reserved memory must be finite and not negative, got nan");
  expect_cli_error(dir, "plan capacity --memory-gib -1 --layers 78", "the memory budget must be positive and finite, got -1");
  // The largest budget whose tokens fit int64 still plans.
  const auto big = run_cli(dir, "plan capacity --memory-gib 1e9 --layers 78 --json");
  ASSERT_EQ(big.exit_code, 0) << big.err;
  EXPECT_GT(nlohmann::json::parse(big.out)["tokens"].get<int64_t>(), 0);
}

#endif
