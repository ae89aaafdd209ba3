// PNG figures: written for every part of the report, valid PNG files (signature, IHDR first,
// every chunk's CRC, IEND last), and the data drawn where they belong: the decoded pixels at
// each plotted point differ from the background, and each needle cell has its mass ratio's
// colour (a blank figure fails).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#if defined(NVFP4MLA_TEST_HAVE_PNG)
#include <png.h>
#endif

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

#if defined(NVFP4MLA_TEST_HAVE_PNG)

// A PNG decoded to 8-bit RGB by libpng.
struct Pixels {
  int width = 0, height = 0;
  std::vector<uint8_t> rgb;
  const uint8_t* at(int x, int y) const { return &rgb[(static_cast<size_t>(y) * width + x) * 3]; }
};

Pixels decode_png(const std::filesystem::path& path) {
  png_image image;
  std::memset(&image, 0, sizeof image);
  image.version = PNG_IMAGE_VERSION;
  Pixels px;
  if (!png_image_begin_read_from_file(&image, path.c_str())) {
    ADD_FAILURE() << path << ": " << image.message;
    png_image_free(&image);
    return px;
  }
  image.format = PNG_FORMAT_RGB;
  px.rgb.resize(PNG_IMAGE_SIZE(image));
  if (!png_image_finish_read(&image, nullptr, px.rgb.data(), 0, nullptr)) {
    ADD_FAILURE() << path << ": " << image.message;
    png_image_free(&image);
    px.rgb.clear();
    return px;
  }
  px.width = static_cast<int>(image.width);
  px.height = static_cast<int>(image.height);
  return px;
}

// Ink: neither the white canvas, the light grey grid (0.88) nor the shaded band (0.93, 0.93, 0.97).
bool is_ink(const uint8_t* c) {
  auto near = [&](int r, int g, int b) { return std::abs(c[0] - r) <= 6 && std::abs(c[1] - g) <= 6 && std::abs(c[2] - b) <= 6; };
  return !near(255, 255, 255) && !near(224, 224, 224) && !near(237, 237, 247);
}

// The figure layout of src/lib/eval/plot.cpp and plot/chart.cpp: a chart's plot rectangle and
// its axes, log or linear.
struct PlotRect {
  double x, y, w, h;
};
struct AxisRange {
  double lo, hi;
  bool log;
  double t(double v) const { return log ? (std::log10(v) - std::log10(lo)) / (std::log10(hi) - std::log10(lo)) : (v - lo) / (hi - lo); }
};
// plot::log_axis_for: decades around the positive finite values.
AxisRange log_axis(const std::vector<std::vector<double>>& values) {
  double lo = INFINITY, hi = 0.0;
  for (const auto& v : values)
    for (double x : v)
      if (x > 0.0 && std::isfinite(x)) {
        lo = std::min(lo, x);
        hi = std::max(hi, x);
      }
  if (!(hi > 0.0)) return {1e-3, 1.0, true};
  AxisRange a{std::pow(10.0, std::floor(std::log10(lo))), std::pow(10.0, std::ceil(std::log10(hi) + 1e-12)), true};
  if (a.hi <= a.lo) a.hi = a.lo * 10.0;
  return a;
}

// Every plotted point (x_i, y_i) of every series away from the frame has ink within 2 pixels.
// Returns the number of points checked.
int expect_points_drawn(const Pixels& px, const PlotRect& p, const AxisRange& x, const AxisRange& y,
                        const std::vector<std::vector<double>>& xs, const std::vector<std::vector<double>>& ys,
                        const std::string& what) {
  int checked = 0;
  for (size_t s = 0; s < ys.size(); ++s)
    for (size_t i = 0; i < ys[s].size(); ++i) {
      const double v = ys[s][i];
      if (!std::isfinite(v) || (y.log && v <= 0.0)) continue;  // not drawn
      const double cx = p.x + x.t(xs[s][i]) * p.w, cy = p.y + p.h - y.t(std::clamp(v, y.lo, y.hi)) * p.h;
      if (cx < p.x + 4 || cx > p.x + p.w - 4 || cy < p.y + 4 || cy > p.y + p.h - 4) continue;  // on the frame
      bool ink = false;
      for (int dy = -2; dy <= 2 && !ink; ++dy)
        for (int dx = -2; dx <= 2 && !ink; ++dx) ink = is_ink(px.at(static_cast<int>(std::lround(cx)) + dx, static_cast<int>(std::lround(cy)) + dy));
      EXPECT_TRUE(ink) << what << ": series " << s << " point " << i << " (" << xs[s][i] << ", " << v << ") at pixel (" << cx
                       << ", " << cy << ") is blank";
      ++checked;
    }
  return checked;
}

