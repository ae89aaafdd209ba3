// Disk full, file size limit and permission errors: each gives a clear error, leaves no
// temporary behind, and loses nothing already stored (an older block under the same key
// included). Scenarios that change process-wide state (mount namespace, rlimits, user id) run
// in a forked child.
#include <gtest/gtest.h>
#include <sched.h>
#include <signal.h>
#include <sys/mount.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <functional>
#include <stdexcept>

#include "nvfp4mla/error.h"
#include "nvfp4mla/offload/block_file.h"
#include "nvfp4mla/offload/disk_tier.h"
#include "nvfp4mla/offload/store.h"
#include "support/offload_fixtures.h"

using namespace nvfp4mla;
using namespace nvfp4mla::offload;
using nvfp4mla::testing::files_under;
using nvfp4mla::testing::key_of;
using nvfp4mla::testing::pattern_bytes;
using nvfp4mla::testing::ScratchDir;
using nvfp4mla::testing::small_params;
namespace fs = std::filesystem;

namespace {

constexpr const char* kSkip = "SKIP: ";

void check(bool ok, const std::string& what) {
  if (!ok) throw std::runtime_error(what);
}

// Runs `scenario` in a child; returns "" on success, the child's failure message, or a message
// starting with kSkip.
std::string run_in_child(const std::function<std::string()>& scenario) {
  int fds[2];
  if (::pipe(fds) != 0) return "pipe failed";
  const pid_t pid = ::fork();
  if (pid < 0) return "fork failed";
  if (pid == 0) {
    ::close(fds[0]);
    std::string message;
    try {
      message = scenario();
    } catch (const std::exception& e) {
      message = e.what();
    }
    if (!message.empty()) (void)!::write(fds[1], message.data(), message.size());
    ::_exit(message.empty() ? 0 : 1);
  }
  ::close(fds[1]);
  std::string message;
  char buf[512];
  ssize_t n;
  while ((n = ::read(fds[0], buf, sizeof buf)) > 0) message.append(buf, static_cast<size_t>(n));
  ::close(fds[0]);
  int status = 0;
  ::waitpid(pid, &status, 0);
  if (!WIFEXITED(status)) return "child died with status " + std::to_string(status) + ": " + message;
  if (WEXITSTATUS(status) != 0 && message.empty()) return "child failed without a message";
  return message;
}

// The error of `f`, or "" when it did not throw nvfp4mla::Error.
std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

bool contains(const std::string& text, const std::string& needle) { return text.find(needle) != std::string::npos; }

// Every block i < count of `tier` reads back as pattern(i) (or `overrides` for key 0).
void check_blocks(DiskTier& tier, uint64_t count, uint64_t seed_of_key0 = 0) {
  std::vector<uint8_t> out(tier.block_bytes());
  for (uint64_t i = 0; i < count; ++i) {
    check(tier.get(key_of(i), out), "block " + std::to_string(i) + " lost");
    check(out == pattern_bytes(tier.block_bytes(), i == 0 ? seed_of_key0 : i),
          "block " + std::to_string(i) + " changed");
  }
}

}  // namespace

