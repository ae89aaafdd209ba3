#pragma once
// Shared helpers of the offload store tests: namespaces, deterministic blocks, scratch dirs.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "nvfp4mla/config.h"
#include "nvfp4mla/error.h"
#include "nvfp4mla/offload/namespace.h"
#include "support/expect_error.h"

namespace nvfp4mla::testing {

// A scratch directory, on tmpfs (/dev/shm) when there is one so that fsync-heavy tests stay
// fast; NVFP4MLA_TEST_TMPDIR overrides. Removed afterwards.
class ScratchDir {
 public:
  ScratchDir() {
    namespace fs = std::filesystem;
    fs::path base = fs::temp_directory_path();
    if (const char* env = std::getenv("NVFP4MLA_TEST_TMPDIR"); env && *env)
      base = env;
    else if (::access("/dev/shm", W_OK) == 0)
      base = "/dev/shm";
    std::random_device rd;
    path_ = base / ("nvfp4mla-offload-" + std::to_string(::getpid()) + "-" + std::to_string(rd()));
    fs::create_directories(path_);
  }
  ~ScratchDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  ScratchDir(const ScratchDir&) = delete;
  ScratchDir& operator=(const ScratchDir&) = delete;
  const std::filesystem::path& path() const { return path_; }

 private:
  std::filesystem::path path_;
};

// A small namespace: 368-byte dynamic records, `tokens` tokens, `layers` layers.
inline offload::NamespaceParams small_params(int tokens = 2, int layers = 1, std::string model = "test-model") {
  const FormatConfig f = FormatConfig::create({.rope = RopeEncoding::fp8, .scale_mode = ScaleMode::dynamic});
  return offload::NamespaceParams::for_format(f, tokens, layers, std::move(model));
}

// Deterministic bytes from a seed (splitmix64).
inline std::vector<uint8_t> pattern_bytes(size_t n, uint64_t seed) {
  std::vector<uint8_t> out(n);
  uint64_t x = seed, z = 0;
  for (size_t i = 0; i < n; ++i) {
    if (i % 8 == 0) {
      x += 0x9E3779B97F4A7C15ull;
      z = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
      z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
      z ^= z >> 31;
    }
    out[i] = static_cast<uint8_t>(z >> (8 * (i % 8)));
  }
  return out;
}

inline std::vector<uint8_t> key_of(uint64_t i, size_t bytes = 32) { return pattern_bytes(bytes, 0xC0FFEE00 + i); }

inline std::vector<uint8_t> read_file(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}
inline void write_file(const std::filesystem::path& p, const std::vector<uint8_t>& bytes) {
  std::ofstream out(p, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
}

// Every block file (recursively) under a directory.
inline std::vector<std::filesystem::path> files_under(const std::filesystem::path& dir, const std::string& suffix = "") {
  std::vector<std::filesystem::path> out;
  std::error_code ec;
  for (const auto& e : std::filesystem::recursive_directory_iterator(dir, ec))
    if (e.is_regular_file() && (suffix.empty() || e.path().string().ends_with(suffix))) out.push_back(e.path());
  return out;
}

}  // namespace nvfp4mla::testing
