#include "posix_io.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <climits>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <iterator>
#include <vector>

#include "nvfp4mla/error.h"

namespace nvfp4mla::offload::posix {

void UniqueFd::reset() {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
}

std::string describe_os_error(const std::string& what, const std::filesystem::path& path, int err) {
  std::string msg = what + " '" + path.string() + "': " + std::strerror(err);
  switch (err) {
    case ENOSPC:
    case EDQUOT:
      msg += " (the disk holding the store is full: free space or lower the store's capacity)";
      break;
    case EFBIG:
      msg += " (the file size limit was reached: raise the limit (ulimit -f) or lower the block size)";
      break;
    case EACCES:
    case EPERM:
      msg += " (permission denied: run as the store's owner or give this user write access to the directory)";
      break;
    case EROFS:
      msg += " (the file system is read-only: point the store at a writable directory)";
      break;
    default:
      break;
  }
  return msg;
}

int write_all(int fd, std::span<const iovec> parts) {
  std::vector<iovec> left(parts.begin(), parts.end());
  size_t first = 0;
  while (first < left.size()) {
    const int count = static_cast<int>(std::min<size_t>(left.size() - first, IOV_MAX));
    const ssize_t n = ::writev(fd, left.data() + first, count);
    if (n < 0) {
      if (errno == EINTR) continue;
      return errno;
    }
    if (n == 0) return EIO;
    size_t done = static_cast<size_t>(n);
    while (first < left.size() && done >= left[first].iov_len) {
      done -= left[first].iov_len;
      ++first;
    }
    if (first < left.size() && done > 0) {
      left[first].iov_base = static_cast<uint8_t*>(left[first].iov_base) + done;
      left[first].iov_len -= done;
    }
  }
  return 0;
}

int pread_full(int fd, void* data, size_t size, uint64_t offset) {
  auto* p = static_cast<uint8_t*>(data);
  while (size > 0) {
    const ssize_t n = ::pread(fd, p, size, static_cast<off_t>(offset));
    if (n < 0) {
      if (errno == EINTR) continue;
      return errno;
    }
    if (n == 0) return -1;
    p += n;
    size -= static_cast<size_t>(n);
    offset += static_cast<uint64_t>(n);
  }
  return 0;
}

int fsync_dir(const std::filesystem::path& dir) {
  UniqueFd fd(::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (!fd) return errno;
  if (::fsync(fd.get()) != 0) return errno;
  return 0;
}

void ensure_dir(const std::filesystem::path& dir, bool durable) {
  if (::mkdir(dir.c_str(), 0755) == 0) {
    if (durable) {
      const int err = fsync_dir(dir.parent_path());
      if (err) throw Error(describe_os_error("cannot sync directory", dir.parent_path(), err));
    }
    return;
  }
  const int err = errno;
  struct stat st {};
  if (err == EEXIST && ::stat(dir.c_str(), &st) == 0 && S_ISDIR(st.st_mode)) return;
  if (err == EEXIST) throw Error("'" + dir.string() + "' exists but is not a directory: move it away");
  throw Error(describe_os_error("cannot create directory", dir, err));
}

void write_file_atomically(const std::filesystem::path& path, std::span<const uint8_t> bytes, bool durable) {
  static std::atomic<uint64_t> counter{0};
  const std::filesystem::path tmp =
      path.string() + ".tmp." + std::to_string(::getpid()) + "." + std::to_string(counter.fetch_add(1));
  UniqueFd fd(::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644));
  if (!fd) throw Error(describe_os_error("cannot create", tmp, errno));
  const iovec part{const_cast<uint8_t*>(bytes.data()), bytes.size()};
  int err = write_all(fd.get(), {&part, 1});
  if (!err && durable && ::fsync(fd.get()) != 0) err = errno;
  fd.reset();
  if (!err && ::rename(tmp.c_str(), path.c_str()) != 0) err = errno;
  if (err) {
    ::unlink(tmp.c_str());
    throw Error(describe_os_error("cannot write", path, err));
  }
  if (durable) {
    err = fsync_dir(path.parent_path());
    if (err) throw Error(describe_os_error("cannot sync directory", path.parent_path(), err));
  }
}

std::string read_text_file(const std::filesystem::path& path, const char* what) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw Error(std::string("cannot read ") + what + " '" + path.string() + "': " + std::strerror(errno));
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (in.bad()) throw Error(std::string("error while reading ") + what + " '" + path.string() + "'");
  return text;
}

}  // namespace nvfp4mla::offload::posix
