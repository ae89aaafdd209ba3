#include "nvfp4mla/file_read.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "io/file_read_at.h"
#include "nvfp4mla/error.h"

namespace nvfp4mla {

namespace io {

namespace {

std::string kind_of(mode_t mode) {
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISFIFO(mode)) return "a FIFO";
  if (S_ISCHR(mode) || S_ISBLK(mode)) return "a device";
  if (S_ISSOCK(mode)) return "a socket";
  return "not a regular file";
}

}  // namespace

std::string read_regular_file_at(int dir_fd, const char* name, const std::filesystem::path& shown,
                                 uint64_t max_bytes, const std::string& what, FinalLink link) {
  const std::string quoted = " '" + shown.string() + "'";
  // O_NONBLOCK: opening a FIFO must not wait for a writer; the type check below refuses it.
  const int flags = O_RDONLY | O_CLOEXEC | O_NONBLOCK | (link == FinalLink::refuse ? O_NOFOLLOW : 0);
  const int fd = ::openat(dir_fd, name, flags);
  if (fd < 0) {
    const int err = errno;
    struct stat st {};
    if (link == FinalLink::refuse && (err == ELOOP || err == EMLINK) && ::fstatat(dir_fd, name, &st, AT_SYMLINK_NOFOLLOW) == 0 &&
        S_ISLNK(st.st_mode))
      throw Error(what + quoted + " is a symbolic link, which is never followed here: replace it with the file itself");
    throw Error("cannot read " + what + quoted + ": " + std::strerror(err));
  }
  struct Closer {
    int fd;
    ~Closer() { ::close(fd); }
  } closer{fd};
  struct stat st {};
  if (::fstat(fd, &st) != 0) throw Error("cannot read " + what + quoted + ": " + std::strerror(errno));
  if (!S_ISREG(st.st_mode)) throw Error(what + quoted + " is " + kind_of(st.st_mode) + ", not a regular file");
  const uint64_t size = static_cast<uint64_t>(st.st_size);
  if (size > max_bytes)
    throw Error(what + quoted + " is " + std::to_string(size) + " bytes; at most " + std::to_string(max_bytes) +
                " bytes are accepted");
  std::string bytes(size, '\0');
  size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t n = ::pread(fd, bytes.data() + done, bytes.size() - done, static_cast<off_t>(done));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) throw Error("error while reading " + what + quoted + ": " + std::strerror(errno));
    if (n == 0) break;  // shrank since fstat: what is there is the file
    done += static_cast<size_t>(n);
  }
  bytes.resize(done);
  return bytes;
}

}  // namespace io

std::string read_regular_file(const std::filesystem::path& path, uint64_t max_bytes, const std::string& what) {
  return io::read_regular_file_at(AT_FDCWD, path.c_str(), path, max_bytes, what, io::FinalLink::follow);
}

}  // namespace nvfp4mla
