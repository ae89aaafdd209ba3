// Multi-GPU DCP runs on the CPU side: the NCCL id exchange through a file (dcp_id_file.h),
// `nvfp4mla dcp run`'s argument errors (one line, naming the option, before any GPU or NCCL
// call), and scripts/dcp_multi_gpu.sh with stand-in ranks (one failing rank stops the others).
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <string>
#include <thread>
#include <vector>

#include "nvfp4mla/dcp_id_file.h"
#include "nvfp4mla/error.h"
#include "support/cli_runner.h"
#include "support/temp_dir.h"

using nvfp4mla::testing::TempDir;
namespace fs = std::filesystem;

namespace {

std::vector<char> id_bytes(char seed) {
  std::vector<char> b(128);
  for (size_t i = 0; i < b.size(); ++i) b[i] = static_cast<char>(seed + 7 * i);
  return b;
}

size_t entries(const TempDir& dir) {
  return static_cast<size_t>(std::distance(fs::directory_iterator(dir.path()), fs::directory_iterator()));
}

std::string read_text(const fs::path& p) {
  std::ifstream f(p);
  return {std::istreambuf_iterator<char>(f), {}};
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const nvfp4mla::Error& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST(DcpIdFile, WriteThenReadGivesTheBytesAndLeavesOneFile) {
  TempDir dir;
  const std::string path = (dir / "nccl.id").string();
  const std::vector<char> id = id_bytes(3);
  nvfp4mla::write_dcp_id_file(path, id.data(), id.size());
  EXPECT_EQ(nvfp4mla::read_dcp_id_file(path, 128, 0), id);
  EXPECT_EQ(entries(dir), 1u);  // no temporary file left
}

TEST(DcpIdFile, ReaderWaitsForTheWriter) {
  TempDir dir;
  const std::string path = (dir / "nccl.id").string();
  const std::vector<char> id = id_bytes(9);
  std::thread writer([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(150));
    nvfp4mla::write_dcp_id_file(path, id.data(), id.size());
  });
  const auto start = std::chrono::steady_clock::now();
  const std::vector<char> got = nvfp4mla::read_dcp_id_file(path, 128, 10);
  writer.join();
  EXPECT_EQ(got, id);
  EXPECT_GE(std::chrono::steady_clock::now() - start, std::chrono::milliseconds(100));
}

TEST(DcpIdFile, StaleFileTimeoutAndWrongSizeAreClearErrors) {
  TempDir dir;
  const std::string path = (dir / "nccl.id").string();
  const std::vector<char> id = id_bytes(1);
  // No writer: the reader gives up after the timeout, naming the file.
  const std::string timeout = error_of([&] { nvfp4mla::read_dcp_id_file(path, 128, 0.05); });
  EXPECT_NE(timeout.find("did not appear"), std::string::npos) << timeout;
  EXPECT_NE(timeout.find(path), std::string::npos) << timeout;
  // A file of another size is not an id.
  dir.write("short.id", "abc");
  const std::string size = error_of([&] { nvfp4mla::read_dcp_id_file((dir / "short.id").string(), 128, 1); });
  EXPECT_NE(size.find("holds 3 bytes, not 128"), std::string::npos) << size;
  // A file left from an earlier run is refused and kept as it was.
  nvfp4mla::write_dcp_id_file(path, id.data(), id.size());
  const std::vector<char> other = id_bytes(2);
  const std::string stale = error_of([&] { nvfp4mla::write_dcp_id_file(path, other.data(), other.size()); });
  EXPECT_NE(stale.find("already exists"), std::string::npos) << stale;
  EXPECT_EQ(nvfp4mla::read_dcp_id_file(path, 128, 0), id);
  EXPECT_EQ(entries(dir), 2u);
  // An unwritable folder: an error, nothing left.
  const std::string bad = error_of([&] { nvfp4mla::write_dcp_id_file((dir / "missing" / "id").string(), id.data(), 128); });
  EXPECT_NE(bad.find("cannot write"), std::string::npos) << bad;
  EXPECT_EQ(entries(dir), 2u);
  EXPECT_THROW(nvfp4mla::write_dcp_id_file("", id.data(), 128), nvfp4mla::Error);
  EXPECT_THROW(nvfp4mla::read_dcp_id_file(path, 128, -1), nvfp4mla::Error);
}

#ifdef NVFP4MLA_CLI_PATH
using nvfp4mla::testing::expect_cli_error;

// Every check runs before a GPU or NCCL is touched, so these fail the same way with and without
// a device and in CPU-only builds.
TEST(CliDcpRun, BadArgumentsAreOneLineErrorsNamingTheOption) {
  TempDir dir;
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"dcp run --rank 0", "--world is required"},
      {"dcp run --world 1", "--rank is required"},
      {"dcp run --world 0 --rank 0", "--world must be >= 1"},
      {"dcp run --world 2 --rank 2 --id-file f", "--rank must be in 0..1 (got 2)"},
      {"dcp run --world 2 --rank 1", "--id-file is required when --world > 1"},
      {"dcp run --world 1 --rank 0 --interleave 3", "--interleave must be a power of two (got 3)"},
      {"dcp run --world 1 --rank 0 --interleave 128", "--page-size must be a positive multiple of --interleave"},
      {"dcp run --world 1 --rank 0 --next-n 0", "--next-n must be in 1..8"},
      {"dcp run --world 1 --rank 0 --next-n 2 --rows 64,3", "--rows must be positive multiples of --next-n (got 3"},
      {"dcp run --world 1 --rank 0 --heads 0", "--heads must be in 1..128"},
      {"dcp run --world 1 --rank 0 --context 0", "--context must be in 1..2^31-1"},
      {"dcp run --world 1 --rank 0 -k 0", "-k must be in 1.."},
      {"dcp run --world 1 --rank 0 --device -2", "--device must be >= 0"},
      {"dcp run --world 1 --rank 0 --formats bf16-1152,nvfp4", "unknown format 'nvfp4'"},
      {"dcp run --world 1 --rank 0 --kv-budget-gib 0", "--kv-budget-gib must be > 0"},
      {"dcp run --world 2 --rank 1 --id-file f --id-timeout -1", "--id-timeout must be >= 0"},
  };
  for (const auto& [args, needle] : cases) expect_cli_error(dir, args, needle);
}
#endif

