// Shared pieces of the PNG figures (cairo).
#include "plot/chart.h"

#include "nvfp4mla/error.h"

#if defined(NVFP4MLA_WITH_CAIRO)
#include <fontconfig/fontconfig.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <numbers>
#endif

namespace nvfp4mla::plot {

void unavailable() {
  throw Error("PNG figures need cairo, which this build lacks: install libcairo2-dev (scripts/install-deps.sh), "
              "then reconfigure and rebuild");
}

void make_folder(const std::filesystem::path& dir) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec || !std::filesystem::is_directory(dir))
    throw Error("cannot create the figure folder '" + dir.string() + "'" + (ec ? ": " + ec.message() : ""));
}

#if !defined(NVFP4MLA_WITH_CAIRO)

bool available() { return false; }

#else

bool available() { return true; }

Style format_style(CacheDtype dtype, RopeEncoding rope, std::optional<ScaleMode> scale_mode) {
  if (dtype == CacheDtype::bf16) return {{0.0, 0.0, 0.0}, false};
  if (dtype == CacheDtype::fp8_ds_mla) return {{0.45, 0.45, 0.45}, false};
  const bool dashed = rope == RopeEncoding::bf16;
  switch (scale_mode.value_or(ScaleMode::implicit)) {
    case ScaleMode::implicit: return {{0.84, 0.15, 0.16}, dashed};
    case ScaleMode::static_calibrated: return {{0.17, 0.60, 0.17}, dashed};
    case ScaleMode::dynamic: return {{0.12, 0.40, 0.75}, dashed};
  }
  return {{0, 0, 0}, false};
}

std::string fmt(const char* f, double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, f, v);
  return buf;
}

Canvas::Canvas(int width, int height)
    : surface_(cairo_image_surface_create(CAIRO_FORMAT_RGB24, width, height)), cr_(cairo_create(surface_)) {
  cairo_set_source_rgb(cr_, 1, 1, 1);
  cairo_paint(cr_);
  cairo_select_font_face(cr_, "DejaVu Sans", CAIRO_FONT_SLANT_NORMAL, CAIRO_FONT_WEIGHT_NORMAL);
}

Canvas::~Canvas() {
  cairo_destroy(cr_);
  cairo_surface_destroy(surface_);
}

void Canvas::save(const std::filesystem::path& path) const {
  const std::filesystem::path partial = path.string() + ".partial";
  cairo_surface_flush(surface_);
  if (cairo_surface_write_to_png(surface_, partial.c_str()) != CAIRO_STATUS_SUCCESS) {
    std::error_code ec;
    std::filesystem::remove(partial, ec);
    throw Error("cannot write the figure '" + path.string() + "'");
  }
  std::error_code ec;
  std::filesystem::rename(partial, path, ec);
  if (ec) throw Error("cannot write the figure '" + path.string() + "': " + ec.message());
}

void text(cairo_t* cr, double x, double y, const std::string& s, double size, double align, bool bold, bool vertical) {
  cairo_save(cr);
  cairo_select_font_face(cr, "DejaVu Sans", CAIRO_FONT_SLANT_NORMAL, bold ? CAIRO_FONT_WEIGHT_BOLD : CAIRO_FONT_WEIGHT_NORMAL);
  cairo_set_font_size(cr, size);
  cairo_text_extents_t e;
  cairo_text_extents(cr, s.c_str(), &e);
  cairo_move_to(cr, x, y);
  if (vertical) cairo_rotate(cr, -std::numbers::pi / 2);
  cairo_rel_move_to(cr, -align * e.x_advance, 0);
  cairo_set_source_rgb(cr, 0.1, 0.1, 0.1);
  cairo_show_text(cr, s.c_str());
  cairo_restore(cr);
}

double Axis::map(double v, double a, double b) const {
  const double t = log ? (std::log10(v) - std::log10(lo)) / (std::log10(hi) - std::log10(lo)) : (v - lo) / (hi - lo);
  return a + t * (b - a);
}

std::vector<double> Axis::ticks() const {
  std::vector<double> t;
  if (!categories.empty()) {
    for (size_t i = 0; i < categories.size(); ++i) t.push_back(static_cast<double>(i));
    return t;
  }
  if (log) {
    for (int k = static_cast<int>(std::floor(std::log10(lo) + 1e-9)); k <= static_cast<int>(std::floor(std::log10(hi) + 1e-9)); ++k)
      for (double m : log_minor ? std::vector<double>{1, 2, 5} : std::vector<double>{1}) {
        const double v = m * std::pow(10.0, k);
        if (v >= lo * (1 - 1e-9) && v <= hi * (1 + 1e-9)) t.push_back(v);
      }
    return t;
  }
  const double raw = (hi - lo) / 6.0;
  const double p = std::pow(10.0, std::floor(std::log10(raw)));
  double step = p;
  for (double m : {1.0, 2.0, 5.0, 10.0})
    if (m * p >= raw) {
      step = m * p;
      break;
    }
  for (double v = std::ceil(lo / step) * step; v <= hi + 1e-9 * step; v += step) t.push_back(v);
  return t;
}