TEST(OffloadFaults, DiskFullIsAClearErrorAndLosesNothing) {
  ScratchDir dir;
  const fs::path mnt = dir.path() / "small-fs";
  fs::create_directories(mnt);
  const std::string r = run_in_child([&]() -> std::string {
    // A 256 KiB tmpfs in a private mount namespace (needs CAP_SYS_ADMIN, as root in CI).
    if (::unshare(CLONE_NEWNS) != 0) return std::string(kSkip) + "cannot create a mount namespace";
    if (::mount(nullptr, "/", nullptr, MS_REC | MS_PRIVATE, nullptr) != 0) return std::string(kSkip) + "mount --make-rprivate failed";
    if (::mount("tmpfs", mnt.c_str(), "tmpfs", 0, "size=256k") != 0) return std::string(kSkip) + "cannot mount a tmpfs";
    const NamespaceParams p = small_params(16, 1);  // 5888-byte blocks
    const fs::path root = mnt / "store";
    uint64_t stored = 0;
    std::string full;
    {
      DiskTier tier(root, p);
      for (; stored < 1000; ++stored) {
        full = error_of([&] { tier.put(key_of(stored), pattern_bytes(p.block_bytes(), stored)); });
        if (!full.empty()) break;
      }
      check(stored >= 10 && stored < 1000, "expected the disk to fill after some blocks, stored " + std::to_string(stored));
      check(contains(full, "No space left on device") && contains(full, "disk holding the store is full"),
            "unclear disk-full error: " + full);
      check(files_under(tier.dir() / "tmp").empty(), "a temporary file was left behind");
      // Fill what the failed put gave back, then try to replace block 0: the old one must stay.
      {
        std::ofstream filler(mnt / "filler", std::ios::binary);
        const std::vector<char> chunk(4096, 'x');
        while (filler.write(chunk.data(), chunk.size())) {
        }
      }
      const std::string replace = error_of([&] { tier.put(key_of(0), pattern_bytes(p.block_bytes(), 999)); });
      check(contains(replace, "No space left on device"), "overwrite on a full disk did not fail: '" + replace + "'");
      check_blocks(tier, stored);
      check(tier.stats().put_failures == 2, "put failures not counted");
    }
    // After a restart everything is still there and valid.
    DiskTier tier(root, p);
    check(tier.stats().blocks == stored && tier.stats().quarantined_at_open == 0, "reopen found damage");
    check_blocks(tier, stored);
    check(tier.verify().problems.empty(), "verify found damage");
    // Space freed: writes work again.
    fs::remove(mnt / "filler");
    tier.erase(key_of(stored - 1));
    tier.put(key_of(0), pattern_bytes(p.block_bytes(), 999));
    check_blocks(tier, stored - 1, 999);
    return "";
  });
  if (r.starts_with(kSkip)) GTEST_SKIP() << r;
  EXPECT_EQ(r, "");
}

TEST(OffloadFaults, FileSizeLimitIsAClearErrorAndLosesNothing) {
  ScratchDir dir;
  const NamespaceParams p = small_params(16, 1);
  // A full tier: replacing block 0, the least recently used, must not evict it before the write.
  const DiskTierOptions full{.capacity_bytes = 5 * block_file_size(32, p.block_bytes())};
  {
    DiskTier tier(dir.path(), p, full);
    for (uint64_t i = 0; i < 5; ++i) tier.put(key_of(i), pattern_bytes(p.block_bytes(), i));
  }
  const std::string r = run_in_child([&]() -> std::string {
    ::signal(SIGXFSZ, SIG_IGN);  // get EFBIG instead of the signal
    const rlimit limit{p.block_bytes() / 2, p.block_bytes() / 2};
    check(::setrlimit(RLIMIT_FSIZE, &limit) == 0, "setrlimit failed");
    DiskTier tier(dir.path(), p, full);
    const std::string e = error_of([&] { tier.put(key_of(0), pattern_bytes(p.block_bytes(), 77)); });
    check(contains(e, "File too large") && contains(e, "ulimit -f"), "unclear file-size error: '" + e + "'");
    check(files_under(tier.dir() / "tmp").empty(), "a temporary file was left behind");
    check_blocks(tier, 5);
    return "";
  });
  EXPECT_EQ(r, "");
  DiskTier tier(dir.path(), p, full);
  EXPECT_EQ(tier.stats().quarantined_at_open, 0u);
  EXPECT_NO_THROW(check_blocks(tier, 5));
}

