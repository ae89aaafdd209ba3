#pragma once
// Small POSIX helpers of the offload store (private): owned descriptors, complete reads and
// writes, directories opened once and used through *at() calls without following symbolic
// links, and error messages that say what to do.
#include <sys/uio.h>

#include <cstdint>
#include <filesystem>
#include <span>
#include <string>
#include <vector>

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

// The Error for an entry of the store that could not be opened (`open_errno`): a symbolic link
// (never followed), an entry of another type than `expected_type` (S_IFDIR, S_IFREG), or else
// describe_os_error(what, shown, open_errno).
[[noreturn]] void throw_unexpected_entry(int dir_fd, const std::string& name, const std::filesystem::path& shown,
                                         unsigned expected_type, const std::string& what, int open_errno);

// Opens the directory `name` inside `parent_fd` without following a symbolic link. When absent
// it is created (create) or an empty UniqueFd is returned (!create); with `durable` a creation
// is made durable by an fsync of the parent. Anything but a directory is an Error naming `shown`.
UniqueFd open_dir_at(int parent_fd, const std::string& name, const std::filesystem::path& shown, bool create,
                     bool durable);

// The names in a directory (without "." and ".."). Throws Error naming `shown`.
std::vector<std::string> list_dir(int dir_fd, const std::filesystem::path& shown);

// Writes `bytes` to `name` in the directory `dir_fd` (shown as `shown_dir`) through an
// exclusively created temporary file in the same directory, fsync, rename, directory fsync.
// Throws Error; leaves no temporary behind.
void write_file_atomically_at(int dir_fd, const std::string& name, const std::filesystem::path& shown_dir,
                              std::span<const uint8_t> bytes, bool durable);

}  // namespace nvfp4mla::offload::posix
