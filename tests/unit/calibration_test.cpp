// Calibration file parsing: every rejection rule, exact round trip, file hashing.
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <cstring>
#include <filesystem>
#include <string>

#include "nvfp4mla/calibration.h"
#include "nvfp4mla/error.h"
#include "nvfp4mla/format.h"
#include "support/temp_dir.h"

using namespace nvfp4mla;

namespace {

const std::string kValid =
    R"({"format": "nvfp4_ds_mla_outer_scale_v1", "num_layers": 2, "latent_dim": 512,
        "denominator": 2688.0, "scales": [0.001, 0.002], "max_abs": [2.688, 5.376]})";

std::string with(const std::string& from, const std::string& to) {
  std::string s = kValid;
  const auto pos = s.find(from);
  EXPECT_NE(pos, std::string::npos) << from;
  return s.replace(pos, from.size(), to);
}

void expect_rejected(const std::string& text, const std::string& needle) {
  try {
    (void)Calibration::parse(text, "test");
    FAIL() << "accepted: " << text;
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}

}  // namespace

TEST(Calibration, ParsesValidFile) {
  const auto c = Calibration::parse(kValid);
  ASSERT_EQ(c.num_layers(), 2);
  EXPECT_EQ(c.scales[1], 0.002f);
  EXPECT_EQ(c.layer_scale(0), 0.001f);
  EXPECT_EQ(c.layer_scale(5, MissingLayer::unit_scale), 1.0f);
  EXPECT_THROW((void)c.layer_scale(5), Error);
  EXPECT_THROW((void)c.layer_scale(-1, MissingLayer::unit_scale), Error);
}

TEST(Calibration, RejectsMalformedFiles) {
  expect_rejected("not json", "not valid JSON");
  expect_rejected("[1, 2]", "JSON object");
  expect_rejected(with("nvfp4_ds_mla_outer_scale_v1", "nvfp4_outer_scale_v2"), "\"format\"");
  expect_rejected(with(R"("num_layers": 2)", R"("num_layers": 3)"), "has 2 entries but num_layers is 3");
  expect_rejected(with(R"("num_layers": 2)", R"("num_layers": 0)"), "positive layer count");
  expect_rejected(with(R"("num_layers": 2)", R"("num_layers": 2.5)"), "must be an integer");
  expect_rejected(with(R"("num_layers": 2)", R"("num_layers": true)"), "must be an integer");
  expect_rejected(with(R"("num_layers": 2, )", ""), "missing \"num_layers\"");
  expect_rejected(with(R"("latent_dim": 512)", R"("latent_dim": 576)"), "latent_dim must be 512");
  expect_rejected(with(R"("denominator": 2688.0)", R"("denominator": 448.0)"), "denominator must be 2688");
  // Not 2688, though it rounds to 2688 in fp32.
  expect_rejected(with(R"("denominator": 2688.0)", R"("denominator": 2688.0001)"), "denominator must be 2688");
  expect_rejected(with(R"("denominator": 2688.0)", R"("denominator": "2688")"), "must be a number");
  expect_rejected(with("[0.001, 0.002]", "[0.001, true]"), "scales[1] must be a number");
  expect_rejected(with("[0.001, 0.002]", R"([0.001, "0.002"])"), "scales[1] must be a number");
  expect_rejected(with("[0.001, 0.002]", "[0.001, 0.0]"), "scales[1] must be positive");
  expect_rejected(with("[0.001, 0.002]", "[-0.001, 0.002]"), "scales[0] must be positive");
  expect_rejected(with("[0.001, 0.002]", "[1e39, 0.002]"), "not a finite fp32");
  expect_rejected(with("[0.001, 0.002]", "[0.001, null]"), "must be a number");
  expect_rejected(with("[0.001, 0.002]", "0.001"), "must be an array");
  expect_rejected(with("[2.688, 5.376]", "[2.688]"), "max_abs\" has 1 entries");
  expect_rejected(with("[2.688, 5.376]", "[2.688, -1]"), "must not be negative");
}

