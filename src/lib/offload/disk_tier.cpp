#include "nvfp4mla/offload/disk_tier.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
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
std::string as_key_string(ByteSpan key) { return {reinterpret_cast<const char*>(key.data()), key.size()}; }

}  // namespace

struct DiskTier::Impl {
  NamespaceParams params;
  BlockExpectation expect;
  DiskTierOptions options;
  fs::path dir, blocks_dir, tmp_dir, quarantine_dir;
  UniqueFd lock_fd;
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
  std::bitset<kFanout> fanout_ready;
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

  fs::path fanout_dir(ByteSpan key) const { return blocks_dir / fanout_name(fanout_of(key)); }
  fs::path block_path(ByteSpan key) const { return fanout_dir(key) / (key_to_hex(key) + kBlockSuffix); }
  uint64_t file_size_for(size_t key_bytes) const { return block_file_size(key_bytes, expect.payload_bytes()); }

  void open(const fs::path& root);
  void take_lock();
  void check_or_write_manifest();
  void remove_stale_temporaries();
  void scan_blocks();

  // --- index operations; caller holds mu ---
  void touch_locked(const std::string& key, int64_t access_ns, uint64_t file_bytes);
  void drop_locked(std::unordered_map<std::string, Entry>::iterator it);
  // Deletes the least recently used block; false when there is none.
  bool evict_one_locked();

  void ensure_fanout(ByteSpan key);
  // Moves the file at `path` aside if it is still the one `fd` refers to; logs `reason`.
  void quarantine(const fs::path& path, int fd, const std::string& reason);
  bool quarantine_path_locked(const fs::path& path, const std::string& reason);
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
  dir = namespace_dir(root, params);
  blocks_dir = dir / kBlocksDir;
  tmp_dir = dir / kTmpDir;
  quarantine_dir = dir / kQuarantineDir;
  posix::ensure_dir(dir, options.durable);
  take_lock();
  check_or_write_manifest();
  posix::ensure_dir(blocks_dir, options.durable);
  posix::ensure_dir(tmp_dir, options.durable);
  posix::ensure_dir(quarantine_dir, options.durable);
  remove_stale_temporaries();
  scan_blocks();
  std::lock_guard lock(mu);
  counters.capacity_bytes = options.capacity_bytes;
  while (bytes > options.capacity_bytes && evict_one_locked()) {
  }
}

void DiskTier::Impl::take_lock() {
  const fs::path path = dir / kLockFile;
  lock_fd = UniqueFd(::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644));
  if (!lock_fd) throw Error(posix::describe_os_error("cannot open the namespace lock", path, errno));
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
  const fs::path path = dir / kManifestFileName;
  std::error_code ec;
  if (fs::exists(path, ec)) {
    const NamespaceParams found = parse_manifest(posix::read_text_file(path, "manifest"), "'" + path.string() + "'");
    check_manifest_matches(params, found, "'" + dir.string() + "'");
    return;
  }
  // Blocks are only ever written after the manifest, so blocks without one mean the manifest
  // was removed by hand: their meaning is unknown.
  bool has_files = false;
  for (auto it = fs::recursive_directory_iterator(blocks_dir, ec); !ec && it != fs::recursive_directory_iterator();
       it.increment(ec))
    has_files |= it->is_regular_file();
  if (has_files)
    throw Error("the namespace directory '" + dir.string() +
                "' holds blocks but no manifest.json; refusing to guess their format (move the directory away)");
  const std::string text = manifest_json(params);
  posix::write_file_atomically(path, as_bytes(text), options.durable);
}

void DiskTier::Impl::remove_stale_temporaries() {
  // We hold the namespace lock, so every temporary file belongs to a writer that is gone.
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(tmp_dir, ec)) {
    std::error_code rm;
    fs::remove(entry.path(), rm);
  }
  // Manifest temporaries of a creation that was interrupted.
  const std::string manifest_tmp = std::string(kManifestFileName) + ".tmp.";
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    std::error_code rm;
    if (entry.path().filename().string().starts_with(manifest_tmp)) fs::remove(entry.path(), rm);
  }
}

