// The bootstrap id exchange of multi-process DCP runs (dcp_id_file.h).
#include "nvfp4mla/dcp_id_file.h"

#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <system_error>
#include <thread>

#include "nvfp4mla/error.h"

namespace nvfp4mla {

void write_dcp_id_file(const std::string& path, const void* bytes, size_t size) {
  if (path.empty()) throw Error("id file: the path is empty");
  if (!bytes || size == 0) throw Error("id file: no bytes to write");
  namespace fs = std::filesystem;
  std::error_code ec;
  if (fs::exists(path, ec))
    throw Error("id file " + path + " already exists (left from an earlier run?): remove it or pass a new path");
  // The temporary name is unique per process, in the target's folder so the rename is atomic.
  const std::string tmp = path + ".tmp." + std::to_string(::getpid());
  {
    std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
    if (!f || !f.write(static_cast<const char*>(bytes), static_cast<std::streamsize>(size)) || !f.flush()) {
      f.close();
      fs::remove(tmp, ec);
      throw Error("id file: cannot write " + tmp);
    }
  }
  // rename() replaces silently; the existence check above is what refuses a stale file.
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    fs::remove(tmp, ec);
    throw Error("id file: cannot rename " + tmp + " to " + path);
  }
}

std::vector<char> read_dcp_id_file(const std::string& path, size_t size, double timeout_seconds) {
  if (path.empty()) throw Error("id file: the path is empty");
  if (!(timeout_seconds >= 0)) throw Error("id file: timeout_seconds must be >= 0");
  namespace fs = std::filesystem;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_seconds);
  for (;;) {
    std::error_code ec;
    if (fs::exists(path, ec)) {
      std::ifstream f(path, std::ios::binary);
      std::vector<char> got{std::istreambuf_iterator<char>(f), {}};
      if (got.size() != size)
        throw Error("id file " + path + " holds " + std::to_string(got.size()) + " bytes, not " + std::to_string(size) +
                    " (not written by rank 0 of this run?)");
      return got;
    }
    if (std::chrono::steady_clock::now() >= deadline) {
      char seconds[32];
      std::snprintf(seconds, sizeof seconds, "%g", timeout_seconds);
      throw Error("id file " + path + " did not appear within " + seconds + " s: is rank 0 running with the same id file?");
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

}  // namespace nvfp4mla
