#include "nvfp4mla/offload/disk_tier.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <bitset>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <ctime>
#include <list>
#include <mutex>
#include <optional>
#include <unordered_map>

#include "nvfp4mla/error.h"
#include "manifest_file.h"
#include "posix_io.h"

#define XXH_INLINE_ALL
#include <xxhash.h>

namespace nvfp4mla::offload {

namespace fs = std::filesystem;
using posix::UniqueFd;

namespace {

constexpr const char* kBlocksDir = "blocks";
constexpr const char* kTmpDir = "tmp";
constexpr const char* kQuarantineDir = "quarantine";
constexpr const char* kLockFile = "lock";
constexpr const char* kQuarantineLog = "reasons.log";
constexpr const char* kBlockSuffix = ".blk";
constexpr size_t kFanout = 256;

int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}
int64_t mtime_ns(const struct stat& st) { return int64_t(st.st_mtim.tv_sec) * 1000000000 + st.st_mtim.tv_nsec; }

// Blocks spread over 256 sub-directories by a hash of the key, so that keys with common
// prefixes (or small integers) do not pile into one directory.
size_t fanout_of(ByteSpan key) { return XXH3_64bits(key.data(), key.size()) % kFanout; }
std::string fanout_name(size_t i) {
  static constexpr char kDigits[] = "0123456789abcdef";
  return {kDigits[i >> 4], kDigits[i & 0xF]};
}

int set_access_time(int fd, int64_t access_ns) {
  const timespec times[2] = {{0, UTIME_OMIT}, {access_ns / 1000000000, access_ns % 1000000000}};
  return ::futimens(fd, times) == 0 ? 0 : errno;
}

ByteSpan as_bytes(const std::string& s) { return {reinterpret_cast<const uint8_t*>(s.data()), s.size()}; }

// A namespace directory given by path: its parent is the caller's path, the directory itself is
// never a followed link. Empty when it does not exist.
UniqueFd open_namespace_dir(const fs::path& namespace_dir) {
  const fs::path parent = namespace_dir.parent_path().empty() ? fs::path(".") : namespace_dir.parent_path();
  const UniqueFd parent_fd(::open(parent.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (!parent_fd) throw Error(posix::describe_os_error("cannot open store root", parent, errno));
  return posix::open_dir_at(parent_fd.get(), namespace_dir.filename().string(), namespace_dir, false, false);
}
std::string as_key_string(ByteSpan key) { return {reinterpret_cast<const char*>(key.data()), key.size()}; }

}  // namespace

struct DiskTier::Impl {
  NamespaceParams params;
  BlockExpectation expect;
  DiskTierOptions options;
  // Paths for messages only: every file operation goes through these descriptors, opened once
  // without following links, so a link placed in the store later is never followed.
  fs::path dir, blocks_dir, tmp_dir, quarantine_dir;
  UniqueFd dir_fd, blocks_fd, tmp_fd, quarantine_fd, lock_fd;
  std::atomic<uint64_t> tmp_counter{0};

  struct Entry {
    uint64_t file_bytes = 0;
    int64_t access_ns = 0;
    std::list<std::string>::iterator lru;  // position in `lru`
  };
  mutable std::mutex mu;
  std::condition_variable room_freed;
  std::unordered_map<std::string, Entry> index;  // key bytes -> entry
  std::list<std::string> lru;                    // most recently used first
  uint64_t bytes = 0;                            // files in the index
  uint64_t reserved = 0;                         // puts between reservation and rename
  // Keys with a put in flight: eviction passes over them, so that a failed replacement leaves
  // the older block in place (its bytes count as freed only when the new file is renamed over it).
  std::unordered_map<std::string, int> replacing;
  std::bitset<kFanout> fanout_ready;             // blocks/<xx> known to exist; guarded by mu
  DiskTierStats counters;
  int64_t last_access_ns = 0;

  // Access times are stamped explicitly (file timestamps set by the kernel are only as fine as
  // its clock tick) and strictly increase, so the order is exact across a restart.
  int64_t next_access_ns_locked() {
    last_access_ns = std::max(now_ns(), last_access_ns + 1);
    return last_access_ns;
  }
  int64_t next_access_ns() {
    std::lock_guard lock(mu);
    return next_access_ns_locked();
  }

  static std::string block_name(ByteSpan key) { return key_to_hex(key) + kBlockSuffix; }
  fs::path fanout_path(size_t i) const { return blocks_dir / fanout_name(i); }
  fs::path block_path(ByteSpan key) const { return fanout_path(fanout_of(key)) / block_name(key); }
  uint64_t file_size_for(size_t key_bytes) const { return block_file_size(key_bytes, expect.payload_bytes()); }

  void open(const fs::path& root);
  void take_lock();
  void check_or_write_manifest();
  void check_quarantine_log();
  void remove_stale_temporaries();
  void scan_blocks();

  // --- index operations; caller holds mu ---
  void touch_locked(const std::string& key, int64_t access_ns, uint64_t file_bytes);
  void drop_locked(std::unordered_map<std::string, Entry>::iterator it);
  // Deletes the least recently used block that no put is replacing; false when there is none.
  bool evict_one_locked();
  // blocks/<xx> of `key`, opened for one operation without following a link (a descriptor
  // kept per fan-out directory would hold up to 256 per open namespace); empty when it does not
  // exist. Throws Error when it is a link or not a directory.
  UniqueFd open_fanout(ByteSpan key) const {
    const size_t i = fanout_of(key);
    return posix::open_dir_at(blocks_fd.get(), fanout_name(i), fanout_path(i), false, false);
  }
  // The same, creating the directory when absent.
  UniqueFd ensure_fanout(ByteSpan key);
  // Moves the block file of `key` aside if it is still the one `held` describes; logs `reason`.
  void quarantine(ByteSpan key, const struct stat& held, const std::string& reason);
  // Moves `name` in the directory `from_fd` to quarantine/ (the entry itself: a link is moved,
  // never followed); false when it could not be moved.
  bool quarantine_entry_locked(int from_fd, const std::string& name, const std::string& reason);
  // Opens, reads and validates the block of `key` into `out` (payload bytes). A defective
  // file is quarantined and `out` zeroed.
  struct ReadOutcome {
    enum Kind { ok, missing, unopenable, defective } kind = ok;
    BlockDefect defect = BlockDefect::none;
    int err = 0;  // unopenable: the errno
  };
  // With `touch`, a valid block's file gets access time `access_ns`.
  ReadOutcome read_block(ByteSpan key, MutableByteSpan out, std::optional<int64_t> touch);
};

void DiskTier::Impl::open(const fs::path& root) {
  params.validate();
  expect = BlockExpectation::of(params);
  std::error_code ec;
  fs::create_directories(root, ec);
  if (ec) throw Error(posix::describe_os_error("cannot create store root", root, ec.value()));
  // The root is the caller's path (it may be a link); below it the store follows nothing.
  const UniqueFd root_fd(::open(root.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (!root_fd) throw Error(posix::describe_os_error("cannot open store root", root, errno));
  const std::string digest = to_hex(namespace_digest(params));
  dir = root / digest;
  blocks_dir = dir / kBlocksDir;
  tmp_dir = dir / kTmpDir;
  quarantine_dir = dir / kQuarantineDir;
  dir_fd = posix::open_dir_at(root_fd.get(), digest, dir, true, options.durable);
  take_lock();
  blocks_fd = posix::open_dir_at(dir_fd.get(), kBlocksDir, blocks_dir, true, options.durable);
  check_or_write_manifest();
  tmp_fd = posix::open_dir_at(dir_fd.get(), kTmpDir, tmp_dir, true, options.durable);
  quarantine_fd = posix::open_dir_at(dir_fd.get(), kQuarantineDir, quarantine_dir, true, options.durable);
  check_quarantine_log();
  remove_stale_temporaries();
  scan_blocks();
  std::lock_guard lock(mu);
  counters.capacity_bytes = options.capacity_bytes;
  while (bytes > options.capacity_bytes && evict_one_locked()) {
  }
}

void DiskTier::Impl::take_lock() {
  const fs::path path = dir / kLockFile;
  lock_fd = UniqueFd(::openat(dir_fd.get(), kLockFile, O_RDWR | O_CREAT | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC, 0644));
  if (!lock_fd) posix::throw_unexpected_entry(dir_fd.get(), kLockFile, path, S_IFREG, "cannot open the namespace lock", errno);
  struct stat st {};
  if (::fstat(lock_fd.get(), &st) != 0) throw Error(posix::describe_os_error("cannot stat", path, errno));
  if (!S_ISREG(st.st_mode)) throw Error("'" + path.string() + "' exists but is not a regular file: move it away");
  if (::flock(lock_fd.get(), LOCK_EX | LOCK_NB) != 0) {
    const int err = errno;
    if (err == EWOULDBLOCK)
      throw Error("the store namespace '" + dir.string() +
                  "' is in use by another store (another process, or another store object in this process); "
                  "close it first or use another --root");
    throw Error(posix::describe_os_error("cannot lock", path, err));
  }
}

void DiskTier::Impl::check_or_write_manifest() {
  struct stat st {};
  if (::fstatat(dir_fd.get(), kManifestFileName, &st, AT_SYMLINK_NOFOLLOW) == 0) {
    check_manifest_matches(params, read_manifest_at(dir_fd.get(), dir), "'" + dir.string() + "'");
    return;
  }
  // Blocks are only ever written after the manifest, so blocks without one mean the manifest
  // was removed by hand: their meaning is unknown.
  bool has_files = false;
  for (const std::string& sub : posix::list_dir(blocks_fd.get(), blocks_dir)) {
    struct stat sub_st {};
    if (::fstatat(blocks_fd.get(), sub.c_str(), &sub_st, AT_SYMLINK_NOFOLLOW) != 0 || !S_ISDIR(sub_st.st_mode)) {
      has_files = true;
      continue;
    }
    const UniqueFd sub_fd = posix::open_dir_at(blocks_fd.get(), sub, blocks_dir / sub, false, false);
    has_files |= sub_fd && !posix::list_dir(sub_fd.get(), blocks_dir / sub).empty();
  }
  if (has_files)
    throw Error("the namespace directory '" + dir.string() +
                "' holds blocks but no manifest.json; refusing to guess their format (move the directory away)");
  const std::string text = manifest_json(params);
  posix::write_file_atomically_at(dir_fd.get(), kManifestFileName, dir, as_bytes(text), options.durable);
}

void DiskTier::Impl::check_quarantine_log() {
  struct stat st {};
  if (::fstatat(quarantine_fd.get(), kQuarantineLog, &st, AT_SYMLINK_NOFOLLOW) == 0 && !S_ISREG(st.st_mode))
    posix::throw_unexpected_entry(quarantine_fd.get(), kQuarantineLog, quarantine_dir / kQuarantineLog, S_IFREG,
                                  "cannot use", EINVAL);
}

void DiskTier::Impl::remove_stale_temporaries() {
  // We hold the namespace lock, so every temporary file belongs to a writer that is gone.
  // unlinkat removes an entry itself: a link is removed, its target never touched.
  for (const std::string& name : posix::list_dir(tmp_fd.get(), tmp_dir)) ::unlinkat(tmp_fd.get(), name.c_str(), 0);
  // Manifest temporaries of a creation that was interrupted.
  const std::string manifest_tmp = std::string(kManifestFileName) + ".tmp.";
  for (const std::string& name : posix::list_dir(dir_fd.get(), dir))
    if (name.starts_with(manifest_tmp)) ::unlinkat(dir_fd.get(), name.c_str(), 0);
}

void DiskTier::Impl::scan_blocks() {
  struct Found {
    std::string key;
    int64_t access_ns;
    uint64_t file_bytes;
  };
  std::vector<Found> found;
  std::lock_guard lock(mu);
  for (const std::string& sub_name : posix::list_dir(blocks_fd.get(), blocks_dir)) {
    size_t fanout = kFanout;
    for (size_t i = 0; i < kFanout; ++i)
      if (sub_name == fanout_name(i)) fanout = i;
    struct stat sub_st {};
    const bool is_dir = ::fstatat(blocks_fd.get(), sub_name.c_str(), &sub_st, AT_SYMLINK_NOFOLLOW) == 0 &&
                        S_ISDIR(sub_st.st_mode);
    if (fanout == kFanout || !is_dir) {
      if (quarantine_entry_locked(blocks_fd.get(), sub_name, "unexpected entry in blocks/")) ++counters.quarantined_at_open;
      continue;
    }
    const UniqueFd sub = posix::open_dir_at(blocks_fd.get(), sub_name, fanout_path(fanout), false, false);
    if (!sub) continue;  // removed meanwhile
    fanout_ready.set(fanout);
    const int sub_fd = sub.get();
    for (const std::string& name : posix::list_dir(sub_fd, fanout_path(fanout))) {
      std::string reason;
      std::vector<uint8_t> key;
      struct stat st {};
      if (name.size() <= std::strlen(kBlockSuffix) || !name.ends_with(kBlockSuffix)) {
        reason = "unexpected file name";
      } else {
        try {
          key = key_from_hex(name.substr(0, name.size() - std::strlen(kBlockSuffix)));
        } catch (const Error&) {
          reason = "file name is not a key";
        }
        if (reason.empty() && fanout_of(key) != fanout) reason = "file in the wrong fan-out directory";
        if (reason.empty() && ::fstatat(sub_fd, name.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0)
          reason = std::string("stat failed: ") + std::strerror(errno);
        if (reason.empty() && !S_ISREG(st.st_mode)) reason = to_string(BlockDefect::not_a_file);
        if (reason.empty() && uint64_t(st.st_size) != file_size_for(key.size())) reason = to_string(BlockDefect::wrong_size);
      }
      if (!reason.empty()) {
        if (quarantine_entry_locked(sub_fd, name, reason)) ++counters.quarantined_at_open;
        continue;
      }
      found.push_back({as_key_string(key), mtime_ns(st), uint64_t(st.st_size)});
    }
  }
  // Oldest first, so that touching each in turn leaves the newest at the front.
  std::sort(found.begin(), found.end(), [](const Found& a, const Found& b) {
    return a.access_ns != b.access_ns ? a.access_ns < b.access_ns : a.key < b.key;
  });
  for (const Found& f : found) touch_locked(f.key, f.access_ns, f.file_bytes);
  if (!found.empty()) last_access_ns = found.back().access_ns;
}

void DiskTier::Impl::touch_locked(const std::string& key, int64_t access_ns, uint64_t file_bytes) {
  auto it = index.find(key);
  if (it == index.end()) {
    lru.push_front(key);
    index.emplace(key, Entry{file_bytes, access_ns, lru.begin()});
    bytes += file_bytes;
  } else {
    lru.splice(lru.begin(), lru, it->second.lru);
    bytes = bytes - it->second.file_bytes + file_bytes;
    it->second.file_bytes = file_bytes;
    it->second.access_ns = access_ns;
  }
}

void DiskTier::Impl::drop_locked(std::unordered_map<std::string, Entry>::iterator it) {
  bytes -= it->second.file_bytes;
  lru.erase(it->second.lru);
  index.erase(it);
  room_freed.notify_all();
}

bool DiskTier::Impl::evict_one_locked() {
  auto victim = lru.rbegin();
  while (victim != lru.rend() && replacing.count(*victim)) ++victim;
  if (victim == lru.rend()) return false;
  auto it = index.find(*victim);
  const ByteSpan key = as_bytes(it->first);
  const UniqueFd sub = open_fanout(key);
  if (sub && ::unlinkat(sub.get(), block_name(key).c_str(), 0) != 0 && errno != ENOENT)
    throw Error(posix::describe_os_error("cannot evict block", block_path(key), errno));
  drop_locked(it);
  ++counters.evictions;
  return true;
}

UniqueFd DiskTier::Impl::ensure_fanout(ByteSpan key) {
  const size_t i = fanout_of(key);
  bool ready;
  {
    std::lock_guard lock(mu);
    ready = fanout_ready.test(i);
  }
  // Known directories are only opened; mkdir (and its parent fsync) happens once.
  UniqueFd fd = posix::open_dir_at(blocks_fd.get(), fanout_name(i), fanout_path(i), !ready, options.durable);
  if (!fd) fd = posix::open_dir_at(blocks_fd.get(), fanout_name(i), fanout_path(i), true, options.durable);
  std::lock_guard lock(mu);
  fanout_ready.set(i);
  return fd;
}

bool DiskTier::Impl::quarantine_entry_locked(int from_fd, const std::string& name, const std::string& reason) {
  const std::string target = name + "." + std::to_string(now_ns());
  if (::renameat(from_fd, name.c_str(), quarantine_fd.get(), target.c_str()) != 0) return false;
  // Best effort: the evidence is the moved file; the log says why it was moved.
  UniqueFd fd(::openat(quarantine_fd.get(), kQuarantineLog, O_WRONLY | O_CREAT | O_APPEND | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC,
                       0644));
  struct stat st {};
  if (fd && ::fstat(fd.get(), &st) == 0 && S_ISREG(st.st_mode)) {
    const std::string line = std::to_string(now_ns() / 1000000000) + " " + target + " " + reason + "\n";
    const iovec part{const_cast<char*>(line.data()), line.size()};
    (void)posix::write_all(fd.get(), {&part, 1});
  }
  return true;
}

void DiskTier::Impl::quarantine(ByteSpan key, const struct stat& held, const std::string& reason) {
  std::lock_guard lock(mu);
  UniqueFd sub;
  try {
    sub = open_fanout(key);
  } catch (const Error&) {
    return;  // no longer a directory: the next open's scan quarantines it
  }
  const std::string name = block_name(key);
  struct stat current {};
  // A concurrent put may have replaced the file since it was opened (puts rename under mu): move
  // only the bad one.
  if (!sub || ::fstatat(sub.get(), name.c_str(), &current, AT_SYMLINK_NOFOLLOW) != 0) return;
  if (held.st_dev != current.st_dev || held.st_ino != current.st_ino) return;
  if (!quarantine_entry_locked(sub.get(), name, reason)) return;
  if (const auto it = index.find(as_key_string(key)); it != index.end()) drop_locked(it);
}

DiskTier::Impl::ReadOutcome DiskTier::Impl::read_block(ByteSpan key, MutableByteSpan out,
                                                       std::optional<int64_t> touch) {
  const std::string name = block_name(key);
  UniqueFd sub;
  try {
    sub = open_fanout(key);
  } catch (const Error&) {
    // A link or a file in place of blocks/<xx>: not followed (the next open quarantines it).
    return {ReadOutcome::unopenable, BlockDefect::read_error, ENOTDIR};
  }
  const int sub_fd = sub.get();
  // O_NOFOLLOW: a link put in place of a block is a defect, never a way out of the store;
  // O_NONBLOCK: a FIFO put there must not block the open.
  UniqueFd fd(sub_fd < 0 ? -1 : ::openat(sub_fd, name.c_str(), O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC));
  if (!fd) {
    const int err = sub_fd < 0 ? ENOENT : errno;
    std::lock_guard lock(mu);
    struct stat st {};
    const bool exists = sub_fd >= 0 && ::fstatat(sub_fd, name.c_str(), &st, AT_SYMLINK_NOFOLLOW) == 0;
    if (exists && S_ISLNK(st.st_mode)) {
      if (quarantine_entry_locked(sub_fd, name, to_string(BlockDefect::not_a_file)))
        if (auto it = index.find(as_key_string(key)); it != index.end()) drop_locked(it);
      return {ReadOutcome::defective, BlockDefect::not_a_file};
    }
    if (err != ENOENT) return {ReadOutcome::unopenable, BlockDefect::read_error, err};
    // Evicted or erased since the caller looked; or removed behind the store's back.
    if (!exists)
      if (auto it = index.find(as_key_string(key)); it != index.end()) drop_locked(it);
    return {ReadOutcome::missing};
  }
  BlockDefect defect = BlockDefect::none;
  struct stat st {};
  const size_t header_bytes = kBlockHeaderFixedBytes + key.size();
  std::vector<uint8_t> header(header_bytes);
  std::array<uint8_t, kBlockChecksumBytes> stored_sum{};
  auto read = [&](void* p, size_t n, uint64_t at) {
    const int r = posix::pread_full(fd.get(), p, n, at);
    if (r != 0) defect = r < 0 ? BlockDefect::wrong_size : BlockDefect::read_error;
    return r == 0;
  };
  if (::fstat(fd.get(), &st) != 0) {
    defect = BlockDefect::read_error;
  } else if (!S_ISREG(st.st_mode)) {
    defect = BlockDefect::not_a_file;
  } else if (uint64_t(st.st_size) != file_size_for(key.size())) {
    defect = BlockDefect::wrong_size;
  } else if (read(header.data(), header_bytes, 0)) {
    defect = check_block_header(header, expect, key);
    if (defect == BlockDefect::none && read(out.data(), out.size(), header_bytes) &&
        read(stored_sum.data(), stored_sum.size(), header_bytes + out.size())) {
      BlockChecksum sum;
      sum.update(header);
      sum.update(out);
      if (sum.finish() != stored_sum) defect = BlockDefect::bad_checksum;
    }
  }
  if (defect != BlockDefect::none) {
    std::memset(out.data(), 0, out.size());
    quarantine(key, st, to_string(defect));  // a failed fstat leaves st zero: matches no file
    return {ReadOutcome::defective, defect};
  }
  // The access order lives in the modification time, so LRU survives a restart. Failure (a
  // reader that does not own the file) only costs ordering precision.
  if (touch) (void)set_access_time(fd.get(), *touch);
  return {};
}

// ---------------------------------------------------------------------------------------------

DiskTier::DiskTier(const fs::path& root, const NamespaceParams& params, DiskTierOptions options)
    : impl_(std::make_unique<Impl>()) {
  impl_->params = params;
  impl_->options = options;
  impl_->open(root);
}

std::unique_ptr<DiskTier> DiskTier::open_existing(const fs::path& dir, DiskTierOptions options) {
  const fs::path namespace_dir = dir.filename().empty() ? dir.parent_path() : dir;
  const UniqueFd dir_fd = open_namespace_dir(namespace_dir);
  if (!dir_fd) throw Error(posix::describe_os_error("cannot open namespace directory", namespace_dir, ENOENT));
  const NamespaceParams params = read_manifest_at(dir_fd.get(), namespace_dir);
  if (namespace_dir.filename() != to_hex(namespace_digest(params)))
    throw Error("'" + namespace_dir.string() + "' is not named after the namespace digest of its manifest");
  return std::make_unique<DiskTier>(namespace_dir.parent_path(), params, options);
}

DiskTier::~DiskTier() = default;

const NamespaceParams& DiskTier::params() const { return impl_->params; }
const fs::path& DiskTier::dir() const { return impl_->dir; }
uint64_t DiskTier::block_bytes() const { return impl_->expect.payload_bytes(); }

void DiskTier::put(ByteSpan key, ByteSpan block) {
  Impl& m = *impl_;
  if (block.size() != block_bytes())
    throw Error("block is " + std::to_string(block.size()) + " bytes; blocks of this namespace are " +
                std::to_string(block_bytes()) + " bytes");
  const std::vector<uint8_t> header = encode_block_header(m.expect, key);  // validates the key length
  const uint64_t file_bytes = m.file_size_for(key.size());
  if (file_bytes > m.options.capacity_bytes)
    throw Error("a block file of " + std::to_string(file_bytes) + " bytes exceeds the disk tier capacity of " +
                std::to_string(m.options.capacity_bytes) + " bytes: raise the capacity");
  const std::string k = as_key_string(key);
  {
    std::unique_lock lock(m.mu);
    ++m.replacing[k];
    // The older block under this key stays until the new file replaces it: its bytes count as
    // free here, and eviction passes over it.
    auto own_bytes = [&] {
      const auto it = m.index.find(k);
      return it == m.index.end() ? uint64_t{0} : it->second.file_bytes;
    };
    while (m.bytes - own_bytes() + m.reserved + file_bytes > m.options.capacity_bytes) {
      // Other puts hold the rest of the budget: wait until they land, then evict them.
      if (!m.evict_one_locked()) m.room_freed.wait(lock);
    }
    m.reserved += file_bytes;
  }
  // Under mu: the put of `k` is over (landed or failed).
  auto release_key_locked = [&] {
    if (--m.replacing[k] == 0) m.replacing.erase(k);
  };
  const std::string tmp_name = key_to_hex(key) + "." + std::to_string(m.tmp_counter.fetch_add(1)) + ".tmp";
  const fs::path tmp = m.tmp_dir / tmp_name;
  const std::string name = Impl::block_name(key);
  const fs::path path = m.block_path(key);
  bool created = false, renamed = false;
  // Every failure path: remove the temporary, give back the reservation, report.
  auto fail = [&](const std::string& message) {
    if (created && !renamed) ::unlinkat(m.tmp_fd.get(), tmp_name.c_str(), 0);
    std::lock_guard lock(m.mu);
    if (!renamed) {
      m.reserved -= file_bytes;
      release_key_locked();
    }
    ++m.counters.put_failures;
    m.room_freed.notify_all();
    throw Error(message);
  };
  auto fail_os = [&](const std::string& what, const fs::path& where, int err) {
    fail(posix::describe_os_error(what, where, err));
  };

  BlockChecksum sum;
  sum.update(header);
  sum.update(block);
  const auto checksum = sum.finish();
  UniqueFd fd(::openat(m.tmp_fd.get(), tmp_name.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644));
  if (!fd) fail_os("cannot create block file", tmp, errno);
  created = true;
  const iovec parts[3] = {{const_cast<uint8_t*>(header.data()), header.size()},
                          {const_cast<uint8_t*>(block.data()), block.size()},
                          {const_cast<uint8_t*>(checksum.data()), checksum.size()}};
  if (const int err = posix::write_all(fd.get(), parts)) fail_os("cannot write block file", tmp, err);
  const int64_t access_ns = m.next_access_ns();
  if (const int err = set_access_time(fd.get(), access_ns)) fail_os("cannot set the time of block file", tmp, err);
  if (m.options.durable && ::fsync(fd.get()) != 0) fail_os("cannot sync block file", tmp, errno);
  if (::close(fd.release()) != 0) fail_os("cannot write block file", tmp, errno);
  UniqueFd sub;
  try {
    sub = m.ensure_fanout(key);
  } catch (const Error& e) {
    fail(e.what());
  }
  const int sub_fd = sub.get();
  int rename_err = 0;
  {
    std::lock_guard lock(m.mu);
    if (::renameat(m.tmp_fd.get(), tmp_name.c_str(), sub_fd, name.c_str()) == 0) {
      renamed = true;
      m.reserved -= file_bytes;
      release_key_locked();
      m.touch_locked(k, access_ns, file_bytes);
      ++m.counters.puts;
      m.room_freed.notify_all();
    } else {
      rename_err = errno;
    }
  }
  if (!renamed) fail_os("cannot move block file into place", path, rename_err);
  if (m.options.durable && ::fsync(sub_fd) != 0) fail_os("cannot sync directory", path.parent_path(), errno);
}

bool DiskTier::get(ByteSpan key, MutableByteSpan out) {
  Impl& m = *impl_;
  if (out.size() != block_bytes())
    throw Error("output buffer is " + std::to_string(out.size()) + " bytes; blocks of this namespace are " +
                std::to_string(block_bytes()) + " bytes");
  const std::string k = as_key_string(key);
  {
    std::lock_guard lock(m.mu);
    if (key.size() < 1 || key.size() > kMaxKeyBytes || !m.index.count(k)) {
      ++m.counters.misses;
      return false;
    }
  }
  const int64_t access_ns = m.next_access_ns();
  const Impl::ReadOutcome r = m.read_block(key, out, access_ns);
  std::lock_guard lock(m.mu);
  switch (r.kind) {
    case Impl::ReadOutcome::ok:
      if (auto it = m.index.find(k); it != m.index.end()) m.touch_locked(k, access_ns, it->second.file_bytes);
      ++m.counters.hits;
      return true;
    case Impl::ReadOutcome::defective: ++m.counters.corrupt; break;
    case Impl::ReadOutcome::unopenable: ++m.counters.read_errors; break;
    case Impl::ReadOutcome::missing: break;
  }
  ++m.counters.misses;
  return false;
}

bool DiskTier::contains(ByteSpan key) const {
  std::lock_guard lock(impl_->mu);
  return impl_->index.count(as_key_string(key)) != 0;
}

bool DiskTier::erase(ByteSpan key) {
  Impl& m = *impl_;
  std::lock_guard lock(m.mu);
  const auto it = m.index.find(as_key_string(key));
  if (it == m.index.end()) return false;
  const UniqueFd sub = m.open_fanout(key);
  if (sub && ::unlinkat(sub.get(), Impl::block_name(key).c_str(), 0) != 0 && errno != ENOENT)
    throw Error(posix::describe_os_error("cannot remove block", m.block_path(key), errno));
  m.drop_locked(it);
  return true;
}

VerifyReport DiskTier::verify() {
  Impl& m = *impl_;
  std::vector<std::string> keys;
  {
    std::lock_guard lock(m.mu);
    keys.assign(m.lru.begin(), m.lru.end());
  }
  VerifyReport report;
  std::vector<uint8_t> payload(block_bytes());
  for (const std::string& k : keys) {
    const Impl::ReadOutcome r = m.read_block(as_bytes(k), payload, std::nullopt);
    if (r.kind == Impl::ReadOutcome::missing) continue;  // evicted or erased meanwhile
    ++report.checked;
    const std::string name = m.block_path(as_bytes(k)).filename().string();
    if (r.kind == Impl::ReadOutcome::ok) {
      ++report.ok;
    } else if (r.kind == Impl::ReadOutcome::unopenable) {
      ++report.unreadable;
      report.problems.push_back(posix::describe_os_error("cannot open", name, r.err) + " (left in place)");
    } else {
      ++report.quarantined;
      report.problems.push_back(name + ": " + to_string(r.defect) + " (quarantined)");
      std::lock_guard lock(m.mu);
      ++m.counters.corrupt;
    }
  }
  return report;
}

uint64_t DiskTier::shrink_to(uint64_t max_bytes) {
  std::lock_guard lock(impl_->mu);
  const uint64_t before = impl_->bytes;
  while (impl_->bytes > max_bytes && impl_->evict_one_locked()) {
  }
  return before - impl_->bytes;
}

std::vector<LruEntry> DiskTier::lru_snapshot() const {
  std::lock_guard lock(impl_->mu);
  std::vector<LruEntry> out;
  out.reserve(impl_->lru.size());
  for (auto it = impl_->lru.rbegin(); it != impl_->lru.rend(); ++it) {
    const auto& e = impl_->index.at(*it);
    out.push_back({std::vector<uint8_t>(it->begin(), it->end()), e.access_ns, e.file_bytes});
  }
  return out;
}

DiskTierStats DiskTier::stats() const {
  std::lock_guard lock(impl_->mu);
  DiskTierStats s = impl_->counters;
  s.blocks = impl_->index.size();
  s.bytes = impl_->bytes;
  return s;
}

DiskUsage disk_usage(const fs::path& namespace_dir) {
  // Read-only and best effort: what cannot be listed counts as empty; links are not followed.
  DiskUsage u;
  auto open_dir = [](int parent_fd, const std::string& name, const fs::path& shown) {
    try {
      return posix::open_dir_at(parent_fd, name, shown, false, false);
    } catch (const Error&) {
      return UniqueFd();
    }
  };
  // Calls visit(directory descriptor, entry name, lstat of the entry) for each entry of the
  // directory `name` inside `parent_fd`.
  auto for_each_entry = [&](int parent_fd, const std::string& name, const fs::path& shown, auto&& visit) {
    const UniqueFd fd = open_dir(parent_fd, name, shown);
    if (!fd) return;
    std::vector<std::string> entries;
    try {
      entries = posix::list_dir(fd.get(), shown);
    } catch (const Error&) {
    }
    for (const std::string& entry : entries) {
      struct stat st {};
      if (::fstatat(fd.get(), entry.c_str(), &st, AT_SYMLINK_NOFOLLOW) == 0) visit(fd.get(), entry, st);
    }
  };
  UniqueFd ns_fd;
  try {
    ns_fd = open_namespace_dir(namespace_dir);
  } catch (const Error&) {
  }
  if (!ns_fd) return u;
  const fs::path blocks = namespace_dir / kBlocksDir;
  for_each_entry(ns_fd.get(), kBlocksDir, blocks, [&](int blocks_fd, const std::string& sub, const struct stat& st) {
    if (!S_ISDIR(st.st_mode)) return;
    for_each_entry(blocks_fd, sub, blocks / sub, [&](int, const std::string&, const struct stat& f) {
      if (!S_ISREG(f.st_mode)) return;
      ++u.blocks;
      u.bytes += uint64_t(f.st_size);
      const int64_t t = mtime_ns(f);
      u.oldest_access_ns = u.blocks == 1 ? t : std::min(u.oldest_access_ns, t);
      u.newest_access_ns = std::max(u.newest_access_ns, t);
    });
  });
  for_each_entry(ns_fd.get(), kQuarantineDir, namespace_dir / kQuarantineDir,
                 [&](int, const std::string& name, const struct stat& st) {
                   if (!S_ISREG(st.st_mode) || name == kQuarantineLog) return;
                   ++u.quarantined;
                   u.quarantined_bytes += uint64_t(st.st_size);
                 });
  for_each_entry(ns_fd.get(), kTmpDir, namespace_dir / kTmpDir, [&](int, const std::string&, const struct stat& st) {
    if (S_ISREG(st.st_mode)) ++u.temporaries;
  });
  return u;
}

uint64_t collect_garbage(const fs::path& root, uint64_t max_bytes) {
  std::vector<std::unique_ptr<DiskTier>> tiers;
  struct Candidate {
    LruEntry entry;
    DiskTier* tier;
  };
  std::vector<Candidate> all;
  uint64_t total = 0;
  for (const NamespaceListing& l : list_namespaces(root)) {
    if (!l.valid) continue;
    tiers.push_back(DiskTier::open_existing(l.dir));
    for (LruEntry& e : tiers.back()->lru_snapshot()) {
      total += e.file_bytes;
      all.push_back({std::move(e), tiers.back().get()});
    }
  }
  std::stable_sort(all.begin(), all.end(),
                   [](const Candidate& a, const Candidate& b) { return a.entry.access_ns < b.entry.access_ns; });
  uint64_t freed = 0;
  for (const Candidate& c : all) {
    if (total - freed <= max_bytes) break;
    if (c.tier->erase(c.entry.key)) freed += c.entry.file_bytes;
  }
  return freed;
}

namespace {

bool remove_namespace_if_empty_or_throw(const fs::path& namespace_dir) {
  const UniqueFd ns = open_namespace_dir(namespace_dir);
  if (!ns) return false;
  const UniqueFd lock(::openat(ns.get(), kLockFile, O_RDWR | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC));
  if (!lock || ::flock(lock.get(), LOCK_EX | LOCK_NB) != 0) return false;
  // Everything is checked before anything is removed; while we hold the lock no store writes.
  const std::string manifest_tmp = std::string(kManifestFileName) + ".tmp.";
  for (const std::string& entry : posix::list_dir(ns.get(), namespace_dir)) {
    const bool known = entry == kManifestFileName || entry == kLockFile || entry == kBlocksDir || entry == kTmpDir ||
                       entry == kQuarantineDir || entry.starts_with(manifest_tmp);
    if (!known) return false;
  }
  const UniqueFd blocks = posix::open_dir_at(ns.get(), kBlocksDir, namespace_dir / kBlocksDir, false, false);
  std::vector<std::string> fanouts;
  if (blocks) {
    fanouts = posix::list_dir(blocks.get(), namespace_dir / kBlocksDir);
    for (const std::string& sub : fanouts) {
      const UniqueFd sub_fd = posix::open_dir_at(blocks.get(), sub, namespace_dir / kBlocksDir / sub, false, false);
      if (!sub_fd || !posix::list_dir(sub_fd.get(), namespace_dir / kBlocksDir / sub).empty()) return false;
    }
  }
  const UniqueFd quarantine = posix::open_dir_at(ns.get(), kQuarantineDir, namespace_dir / kQuarantineDir, false, false);
  if (quarantine && !posix::list_dir(quarantine.get(), namespace_dir / kQuarantineDir).empty()) return false;
  const UniqueFd tmp = posix::open_dir_at(ns.get(), kTmpDir, namespace_dir / kTmpDir, false, false);
  if (tmp)
    for (const std::string& entry : posix::list_dir(tmp.get(), namespace_dir / kTmpDir))
      ::unlinkat(tmp.get(), entry.c_str(), 0);  // abandoned temporaries: their writer is gone
  for (const std::string& sub : fanouts) ::unlinkat(blocks.get(), sub.c_str(), AT_REMOVEDIR);
  for (const char* sub : {kBlocksDir, kTmpDir, kQuarantineDir}) ::unlinkat(ns.get(), sub, AT_REMOVEDIR);
  for (const std::string& entry : posix::list_dir(ns.get(), namespace_dir))
    if (entry.starts_with(manifest_tmp) || entry == kManifestFileName) ::unlinkat(ns.get(), entry.c_str(), 0);
  ::unlinkat(ns.get(), kLockFile, 0);
  // rmdir removes only an empty directory (and never through a link): a store that opened it
  // meanwhile keeps it.
  return ::rmdir(namespace_dir.c_str()) == 0;
}

}  // namespace

bool remove_namespace_if_empty(const fs::path& namespace_dir) {
  try {
    return remove_namespace_if_empty_or_throw(namespace_dir);
  } catch (const Error&) {
    return false;  // something unexpected is there (e.g. a link): leave it all
  }
}

}  // namespace nvfp4mla::offload
