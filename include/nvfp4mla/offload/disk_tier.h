#pragma once
// Disk tier of the offload store: one block file per key under the namespace directory.
//
// <root>/<namespace digest hex>/
//   manifest.json        the namespace, human readable; must match on open
//   lock                 flock()ed by the one DiskTier that owns the directory
//   blocks/<xx>/<key hex>.blk   xx = fan-out by a hash of the key
//   tmp/                 files being written (removed on open: their writer is gone)
//   quarantine/          files that failed validation, moved aside with reasons.log
//
// The store never follows a symbolic link below the root: the namespace directory and its
// sub-directories are opened once (O_NOFOLLOW) and every file is reached relative to them; a
// link where the store expects a directory, the lock, the manifest or quarantine/reasons.log is
// an Error naming it, and a link in place of a block file is quarantined (the link itself).
//
// Writes: temporary file, fsync, rename into place, fsync of the directory; a reader therefore
// sees either the old file, the new file or none, never a mix. Reads validate header and
// checksum; any defect is a counted miss and the file goes to quarantine (never deleted).
// Capacity in file bytes with least-recently-used eviction; the access order lives in the files'
// modification times, so it survives restarts. All methods are thread safe.
#include <cstdint>
#include <filesystem>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "nvfp4mla/offload/block_file.h"
#include "nvfp4mla/offload/namespace.h"

namespace nvfp4mla::offload {

struct DiskTierOptions {
  uint64_t capacity_bytes = std::numeric_limits<uint64_t>::max();  // block file bytes on disk
  bool durable = true;  // fsync each file and its directory before put() returns
};

struct DiskTierStats {
  uint64_t blocks = 0, bytes = 0, capacity_bytes = 0;
  uint64_t hits = 0, misses = 0;
  uint64_t corrupt = 0;       // reads (and verifications) that found a defect: quarantined
  uint64_t read_errors = 0;   // block files that could not be opened (e.g. permissions): misses
  uint64_t puts = 0, put_failures = 0, evictions = 0;
  uint64_t quarantined_at_open = 0;  // unexpected or wrongly sized files found by the open scan
};

struct VerifyReport {
  uint64_t checked = 0, ok = 0;
  uint64_t quarantined = 0;  // defective files, moved to quarantine/
  uint64_t unreadable = 0;   // files that could not be opened (e.g. permissions), left in place
  std::vector<std::string> problems;  // one line per quarantined or unreadable file
};

// One block's place in the eviction order.
struct LruEntry {
  std::vector<uint8_t> key;
  int64_t access_ns = 0;  // last write or read, ns since the epoch
  uint64_t file_bytes = 0;
};

class DiskTier {
 public:
  // Opens (creating when absent) the namespace directory under `root`. Throws Error when the
  // directory's manifest disagrees with `params`, when another DiskTier holds it, or when it
  // cannot be created or locked (the message names the path and the OS reason).
  DiskTier(const std::filesystem::path& root, const NamespaceParams& params, DiskTierOptions options = {});
  // Opens an existing namespace directory, taking the namespace from its manifest.
  static std::unique_ptr<DiskTier> open_existing(const std::filesystem::path& namespace_dir,
                                                 DiskTierOptions options = {});
  ~DiskTier();
  DiskTier(const DiskTier&) = delete;
  DiskTier& operator=(const DiskTier&) = delete;

  const NamespaceParams& params() const;
  const std::filesystem::path& dir() const;
  uint64_t block_bytes() const;  // payload bytes per block

  // Stores a block (block.size() == block_bytes()), replacing any block with the same key,
  // evicting least-recently-used blocks to stay within capacity (the older block under the same
  // key is replaced, never evicted for room). Throws Error (disk full, permission, block larger
  // than the capacity, ...) after removing its temporary file; the older block under the same key
  // and every block not evicted for room are untouched by a failure.
  void put(ByteSpan key, ByteSpan block);
  // Reads a block into `out` (out.size() == block_bytes()). False on a miss; a defective file is
  // a miss too (counted, quarantined, `out` zeroed). Never returns a partially written block.
  bool get(ByteSpan key, MutableByteSpan out);
  bool contains(ByteSpan key) const;
  bool erase(ByteSpan key);

  // Re-checks every block file; quarantines the defective ones.
  VerifyReport verify();
  // Evicts least-recently-used blocks until at most max_bytes remain; returns bytes freed.
  uint64_t shrink_to(uint64_t max_bytes);
  std::vector<LruEntry> lru_snapshot() const;  // oldest first
  DiskTierStats stats() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// What a namespace directory holds, read without opening (or locking) it: safe while a store
// is using the directory.
struct DiskUsage {
  uint64_t blocks = 0, bytes = 0;                  // block files in blocks/
  uint64_t quarantined = 0, quarantined_bytes = 0;  // files in quarantine/ (reasons.log excluded)
  uint64_t temporaries = 0;                        // files in tmp/ (writes in flight or abandoned)
  int64_t oldest_access_ns = 0, newest_access_ns = 0;  // over the block files (0 when none)
};
DiskUsage disk_usage(const std::filesystem::path& namespace_dir);

// Evicts least-recently-used blocks across every namespace under `root` until their files
// total at most max_bytes (UINT64_MAX keeps everything). Returns bytes freed. Throws Error when
// a namespace is in use.
uint64_t collect_garbage(const std::filesystem::path& root, uint64_t max_bytes);

// Removes a namespace directory that holds nothing of value: no block, nothing in quarantine/,
// no entry the store does not know (a first put that failed leaves such a directory). Takes
// the namespace lock first; returns false, removing nothing, when the namespace is in use or
// holds anything else. Never follows a link.
bool remove_namespace_if_empty(const std::filesystem::path& namespace_dir);

}  // namespace nvfp4mla::offload
