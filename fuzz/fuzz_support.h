#pragma once
// Shared by the fuzz targets. The contract every target checks: a parser given any bytes either
// accepts them or throws nvfp4mla::Error. Any other exception, a sanitizer report, a hang, an
// unbounded allocation or a broken round-trip property is a finding (the target aborts).
#include <signal.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <string>
#include <string_view>
#include <vector>

#include "nvfp4mla/error.h"

namespace nvfp4mla::fuzz {

[[noreturn]] inline void fail(const std::string& what) {
  std::fprintf(stderr, "fuzz property violated: %s\n", what.c_str());
  std::abort();
}

inline void require(bool ok, const std::string& what) {
  if (!ok) fail(what);
}

// Runs `parse`; nvfp4mla::Error is the expected rejection, anything else escapes to libFuzzer
// (an uncaught exception aborts with its type and message). Returns whether it was accepted.
template <class F>
bool accepts(F&& parse) {
  try {
    parse();
    return true;
  } catch (const Error&) {
    return false;
  }
}

// A file whose bytes are the input, for parsers that take a path: an anonymous in-memory file
// reached through /proc/self/fd, so no disk I/O per input and nothing left behind.
class MemoryFile {
 public:
  MemoryFile() : fd_(::memfd_create("nvfp4mla-fuzz", MFD_CLOEXEC)) {
    if (fd_ < 0) fail("memfd_create failed");
  }
  ~MemoryFile() { ::close(fd_); }
  MemoryFile(const MemoryFile&) = delete;
  MemoryFile& operator=(const MemoryFile&) = delete;

  void assign(const uint8_t* data, size_t size) {
    if (::ftruncate(fd_, 0) != 0) fail("ftruncate failed");
    size_t done = 0;
    while (done < size) {
      const ssize_t n = ::pwrite(fd_, data + done, size - done, static_cast<off_t>(done));
      if (n <= 0) fail("pwrite failed");
      done += static_cast<size_t>(n);
    }
  }
  std::filesystem::path path() const { return "/proc/self/fd/" + std::to_string(fd_); }

 private:
  int fd_;
};

// A private scratch folder for targets that must write real files, named after the process.
// libFuzzer ends its processes with _Exit, which skips exit handlers, so each new process removes
// the folders of processes that are gone instead: one folder outlives a session.
inline const std::filesystem::path& scratch_dir() {
  static const std::filesystem::path dir = [] {
    // Memory-backed when available: targets that write files fsync them.
    std::error_code ec;
    const std::filesystem::path base =
        std::filesystem::is_directory("/dev/shm", ec) ? "/dev/shm" : std::filesystem::temp_directory_path();
    const std::string prefix = "nvfp4mla-fuzz-";
    for (const auto& entry : std::filesystem::directory_iterator(base, ec)) {
      const std::string name = entry.path().filename().string();
      if (!name.starts_with(prefix)) continue;
      const long pid = std::strtol(name.c_str() + prefix.size(), nullptr, 10);
      std::error_code rm;
      if (pid > 0 && ::kill(static_cast<pid_t>(pid), 0) != 0 && errno == ESRCH) std::filesystem::remove_all(entry.path(), rm);
    }
    const std::filesystem::path mine = base / (prefix + std::to_string(::getpid()));
    std::filesystem::remove_all(mine, ec);
    if (!std::filesystem::create_directory(mine, ec)) fail("cannot create " + mine.string() + ": " + ec.message());
    return mine;
  }();
  return dir;
}

// Newline-separated fields of a text input (the last field may lack its newline).
inline std::vector<std::string> lines(const uint8_t* data, size_t size) {
  std::vector<std::string> out;
  std::string_view rest(reinterpret_cast<const char*>(data), size);
  while (!rest.empty()) {
    const size_t nl = rest.find('\n');
    out.emplace_back(rest.substr(0, nl));
    if (nl == std::string_view::npos) break;
    rest.remove_prefix(nl + 1);
  }
  return out;
}

}  // namespace nvfp4mla::fuzz
