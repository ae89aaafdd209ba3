// The bootstrap id exchange of multi-process DCP runs (dcp_id_file.h).
#include "nvfp4mla/dcp_id_file.h"

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <system_error>
#include <thread>

#include "nvfp4mla/calibration.h"
#include "nvfp4mla/error.h"
#include "nvfp4mla/safetensors.h"

namespace nvfp4mla {

namespace {

// Writes `bytes` to `path` with the library's atomic writer (temporary file, fsync, rename): a
// reader sees the old file, no file or the whole new one.
void write_atomically(const std::string& path, const void* bytes, size_t size, const char* what) {
  try {
    write_file_atomic(path, bytes, size);
  } catch (const Error& e) {
    throw Error(std::string(what) + ": cannot write " + path + " (" + e.what() + ")");
  }
}

std::string seconds_text(double s) {
  char text[32];
  std::snprintf(text, sizeof text, "%g", s);
  return text;
}

constexpr const char* kNoticeMagic = "nvfp4mla dcp rank notice";

std::string notice_path(const std::string& id_path, int rank) { return id_path + ".rank" + std::to_string(rank); }

// A notice's content: magic, the id's SHA-256, "ready" or "failed", then the detail.
struct Notice {
  bool ready = false;
  std::string detail;
};

// The notice at `path` if there is one for the run of id hash `key`; none for a missing file or
// one left by another run.
bool read_notice(const std::string& path, const std::string& key, Notice* out) {
  std::ifstream f(path, std::ios::binary);
  if (!f) return false;
  std::string magic, id_line, state;
  if (!std::getline(f, magic) || !std::getline(f, id_line) || !std::getline(f, state)) return false;
  if (magic != kNoticeMagic || id_line != "id " + key || (state != "ready" && state != "failed")) return false;
  out->ready = state == "ready";
  out->detail.assign(std::istreambuf_iterator<char>(f), {});
  return true;
}


// Waits for the notices of `ranks` (this rank is `self`, of a world of `world`) for the run of
// id hash `key`: returns when each is ready (with `*options`, when given), throws Error at the
// first failed one, one with other options, or after the timeout naming the silent ranks.
void wait_until_ready(const std::string& id_path, std::vector<int> ranks, int world, int self, const std::string& key,
                      const std::string* options, double timeout_seconds) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_seconds);
  for (;;) {
    std::vector<int> silent;
    for (int q : ranks) {
      Notice n;
      if (!read_notice(notice_path(id_path, q), key, &n)) {
        silent.push_back(q);
        continue;
      }
      if (!n.ready) throw Error("rank " + std::to_string(q) + " will not join the run of id file " + id_path + ": " + n.detail);
      if (options && n.detail != *options)
        throw Error("rank " + std::to_string(q) + " runs with other options than rank " + std::to_string(self) + " (rank " +
                    std::to_string(q) + ": " + n.detail + "; rank " + std::to_string(self) + ": " + *options + ")");
    }
    if (silent.empty()) return;
    ranks = silent;
    if (std::chrono::steady_clock::now() >= deadline) {
      std::string names;
      for (int q : silent) names += (names.empty() ? "" : ", ") + std::to_string(q);
      throw Error("rank(s) " + names + " of " + std::to_string(world) + " left no notice next to id file " + id_path +
                  " within " + seconds_text(timeout_seconds) + " s: are they running with this id file?");
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

void check_notice_args(const std::string& id_path, int world, int rank, const std::vector<char>& id, double timeout_seconds) {
  if (id_path.empty()) throw Error("rank notices: the id file path is empty");
  if (world < 1 || rank < 0 || rank >= world) throw Error("rank notices: rank must be in 0..world-1");
  if (id.empty()) throw Error("rank notices: the id is empty");
  if (!(timeout_seconds >= 0)) throw Error("rank notices: timeout_seconds must be >= 0");
}

}  // namespace

void write_dcp_id_file(const std::string& path, const void* bytes, size_t size) {
  if (path.empty()) throw Error("id file: the path is empty");
  if (!bytes || size == 0) throw Error("id file: no bytes to write");
  namespace fs = std::filesystem;
  std::error_code ec;
  if (fs::exists(path, ec))
    throw Error("id file " + path + " already exists (left from an earlier run?): remove it or pass a new path");
  // rename() replaces silently; the existence check above is what refuses a stale file.
  write_atomically(path, bytes, size, "id file");
}

void write_dcp_rank_notice(const std::string& id_path, int rank, const std::vector<char>& id, bool ready,
                           const std::string& detail) {
  if (id_path.empty()) throw Error("rank notice: the id file path is empty");
  if (rank < 0) throw Error("rank notice: rank must be >= 0");
  if (id.empty()) throw Error("rank notice: the id is empty");
  const std::string text = std::string(kNoticeMagic) + "\nid " + sha256_hex(id.data(), id.size()) + "\n" +
                           (ready ? "ready" : "failed") + "\n" + detail;
  write_atomically(notice_path(id_path, rank), text.data(), text.size(), "rank notice");
}

void await_dcp_ranks(const std::string& id_path, int world, int rank, const std::vector<char>& id,
                     const std::string& options, double timeout_seconds) {
  check_notice_args(id_path, world, rank, id, timeout_seconds);
  std::vector<int> others;
  for (int q = 0; q < world; ++q)
    if (q != rank) others.push_back(q);
  wait_until_ready(id_path, others, world, rank, sha256_hex(id.data(), id.size()), &options, timeout_seconds);
}

void await_dcp_rank_zero(const std::string& id_path, int world, int rank, const std::vector<char>& id,
                         double timeout_seconds) {
  check_notice_args(id_path, world, rank, id, timeout_seconds);
  if (rank == 0) throw Error("rank notices: rank 0 waits for the others (await_dcp_ranks), not for itself");
  wait_until_ready(id_path, {0}, world, rank, sha256_hex(id.data(), id.size()), nullptr, timeout_seconds);
}

void remove_dcp_rank_notice(const std::string& id_path, int rank) {
  std::error_code ec;
  std::filesystem::remove(notice_path(id_path, rank), ec);
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
      throw Error("id file " + path + " did not appear within " + seconds_text(timeout_seconds) +
                  " s: is rank 0 running with the same id file?");
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

}  // namespace nvfp4mla
