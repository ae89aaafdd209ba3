#include "posix_io.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <climits>
#include <cstring>

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

void throw_unexpected_entry(int dir_fd, const std::string& name, const std::filesystem::path& shown,
                            unsigned expected_type, const std::string& what, int open_errno) {
  struct stat st {};
  if (::fstatat(dir_fd, name.c_str(), &st, AT_SYMLINK_NOFOLLOW) == 0) {
    if (S_ISLNK(st.st_mode))
      throw Error("'" + shown.string() + "' is a symbolic link; the store never follows links it did not create: "
                  "remove the link (and check what it points to)");
    if ((st.st_mode & S_IFMT) != expected_type)
      throw Error("'" + shown.string() + "' exists but is not " +
                  (expected_type == S_IFDIR ? "a directory" : "a regular file") + ": move it away");
  }
  throw Error(describe_os_error(what, shown, open_errno));
}

UniqueFd open_dir_at(int parent_fd, const std::string& name, const std::filesystem::path& shown, bool create,
                     bool durable) {
  bool created = false;
  if (create) {
    if (::mkdirat(parent_fd, name.c_str(), 0755) == 0)
      created = true;
    else if (errno != EEXIST)
      throw Error(describe_os_error("cannot create directory", shown, errno));
  }
  UniqueFd fd(::openat(parent_fd, name.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
  if (!fd) {
    const int err = errno;
    if (!create && err == ENOENT) return {};
    throw_unexpected_entry(parent_fd, name, shown, S_IFDIR, "cannot open directory", err);
  }
  if (created && durable && ::fsync(parent_fd) != 0)
    throw Error(describe_os_error("cannot sync directory", shown.parent_path(), errno));
  return fd;
}

std::vector<std::string> list_dir(int dir_fd, const std::filesystem::path& shown) {
  // A descriptor of its own: readdir moves the file offset, which a dup() would share.
  const int fd = ::openat(dir_fd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) throw Error(describe_os_error("cannot list", shown, errno));
  DIR* d = ::fdopendir(fd);
  if (!d) {
    const int err = errno;
    ::close(fd);
    throw Error(describe_os_error("cannot list", shown, err));
  }
  std::vector<std::string> names;
  errno = 0;
  while (const dirent* e = ::readdir(d)) {
    const std::string name = e->d_name;
    if (name != "." && name != "..") names.push_back(name);
    errno = 0;
  }
  const int err = errno;
  ::closedir(d);
  if (err) throw Error(describe_os_error("cannot list", shown, err));
  return names;
}

void write_file_atomically_at(int dir_fd, const std::string& name, const std::filesystem::path& shown_dir,
                              std::span<const uint8_t> bytes, bool durable) {
  static std::atomic<uint64_t> counter{0};
  const std::string tmp = name + ".tmp." + std::to_string(::getpid()) + "." + std::to_string(counter.fetch_add(1));
  // O_EXCL: a name that exists, a symbolic link included, is never opened.
  UniqueFd fd(::openat(dir_fd, tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644));
  if (!fd) throw Error(describe_os_error("cannot create", shown_dir / tmp, errno));
  const iovec part{const_cast<uint8_t*>(bytes.data()), bytes.size()};
  int err = write_all(fd.get(), {&part, 1});
  if (!err && durable && ::fsync(fd.get()) != 0) err = errno;
  if (::close(fd.release()) != 0 && !err) err = errno;
  if (!err && ::renameat(dir_fd, tmp.c_str(), dir_fd, name.c_str()) != 0) err = errno;
  if (err) {
    ::unlinkat(dir_fd, tmp.c_str(), 0);
    throw Error(describe_os_error("cannot write", shown_dir / name, err));
  }
  if (durable && ::fsync(dir_fd) != 0) throw Error(describe_os_error("cannot sync directory", shown_dir, errno));
}

}  // namespace nvfp4mla::offload::posix
