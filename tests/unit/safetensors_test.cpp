// safetensors reader/writer: round trips, every malformed-file rejection, atomic writes.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>

#include "nvfp4mla/error.h"
#include "nvfp4mla/safetensors.h"
#include "support/temp_dir.h"

using namespace nvfp4mla;
using nvfp4mla::testing::TempDir;

namespace {

// A file made by hand: 8-byte little-endian header length, header text, data bytes.
std::string raw_file(const std::string& header, const std::string& data, uint64_t header_len) {
  std::string s(8, '\0');
  for (int i = 0; i < 8; ++i) s[i] = static_cast<char>((header_len >> (8 * i)) & 0xFF);
  return s + header + data;
}
std::string raw_file(const std::string& header, const std::string& data) {
  return raw_file(header, data, header.size());
}

std::string read_bytes(const std::filesystem::path& p) {
  std::ifstream f(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(f), {}};
}

// Expect read_safetensors to fail with a message naming the file and containing `needle`.
void expect_rejected(const TempDir& dir, const std::string& bytes, const std::string& needle) {
  const auto p = dir.write("bad.safetensors", bytes);
  try {
    (void)read_safetensors(p);
    FAIL() << "accepted a file that should fail with '" << needle << "'";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find(p.string()), std::string::npos) << msg;
    EXPECT_NE(msg.find(needle), std::string::npos) << msg;
  }
}

std::string entry(const std::string& name, const std::string& dtype, const std::string& shape, uint64_t begin,
                  uint64_t end) {
  return "\"" + name + "\":{\"dtype\":\"" + dtype + "\",\"shape\":" + shape + ",\"data_offsets\":[" +
         std::to_string(begin) + "," + std::to_string(end) + "]}";
}

// Only the temporary files of atomic writes could be left over; a clean folder holds `expected`.
size_t files_in(const TempDir& dir) {
  size_t n = 0;
  for (const auto& e : std::filesystem::directory_iterator(dir.path())) (void)e, ++n;
  return n;
}

Tensor filled(DType dtype, std::vector<int64_t> shape, uint8_t seed) {
  Tensor t = Tensor::zeros(dtype, std::move(shape));
  for (size_t i = 0; i < t.data.size(); ++i) t.data[i] = static_cast<uint8_t>(seed + 31 * i);
  return t;
}

}  // namespace

TEST(Safetensors, RoundTripsEveryDtypeAndMetadata) {
  TempDir dir;
  TensorMap in;
  in["a_u8"] = filled(DType::U8, {3, 5}, 1);
  in["b_i32"] = filled(DType::I32, {2, 2}, 2);
  in["c_i64"] = filled(DType::I64, {4}, 3);
  in["d_f32"] = filled(DType::F32, {2, 3, 4}, 4);
  in["e_f16"] = filled(DType::F16, {7}, 5);
  in["f_bf16"] = filled(DType::BF16, {1, 9}, 6);
  in["g_scalar"] = filled(DType::F32, {}, 7);
  in["h_empty"] = filled(DType::U8, {0, 368}, 8);
  const MetadataMap meta{{"nvfp4mla.identity", "bf16:1152:v1"}, {"note", "x"}};
  const auto p = dir / "t.safetensors";
  write_safetensors(p, in, meta);

  MetadataMap meta_back;
  const TensorMap back = read_safetensors(p, &meta_back);
  EXPECT_EQ(meta_back, meta);
  ASSERT_EQ(back.size(), in.size());
  for (const auto& [name, t] : in) {
    ASSERT_TRUE(back.count(name)) << name;
    EXPECT_EQ(back.at(name).dtype, t.dtype) << name;
    EXPECT_EQ(back.at(name).shape, t.shape) << name;
    EXPECT_EQ(back.at(name).data, t.data) << name;
  }
  // The data section starts 8-byte aligned (header padded with spaces).
  const std::string bytes = read_bytes(p);
  uint64_t header_len = 0;
  for (int i = 7; i >= 0; --i) header_len = (header_len << 8) | static_cast<uint8_t>(bytes[i]);
  EXPECT_EQ(header_len % 8, 0u);
  EXPECT_EQ(files_in(dir), 1u);  // no temporary file left
}