void DiskTier::Impl::scan_blocks() {
  struct Found {
    std::string key;
    int64_t access_ns;
    uint64_t file_bytes;
  };
  std::vector<Found> found;
  std::error_code ec;
  std::lock_guard lock(mu);
  for (const auto& sub : fs::directory_iterator(blocks_dir, ec)) {
    const std::string sub_name = sub.path().filename().string();
    size_t fanout = kFanout;
    for (size_t i = 0; i < kFanout; ++i)
      if (sub_name == fanout_name(i)) fanout = i;
    if (fanout == kFanout || !sub.is_directory()) {
      if (quarantine_path_locked(sub.path(), "unexpected entry in blocks/")) ++counters.quarantined_at_open;
      continue;
    }
    fanout_ready.set(fanout);
    std::error_code sub_ec;
    for (const auto& file : fs::directory_iterator(sub.path(), sub_ec)) {
      const std::string name = file.path().filename().string();
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
        if (reason.empty() && ::lstat(file.path().c_str(), &st) != 0) reason = std::string("stat failed: ") + std::strerror(errno);
        if (reason.empty() && !S_ISREG(st.st_mode)) reason = "not a regular file";
        if (reason.empty() && uint64_t(st.st_size) != file_size_for(key.size())) reason = to_string(BlockDefect::wrong_size);
      }
      if (!reason.empty()) {
        if (quarantine_path_locked(file.path(), reason)) ++counters.quarantined_at_open;
        continue;
      }
      found.push_back({as_key_string(key), mtime_ns(st), uint64_t(st.st_size)});
    }
    if (sub_ec) throw Error("cannot list '" + sub.path().string() + "': " + sub_ec.message());
  }
  if (ec) throw Error("cannot list '" + blocks_dir.string() + "': " + ec.message());
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
  if (lru.empty()) return false;
  auto it = index.find(lru.back());
  const fs::path path = block_path(as_bytes(it->first));
  if (::unlink(path.c_str()) != 0 && errno != ENOENT)
    throw Error(posix::describe_os_error("cannot evict block", path, errno));
  drop_locked(it);
  ++counters.evictions;
  return true;
}

void DiskTier::Impl::ensure_fanout(ByteSpan key) {
  const size_t i = fanout_of(key);
  {
    std::lock_guard lock(mu);
    if (fanout_ready.test(i)) return;
  }
  posix::ensure_dir(blocks_dir / fanout_name(i), options.durable);
  std::lock_guard lock(mu);
  fanout_ready.set(i);
}

bool DiskTier::Impl::quarantine_path_locked(const fs::path& path, const std::string& reason) {
  const fs::path target = quarantine_dir / (path.filename().string() + "." + std::to_string(now_ns()));
  if (::rename(path.c_str(), target.c_str()) != 0) return false;
  // Best effort: the evidence is the moved file; the log says why it was moved.
  const fs::path log = quarantine_dir / kQuarantineLog;
  UniqueFd fd(::open(log.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644));
  if (fd) {
    const std::string line = std::to_string(now_ns() / 1000000000) + " " + target.filename().string() + " " + reason + "\n";
    const iovec part{const_cast<char*>(line.data()), line.size()};
    (void)posix::write_all(fd.get(), {&part, 1});
  }
  return true;
}

void DiskTier::Impl::quarantine(const fs::path& path, int fd, const std::string& reason) {
  std::lock_guard lock(mu);
  struct stat held {}, current {};
  // A concurrent put may have replaced the file since it was opened: move only the bad one.
  if (::fstat(fd, &held) != 0 || ::stat(path.c_str(), &current) != 0) return;
  if (held.st_dev != current.st_dev || held.st_ino != current.st_ino) return;
  if (!quarantine_path_locked(path, reason)) return;
  const std::string name = path.stem().string();
  try {
    const auto it = index.find(as_key_string(key_from_hex(name)));
    if (it != index.end()) drop_locked(it);
  } catch (const Error&) {
  }
}

