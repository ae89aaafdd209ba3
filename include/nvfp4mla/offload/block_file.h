#pragma once
// On-disk block file: fixed little-endian header, the key, the payload, and an XXH3-128
// checksum of everything before it. docs/OFFLOAD.md has the byte table.
//
//   offset  bytes  field
//   0       8      magic "NVF4KVB1"
//   8       4      file format version (kBlockFileVersion)
//   12      4      key length K (1..kMaxKeyBytes)
//   16      32     namespace digest (SHA-256, namespace.h)
//   48      4      record bytes
//   52      4      tokens per block
//   56      4      layers in block
//   60      4      reserved, zero
//   64      8      payload length P (= record bytes * tokens * layers)
//   72      K      key
//   72+K    P      payload
//   72+K+P  16     XXH3-128 of bytes [0, 72+K+P), canonical (big-endian) form
#include <array>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "nvfp4mla/offload/namespace.h"

namespace nvfp4mla::offload {

using ByteSpan = std::span<const uint8_t>;
using MutableByteSpan = std::span<uint8_t>;

inline constexpr std::array<uint8_t, 8> kBlockMagic = {'N', 'V', 'F', '4', 'K', 'V', 'B', '1'};
inline constexpr uint32_t kBlockFileVersion = 1;
inline constexpr size_t kBlockHeaderFixedBytes = 72;
inline constexpr size_t kBlockChecksumBytes = 16;
// Keys are the caller's block hashes (a 32-byte chained token hash is typical). The file name
// is the key in hex, so the bound keeps names well under NAME_MAX.
inline constexpr size_t kMaxKeyBytes = 64;

// What a block file must say about itself to be accepted.
struct BlockExpectation {
  NamespaceDigest digest{};
  uint32_t record_bytes = 0;
  uint32_t tokens_per_block = 0;
  uint32_t layers_in_block = 0;
  uint64_t payload_bytes() const { return uint64_t(record_bytes) * tokens_per_block * layers_in_block; }
  static BlockExpectation of(const NamespaceParams& params);
};

// Why a block file was rejected (none = valid).
enum class BlockDefect : uint8_t {
  none,
  wrong_size,        // file length differs from header + key + payload + checksum (short or long)
  bad_magic,
  bad_version,
  wrong_namespace,   // digest of another namespace
  wrong_geometry,    // record bytes / tokens / layers / payload length differ
  wrong_key,         // key length or bytes differ from the requested key
  reserved_nonzero,
  bad_checksum,
  read_error,        // the OS reported an error while reading
  not_a_file,        // a symbolic link, FIFO, device or directory where a block file belongs
};
const char* to_string(BlockDefect defect);

uint64_t block_file_size(size_t key_bytes, uint64_t payload_bytes);

// The header (fixed part + key) of a block file. Throws Error for an invalid key length.
std::vector<uint8_t> encode_block_header(const BlockExpectation& expect, ByteSpan key);
// Checks a header (fixed part + key, exactly kBlockHeaderFixedBytes + key.size() bytes) against
// what the reader expects, the key included.
BlockDefect check_block_header(ByteSpan header, const BlockExpectation& expect, ByteSpan key);

// Streaming XXH3-128 in canonical byte order.
class BlockChecksum {
 public:
  BlockChecksum();
  ~BlockChecksum();
  BlockChecksum(const BlockChecksum&) = delete;
  BlockChecksum& operator=(const BlockChecksum&) = delete;
  void update(ByteSpan bytes);
  std::array<uint8_t, kBlockChecksumBytes> finish() const;

 private:
  void* state_;
};

// A whole block file in memory (tests, CLI, verification).
std::vector<uint8_t> encode_block_file(const BlockExpectation& expect, ByteSpan key, ByteSpan payload);
// Validates a whole file; on success `payload` (when non-null) views the payload inside `file`.
BlockDefect check_block_file(ByteSpan file, const BlockExpectation& expect, ByteSpan key,
                             ByteSpan* payload = nullptr);

// Keys in file names and on the command line: lowercase hex.
std::string key_to_hex(ByteSpan key);
// Throws Error for odd length, non-hex characters, or a length outside 1..kMaxKeyBytes.
std::vector<uint8_t> key_from_hex(const std::string& hex);

}  // namespace nvfp4mla::offload