// The store's put fails as a whole: the new block reaches neither tier, and a get still
// returns the older block, from DRAM and from disk alike.
TEST(OffloadFaults, FailedStorePutLeavesBothTiersAsTheyWere) {
  ScratchDir dir;
  const NamespaceParams p = small_params(16, 1);
  const std::string r = run_in_child([&]() -> std::string {
    Store store(dir.path(), p, {.dram_capacity_bytes = 4 * (p.block_bytes() + 32)});
    store.put(key_of(0), pattern_bytes(p.block_bytes(), 1));
    ::signal(SIGXFSZ, SIG_IGN);
    const rlimit limit{p.block_bytes() / 2, p.block_bytes() / 2};
    check(::setrlimit(RLIMIT_FSIZE, &limit) == 0, "setrlimit failed");
    check(contains(error_of([&] { store.put(key_of(0), pattern_bytes(p.block_bytes(), 2)); }), "File too large"),
          "the put did not fail");
    std::vector<uint8_t> out(p.block_bytes());
    check(store.get(key_of(0), out) && out == pattern_bytes(p.block_bytes(), 1), "get returned a block that never reached disk");
    check(store.stats().dram.hits == 1, "the get did not come from DRAM");
    check(store.disk().get(key_of(0), out) && out == pattern_bytes(p.block_bytes(), 1), "disk lost the older block");
    return "";
  });
  EXPECT_EQ(r, "");
}

TEST(OffloadFaults, PermissionErrorsAreClearAndLoseNothing) {
  ScratchDir dir;
  const NamespaceParams p = small_params(2, 1);
  fs::path ns;
  {
    DiskTier tier(dir.path() / "store", p);
    for (uint64_t i = 0; i < 5; ++i) tier.put(key_of(i), pattern_bytes(p.block_bytes(), i));
    ns = tier.dir();
  }
  fs::create_directories(dir.path() / "read-only");
  // Readable by the unprivileged user whatever the umask was.
  ::chmod(dir.path().c_str(), 0755);
  for (const auto& e : fs::recursive_directory_iterator(dir.path()))
    fs::permissions(e.path(), e.is_directory() ? fs::perms(0755) : fs::perms(0644));
  ::chmod((dir.path() / "read-only").c_str(), 0555);
  // Root ignores permission bits: the child drops to an unprivileged user first.
  auto as_unprivileged = [](const std::function<std::string()>& scenario) {
    return run_in_child([&]() -> std::string {
      if (::geteuid() == 0) check(::setgid(65534) == 0 && ::setuid(65534) == 0, "cannot drop privileges");
      return scenario();
    });
  };
  // 1. A store root that cannot be created.
  EXPECT_EQ(as_unprivileged([&]() -> std::string {
              const std::string e = error_of([&] { DiskTier t(dir.path() / "read-only" / "store", p); });
              check(contains(e, "cannot create store root") && contains(e, "Permission denied"), "unclear: '" + e + "'");
              return "";
            }),
            "");
  // 2. A namespace this user may not lock (it belongs to someone else).
  ::chmod((ns / "lock").c_str(), 0444);
  EXPECT_EQ(as_unprivileged([&]() -> std::string {
              const std::string e = error_of([&] { DiskTier t(dir.path() / "store", p); });
              check(contains(e, "namespace lock") && contains(e, "permission denied: run as the store's owner"),
                    "unclear: '" + e + "'");
              return "";
            }),
            "");
  // 3. A namespace this user may read but not write: reads work, writes fail clearly.
  ::chmod((ns / "lock").c_str(), 0666);
  ::chmod((ns / "tmp").c_str(), 0555);
  EXPECT_EQ(as_unprivileged([&]() -> std::string {
              DiskTier t(dir.path() / "store", p);
              check_blocks(t, 5);
              const std::string e = error_of([&] { t.put(key_of(0), pattern_bytes(p.block_bytes(), 50)); });
              check(contains(e, "cannot create block file") && contains(e, "Permission denied"), "unclear: '" + e + "'");
              check_blocks(t, 5);
              return "";
            }),
            "");
  ::chmod((ns / "tmp").c_str(), 0755);
  DiskTier tier(dir.path() / "store", p);
  EXPECT_EQ(tier.stats().blocks, 5u);
  EXPECT_NO_THROW(check_blocks(tier, 5));
}