// The launcher with stand-in ranks (a shell script in place of nvfp4mla): every rank gets its
// rank, device, the shared id file and the options; one failing rank fails the run and stops the
// others. Skipped where nvidia-smi exists (the launcher then checks the GPU count).
TEST(DcpMultiGpuScript, StartsEveryRankAndStopsTheOthersWhenOneFails) {
  const fs::path script = fs::path(NVFP4MLA_SOURCE_DIR) / "scripts" / "dcp_multi_gpu.sh";
  ASSERT_TRUE(fs::exists(script)) << script;
  if (std::system("command -v nvidia-smi >/dev/null 2>&1") == 0) GTEST_SKIP() << "nvidia-smi present: the launcher checks GPUs";
  TempDir dir;
  const fs::path ok = dir.write("ok.sh", "#!/bin/sh\necho \"args: $*\"\n");
  // Rank 1 fails at once; rank 0 would sleep for a minute unless it is stopped.
  const fs::path fail = dir.write("fail.sh",
                                  "#!/bin/sh\ncase \"$*\" in *'--rank 1 '*) echo 'nvfp4mla: error: rank 1 failed'; exit 3;; esac\n"
                                  "exec sleep 60\n");
  fs::permissions(ok, fs::perms::owner_all);
  fs::permissions(fail, fs::perms::owner_all);
  auto run = [&](const fs::path& bin, const std::string& out) {
    const std::string cmd = "'" + script.string() + "' 2 --bin '" + bin.string() + "' --out '" + (dir / out).string() +
                            "' -- --context 4096 > '" + (dir / (out + ".log")).string() + "' 2>&1";
    const int status = std::system(cmd.c_str());
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  };
  EXPECT_EQ(run(ok, "good"), 0);
  const std::string rank1 = read_text(dir / "good" / "rank1.log");
  EXPECT_NE(rank1.find("dcp run --world 2 --rank 1 --device 1 --id-file " + (dir / "good" / "nccl.id").string()),
            std::string::npos)
      << rank1;
  EXPECT_NE(rank1.find("--context 4096"), std::string::npos) << rank1;
  const auto start = std::chrono::steady_clock::now();
  EXPECT_EQ(run(fail, "bad"), 3);
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(30));  // rank 0 was stopped
  EXPECT_NE(read_text(dir / "bad.log").find("rank 1 failed"), std::string::npos);
}

