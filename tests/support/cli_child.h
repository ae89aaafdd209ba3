#pragma once
// Running the real nvfp4mla binary in a child process with the limits an operator can set:
// the file size limit (ulimit -f) with SIGXFSZ at its default action, an address-space limit,
// another user, and a time limit. The shell cannot give a child SIGXFSZ back once an ancestor
// ignores it, so the child is forked and exec'd directly.
#include <fcntl.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "support/cli_runner.h"

#ifdef NVFP4MLA_CLI_PATH
namespace nvfp4mla::testing {

// Sanitizer runtimes reserve terabytes of address space: an address-space limit cannot apply.
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)  // GCC names these two
inline constexpr bool kAddressSpaceLimitsWork = false;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(memory_sanitizer) || __has_feature(thread_sanitizer)
inline constexpr bool kAddressSpaceLimitsWork = false;
#else
inline constexpr bool kAddressSpaceLimitsWork = true;
#endif
#else
inline constexpr bool kAddressSpaceLimitsWork = true;
#endif

struct ChildLimits {
  std::optional<rlim_t> file_size_bytes;      // RLIMIT_FSIZE
  std::optional<rlim_t> address_space_bytes;  // RLIMIT_AS
  std::optional<uid_t> user;                  // setuid (and setgid to the same id) when root
  unsigned timeout_s = 60;                    // SIGALRM after this long
};

struct ChildResult {
  int exit_code = -1;     // -1 when killed by a signal
  int signal = 0;         // the signal that killed it
  std::string out, err;
};

// Runs `nvfp4mla args...` in `dir` (no shell: each argument is passed as is) with the vLLM
// variables removed from the environment.
inline ChildResult run_cli_child(const std::filesystem::path& dir, const std::vector<std::string>& args,
                                 const ChildLimits& limits = {}) {
  const std::filesystem::path out = dir / ".child-stdout", err = dir / ".child-stderr";
  std::vector<std::string> argv_text{NVFP4MLA_CLI_PATH};
  argv_text.insert(argv_text.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (auto& a : argv_text) argv.push_back(a.data());
  argv.push_back(nullptr);
  std::vector<std::string> env_text;
  for (char** e = environ; *e; ++e) {
    const std::string kv = *e;
    if (kv.starts_with("VLLM_") || kv.starts_with("KV_FP8_ROPE=")) continue;
    env_text.push_back(kv);
  }
  std::vector<char*> envp;
  for (auto& e : env_text) envp.push_back(e.data());
  envp.push_back(nullptr);
  // Everything the child needs is prepared before fork: after it only async-signal-safe calls.
  const pid_t pid = ::fork();
  if (pid == 0) {
    if (::chdir(dir.c_str()) != 0) ::_exit(120);
    const int o = ::open(out.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    const int e = ::open(err.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (o < 0 || e < 0 || ::dup2(o, 1) < 0 || ::dup2(e, 2) < 0) ::_exit(121);
    ::signal(SIGXFSZ, SIG_DFL);
    if (limits.file_size_bytes) {
      const rlimit r{*limits.file_size_bytes, *limits.file_size_bytes};
      if (::setrlimit(RLIMIT_FSIZE, &r) != 0) ::_exit(122);
    }
    if (limits.address_space_bytes) {
      const rlimit r{*limits.address_space_bytes, *limits.address_space_bytes};
      if (::setrlimit(RLIMIT_AS, &r) != 0) ::_exit(123);
    }
    if (limits.user && ::geteuid() == 0 && (::setgid(*limits.user) != 0 || ::setuid(*limits.user) != 0)) ::_exit(124);
    ::alarm(limits.timeout_s);
    ::execve(argv[0], argv.data(), envp.data());
    ::_exit(125);
  }
  ChildResult r;
  int status = 0;
  if (pid > 0 && ::waitpid(pid, &status, 0) == pid) {
    if (WIFEXITED(status)) r.exit_code = WEXITSTATUS(status);
    if (WIFSIGNALED(status)) r.signal = WTERMSIG(status);
  }
  r.out = slurp(out);
  r.err = slurp(err);
  std::error_code ec;
  std::filesystem::remove(out, ec);
  std::filesystem::remove(err, ec);
  return r;
}

// A failed run as the CLI promises it: exit 1 (not a signal, not 2 "internal error") and one
// stderr line "nvfp4mla: error: ..." containing `needle`.
inline void expect_clean_failure(const ChildResult& r, const std::string& needle) {
  EXPECT_EQ(r.signal, 0) << "killed by signal " << r.signal << ": " << r.err;
  EXPECT_EQ(r.exit_code, 1) << r.err;
  EXPECT_EQ(r.err.rfind("nvfp4mla: error: ", 0), 0u) << r.err;
  EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
  EXPECT_NE(r.err.find(needle), std::string::npos) << r.err;
}

}  // namespace nvfp4mla::testing
#endif
