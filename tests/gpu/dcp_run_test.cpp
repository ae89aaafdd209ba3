// `nvfp4mla dcp run` with a world of 1 over NCCL: every record format, MTP rows, the step equal to
// the single GPU (top-k bit for bit, attention within the GPU tests' limits), graph replay equal
// to eager, phase times and the capacity table in the JSON; the same through the launcher
// (scripts/dcp_multi_gpu.sh 1, which exchanges the NCCL id through a file); and rank 0 of a world
// of 2 stopping before the join when rank 1 is missing or says it failed, and giving the join up
// when rank 1 said it was ready but never joins. Skips without a device or a loadable NCCL.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "gpu/dcp_support.h"
#include "gpu/gpu_support.h"
#include "nvfp4mla/dcp_id_file.h"
#include "nvfp4mla/error.h"
#include "nvfp4mla/format.h"
#include "support/temp_dir.h"

#ifdef NVFP4MLA_CLI_PATH
namespace fs = std::filesystem;
namespace nt = nvfp4mla::testing;

namespace {

struct ShellRun {
  int exit_code;
  std::string output;
};

ShellRun run_shell(const nt::TempDir& dir, const std::string& cmd) {
  const fs::path log = dir / "run.log";
  const int status = std::system(("cd '" + dir.path().string() + "' && " + cmd + " >'" + log.string() + "' 2>&1").c_str());
  std::ifstream f(log);
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, {std::istreambuf_iterator<char>(f), {}}};
}

// Small cases (the command's defaults are the benchmark's 128K and 1M tokens).
const char* const kCaseOptions = " --context 5000,70000 --rows 4 --heads 16,128 --formats all -k 512 --next-n 2 --iters 2 --warmup 1";

void expect_passing_json(const fs::path& path, int world) {
  std::ifstream f(path);
  ASSERT_TRUE(f) << path;
  const nlohmann::json j = nlohmann::json::parse(f);
  EXPECT_EQ(j["world"], world);
  EXPECT_EQ(j["failed_cases"], 0);
  EXPECT_EQ(j["nccl_nvls_enable"], "0");
  const size_t formats = std::size(nvfp4mla::kAllRecordSpecs);
  ASSERT_EQ(j["cases"].size(), formats * 2 * 2);  // formats x contexts x heads
  for (const auto& c : j["cases"]) {
    SCOPED_TRACE(c.dump());
    EXPECT_TRUE(c["passed"].get<bool>());
    EXPECT_TRUE(c["topk_equal"].get<bool>());
    EXPECT_TRUE(c["graph_equals_eager"].get<bool>());
    EXPECT_EQ(c["attention"]["failures"], 0);
    EXPECT_EQ(c["device_errors"], 0);
    EXPECT_EQ(c["rows"], 4);
    ASSERT_EQ(c["ranks"].size(), size_t(world));
    const auto& t = c["ranks"][0];
    // (A world-of-1 all-gather in place may enqueue nothing: its phases can time as 0.)
    for (const char* phase : {"gather_candidates_us", "gather_partials_us"}) EXPECT_GE(t[phase].get<double>(), 0.0) << phase;
    for (const char* phase : {"local_select_us", "topk_merge_and_attention_us", "merge_us", "step_us", "graph_replay_us"})
      EXPECT_GT(t[phase].get<double>(), 0.0) << phase;
    EXPECT_LE(t["merge_us"].get<double>(), t["step_us"].get<double>());
  }
  ASSERT_EQ(j["capacity"].size(), formats);
  for (const auto& c : j["capacity"]) {
    EXPECT_GT(c["tokens_per_gpu"].get<int64_t>(), 0);
    EXPECT_EQ(c["max_request_tokens_dcp"], c["max_request_tokens_dcp1"].get<int64_t>() * world);
  }
}

}  // namespace

TEST(GpuDcpRun, WorldOfOneEqualsSingleGpuForEveryFormat) {
  NVFP4MLA_REQUIRE_GPU();
  NVFP4MLA_REQUIRE_NCCL();
  nt::TempDir dir;
  const std::string lib = nt::test_nccl_library();
  const std::string cmd = std::string("env -u NCCL_NVLS_ENABLE '") + NVFP4MLA_CLI_PATH + "' dcp run --world 1 --rank 0" +
                          kCaseOptions + " --json run.json" + (lib.empty() ? "" : " --nccl-library '" + lib + "'");
  const ShellRun r = run_shell(dir, cmd);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("PASS"), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("FAIL"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("KV capacity"), std::string::npos) << r.output;
  expect_passing_json(dir / "run.json", 1);
}

TEST(GpuDcpRun, LauncherWithOneGpu) {
  NVFP4MLA_REQUIRE_GPU();
  NVFP4MLA_REQUIRE_NCCL();
  nt::TempDir dir;
  const std::string lib = nt::test_nccl_library();
  const std::string cmd = std::string("env -u NCCL_NVLS_ENABLE ") + (lib.empty() ? "" : "NVFP4MLA_NCCL_LIBRARY='" + lib + "' ") +
                          "'" NVFP4MLA_SOURCE_DIR "/scripts/dcp_multi_gpu.sh' 1 --bin '" NVFP4MLA_CLI_PATH "' --out out --" +
                          kCaseOptions + " --interleave 64";
  const ShellRun r = run_shell(dir, cmd);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("all ranks passed"), std::string::npos) << r.output;
  EXPECT_FALSE(fs::exists(dir / "out" / "nccl.id"));  // rank 0 removes the id once every rank joined
  expect_passing_json(dir / "out" / "dcp_run.json", 1);
}

