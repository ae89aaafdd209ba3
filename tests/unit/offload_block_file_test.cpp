// Block file format: round trip, byte layout, and that every single-bit flip, truncation and
// extension of a whole file is detected.
#include <gtest/gtest.h>

#include <cstring>

#include "nvfp4mla/error.h"
#include "nvfp4mla/offload/block_file.h"
#include "support/offload_fixtures.h"

using namespace nvfp4mla;
using namespace nvfp4mla::offload;
using nvfp4mla::testing::expect_error_containing;
using nvfp4mla::testing::key_of;
using nvfp4mla::testing::pattern_bytes;
using nvfp4mla::testing::small_params;

namespace {
struct Fixture {
  NamespaceParams params = small_params(2, 1);
  BlockExpectation expect = BlockExpectation::of(params);
  std::vector<uint8_t> key = key_of(7);
  std::vector<uint8_t> payload = pattern_bytes(params.block_bytes(), 7);
  std::vector<uint8_t> file = encode_block_file(expect, key, payload);
};
}  // namespace

TEST(OffloadBlockFile, RoundTripAndLayout) {
  Fixture f;
  ASSERT_EQ(f.file.size(), block_file_size(f.key.size(), f.payload.size()));
  ByteSpan payload;
  ASSERT_EQ(check_block_file(f.file, f.expect, f.key, &payload), BlockDefect::none);
  EXPECT_TRUE(std::equal(payload.begin(), payload.end(), f.payload.begin(), f.payload.end()));
  // Byte table of block_file.h: magic, version, key length, digest, geometry, key, payload.
  EXPECT_EQ(std::memcmp(f.file.data(), "NVF4KVB1", 8), 0);
  EXPECT_EQ(f.file[8], kBlockFileVersion);
  EXPECT_EQ(f.file[12], f.key.size());
  EXPECT_EQ(std::memcmp(f.file.data() + 16, f.expect.digest.data(), 32), 0);
  EXPECT_EQ(f.file[48] | f.file[49] << 8, f.params.record_bytes);
  EXPECT_EQ(f.file[52], f.params.tokens_per_block);
  EXPECT_EQ(f.file[56], f.params.layers_in_block);
  EXPECT_EQ(f.file[64] | f.file[65] << 8, static_cast<int>(f.payload.size()));
  EXPECT_EQ(std::memcmp(f.file.data() + 72, f.key.data(), f.key.size()), 0);
  EXPECT_EQ(std::memcmp(f.file.data() + 72 + f.key.size(), f.payload.data(), f.payload.size()), 0);
}

TEST(OffloadBlockFile, EverySingleBitFlipIsDetected) {
  Fixture f;
  for (size_t bit = 0; bit < f.file.size() * 8; ++bit) {
    std::vector<uint8_t> bad = f.file;
    bad[bit / 8] ^= static_cast<uint8_t>(1u << (bit % 8));
    ASSERT_NE(check_block_file(bad, f.expect, f.key), BlockDefect::none) << "bit " << bit;
  }
}

TEST(OffloadBlockFile, HeaderFlipsReportTheirField) {
  Fixture f;
  auto defect_after_flip = [&](size_t byte) {
    std::vector<uint8_t> bad = f.file;
    bad[byte] ^= 1;
    return check_block_file(bad, f.expect, f.key);
  };
  EXPECT_EQ(defect_after_flip(0), BlockDefect::bad_magic);
  EXPECT_EQ(defect_after_flip(8), BlockDefect::bad_version);
  EXPECT_EQ(defect_after_flip(12), BlockDefect::wrong_key);
  EXPECT_EQ(defect_after_flip(20), BlockDefect::wrong_namespace);
  EXPECT_EQ(defect_after_flip(48), BlockDefect::wrong_geometry);
  EXPECT_EQ(defect_after_flip(60), BlockDefect::reserved_nonzero);
  EXPECT_EQ(defect_after_flip(64), BlockDefect::wrong_geometry);
  EXPECT_EQ(defect_after_flip(72), BlockDefect::wrong_key);
  EXPECT_EQ(defect_after_flip(72 + f.key.size()), BlockDefect::bad_checksum);
  EXPECT_EQ(defect_after_flip(f.file.size() - 1), BlockDefect::bad_checksum);
}

TEST(OffloadBlockFile, EveryTruncationAndExtensionIsDetected) {
  Fixture f;
  for (size_t n = 0; n < f.file.size(); ++n)
    ASSERT_EQ(check_block_file(ByteSpan(f.file.data(), n), f.expect, f.key), BlockDefect::wrong_size) << n;
  std::vector<uint8_t> longer = f.file;
  longer.push_back(0);
  EXPECT_EQ(check_block_file(longer, f.expect, f.key), BlockDefect::wrong_size);
}

TEST(OffloadBlockFile, ReaderExpectationsMustAllMatch) {
  Fixture f;
  EXPECT_EQ(check_block_file(f.file, f.expect, key_of(8)), BlockDefect::wrong_key);
  BlockExpectation other = f.expect;
  other.digest[31] ^= 0x80;
  EXPECT_EQ(check_block_file(f.file, other, f.key), BlockDefect::wrong_namespace);
  // Same payload length, different geometry (2 tokens x 1 layer vs 1 token x 2 layers).
  other = f.expect;
  other.tokens_per_block = 1;
  other.layers_in_block = 2;
  EXPECT_EQ(check_block_file(f.file, other, f.key), BlockDefect::wrong_geometry);
}

TEST(OffloadBlockFile, KeysInHex) {
  const std::vector<uint8_t> key = {0x00, 0xab, 0xff, 0x10};
  EXPECT_EQ(key_to_hex(key), "00abff10");
  EXPECT_EQ(key_from_hex("00ABff10"), key);
  expect_error_containing([] { key_from_hex("abc"); }, "odd number");
  expect_error_containing([] { key_from_hex("zz"); }, "not hexadecimal");
  expect_error_containing([] { key_from_hex(""); }, "1..64 bytes");
  expect_error_containing([] { key_from_hex(std::string(130, 'a')); }, "1..64 bytes");
  Fixture f;
  expect_error_containing([&] { encode_block_file(f.expect, f.key, ByteSpan(f.payload.data(), 10)); },
                          "blocks are");
}