TEST(Calibration, JsonRoundTripIsExact) {
  const std::vector<float> max_abs = {0.0213f, 5.2f, 1.0f / 3.0f, 123456.789f, 1e-30f};
  const auto c = Calibration::from_max_abs(max_abs);
  for (size_t i = 0; i < max_abs.size(); ++i) EXPECT_EQ(c.scales[i], max_abs[i] * kInv2688);
  const auto back = Calibration::parse(c.to_json());
  ASSERT_EQ(back.num_layers(), c.num_layers());
  for (int i = 0; i < c.num_layers(); ++i) {
    EXPECT_EQ(std::memcmp(&back.scales[i], &c.scales[i], 4), 0) << i;
    EXPECT_EQ(std::memcmp(&back.max_abs[i], &c.max_abs[i], 4), 0) << i;
  }
  EXPECT_THROW(Calibration::from_max_abs({1.0f, 0.0f}), Error);
  EXPECT_THROW(Calibration::from_max_abs({}), Error);
}

TEST(Calibration, LoadHashesExactBytes) {
  nvfp4mla::testing::TempDir dir;
  const auto p = dir.write("s.json", kValid);
  const auto c = Calibration::load(p);
  EXPECT_EQ(c.sha256_hex, sha256_hex(kValid.data(), kValid.size()));
  EXPECT_EQ(c.sha256_hex, sha256_file_hex(p));
  // Known-answer test for the hash itself (SHA-256 of "abc").
  EXPECT_EQ(sha256_hex("abc", 3), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  EXPECT_THROW(Calibration::load(dir / "absent.json"), Error);
}

// Issue 20 items 7 and 8: a number beyond double (1e999) escaped as nlohmann's out_of_range
// ("internal error"), and a repeated key silently replaced the first.
TEST(Calibration, RejectsRepeatedKeysAndOverflowingNumbers) {
  expect_rejected(with("[0.001, 0.002]", "[1e999, 0.002]"), "not valid JSON");
  expect_rejected(with(R"("num_layers": 2, )", R"("num_layers": 2, "num_layers": 2, )"), "repeats the key 'num_layers'");
  expect_rejected(with(R"("max_abs": [2.688, 5.376])", R"("max_abs": [2.688, 5.376], "scales": [0.5, 0.5])"),
                  "repeats the key 'scales'");
}

// A NUL byte ended nlohmann's input: whatever followed it was never read, so a file with trailing
// garbage after a NUL loaded as if the garbage were not there.
TEST(Calibration, RejectsANulByteAndWhatFollowsIt) {
  expect_rejected(kValid + std::string("\0 trailing garbage", 18), "NUL byte at offset " + std::to_string(kValid.size()));
  expect_rejected(std::string("\0", 1) + kValid, "NUL byte at offset 0");
}

// An unsigned value beyond int64 was converted first and reported as "got -1".
TEST(Calibration, HugeUnsignedCountsAreReportedAsWritten) {
  expect_rejected(with(R"("num_layers": 2)", R"("num_layers": 18446744073709551615)"), "got 18446744073709551615");
  expect_rejected(with(R"("num_layers": 2)", R"("num_layers": 9223372036854775808)"), "got 9223372036854775808");
  expect_rejected(with(R"("latent_dim": 512)", R"("latent_dim": 18446744073709551104)"), "got 18446744073709551104");
}

// Issue 20 items 6 and 7: a directory, a FIFO, a device or an oversized file as the calibration
// file is refused before anything is read (a directory was an "internal error"; /dev/zero grew
// without limit; a FIFO waited for a writer).
TEST(Calibration, LoadRefusesWhatIsNotASmallRegularFile) {
  nvfp4mla::testing::TempDir dir;
  auto expect_load_error = [](const std::filesystem::path& p, const std::string& needle) {
    try {
      (void)Calibration::load(p);
      ADD_FAILURE() << "loaded " << p;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  expect_load_error(dir.path(), "is a directory");
  expect_load_error("/dev/zero", "is a device");
  const auto fifo = dir / "fifo";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  expect_load_error(fifo, "is a FIFO");
  const auto big = dir.write("big.json", "");
  std::filesystem::resize_file(big, kMaxCalibrationFileBytes + 1);
  expect_load_error(big, "at most " + std::to_string(kMaxCalibrationFileBytes) + " bytes");
}
