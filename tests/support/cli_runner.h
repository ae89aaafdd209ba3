#pragma once
// Running the real nvfp4mla binary from tests (NVFP4MLA_CLI_PATH is defined by CMake).
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "support/temp_dir.h"

#ifdef NVFP4MLA_CLI_PATH
namespace nvfp4mla::testing {

struct RunResult {
  int exit_code;
  std::string out, err;
};

inline std::string slurp(const std::filesystem::path& p) {
  std::ifstream f(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(f), {}};
}

// Runs the CLI in `dir` with the vLLM variables cleared (unless `env` sets them).
inline RunResult run_cli(const TempDir& dir, const std::string& args, const std::string& env = "") {
  const auto out = dir / ".stdout", err = dir / ".stderr";
  const std::string cmd = "cd '" + dir.path().string() +
                          "' && env -u VLLM_NVFP4_MLA_DYNAMIC_SCALE -u KV_FP8_ROPE -u VLLM_NVFP4_MLA_SCALES_FILE " +
                          env + " '" + NVFP4MLA_CLI_PATH + "' " + args + " >'" + out.string() + "' 2>'" +
                          err.string() + "'";
  const int status = std::system(cmd.c_str());
  RunResult r{WIFEXITED(status) ? WEXITSTATUS(status) : -1, slurp(out), slurp(err)};
  std::filesystem::remove(out);
  std::filesystem::remove(err);
  return r;
}

inline std::vector<std::string> dir_listing(const TempDir& dir) {
  std::vector<std::string> names;
  for (const auto& e : std::filesystem::directory_iterator(dir.path())) names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  return names;
}

// Expect a failed run: non-zero exit, exactly one stderr line "nvfp4mla: error: ..." that
// contains `needle`, and no new file in the folder (no output, no temporary file).
inline void expect_cli_error(const TempDir& dir, const std::string& args, const std::string& needle,
                      const std::string& env = "") {
  SCOPED_TRACE(args);
  const auto before = dir_listing(dir);
  const RunResult r = run_cli(dir, args, env);
  EXPECT_NE(r.exit_code, 0);
  EXPECT_EQ(r.err.rfind("nvfp4mla: error: ", 0), 0u) << r.err;
  EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
  EXPECT_NE(r.err.find(needle), std::string::npos) << r.err;
  EXPECT_EQ(dir_listing(dir), before);
}

}  // namespace nvfp4mla::testing
#endif