TEST(Safetensors, ReadsAHandWrittenFile) {
  TempDir dir;
  // Tensors listed out of data order, metadata present, header followed by padding spaces.
  const std::string header = "{\"__metadata__\":{\"k\":\"v\"}," + entry("y", "U8", "[2]", 4, 6) + "," +
                             entry("x", "I32", "[1]", 0, 4) + "}   ";
  const std::string data = std::string("\x01\x00\x00\x00", 4) + "\x07\x08";
  const auto p = dir.write("h.safetensors", raw_file(header, data));
  const TensorMap m = read_safetensors(p);
  ASSERT_EQ(m.size(), 2u);
  EXPECT_EQ(m.at("x").as<int32_t>()[0], 1);
  EXPECT_EQ(m.at("y").data, (std::vector<uint8_t>{7, 8}));
}

TEST(Safetensors, RejectsMissingFileAndFolder) {
  TempDir dir;
  try {
    (void)read_safetensors(dir / "absent.safetensors");
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("absent.safetensors: no such file"), std::string::npos) << e.what();
  }
  EXPECT_THROW((void)read_safetensors(dir.path()), Error);
}

TEST(Safetensors, RejectsTruncatedFiles) {
  TempDir dir;
  expect_rejected(dir, "", "too short");
  expect_rejected(dir, std::string("\x10\x00\x00", 3), "too short");
  // Header length promises more bytes than follow.
  expect_rejected(dir, raw_file("{}", "", 64), "exceeds");
  // A valid file with its last data bytes cut off.
  const std::string header = "{" + entry("x", "F32", "[4]", 0, 16) + "}";
  expect_rejected(dir, raw_file(header, std::string(10, '\0')), "past the end");
  // The same file, complete, is accepted.
  EXPECT_NO_THROW((void)read_safetensors(dir.write("ok.safetensors", raw_file(header, std::string(16, '\0')))));
}

TEST(Safetensors, RejectsImplausibleHeaderLength) {
  TempDir dir;
  expect_rejected(dir, raw_file("", "", 0), "not plausible");
  expect_rejected(dir, raw_file("{", "", 1), "not plausible");
  expect_rejected(dir, raw_file("{}", "", uint64_t{1} << 40), "not plausible");
  expect_rejected(dir, raw_file("{}", "", ~uint64_t{0}), "not plausible");
}

TEST(Safetensors, RejectsBadJson) {
  TempDir dir;
  expect_rejected(dir, raw_file("{\"x\": [1, 2", ""), "not valid JSON");
  expect_rejected(dir, raw_file("not json", ""), "not valid JSON");
  expect_rejected(dir, raw_file("[1, 2]", ""), "must be a JSON object");
  expect_rejected(dir, raw_file("{" + entry("x", "U8", "[1]", 0, 1) + "," + entry("x", "U8", "[1]", 1, 2) + "}", "ab"),
                  "repeats the key 'x'");
  expect_rejected(dir, raw_file("{\"x\": 5}", ""), "must be a JSON object");
  expect_rejected(dir, raw_file("{\"x\": {\"dtype\": \"U8\", \"shape\": [1]}}", "a"), "needs the fields");
  expect_rejected(dir, raw_file("{\"x\": {\"dtype\": \"U8\", \"shape\": [1], \"data_offsets\": [0, 1], \"extra\": 1}}", "a"),
                  "unexpected field 'extra'");
  expect_rejected(dir, raw_file("{\"__metadata__\": {\"k\": 1}}", ""), "must be a string");
  expect_rejected(dir, raw_file("{\"__metadata__\": [\"k\"]}", ""), "__metadata__ must be a JSON object");
  // A NUL byte ended the parse: the header's text after it was never looked at.
  expect_rejected(dir, raw_file(std::string("{}\0garbage", 10), ""), "NUL byte at offset 2");
  expect_rejected(dir, raw_file("{" + entry("x", "U8", "[1]", 0, 1) + "}" + std::string("\0\0{\"", 4), "a"), "NUL byte");
}