std::string Axis::tick_label(double v) const {
  if (!categories.empty()) return categories.at(static_cast<size_t>(std::lround(v)));
  if (log) {
    const int k = static_cast<int>(std::lround(std::log10(v)));
    if ((k >= -2 && k <= 3) || log_minor) return fmt("%g", v);
    return "1e" + std::to_string(k);
  }
  return fmt("%g", v);
}

Axis log_axis_for(const std::vector<std::vector<double>>& values, const std::string& label) {
  double lo = std::numeric_limits<double>::infinity(), hi = 0.0;
  for (const auto& v : values)
    for (double x : v)
      if (x > 0.0 && std::isfinite(x)) {
        lo = std::min(lo, x);
        hi = std::max(hi, x);
      }
  Axis a;
  a.log = true;
  a.label = label;
  if (!(hi > 0.0)) {
    a.lo = 1e-3;
    a.hi = 1.0;
    return a;
  }
  a.lo = std::pow(10.0, std::floor(std::log10(lo)));
  a.hi = std::pow(10.0, std::ceil(std::log10(hi) + 1e-12));
  if (a.hi <= a.lo) a.hi = a.lo * 10.0;
  return a;
}

Axis category_axis(std::vector<std::string> names, const std::string& label, bool vertical_ticks) {
  Axis a;
  a.lo = -0.5;
  a.hi = static_cast<double>(names.size()) - 0.5;
  a.label = label;
  a.categories = std::move(names);
  a.vertical_ticks = vertical_ticks;
  return a;
}

std::vector<std::vector<double>> ys(const std::vector<Series>& s) {
  std::vector<std::vector<double>> v;
  for (const auto& e : s) v.push_back(e.y);
  return v;
}

namespace {

void set_style(cairo_t* cr, const Style& s, double width) {
  cairo_set_source_rgb(cr, s.color.r, s.color.g, s.color.b);
  cairo_set_line_width(cr, width);
  const double dash[2] = {7.0, 4.0};
  cairo_set_dash(cr, dash, s.dashed ? 2 : 0, 0.0);
}

void grid_line(cairo_t* cr, double x0, double y0, double x1, double y1) {
  cairo_set_source_rgb(cr, 0.88, 0.88, 0.88);
  cairo_move_to(cr, x0, y0);
  cairo_line_to(cr, x1, y1);
  cairo_stroke(cr);
}

// Whether a value has a place on the y axis.
bool drawable(const Axis& y, double v) { return std::isfinite(v) && !(y.log && v <= 0.0); }

void dot(cairo_t* cr, double x, double y) {
  cairo_new_sub_path(cr);
  cairo_arc(cr, x, y, 3.5, 0, 2 * std::numbers::pi);
  cairo_fill(cr);
}

// The series inside the plot rectangle `p` (the caller clips).
void draw_series(cairo_t* cr, const Rect& p, const Axis& x, const Axis& y, const Series& s) {
  const auto px = [&](double v) { return x.map(v, p.x, p.x + p.w); };
  const auto py = [&](double v) { return y.map(std::clamp(v, y.lo, y.hi), p.y + p.h, p.y); };
  set_style(cr, s.style, 2.0);
  if (s.mark == Mark::bars) {  // 0.6 of a unit wide, from the axis floor (or zero) up
    const double base = py(y.log ? y.lo : std::max(y.lo, 0.0)), half = 0.3 * (px(1.0) - px(0.0));
    for (size_t i = 0; i < s.x.size(); ++i)
      if (drawable(y, s.y[i])) {
        cairo_rectangle(cr, px(s.x[i]) - half, py(s.y[i]), 2 * half, base - py(s.y[i]));
        cairo_fill(cr);
      }
    return;
  }
  bool pen = false;
  for (size_t i = 0; i < s.x.size(); ++i) {
    if (!drawable(y, s.y[i])) {
      pen = false;  // not drawable on this axis: break the line
      continue;
    }
    if (pen) cairo_line_to(cr, px(s.x[i]), py(s.y[i]));
    else cairo_move_to(cr, px(s.x[i]), py(s.y[i]));
    pen = true;
  }
  cairo_stroke(cr);
  if (s.mark == Mark::line_points)
    for (size_t i = 0; i < s.x.size(); ++i)
      if (drawable(y, s.y[i])) dot(cr, px(s.x[i]), py(s.y[i]));
}

void draw_value_labels(cairo_t* cr, const Rect& p, const Axis& x, const Axis& y, const Series& s) {
  if (s.value_format.empty()) return;
  for (size_t i = 0; i < s.x.size(); ++i)
    if (drawable(y, s.y[i]))
      text(cr, x.map(s.x[i], p.x, p.x + p.w), y.map(std::clamp(s.y[i], y.lo, y.hi), p.y + p.h, p.y) - 6,
           fmt(s.value_format.c_str(), s.y[i]), 11, 0.5);
}

}  // namespace

