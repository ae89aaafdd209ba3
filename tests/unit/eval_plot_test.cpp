// PNG figures: written for every part of the report and valid PNG files (signature, IHDR first,
// every chunk's CRC, IEND last).
#include <gtest/gtest.h>

#include <cstdint>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "nvfp4mla/error.h"
#include "nvfp4mla/eval/plot.h"
#include "support/eval_small.h"
#include "support/temp_dir.h"

using namespace nvfp4mla;
using namespace nvfp4mla::eval;

namespace {

uint32_t be32(const uint8_t* p) { return (uint32_t(p[0]) << 24) | (uint32_t(p[1]) << 16) | (uint32_t(p[2]) << 8) | p[3]; }

// CRC-32 (ISO-HDLC, the PNG chunk checksum), bit by bit.
uint32_t crc32(const uint8_t* data, size_t n) {
  uint32_t c = 0xFFFFFFFFu;
  for (size_t i = 0; i < n; ++i) {
    c ^= data[i];
    for (int k = 0; k < 8; ++k) c = (c >> 1) ^ (0xEDB88320u & (0u - (c & 1u)));
  }
  return c ^ 0xFFFFFFFFu;
}

struct PngInfo {
  uint32_t width = 0, height = 0;
  int bit_depth = 0, color_type = 0;
};

// Parses the file's chunk structure; fails the test on any defect.
PngInfo check_png(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  const std::vector<uint8_t> b((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  PngInfo info;
  static const uint8_t kSignature[8] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1A, '\n'};
  EXPECT_GE(b.size(), 8u + 25u + 12u) << path;
  if (b.size() < 45 || !std::equal(kSignature, kSignature + 8, b.begin())) {
    ADD_FAILURE() << path << ": no PNG signature";
    return info;
  }
  size_t pos = 8;
  bool first = true, saw_end = false, saw_data = false;
  while (pos + 12 <= b.size()) {
    const uint32_t len = be32(&b[pos]);
    if (pos + 12 + len > b.size()) {
      ADD_FAILURE() << path << ": truncated chunk at " << pos;
      return info;
    }
    const std::string type(b.begin() + static_cast<long>(pos) + 4, b.begin() + static_cast<long>(pos) + 8);
    EXPECT_EQ(crc32(&b[pos + 4], len + 4), be32(&b[pos + 8 + len])) << path << ": bad CRC in " << type;
    if (first) {
      EXPECT_EQ(type, "IHDR") << path;
      EXPECT_EQ(len, 13u) << path;
      info.width = be32(&b[pos + 8]);
      info.height = be32(&b[pos + 12]);
      info.bit_depth = b[pos + 16];
      info.color_type = b[pos + 17];
      first = false;
    }
    saw_data |= type == "IDAT";
    pos += 12 + len;
    if (type == "IEND") {
      saw_end = true;
      break;
    }
  }
  EXPECT_TRUE(saw_data) << path;
  EXPECT_TRUE(saw_end) << path;
  EXPECT_EQ(pos, b.size()) << path << ": bytes after IEND";
  return info;
}

}  // namespace

TEST(EvalPlot, WritesValidPngFigures) {
  nvfp4mla::testing::TempDir dir;
  const EvalReport& r = nvfp4mla::testing::small_eval_report();
  if (!plotting_available()) {
    try {
      write_plots(r, dir / "figs");
      FAIL() << "expected an error without cairo";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("libcairo2-dev"), std::string::npos);
    }
    GTEST_SKIP() << "built without cairo";
  }
  const auto files = write_plots(r, dir / "figs");  // the folder is created
  ASSERT_EQ(files.size(), 2 + r.needle_layers.size());
  for (const auto& f : files) {
    const PngInfo info = check_png(f);
    EXPECT_GE(info.width, 400u) << f;
    EXPECT_GE(info.height, 300u) << f;
    EXPECT_EQ(info.bit_depth, 8) << f;
    EXPECT_TRUE(info.color_type == 2 || info.color_type == 6) << f;  // RGB or RGBA
    EXPECT_LT(std::filesystem::file_size(f), 300000u) << f;           // small enough to commit
  }
  EXPECT_TRUE(std::filesystem::exists(dir / "figs" / "error_vs_magnitude.png"));
  EXPECT_TRUE(std::filesystem::exists(dir / "figs" / "per_layer_error.png"));
  EXPECT_TRUE(std::filesystem::exists(dir / "figs" / ("needle_layer" + std::to_string(r.needle_layers[0]) + ".png")));
}

TEST(EvalPlot, UnwritableFolderIsAnError) {
  if (!plotting_available()) GTEST_SKIP() << "built without cairo";
  nvfp4mla::testing::TempDir dir;
  const auto file = dir.write("not-a-folder", "x");
  EXPECT_THROW(write_plots(nvfp4mla::testing::small_eval_report(), file), Error);
}
