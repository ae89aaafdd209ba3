#include "nvfp4mla/offload/block_file.h"

#include <cstring>

#include "nvfp4mla/error.h"

// Header-only xxHash: no library to link or export.
#define XXH_INLINE_ALL
#include <xxhash.h>

namespace nvfp4mla::offload {

namespace {

// Field offsets of the fixed header (block_file.h has the table).
constexpr size_t kMagicAt = 0;
constexpr size_t kVersionAt = 8;
constexpr size_t kKeyLengthAt = 12;
constexpr size_t kDigestAt = 16;
constexpr size_t kRecordBytesAt = 48;
constexpr size_t kTokensAt = 52;
constexpr size_t kLayersAt = 56;
constexpr size_t kReservedAt = 60;
constexpr size_t kPayloadLengthAt = 64;
static_assert(kPayloadLengthAt + 8 == kBlockHeaderFixedBytes);
static_assert(kDigestAt + sizeof(NamespaceDigest) == kRecordBytesAt);

void put_le(uint8_t* p, uint64_t v, int bytes) {
  for (int i = 0; i < bytes; ++i) p[i] = static_cast<uint8_t>(v >> (8 * i));
}
uint64_t get_le(const uint8_t* p, int bytes) {
  uint64_t v = 0;
  for (int i = 0; i < bytes; ++i) v |= uint64_t(p[i]) << (8 * i);
  return v;
}

void check_key_length(size_t key_bytes) {
  if (key_bytes < 1 || key_bytes > kMaxKeyBytes)
    throw Error("a block key must be 1.." + std::to_string(kMaxKeyBytes) + " bytes, got " + std::to_string(key_bytes));
}

}  // namespace

BlockExpectation BlockExpectation::of(const NamespaceParams& params) {
  BlockExpectation e;
  e.digest = namespace_digest(params);
  e.record_bytes = static_cast<uint32_t>(params.record_bytes);
  e.tokens_per_block = static_cast<uint32_t>(params.tokens_per_block);
  e.layers_in_block = static_cast<uint32_t>(params.layers_in_block);
  return e;
}

const char* to_string(BlockDefect defect) {
  switch (defect) {
    case BlockDefect::none: return "valid";
    case BlockDefect::wrong_size: return "wrong file size (short or overlong)";
    case BlockDefect::bad_magic: return "bad magic";
    case BlockDefect::bad_version: return "unsupported file version";
    case BlockDefect::wrong_namespace: return "namespace digest of another namespace";
    case BlockDefect::wrong_geometry: return "geometry differs from the namespace";
    case BlockDefect::wrong_key: return "key differs from the file name";
    case BlockDefect::reserved_nonzero: return "reserved header bytes not zero";
    case BlockDefect::bad_checksum: return "checksum mismatch";
    case BlockDefect::read_error: return "read error";
    case BlockDefect::not_a_file: return "not a regular file (a link, FIFO, device or directory)";
  }
  return "?";
}

uint64_t block_file_size(size_t key_bytes, uint64_t payload_bytes) {
  return kBlockHeaderFixedBytes + key_bytes + payload_bytes + kBlockChecksumBytes;
}

std::vector<uint8_t> encode_block_header(const BlockExpectation& expect, ByteSpan key) {
  check_key_length(key.size());
  std::vector<uint8_t> h(kBlockHeaderFixedBytes + key.size(), 0);
  std::memcpy(h.data() + kMagicAt, kBlockMagic.data(), kBlockMagic.size());
  put_le(h.data() + kVersionAt, kBlockFileVersion, 4);
  put_le(h.data() + kKeyLengthAt, key.size(), 4);
  std::memcpy(h.data() + kDigestAt, expect.digest.data(), expect.digest.size());
  put_le(h.data() + kRecordBytesAt, expect.record_bytes, 4);
  put_le(h.data() + kTokensAt, expect.tokens_per_block, 4);
  put_le(h.data() + kLayersAt, expect.layers_in_block, 4);
  put_le(h.data() + kPayloadLengthAt, expect.payload_bytes(), 8);
  std::memcpy(h.data() + kBlockHeaderFixedBytes, key.data(), key.size());
  return h;
}

BlockDefect check_block_header(ByteSpan header, const BlockExpectation& expect, ByteSpan key) {
  if (header.size() != kBlockHeaderFixedBytes + key.size()) return BlockDefect::wrong_size;
  const uint8_t* h = header.data();
  if (std::memcmp(h + kMagicAt, kBlockMagic.data(), kBlockMagic.size()) != 0) return BlockDefect::bad_magic;
  if (get_le(h + kVersionAt, 4) != kBlockFileVersion) return BlockDefect::bad_version;
  if (get_le(h + kKeyLengthAt, 4) != key.size()) return BlockDefect::wrong_key;
  if (std::memcmp(h + kDigestAt, expect.digest.data(), expect.digest.size()) != 0) return BlockDefect::wrong_namespace;
  if (get_le(h + kRecordBytesAt, 4) != expect.record_bytes || get_le(h + kTokensAt, 4) != expect.tokens_per_block ||
      get_le(h + kLayersAt, 4) != expect.layers_in_block || get_le(h + kPayloadLengthAt, 8) != expect.payload_bytes())
    return BlockDefect::wrong_geometry;
  if (get_le(h + kReservedAt, 4) != 0) return BlockDefect::reserved_nonzero;
  if (std::memcmp(h + kBlockHeaderFixedBytes, key.data(), key.size()) != 0) return BlockDefect::wrong_key;
  return BlockDefect::none;
}

BlockChecksum::BlockChecksum() : state_(XXH3_createState()) {
  if (!state_) throw std::bad_alloc();
  XXH3_128bits_reset(static_cast<XXH3_state_t*>(state_));
}

BlockChecksum::~BlockChecksum() { XXH3_freeState(static_cast<XXH3_state_t*>(state_)); }

void BlockChecksum::update(ByteSpan bytes) {
  XXH3_128bits_update(static_cast<XXH3_state_t*>(state_), bytes.data(), bytes.size());
}

std::array<uint8_t, kBlockChecksumBytes> BlockChecksum::finish() const {
  XXH128_canonical_t canonical;
  XXH128_canonicalFromHash(&canonical, XXH3_128bits_digest(static_cast<XXH3_state_t*>(state_)));
  std::array<uint8_t, kBlockChecksumBytes> out{};
  static_assert(sizeof(canonical.digest) == kBlockChecksumBytes);
  std::memcpy(out.data(), canonical.digest, out.size());
  return out;
}

std::vector<uint8_t> encode_block_file(const BlockExpectation& expect, ByteSpan key, ByteSpan payload) {
  if (payload.size() != expect.payload_bytes())
    throw Error("block payload is " + std::to_string(payload.size()) + " bytes; the namespace's blocks are " +
                std::to_string(expect.payload_bytes()) + " bytes");
  std::vector<uint8_t> file = encode_block_header(expect, key);
  file.insert(file.end(), payload.begin(), payload.end());
  BlockChecksum sum;
  sum.update(file);
  const auto digest = sum.finish();
  file.insert(file.end(), digest.begin(), digest.end());
  return file;
}

BlockDefect check_block_file(ByteSpan file, const BlockExpectation& expect, ByteSpan key, ByteSpan* payload) {
  if (file.size() != block_file_size(key.size(), expect.payload_bytes())) return BlockDefect::wrong_size;
  const size_t header_bytes = kBlockHeaderFixedBytes + key.size();
  const BlockDefect defect = check_block_header(file.first(header_bytes), expect, key);
  if (defect != BlockDefect::none) return defect;
  const size_t body = file.size() - kBlockChecksumBytes;
  BlockChecksum sum;
  sum.update(file.first(body));
  const auto digest = sum.finish();
  if (std::memcmp(digest.data(), file.data() + body, digest.size()) != 0) return BlockDefect::bad_checksum;
  if (payload) *payload = file.subspan(header_bytes, body - header_bytes);
  return BlockDefect::none;
}

std::string key_to_hex(ByteSpan key) {
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string out;
  out.reserve(2 * key.size());
  for (uint8_t b : key) {
    out.push_back(kDigits[b >> 4]);
    out.push_back(kDigits[b & 0xF]);
  }
  return out;
}

std::vector<uint8_t> key_from_hex(const std::string& hex) {
  auto nibble = [&](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    throw Error("key '" + hex + "' is not hexadecimal (character '" + std::string(1, c) + "')");
  };
  if (hex.size() % 2 != 0) throw Error("key '" + hex + "' has an odd number of hex digits");
  std::vector<uint8_t> key(hex.size() / 2);
  for (size_t i = 0; i < key.size(); ++i) key[i] = static_cast<uint8_t>(nibble(hex[2 * i]) << 4 | nibble(hex[2 * i + 1]));
  check_key_length(key.size());
  return key;
}

}  // namespace nvfp4mla::offload