// The ranks' notices before the join: every rank waits until the others are ready with the same
// options, stops at once with the reason of a rank that failed, ignores notices left for another
// id, and names the silent ranks when it gives up.
TEST(DcpRankNotices, EveryRankReadyWithTheSameOptionsEndsTheWait) {
  TempDir dir;
  const std::string path = (dir / "nccl.id").string();
  const std::vector<char> id = id_bytes(3);
  nvfp4mla::write_dcp_rank_notice(path, 1, id, true, "k 2048");
  std::thread late([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    nvfp4mla::write_dcp_rank_notice(path, 2, id, true, "k 2048");
  });
  const auto start = std::chrono::steady_clock::now();
  EXPECT_NO_THROW(nvfp4mla::await_dcp_ranks(path, 3, 0, id, "k 2048", 30));
  late.join();
  EXPECT_GE(std::chrono::steady_clock::now() - start, std::chrono::milliseconds(150));  // it waited for rank 2
  nvfp4mla::remove_dcp_rank_notice(path, 1);
  nvfp4mla::remove_dcp_rank_notice(path, 2);
  EXPECT_EQ(entries(dir), 0u);
  EXPECT_NO_THROW(nvfp4mla::await_dcp_ranks(path, 1, 0, id, "k 2048", 0));  // a world of one waits for no one
}

TEST(DcpRankNotices, AFailedRankOrOtherOptionsStopTheWaitAtOnce) {
  TempDir dir;
  const std::string path = (dir / "nccl.id").string();
  const std::vector<char> id = id_bytes(3);
  nvfp4mla::write_dcp_rank_notice(path, 0, id, true, "k 2048");
  nvfp4mla::write_dcp_rank_notice(path, 2, id, false, "no CUDA device");
  auto start = std::chrono::steady_clock::now();
  std::string e = error_of([&] { nvfp4mla::await_dcp_ranks(path, 3, 1, id, "k 2048", 30); });
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(5));
  EXPECT_NE(e.find("rank 2 will not join"), std::string::npos) << e;
  EXPECT_NE(e.find("no CUDA device"), std::string::npos) << e;

  nvfp4mla::write_dcp_rank_notice(path, 2, id, true, "k 1024");  // replaces the failed notice
  start = std::chrono::steady_clock::now();
  e = error_of([&] { nvfp4mla::await_dcp_ranks(path, 3, 1, id, "k 2048", 30); });
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(5));
  EXPECT_NE(e.find("rank 2 runs with other options than rank 1 (rank 2: k 1024; rank 1: k 2048)"), std::string::npos) << e;
}

TEST(DcpRankNotices, NoticesOfAnotherRunAreIgnoredAndSilentRanksNamed) {
  TempDir dir;
  const std::string path = (dir / "nccl.id").string();
  const std::vector<char> id = id_bytes(3), old_id = id_bytes(5);
  nvfp4mla::write_dcp_rank_notice(path, 1, old_id, false, "failed in an earlier run");
  nvfp4mla::write_dcp_rank_notice(path, 2, id, true, "k 2048");
  dir.write("nccl.id.rank3", "not a notice\n");
  const std::string e = error_of([&] { nvfp4mla::await_dcp_ranks(path, 4, 0, id, "k 2048", 0.2); });
  EXPECT_NE(e.find("rank(s) 1, 3 of 4 left no notice next to id file " + path + " within 0.2 s"), std::string::npos) << e;

  EXPECT_THROW(nvfp4mla::await_dcp_ranks(path, 2, 2, id, "", 0), nvfp4mla::Error);   // rank out of range
  EXPECT_THROW(nvfp4mla::await_dcp_ranks(path, 2, 0, id, "", -1), nvfp4mla::Error);  // negative timeout
  EXPECT_THROW(nvfp4mla::await_dcp_ranks("", 2, 0, id, "", 0), nvfp4mla::Error);
  EXPECT_THROW(nvfp4mla::write_dcp_rank_notice(path, 0, {}, true, ""), nvfp4mla::Error);  // no id
  EXPECT_THROW(nvfp4mla::write_dcp_rank_notice(path, -1, id, true, ""), nvfp4mla::Error);
  EXPECT_THROW(nvfp4mla::write_dcp_rank_notice((dir / "missing" / "nccl.id").string(), 0, id, true, ""), nvfp4mla::Error);
}