DiskTier::Impl::ReadOutcome DiskTier::Impl::read_block(ByteSpan key, MutableByteSpan out,
                                                       std::optional<int64_t> touch) {
  const fs::path path = block_path(key);
  UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (!fd) {
    const int err = errno;
    if (err != ENOENT) return {ReadOutcome::unopenable, BlockDefect::read_error, err};
    // Evicted or erased since the caller looked; or removed behind the store's back.
    std::lock_guard lock(mu);
    struct stat st {};
    if (::stat(path.c_str(), &st) != 0 && errno == ENOENT)
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
    quarantine(path, fd.get(), to_string(defect));
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
  const fs::path manifest = namespace_dir / kManifestFileName;
  const NamespaceParams params =
      parse_manifest(posix::read_text_file(manifest, "manifest"), "'" + manifest.string() + "'");
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
  {
    std::unique_lock lock(m.mu);
    while (m.bytes + m.reserved + file_bytes > m.options.capacity_bytes) {
      // Other puts hold the rest of the budget: wait until they land, then evict them.
      if (!m.evict_one_locked()) m.room_freed.wait(lock);
    }
    m.reserved += file_bytes;
  }
  const fs::path tmp = m.tmp_dir / (key_to_hex(key) + "." + std::to_string(m.tmp_counter.fetch_add(1)) + ".tmp");
  const fs::path path = m.block_path(key);
  bool renamed = false;
  // Every failure path: remove the temporary, give back the reservation, report.
  auto fail = [&](const std::string& message) {
    if (!renamed) ::unlink(tmp.c_str());
    std::lock_guard lock(m.mu);
    if (!renamed) m.reserved -= file_bytes;
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
  UniqueFd fd(::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644));
  if (!fd) fail_os("cannot create block file", tmp, errno);
  const iovec parts[3] = {{const_cast<uint8_t*>(header.data()), header.size()},
                          {const_cast<uint8_t*>(block.data()), block.size()},
                          {const_cast<uint8_t*>(checksum.data()), checksum.size()}};
  if (const int err = posix::write_all(fd.get(), parts)) fail_os("cannot write block file", tmp, err);
  const int64_t access_ns = m.next_access_ns();
  if (const int err = set_access_time(fd.get(), access_ns)) fail_os("cannot set the time of block file", tmp, err);
  if (m.options.durable && ::fsync(fd.get()) != 0) fail_os("cannot sync block file", tmp, errno);
  if (::close(fd.release()) != 0) fail_os("cannot write block file", tmp, errno);
  try {
    m.ensure_fanout(key);
  } catch (const Error& e) {
    fail(e.what());
  }
  int rename_err = 0;
  {
    std::lock_guard lock(m.mu);
    if (::rename(tmp.c_str(), path.c_str()) == 0) {
      renamed = true;
      m.reserved -= file_bytes;
      m.touch_locked(as_key_string(key), access_ns, file_bytes);
      ++m.counters.puts;
      m.room_freed.notify_all();
    } else {
      rename_err = errno;
    }
  }
  if (!renamed) fail_os("cannot move block file into place", path, rename_err);
  if (m.options.durable) {
    if (const int err = posix::fsync_dir(path.parent_path())) fail_os("cannot sync directory", path.parent_path(), err);
  }
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
  const fs::path path = m.block_path(key);
  if (::unlink(path.c_str()) != 0 && errno != ENOENT) throw Error(posix::describe_os_error("cannot remove block", path, errno));
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
      report.problems.push_back(posix::describe_os_error("cannot open", name, r.err));
    } else {
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
  DiskUsage u;
  std::error_code ec;
  auto files_in = [&](const fs::path& d, auto&& visit) {
    for (const auto& e : fs::directory_iterator(d, ec)) {
      struct stat st {};
      if (::lstat(e.path().c_str(), &st) == 0 && S_ISREG(st.st_mode)) visit(e.path(), st);
    }
    ec.clear();
  };
  for (const auto& sub : fs::directory_iterator(namespace_dir / kBlocksDir, ec)) {
    files_in(sub.path(), [&](const fs::path&, const struct stat& st) {
      ++u.blocks;
      u.bytes += uint64_t(st.st_size);
      const int64_t t = mtime_ns(st);
      u.oldest_access_ns = u.blocks == 1 ? t : std::min(u.oldest_access_ns, t);
      u.newest_access_ns = std::max(u.newest_access_ns, t);
    });
  }
  ec.clear();
  files_in(namespace_dir / kQuarantineDir, [&](const fs::path& p, const struct stat& st) {
    if (p.filename() == kQuarantineLog) return;
    ++u.quarantined;
    u.quarantined_bytes += uint64_t(st.st_size);
  });
  files_in(namespace_dir / kTmpDir, [&](const fs::path&, const struct stat&) { ++u.temporaries; });
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

}  // namespace nvfp4mla::offload