void draw_chart(cairo_t* cr, const Rect& area, const std::string& title, const Axis& x, const Axis& y,
                const std::vector<Series>& series, const ChartExtras& e) {
  const Rect p{area.x + e.left, area.y + e.top, area.w - e.left - e.right, area.h - e.top - e.bottom};
  text(cr, area.x + area.w / 2, area.y + 18, title, 14, 0.5, true);
  if (e.band) {  // a shaded x-range (e.g. where the workload's layers lie)
    const double x0 = x.map(std::max(e.band->x, x.lo), p.x, p.x + p.w), x1 = x.map(std::min(e.band->w, x.hi), p.x, p.x + p.w);
    cairo_set_source_rgb(cr, 0.93, 0.93, 0.97);
    cairo_rectangle(cr, x0, p.y, x1 - x0, p.h);
    cairo_fill(cr);
    text(cr, (x0 + x1) / 2, p.y + 14, e.band_label, 11, 0.5);
  }
  cairo_set_dash(cr, nullptr, 0, 0);
  cairo_set_line_width(cr, 1.0);
  for (double t : x.ticks()) {
    const double px = x.map(t, p.x, p.x + p.w);
    grid_line(cr, px, p.y, px, p.y + p.h);
    if (x.vertical_ticks) text(cr, px + 4, p.y + p.h + 8, x.tick_label(t), 11, 1.0, false, true);
    else text(cr, px, p.y + p.h + 16, x.tick_label(t), 11, 0.5);
  }
  for (double t : y.ticks()) {
    const double py = y.map(t, p.y + p.h, p.y);
    grid_line(cr, p.x, py, p.x + p.w, py);
    text(cr, p.x - 6, py + 4, y.tick_label(t), 11, 1.0);
  }
  cairo_set_source_rgb(cr, 0.2, 0.2, 0.2);
  cairo_rectangle(cr, p.x, p.y, p.w, p.h);
  cairo_stroke(cr);
  text(cr, p.x + p.w / 2, p.y + p.h + e.bottom - 9, x.label, 12, 0.5);
  text(cr, area.x + 16, p.y + p.h / 2, y.label, 12, 0.5, false, true);

  cairo_save(cr);
  cairo_rectangle(cr, p.x, p.y, p.w, p.h);
  cairo_clip(cr);
  for (const Series& s : series) draw_series(cr, p, x, y, s);
  for (const Series& s : series) draw_value_labels(cr, p, x, y, s);
  if (e.y_reference) {
    const double py = y.map(*e.y_reference, p.y + p.h, p.y);
    set_style(cr, Style{{0.55, 0.1, 0.1}, true}, 1.5);
    cairo_move_to(cr, p.x, py);
    cairo_line_to(cr, p.x + p.w, py);
    cairo_stroke(cr);
    cairo_set_dash(cr, nullptr, 0, 0);
  }
  cairo_restore(cr);
  if (e.y_reference) text(cr, p.x + p.w + 5, y.map(*e.y_reference, p.y + p.h, p.y) + 4, e.y_reference_label, 11);
}

void draw_legend(cairo_t* cr, double x, double y, const std::vector<Series>& series, double row) {
  for (size_t i = 0; i < series.size(); ++i) {
    const double yy = y + static_cast<double>(i) * row;
    set_style(cr, series[i].style, 2.5);
    if (series[i].mark == Mark::bars) {
      cairo_rectangle(cr, x + 6, yy - 10, 16, 12);
      cairo_fill(cr);
    } else {
      cairo_move_to(cr, x, yy - 4);
      cairo_line_to(cr, x + 28, yy - 4);
      cairo_stroke(cr);
      if (series[i].mark == Mark::line_points) dot(cr, x + 14, yy - 4);
    }
    cairo_set_dash(cr, nullptr, 0, 0);
    text(cr, x + 34, yy, series[i].label, 12);
  }
}

void release_font_caches() {
  cairo_debug_reset_static_data();
  FcFini();
}

#endif

}  // namespace nvfp4mla::plot
