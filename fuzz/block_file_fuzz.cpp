// Fuzzes the offload block-file checks (check_block_file, check_block_header) that every disk
// tier read and `store verify` apply to bytes found on disk. The input is a whole block file;
// the key it is checked against is the one its header claims (so a valid seed reaches the
// checksum), and the namespace is fixed. Properties: a file is accepted only if it is exactly
// what encode_block_file writes for that key and payload; the header check agrees with the
// whole-file check on the header; a different key is always rejected.
#include <algorithm>
#include <vector>

#include "fuzz_support.h"
#include "nvfp4mla/config.h"
#include "nvfp4mla/offload/block_file.h"

using namespace nvfp4mla;
using namespace nvfp4mla::offload;

namespace {

// The namespace of the seed corpus: 368-byte records, 2 tokens, 1 layer (736-byte payload).
const BlockExpectation& expectation() {
  static const BlockExpectation e = [] {
    FormatOptions format;
    format.rope = RopeEncoding::fp8;
    format.scale_mode = ScaleMode::dynamic;
    return BlockExpectation::of(NamespaceParams::for_format(FormatConfig::create(format), 2, 1, "fuzz"));
  }();
  return e;
}

uint32_t claimed_key_length(ByteSpan file) {
  if (file.size() < 16) return 1;
  uint32_t k = 0;
  for (int i = 0; i < 4; ++i) k |= uint32_t(file[12 + i]) << (8 * i);
  return std::clamp<uint32_t>(k, 1, kMaxKeyBytes);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const ByteSpan file(data, size);
  const BlockExpectation& expect = expectation();
  const size_t key_bytes = claimed_key_length(file);
  std::vector<uint8_t> key(key_bytes, 0);
  if (size >= kBlockHeaderFixedBytes) {
    const size_t have = std::min(key_bytes, size - kBlockHeaderFixedBytes);
    std::copy_n(data + kBlockHeaderFixedBytes, have, key.begin());
  }

  ByteSpan payload;
  const BlockDefect defect = check_block_file(file, expect, key, &payload);
  fuzz::require(to_string(defect)[0] != '?', "a defect without a name");

  const size_t header_bytes = kBlockHeaderFixedBytes + key.size();
  if (size >= header_bytes) {
    const BlockDefect header_defect = check_block_header(file.first(header_bytes), expect, key);
    if (defect == BlockDefect::none) fuzz::require(header_defect == BlockDefect::none, "header check disagrees");
    if (size == block_file_size(key.size(), expect.payload_bytes()) && defect != BlockDefect::bad_checksum)
      fuzz::require(header_defect == defect, "header check and file check name different defects");
  }
  if (defect != BlockDefect::none) return 0;

  fuzz::require(payload.size() == expect.payload_bytes(), "accepted payload has the wrong size");
  const std::vector<uint8_t> again = encode_block_file(expect, key, payload);
  fuzz::require(std::equal(again.begin(), again.end(), file.begin(), file.end()),
                "accepted a file that encode_block_file would not write");
  std::vector<uint8_t> other_key = key;
  other_key.back() ^= 1;
  fuzz::require(check_block_file(file, expect, other_key) != BlockDefect::none, "accepted under another key");
  fuzz::require(key_from_hex(key_to_hex(key)) == key, "key hex round trip failed");
  return 0;
}