// No rank enters the NCCL join (which waits for every rank and cannot be interrupted) before all
// have said they are ready: rank 0 alone stops after --id-timeout naming rank 1, and stops at
// once with rank 1's reason when rank 1 leaves a failed notice for its id.
TEST(GpuDcpRun, RankZeroStopsBeforeTheJoinWhenAnotherRankIsMissingOrFailed) {
  NVFP4MLA_REQUIRE_GPU();
  NVFP4MLA_REQUIRE_NCCL();
  const std::string lib = nt::test_nccl_library();
  const std::string rank0 = std::string("env -u NCCL_NVLS_ENABLE '") + NVFP4MLA_CLI_PATH +
                            "' dcp run --world 2 --rank 0 --id-file nccl.id" + kCaseOptions +
                            (lib.empty() ? "" : " --nccl-library '" + lib + "'");
  using Clock = std::chrono::steady_clock;
  {
    nt::TempDir dir;
    const auto start = Clock::now();
    const ShellRun r = run_shell(dir, rank0 + " --id-timeout 2");
    EXPECT_NE(r.exit_code, 0) << r.output;
    EXPECT_NE(r.output.find("rank(s) 1 of 2 left no notice next to id file nccl.id within 2 s"), std::string::npos) << r.output;
    EXPECT_LT(Clock::now() - start, std::chrono::seconds(60));
  }
  nt::TempDir dir;
  const auto start = Clock::now();
  ShellRun r{-1, ""};
  std::thread rank0_process([&] { r = run_shell(dir, rank0 + " --id-timeout 300"); });
  const fs::path id_path = dir / "nccl.id";
  std::vector<char> id;
  try {
    id = nvfp4mla::read_dcp_id_file(id_path.string(), 128, 60);
    nvfp4mla::write_dcp_rank_notice(id_path.string(), 1, id, false, "stand-in rank 1 cannot run");
  } catch (const nvfp4mla::Error& e) {
    ADD_FAILURE() << e.what();
  }
  rank0_process.join();
  EXPECT_NE(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("rank 1 will not join the run of id file nccl.id: stand-in rank 1 cannot run"), std::string::npos)
      << r.output;
  EXPECT_LT(Clock::now() - start, std::chrono::seconds(120));  // not the 300 s timeout
}

// A rank that said it was ready and then never joins (it died, or hangs) no longer leaves rank 0
// in NCCL's join for ever: the nonblocking join gives up after --nccl-timeout and says so. The
// stand-in rank 1 first learns the options rank 0 runs from rank 0's refusal of other ones, then
// leaves a ready notice with them and never joins.
TEST(GpuDcpRun, RankZeroGivesUpTheJoinWhenAReadyRankNeverJoins) {
  NVFP4MLA_REQUIRE_GPU();
  NVFP4MLA_REQUIRE_NCCL();
  const std::string lib = nt::test_nccl_library();
  // `timeout`: should NCCL's abort not stop a join in progress, the test fails instead of hanging.
  const std::string rank0 = std::string("timeout -k 5 150 env -u NCCL_NVLS_ENABLE '") + NVFP4MLA_CLI_PATH +
                            "' dcp run --world 2 --rank 0 --id-file nccl.id --id-timeout 60 --nccl-timeout 5" +
                            kCaseOptions + (lib.empty() ? "" : " --nccl-library '" + lib + "'");
  auto with_stand_in = [&](const nt::TempDir& dir, const std::string& options) {
    ShellRun r{-1, ""};
    std::thread rank0_process([&] { r = run_shell(dir, rank0); });
    const fs::path id_path = dir / "nccl.id";
    try {
      const std::vector<char> id = nvfp4mla::read_dcp_id_file(id_path.string(), 128, 60);
      nvfp4mla::write_dcp_rank_notice(id_path.string(), 1, id, true, options);
    } catch (const nvfp4mla::Error& e) {
      ADD_FAILURE() << e.what();
    }
    rank0_process.join();
    return r;
  };
  std::string options;
  {
    nt::TempDir dir;
    const ShellRun probe = with_stand_in(dir, "probe");
    const std::string tag = "; rank 0: ";
    const size_t at = probe.output.find(tag);
    ASSERT_NE(at, std::string::npos) << probe.output;
    const size_t line_end = probe.output.find('\n', at);
    ASSERT_NE(line_end, std::string::npos) << probe.output;
    ASSERT_EQ(probe.output[line_end - 1], ')') << probe.output;
    options = probe.output.substr(at + tag.size(), line_end - 1 - (at + tag.size()));
  }
  using Clock = std::chrono::steady_clock;
  nt::TempDir dir;
  const auto start = Clock::now();
  const ShellRun r = with_stand_in(dir, options);
  EXPECT_NE(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("the join of rank 0 of 2 did not complete within 5 s"), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("other options"), std::string::npos) << r.output;
  EXPECT_LT(Clock::now() - start, std::chrono::seconds(120));
}
#endif
