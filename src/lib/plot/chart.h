#pragma once
// Shared pieces of the PNG figures (cairo): canvas, text, axes, line/point/bar charts, legend.
// Internal to the library; used by the evaluation figures and the benchmark figures.
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "nvfp4mla/format.h"

#if defined(NVFP4MLA_WITH_CAIRO)
#include <cairo.h>
#endif

namespace nvfp4mla::plot {

// True when the library was built with cairo.
bool available();
// Throws the Error that says what to install (builds without cairo).
[[noreturn]] void unavailable();
// Creates `dir` if missing; throws Error when it cannot.
void make_folder(const std::filesystem::path& dir);

#if defined(NVFP4MLA_WITH_CAIRO)

struct Rgb {
  double r, g, b;
};
struct Style {
  Rgb color;
  bool dashed;
};

// One look per format, the same in every figure: black = bf16, grey = fp8, and for nvfp4
// red = implicit, green = static, blue = dynamic; dashed = the 432-byte record (BF16 RoPE).
Style format_style(CacheDtype dtype, RopeEncoding rope, std::optional<ScaleMode> scale_mode);

struct Rect {
  double x, y, w, h;
};

std::string fmt(const char* f, double v);

// A white canvas; save() writes the PNG through a temporary name.
class Canvas {
 public:
  Canvas(int width, int height);
  ~Canvas();
  Canvas(const Canvas&) = delete;
  Canvas& operator=(const Canvas&) = delete;
  cairo_t* cr() const { return cr_; }
  void save(const std::filesystem::path& path) const;

 private:
  cairo_surface_t* surface_;
  cairo_t* cr_;
};

// Text anchored at (x, y): align 0 = left, 0.5 = centre, 1 = right; y is the baseline.
void text(cairo_t* cr, double x, double y, const std::string& s, double size, double align = 0.0, bool bold = false,
          bool vertical = false);

struct Axis {
  double lo = 0, hi = 1;
  bool log = false;
  std::string label;
  // Named positions 0, 1, ... (lo/hi should then be -0.5 and n - 0.5); ticks are the names.
  std::vector<std::string> categories;
  bool vertical_ticks = false;  // tick names written downwards (long names)
  bool log_minor = false;       // a log axis also ticks 2x and 5x each decade (plain numbers)
  double map(double v, double a, double b) const;  // position of v along [a, b]
  std::vector<double> ticks() const;
  std::string tick_label(double v) const;
};

// A log axis covering the positive finite values (decade-aligned), or [1e-3, 1] without any.
Axis log_axis_for(const std::vector<std::vector<double>>& values, const std::string& label);
// A category axis for these names.
Axis category_axis(std::vector<std::string> names, const std::string& label, bool vertical_ticks = false);

enum class Mark { line, line_points, bars };

struct Series {
  std::string label;
  Style style;
  std::vector<double> x, y;  // non-finite y (or <= 0 on a log axis): not drawn, the line breaks
  Mark mark = Mark::line;
  std::string value_format;  // printf format of a label above each drawn value; empty: none
};

std::vector<std::vector<double>> ys(const std::vector<Series>& s);

// What a chart may add to the frame and the series.
struct ChartExtras {
  double left = 70, top = 30, right = 20, bottom = 45;  // plot margins inside the chart's area
  std::optional<Rect> band;                              // a shaded x-range [band.x, band.w]
  std::string band_label;
  std::optional<double> y_reference;                     // a dashed horizontal line at this value,
  std::string y_reference_label;                         // labelled in the right margin
};

// Frame, grid, ticks, labels and the series of one chart inside `area`.
void draw_chart(cairo_t* cr, const Rect& area, const std::string& title, const Axis& x, const Axis& y,
                const std::vector<Series>& series, const ChartExtras& extras = {});

void draw_legend(cairo_t* cr, double x, double y, const std::vector<Series>& series, double row = 18);

// Drops cairo's and fontconfig's process-wide font caches: nothing of ours holds them after a
// figure is written, and leak checkers (the sanitizer CI run) would otherwise report them at
// exit. They are rebuilt on the next use. Not for concurrent use.
void release_font_caches();

#endif

}  // namespace nvfp4mla::plot