// Found by fuzzing: printing a deeply nested value in an error message overflowed the stack,
// and parsing one cost memory per level; values quoted from the file are cut short.
TEST(Safetensors, RejectsDeepNestingAndQuotesValuesBriefly) {
  TempDir dir;
  const size_t depth = 200000;
  const std::string nested = std::string(depth, '[') + std::string(depth, ']');
  expect_rejected(dir, raw_file("{\"x\": {\"dtype\": " + nested + ", \"shape\": [1], \"data_offsets\": [0, 1]}}", "a"),
                  "nests deeper");
  expect_rejected(dir, raw_file("{" + entry("x", "U8", "[[1]]", 0, 1) + "}", "a"), "nests deeper");
  expect_rejected(dir, raw_file("{\"__metadata__\": {\"k\": " + nested + "}}", ""), "nests deeper");
  expect_rejected(dir, raw_file("{\"__metadata__\": {\"k\": {\"deeper\": 1}}}", ""), "must be a string");
  // Brackets inside strings (escaped quotes included) are text, not nesting.
  const auto text = dir.write("brackets.safetensors",
                              raw_file("{\"__metadata__\": {\"k\": \"[[[{{{\\\"[[\"}, " + entry("[[[[x", "U8", "[1]", 0, 1) + "}", "a"));
  MetadataMap metadata;
  EXPECT_EQ(read_safetensors(text, &metadata).count("[[[[x"), 1u);
  EXPECT_EQ(metadata.at("k"), "[[[{{{\"[[");

  const std::string long_name(1 << 20, 'D');
  const auto p = dir.write("long.safetensors", raw_file("{" + entry("x", long_name, "[1]", 0, 1) + "}", "a"));
  try {
    (void)read_safetensors(p);
    FAIL() << "accepted an unknown dtype";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_LT(msg.size(), 400u) << msg.substr(0, 400);
    EXPECT_NE(msg.find("unsupported dtype 'DDDD"), std::string::npos) << msg.substr(0, 400);
    EXPECT_NE(msg.find("(1048576 bytes)"), std::string::npos) << msg.substr(0, 400);
  }
}

TEST(Safetensors, RejectsUnknownDtype) {
  TempDir dir;
  expect_rejected(dir, raw_file("{" + entry("x", "F64", "[1]", 0, 8) + "}", std::string(8, '\0')),
                  "unsupported dtype 'F64'");
  expect_rejected(dir, raw_file("{\"x\": {\"dtype\": 3, \"shape\": [1], \"data_offsets\": [0, 1]}}", "a"),
                  "dtype must be a string");
}

TEST(Safetensors, RejectsShapeSizeMismatch) {
  TempDir dir;
  expect_rejected(dir, raw_file("{" + entry("x", "F32", "[2, 3]", 0, 20) + "}", std::string(20, '\0')),
                  "needs 24 bytes but data_offsets span 20");
  expect_rejected(dir, raw_file("{" + entry("x", "U8", "[-1]", 0, 1) + "}", "a"), "non-negative integer");
  expect_rejected(dir, raw_file("{" + entry("x", "U8", "[1.5]", 0, 1) + "}", "a"), "non-negative integer");
  expect_rejected(dir, raw_file("{" + entry("x", "U8", "[true]", 0, 1) + "}", "a"), "non-negative integer");
  // Extents whose product overflows 64 bits.
  expect_rejected(dir, raw_file("{" + entry("x", "I64", "[4294967296, 4294967296]", 0, 0) + "}", ""), "too large");
  // Found by fuzzing: an empty tensor whose other extents multiply past int64 (numel() overflowed).
  expect_rejected(dir, raw_file("{" + entry("x", "U8", "[3037000500, 3037000500, 0]", 0, 0) + "}", ""), "too large");
  expect_rejected(dir, raw_file("{" + entry("x", "U8", "[0, 9223372036854775807, 2]", 0, 0) + "}", ""), "too large");
  EXPECT_THROW(Tensor::zeros(DType::U8, {3037000500, 3037000500, 0}), Error);
  EXPECT_EQ(Tensor::zeros(DType::U8, {0, 9223372036854775807}).numel(), 0);
}

TEST(Safetensors, RejectsOffsetsOutOfRange) {
  TempDir dir;
  expect_rejected(dir, raw_file("{" + entry("x", "U8", "[4]", 2, 6) + "}", "abcd"), "past the end");
  expect_rejected(dir, raw_file("{" + entry("x", "U8", "[0]", 5, 4) + "}", "abcd"), "end before they begin");
  expect_rejected(dir, raw_file("{\"x\": {\"dtype\": \"U8\", \"shape\": [1], \"data_offsets\": [-1, 0]}}", ""),
                  "non-negative integer");
  expect_rejected(dir, raw_file("{\"x\": {\"dtype\": \"U8\", \"shape\": [1], \"data_offsets\": [0]}}", "a"),
                  "data_offsets must be [begin, end]");
}