// The other ranks follow rank 0's decision: its ready notice lets them join, its failed notice
// stops them with its reason.
TEST(DcpRankNotices, OtherRanksFollowRankZerosDecision) {
  TempDir dir;
  const std::string path = (dir / "nccl.id").string();
  const std::vector<char> id = id_bytes(3);
  std::string e = error_of([&] { nvfp4mla::await_dcp_rank_zero(path, 3, 2, id, 0.2); });
  EXPECT_NE(e.find("rank(s) 0 of 3 left no notice next to id file " + path + " within 0.2 s"), std::string::npos) << e;
  nvfp4mla::write_dcp_rank_notice(path, 0, id, false, "rank 1 will not join: no CUDA device");
  e = error_of([&] { nvfp4mla::await_dcp_rank_zero(path, 3, 2, id, 30); });
  EXPECT_NE(e.find("rank 0 will not join the run of id file " + path + ": rank 1 will not join: no CUDA device"), std::string::npos)
      << e;
  nvfp4mla::write_dcp_rank_notice(path, 0, id_bytes(4), true, "k 2048");  // another run's decision: not this one's
  e = error_of([&] { nvfp4mla::await_dcp_rank_zero(path, 3, 2, id, 0.2); });
  EXPECT_NE(e.find("rank(s) 0 of 3 left no notice"), std::string::npos) << e;
  std::thread decide([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    nvfp4mla::write_dcp_rank_notice(path, 0, id, true, "k 2048");
  });
  const auto start = std::chrono::steady_clock::now();
  EXPECT_NO_THROW(nvfp4mla::await_dcp_rank_zero(path, 3, 2, id, 30));
  EXPECT_GE(std::chrono::steady_clock::now() - start, std::chrono::milliseconds(150));
  decide.join();
  EXPECT_THROW(nvfp4mla::await_dcp_rank_zero(path, 3, 0, id, 1), nvfp4mla::Error);  // rank 0 waits for no decision
}

#ifdef NVFP4MLA_CLI_PATH
// A rank that cannot run leaves a failed notice for the run's id with its reason, so that the
// other ranks stop instead of waiting in the join for it: here rank 1 with a bad option (the id
// already written by rank 0), and rank 1 with good options, which fails in a build without CUDA or
// on a machine without a GPU and, with one, gives up waiting for rank 0's notice.
TEST(CliDcpRun, ARankThatCannotRunTellsTheOtherRanksWhy) {
  TempDir dir;
  const std::vector<char> id = id_bytes(9);
  const std::string path = (dir / "nccl.id").string();
  nvfp4mla::write_dcp_id_file(path, id.data(), id.size());
  auto r = nvfp4mla::testing::run_cli(dir, "dcp run --world 2 --rank 1 --id-file nccl.id -k 0");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find("-k must be in 1.."), std::string::npos) << r.err;
  std::string e = error_of([&] { nvfp4mla::await_dcp_ranks(path, 2, 0, id, "", 5); });
  EXPECT_NE(e.find("rank 1 will not join the run of id file " + path + ": -k must be in 1.."), std::string::npos) << e;

  fs::remove(path + ".rank1");
  r = nvfp4mla::testing::run_cli(dir, "dcp run --world 2 --rank 1 --id-file nccl.id --id-timeout 1");
  EXPECT_NE(r.exit_code, 0);
  e = error_of([&] { nvfp4mla::await_dcp_ranks(path, 2, 0, id, "", 5); });
  EXPECT_NE(e.find("rank 1 will not join the run of id file " + path + ": "), std::string::npos) << e;
  // Why depends on the machine and build: no CUDA support (CPU-only builds), no GPU, no NCCL, or
  // (with both) no decision from rank 0.
  EXPECT_TRUE(e.find("no CUDA support") != std::string::npos || e.find("no CUDA device") != std::string::npos ||
              e.find("NCCL") != std::string::npos || e.find("rank(s) 0 of 2 left no notice") != std::string::npos)
      << e;
}
#endif
