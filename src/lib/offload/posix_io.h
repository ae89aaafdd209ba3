#pragma once
// Small POSIX helpers of the offload store (private): owned descriptors, complete reads and
// writes, directory fsync, and error messages that say what to do.
#include <sys/uio.h>

#include <cstdint>
#include <filesystem>
#include <span>
#include <string>

namespace nvfp4mla::offload::posix {

class UniqueFd {
 public:
  UniqueFd() = default;
  explicit UniqueFd(int fd) : fd_(fd) {}
  ~UniqueFd() { reset(); }
  UniqueFd(UniqueFd&& o) noexcept : fd_(o.release()) {}
  UniqueFd& operator=(UniqueFd&& o) noexcept {
    if (this != &o) {
      reset();
      fd_ = o.release();
    }
    return *this;
  }
  UniqueFd(const UniqueFd&) = delete;
  UniqueFd& operator=(const UniqueFd&) = delete;
  int get() const { return fd_; }
  explicit operator bool() const { return fd_ >= 0; }
  int release() {
    const int f = fd_;
    fd_ = -1;
    return f;
  }
  void reset();

 private:
  int fd_ = -1;
};

// "<what> '<path>': <strerror>" plus advice for the errors an operator can fix (disk full,
// file size limit, permissions, read-only file system).
std::string describe_os_error(const std::string& what, const std::filesystem::path& path, int err);

// Writes every byte of the iovecs (retrying short writes and EINTR); returns 0 or an errno.
int write_all(int fd, std::span<const iovec> parts);
// Reads exactly size bytes at offset; returns 0, an errno, or -1 for end of file first.
int pread_full(int fd, void* data, size_t size, uint64_t offset);

// fsync of a directory, so a rename or creation inside it is durable. Returns 0 or an errno.
int fsync_dir(const std::filesystem::path& dir);

// Creates the directory (one level) if missing and fsyncs its parent when it was created.
// Throws Error on failure.
void ensure_dir(const std::filesystem::path& dir, bool durable);

// Writes `bytes` to `path` through a temporary file in the same directory, fsync, rename,
// directory fsync. Throws Error; leaves no temporary behind.
void write_file_atomically(const std::filesystem::path& path, std::span<const uint8_t> bytes, bool durable);

// Whole file as a string; throws Error naming the file.
std::string read_text_file(const std::filesystem::path& path, const char* what);

}  // namespace nvfp4mla::offload::posix