TEST(Safetensors, RejectsOverlapGapsAndTrailingBytes) {
  TempDir dir;
  expect_rejected(dir, raw_file("{" + entry("a", "U8", "[4]", 0, 4) + "," + entry("b", "U8", "[4]", 2, 6) + "}",
                                "abcdef"),
                  "overlap");
  expect_rejected(dir, raw_file("{" + entry("a", "U8", "[4]", 0, 4) + "," + entry("b", "U8", "[4]", 0, 4) + "}",
                                "abcd"),
                  "overlap");
  expect_rejected(dir, raw_file("{" + entry("a", "U8", "[2]", 0, 2) + "," + entry("b", "U8", "[2]", 3, 5) + "}",
                                "abcde"),
                  "unused bytes [2, 3)");
  expect_rejected(dir, raw_file("{" + entry("a", "U8", "[2]", 0, 2) + "}", "abcd"), "2 trailing bytes");
}

TEST(Safetensors, WriterRejectsInconsistentTensorAndLeavesNothing) {
  TempDir dir;
  TensorMap m;
  m["ok"] = filled(DType::U8, {4}, 1);
  m["bad"] = filled(DType::F32, {4}, 1);
  m["bad"].data.resize(15);
  const auto p = dir / "out.safetensors";
  EXPECT_THROW(write_safetensors(p, m), Error);
  EXPECT_FALSE(std::filesystem::exists(p));
  EXPECT_EQ(files_in(dir), 0u);
  // A failed write does not disturb an existing file either.
  write_safetensors(p, {{"ok", m["ok"]}});
  const std::string before = read_bytes(p);
  EXPECT_THROW(write_safetensors(p, m), Error);
  EXPECT_EQ(read_bytes(p), before);
  EXPECT_EQ(files_in(dir), 1u);
}

TEST(Safetensors, AtomicWriterFailsClearlyAndCleansUp) {
  TempDir dir;
  EXPECT_THROW(write_file_atomic(dir / "no-such-folder" / "f.bin", "x", 1), Error);
  {
    AtomicFileWriter w(dir / "f.bin");
    w.write("abc", 3);
    EXPECT_EQ(files_in(dir), 1u);  // the temporary file
    EXPECT_FALSE(std::filesystem::exists(dir / "f.bin"));
  }  // destroyed without commit: discarded
  EXPECT_EQ(files_in(dir), 0u);
  write_file_atomic(dir / "f.bin", "hello", 5);
  EXPECT_EQ(read_bytes(dir / "f.bin"), "hello");
  EXPECT_EQ(files_in(dir), 1u);
}

TEST(Safetensors, RequireTensorNamesWhatIsWrong) {
  TensorMap m;
  m["kv_c"] = Tensor::zeros(DType::BF16, {3, 512});
  auto message = [&](auto&& f) {
    try {
      f();
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NO_THROW((void)require_tensor(m, "kv_c", "in", {DType::BF16}, {kAnyExtent, 512}));
  EXPECT_NE(message([&] { (void)require_tensor(m, "k_pe", "in", {DType::BF16}, {kAnyExtent, 64}); })
                .find("in: no tensor named 'k_pe' (tensors present: kv_c)"),
            std::string::npos);
  EXPECT_NE(message([&] { (void)require_tensor(m, "kv_c", "in", {DType::F32, DType::F16}, {kAnyExtent, 512}); })
                .find("dtype BF16; expected F32 or F16"),
            std::string::npos);
  EXPECT_NE(message([&] { (void)require_tensor(m, "kv_c", "in", {DType::BF16}, {kAnyExtent, 64}); })
                .find("shape [3, 512]; expected [N, 64]"),
            std::string::npos);
  EXPECT_NE(message([&] { (void)require_tensor(m, "kv_c", "in", {DType::BF16}, {3, 512, 1}); }).find("expected [3, 512, 1]"),
            std::string::npos);
}

TEST(Safetensors, ToF32ConvertsExactly) {
  Tensor bf = Tensor::zeros(DType::BF16, {3});
  const uint16_t bf_bits[3] = {0x3F80, 0xC040, 0x0001};  // 1, -3, smallest BF16 subnormal
  std::memcpy(bf.data.data(), bf_bits, sizeof bf_bits);
  const auto b = to_f32(bf, "t", "o");
  EXPECT_EQ(b[0], 1.0f);
  EXPECT_EQ(b[1], -3.0f);
  EXPECT_EQ(b[2], 0x1p-133f);
  Tensor h = Tensor::zeros(DType::F16, {2});
  const uint16_t h_bits[2] = {0x3C00, 0x0001};  // 1, 2^-24
  std::memcpy(h.data.data(), h_bits, sizeof h_bits);
  const auto f = to_f32(h, "t", "o");
  EXPECT_EQ(f[0], 1.0f);
  EXPECT_EQ(f[1], 0x1p-24f);
  EXPECT_THROW((void)to_f32(Tensor::zeros(DType::I32, {1}), "t", "o"), Error);
}