void expect_data_drawn(const EvalReport& r, const std::filesystem::path& dir) {
  std::vector<const ModeResult*> drawn;  // every mode but the exact reference
  for (const ModeResult& m : r.modes)
    if (!m.mode.is_reference()) drawn.push_back(&m);
  int checked = 0;
  {  // Error vs magnitude: one chart in {0, 0, 720, 560}, margins 70 / 30 / 20 / 45.
    const Pixels px = decode_png(dir / "error_vs_magnitude.png");
    ASSERT_EQ(px.width, 960);
    std::vector<std::vector<double>> xs, ys;
    for (const ModeResult* m : drawn) {
      xs.push_back(r.sweep_rms);
      ys.push_back(m->sweep_relative_error);
    }
    AxisRange y = log_axis(ys);
    y.hi = std::max(y.hi, 1.0);
    checked += expect_points_drawn(px, {70, 30, 630, 485}, {r.sweep_rms.front(), r.sweep_rms.back(), true}, y, xs, ys, "error vs magnitude");
  }
  {  // Per layer: panels of 720 x 330 stacked, same margins; linear layer axis.
    const Pixels px = decode_png(dir / "per_layer_error.png");
    ASSERT_EQ(px.width, 960);
    const std::vector<double> ModeResult::*fields[3] = {&ModeResult::latent_relative_error, &ModeResult::attention_relative_error,
                                                        &ModeResult::attention_kld};
    std::vector<double> layers(r.num_layers);
    for (int l = 0; l < r.num_layers; ++l) layers[l] = l;
    for (int panel = 0; panel < 3; ++panel) {
      std::vector<std::vector<double>> xs, ys;
      for (const ModeResult* m : drawn) {
        xs.push_back(layers);
        ys.push_back(m->*fields[panel]);
      }
      checked += expect_points_drawn(px, {70, 330.0 * panel + 30, 630, 255}, {0, std::max(1.0, r.num_layers - 1.0), false},
                                     log_axis(ys), xs, ys, "per layer panel " + std::to_string(panel));
    }
  }
  EXPECT_GE(checked, 20);
  // Needle heatmaps: mode i's grid at (240 (i % 4) + 60, 50 + 250 (i / 4) + 30), 160 x 170; a
  // cell is red below a mass ratio of 0.5 and green above 0.6. Sampled off the cell's centre,
  // clear of the cross that marks a lost needle.
  const size_t lengths = r.needle_lengths.size(), depths = r.needle_depths.size();
  for (size_t g = 0; g < r.needle_layers.size(); ++g) {
    const Pixels px = decode_png(dir / ("needle_layer" + std::to_string(r.needle_layers[g]) + ".png"));
    ASSERT_FALSE(px.rgb.empty());
    for (size_t mi = 0; mi < r.modes.size(); ++mi) {
      const double gx = 240.0 * (mi % 4) + 60, gy = 50 + 250.0 * (mi / 4) + 30;
      const double cw = 160.0 / lengths, ch = 170.0 / depths;
      for (size_t li = 0; li < lengths; ++li)
        for (size_t di = 0; di < depths; ++di) {
          const double ratio = r.modes[mi].needle[g].cells[li * depths + di].mass_ratio;
          const uint8_t* c = px.at(static_cast<int>(gx + cw * (li + 0.5)), static_cast<int>(gy + ch * di + 0.12 * ch));
          const std::string where = "needle layer " + std::to_string(r.needle_layers[g]) + " mode " + r.modes[mi].mode.key +
                                    " cell " + std::to_string(li) + "," + std::to_string(di) + " ratio " + std::to_string(ratio);
          EXPECT_GT(*std::max_element(c, c + 3) - *std::min_element(c, c + 3), 80) << where << ": not a coloured cell";
          if (ratio < 0.5) EXPECT_GT(c[0], c[1]) << where << ": not red";
          if (ratio > 0.6) EXPECT_GT(c[1], c[0]) << where << ": not green";
        }
    }
  }
}

#endif  // NVFP4MLA_TEST_HAVE_PNG

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
  ASSERT_EQ(files.size(), 4 + r.needle_layers.size());  // + the pipeline's needles and selection
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
  EXPECT_TRUE(std::filesystem::exists(dir / "figs" / "pipeline_needles.png"));
  EXPECT_TRUE(std::filesystem::exists(dir / "figs" / "selection_quarters.png"));
  EXPECT_TRUE(std::filesystem::exists(dir / "figs" / ("needle_layer" + std::to_string(r.needle_layers[0]) + ".png")));
#if defined(NVFP4MLA_TEST_HAVE_PNG)
  expect_data_drawn(r, dir / "figs");
#else
  GTEST_SKIP() << "built without libpng (libpng-dev): the figures' pixels were not checked";
#endif
}

TEST(EvalPlot, UnwritableFolderIsAnError) {
  if (!plotting_available()) GTEST_SKIP() << "built without cairo";
  nvfp4mla::testing::TempDir dir;
  const auto file = dir.write("not-a-folder", "x");
  EXPECT_THROW(write_plots(nvfp4mla::testing::small_eval_report(), file), Error);
}
