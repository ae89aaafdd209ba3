// PNG figures with cairo: small line charts with log axes and needle heatmaps.
#include "nvfp4mla/eval/plot.h"

#include "nvfp4mla/error.h"

#if defined(NVFP4MLA_WITH_CAIRO)
#include <cairo.h>
#include <fontconfig/fontconfig.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <numbers>
#include <string>
#endif

namespace nvfp4mla::eval {

#if !defined(NVFP4MLA_WITH_CAIRO)

bool plotting_available() { return false; }

std::vector<std::filesystem::path> write_plots(const EvalReport&, const std::filesystem::path&) {
  throw Error("PNG figures need cairo, which this build lacks: install libcairo2-dev (scripts/install-deps.sh), "
              "then reconfigure and rebuild");
}

#else

bool plotting_available() { return true; }

namespace {

struct Rgb {
  double r, g, b;
};
struct Style {
  Rgb color;
  bool dashed;
};

// One look per mode, the same in every figure: red = implicit, green = static, blue = dynamic;
// dashed = the 432-byte record.
Style mode_style(const EvalMode& m) {
  if (m.dtype == CacheDtype::bf16) return {{0.0, 0.0, 0.0}, false};
  if (m.dtype == CacheDtype::fp8_ds_mla) return {{0.45, 0.45, 0.45}, false};
  const bool dashed = m.rope == RopeEncoding::bf16;
  switch (m.scale_mode.value_or(ScaleMode::implicit)) {
    case ScaleMode::implicit: return {{0.84, 0.15, 0.16}, dashed};
    case ScaleMode::static_calibrated: return {{0.17, 0.60, 0.17}, dashed};
    case ScaleMode::dynamic: return {{0.12, 0.40, 0.75}, dashed};
  }
  return {{0, 0, 0}, false};
}

struct Rect {
  double x, y, w, h;
};

std::string fmt(const char* f, double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, f, v);
  return buf;
}

// A white canvas; save() writes the PNG through a temporary name.
class Canvas {
 public:
  Canvas(int width, int height)
      : surface_(cairo_image_surface_create(CAIRO_FORMAT_RGB24, width, height)), cr_(cairo_create(surface_)) {
    cairo_set_source_rgb(cr_, 1, 1, 1);
    cairo_paint(cr_);
    cairo_select_font_face(cr_, "DejaVu Sans", CAIRO_FONT_SLANT_NORMAL, CAIRO_FONT_WEIGHT_NORMAL);
  }
  ~Canvas() {
    cairo_destroy(cr_);
    cairo_surface_destroy(surface_);
  }
  Canvas(const Canvas&) = delete;
  Canvas& operator=(const Canvas&) = delete;
  cairo_t* cr() const { return cr_; }
  void save(const std::filesystem::path& path) const {
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

 private:
  cairo_surface_t* surface_;
  cairo_t* cr_;
};

// Text anchored at (x, y): align 0 = left, 0.5 = centre, 1 = right; y is the baseline.
void text(cairo_t* cr, double x, double y, const std::string& s, double size, double align = 0.0, bool bold = false,
          bool vertical = false) {
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

struct Axis {
  double lo = 0, hi = 1;
  bool log = false;
  std::string label;
  // Position of v along [a, b].
  double map(double v, double a, double b) const {
    const double t = log ? (std::log10(v) - std::log10(lo)) / (std::log10(hi) - std::log10(lo)) : (v - lo) / (hi - lo);
    return a + t * (b - a);
  }
  std::vector<double> ticks() const {
    std::vector<double> t;
    if (log) {
      for (int k = static_cast<int>(std::ceil(std::log10(lo) - 1e-9)); k <= static_cast<int>(std::floor(std::log10(hi) + 1e-9)); ++k)
        t.push_back(std::pow(10.0, k));
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
};

std::string tick_label(double v, bool log) {
  if (log) {
    const int k = static_cast<int>(std::lround(std::log10(v)));
    if (k >= -2 && k <= 3) return fmt("%g", v);
    return "1e" + std::to_string(k);
  }
  return fmt("%g", v);
}

// A log axis covering the positive finite values (decade-aligned), or [1e-3, 1] without any.
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

struct Series {
  std::string label;
  Style style;
  std::vector<double> x, y;
};

void set_style(cairo_t* cr, const Style& s, double width) {
  cairo_set_source_rgb(cr, s.color.r, s.color.g, s.color.b);
  cairo_set_line_width(cr, width);
  const double dash[2] = {7.0, 4.0};
  cairo_set_dash(cr, dash, s.dashed ? 2 : 0, 0.0);
}

// Frame, grid, ticks, labels and the series of one chart inside `area`.
void draw_chart(cairo_t* cr, const Rect& area, const std::string& title, const Axis& x, const Axis& y,
                const std::vector<Series>& series, const Rect* band = nullptr, const std::string& band_label = "") {
  const Rect p{area.x + 70, area.y + 30, area.w - 90, area.h - 75};
  text(cr, area.x + area.w / 2, area.y + 18, title, 14, 0.5, true);
  if (band) {  // a shaded x-range (e.g. where the workload's layers lie)
    const double x0 = x.map(std::max(band->x, x.lo), p.x, p.x + p.w), x1 = x.map(std::min(band->w, x.hi), p.x, p.x + p.w);
    cairo_set_source_rgb(cr, 0.93, 0.93, 0.97);
    cairo_rectangle(cr, x0, p.y, x1 - x0, p.h);
    cairo_fill(cr);
    text(cr, (x0 + x1) / 2, p.y + 14, band_label, 11, 0.5);
  }
  cairo_set_dash(cr, nullptr, 0, 0);
  cairo_set_line_width(cr, 1.0);
  for (double t : x.ticks()) {
    const double px = x.map(t, p.x, p.x + p.w);
    cairo_set_source_rgb(cr, 0.88, 0.88, 0.88);
    cairo_move_to(cr, px, p.y);
    cairo_line_to(cr, px, p.y + p.h);
    cairo_stroke(cr);
    text(cr, px, p.y + p.h + 16, tick_label(t, x.log), 11, 0.5);
  }
  for (double t : y.ticks()) {
    const double py = y.map(t, p.y + p.h, p.y);
    cairo_set_source_rgb(cr, 0.88, 0.88, 0.88);
    cairo_move_to(cr, p.x, py);
    cairo_line_to(cr, p.x + p.w, py);
    cairo_stroke(cr);
    text(cr, p.x - 6, py + 4, tick_label(t, y.log), 11, 1.0);
  }
  cairo_set_source_rgb(cr, 0.2, 0.2, 0.2);
  cairo_rectangle(cr, p.x, p.y, p.w, p.h);
  cairo_stroke(cr);
  text(cr, p.x + p.w / 2, p.y + p.h + 36, x.label, 12, 0.5);
  text(cr, area.x + 16, p.y + p.h / 2, y.label, 12, 0.5, false, true);

  cairo_save(cr);
  cairo_rectangle(cr, p.x, p.y, p.w, p.h);
  cairo_clip(cr);
  for (const Series& s : series) {
    set_style(cr, s.style, 2.0);
    bool pen = false;
    for (size_t i = 0; i < s.x.size(); ++i) {
      const double v = s.y[i];
      if (!std::isfinite(v) || (y.log && v <= 0.0)) {
        pen = false;  // not drawable on this axis: break the line
        continue;
      }
      const double px = x.map(s.x[i], p.x, p.x + p.w), py = y.map(std::clamp(v, y.lo, y.hi), p.y + p.h, p.y);
      if (pen) cairo_line_to(cr, px, py);
      else cairo_move_to(cr, px, py);
      pen = true;
    }
    cairo_stroke(cr);
  }
  cairo_restore(cr);
}

void draw_legend(cairo_t* cr, double x, double y, const std::vector<Series>& series, double row = 18) {
  for (size_t i = 0; i < series.size(); ++i) {
    const double yy = y + static_cast<double>(i) * row;
    set_style(cr, series[i].style, 2.5);
    cairo_move_to(cr, x, yy - 4);
    cairo_line_to(cr, x + 28, yy - 4);
    cairo_stroke(cr);
    cairo_set_dash(cr, nullptr, 0, 0);
    text(cr, x + 34, yy, series[i].label, 12);
  }
}

std::vector<double> layer_axis_values(int layers) {
  std::vector<double> v(static_cast<size_t>(layers));
  for (int i = 0; i < layers; ++i) v[static_cast<size_t>(i)] = i;
  return v;
}

// Every mode except the exact reference (zero error has no place on a log axis).
template <class Values>
std::vector<Series> mode_series(const EvalReport& r, const std::vector<double>& x, Values values) {
  std::vector<Series> out;
  for (const ModeResult& m : r.modes) {
    if (m.mode.is_reference()) continue;
    out.push_back(Series{m.mode.label, mode_style(m.mode), x, values(m)});
  }
  return out;
}

std::vector<std::vector<double>> ys(const std::vector<Series>& s) {
  std::vector<std::vector<double>> v;
  for (const auto& e : s) v.push_back(e.y);
  return v;
}

// The mode legend to the right of the charts, then the file.
std::filesystem::path save_with_legend(const Canvas& c, const std::vector<Series>& series, const std::filesystem::path& path) {
  draw_legend(c.cr(), 730, 60, series);
  const double below = 60 + 18.0 * static_cast<double>(series.size());
  text(c.cr(), 730, below + 10, "bf16-1152: exact (not drawn)", 11);
  text(c.cr(), 730, below + 30, "dashed: 432-byte record", 11);
  c.save(path);
  return path;
}

std::filesystem::path plot_magnitude(const EvalReport& r, const std::filesystem::path& dir) {
  Canvas c(960, 560);
  const auto series = mode_series(r, r.sweep_rms, [](const ModeResult& m) { return m.sweep_relative_error; });
  Axis x{r.sweep_rms.front(), r.sweep_rms.back(), true, "latent RMS magnitude (the same tokens, scaled)"};
  Axis y = log_axis_for(ys(series), "latent relative error");
  y.hi = std::max(y.hi, 1.0);
  Rect band{0, 0, 0, 0};
  const Rect* band_ptr = nullptr;
  if (!r.layer_rms.empty()) {
    band = Rect{*std::min_element(r.layer_rms.begin(), r.layer_rms.end()), 0,
                *std::max_element(r.layer_rms.begin(), r.layer_rms.end()), 0};
    band_ptr = &band;
  }
  draw_chart(c.cr(), Rect{0, 0, 720, 560},
             "Latent error vs magnitude (" + std::string(r.options.dump.empty() ? "layer " : "dump layer ") +
                 std::to_string(r.sweep_layer) + (r.options.dump.empty() ? " shape, " : ", ") +
                 std::to_string(r.options.sweep.tokens) + " tokens)",
             x, y, series, band_ptr, "the workload's layers");
  return save_with_legend(c, series, dir / "error_vs_magnitude.png");
}

std::filesystem::path plot_per_layer(const EvalReport& r, const std::filesystem::path& dir) {
  struct PanelData {
    std::string title, ylabel;
    std::vector<double> ModeResult::*field;
  };
  std::vector<PanelData> panels;
  if (!r.modes.front().latent_relative_error.empty())
    panels.push_back({"Latent reconstruction error per layer", "relative error", &ModeResult::latent_relative_error});
  if (!r.modes.front().attention_relative_error.empty()) {
    panels.push_back({"Attention output error vs bf16 per layer", "relative error", &ModeResult::attention_relative_error});
    panels.push_back({"Attention KL divergence vs bf16 per layer", "KLD (nats)", &ModeResult::attention_kld});
  }
  const double panel_h = 330;
  Canvas c(960, static_cast<int>(panel_h * static_cast<double>(panels.size())) + 10);
  const auto x_values = layer_axis_values(r.num_layers);
  std::vector<Series> series;
  for (size_t i = 0; i < panels.size(); ++i) {
    series = mode_series(r, x_values, [&](const ModeResult& m) { return m.*(panels[i].field); });
    Axis x{0.0, static_cast<double>(std::max(1, r.num_layers - 1)), false, "layer (max |kv_c| grows from shallow to deep)"};
    const Axis y = log_axis_for(ys(series), panels[i].ylabel);
    draw_chart(c.cr(), Rect{0, panel_h * static_cast<double>(i), 720, panel_h}, panels[i].title, x, y, series);
  }
  return save_with_legend(c, series, dir / "per_layer_error.png");
}

// Mass ratio 0 -> red, 0.5 -> amber, 1 (and above) -> green.
Rgb ratio_color(double v) {
  const double t = std::clamp(v, 0.0, 1.0);
  if (t < 0.5) return {0.85, 0.20 + 1.1 * t, 0.15};
  return {0.85 - 1.3 * (t - 0.5), 0.75 + 0.1 * (t - 0.5), 0.15 + 0.2 * (t - 0.5)};
}

std::string length_label(int64_t n) {
  if (n >= 1048576 && n % 1048576 == 0) return std::to_string(n / 1048576) + "M";
  if (n >= 1024 && n % 1024 == 0) return std::to_string(n / 1024) + "k";
  return std::to_string(n);
}

std::filesystem::path plot_needle(const EvalReport& r, size_t g, const std::filesystem::path& dir) {
  const size_t lengths = r.needle_lengths.size(), depths = r.needle_depths.size();
  const int cols = 4;
  const double pw = 240, ph = 250;
  const int rows = static_cast<int>((r.modes.size() + 1 + cols - 1) / cols);
  Canvas c(static_cast<int>(pw * cols) + 10, static_cast<int>(ph * rows) + 60);
  cairo_t* cr = c.cr();
  const int layer = r.needle_layers[g];
  text(cr, 10, 22,
       "Needle retention, layer " + std::to_string(layer) + " (max |kv_c| ~" +
           fmt("%.3g", r.nominal_max_abs[static_cast<size_t>(layer)]) + ")",
       15, 0.0, true);
  text(cr, 10, 40, "colour: the needle's attention mass relative to bf16; x: the needle is no longer the top-scoring token",
       12);
  for (size_t mi = 0; mi < r.modes.size(); ++mi) {
    const ModeResult& m = r.modes[mi];
    const double ox = pw * static_cast<double>(mi % cols), oy = 50 + ph * static_cast<double>(mi / cols);
    int kept = 0;
    for (const NeedleCell& cell : m.needle[g].cells) kept += cell.kept;
    const Rect p{ox + 60, oy + 30, pw - 80, ph - 80};
    text(cr, p.x + p.w / 2, oy + 20, m.mode.label, 13, 0.5, true);
    const double cw = p.w / static_cast<double>(lengths), ch = p.h / static_cast<double>(depths);
    for (size_t li = 0; li < lengths; ++li) {
      for (size_t di = 0; di < depths; ++di) {
        const NeedleCell& cell = m.needle[g].cells[li * depths + di];
        const Rgb col = ratio_color(cell.mass_ratio);
        const double x0 = p.x + cw * static_cast<double>(li), y0 = p.y + ch * static_cast<double>(di);
        cairo_set_source_rgb(cr, col.r, col.g, col.b);
        cairo_rectangle(cr, x0, y0, cw, ch);
        cairo_fill(cr);
        if (!cell.kept) {
          cairo_set_source_rgb(cr, 0.05, 0.05, 0.05);
          cairo_set_line_width(cr, 1.5);
          const double s = std::min(cw, ch) * 0.3;
          cairo_move_to(cr, x0 + cw / 2 - s, y0 + ch / 2 - s);
          cairo_line_to(cr, x0 + cw / 2 + s, y0 + ch / 2 + s);
          cairo_move_to(cr, x0 + cw / 2 + s, y0 + ch / 2 - s);
          cairo_line_to(cr, x0 + cw / 2 - s, y0 + ch / 2 + s);
          cairo_stroke(cr);
        }
      }
      text(cr, p.x + cw * (static_cast<double>(li) + 0.5), p.y + p.h + 15, length_label(r.needle_lengths[li]), 11, 0.5);
    }
    for (size_t di = 0; di < depths; ++di)
      if (depths <= 6 || di % 2 == 0 || di + 1 == depths)
        text(cr, p.x - 5, p.y + ch * (static_cast<double>(di) + 0.5) + 4, fmt("%g%%", 100.0 * r.needle_depths[di]), 10, 1.0);
    text(cr, p.x + p.w / 2, p.y + p.h + 32, "context length", 11, 0.5);
    text(cr, p.x + p.w / 2, p.y + p.h + 46, std::to_string(kept) + "/" + std::to_string(m.needle[g].cells.size()) + " kept", 11, 0.5);
  }
  // Colour key in the last slot.
  const size_t slot = r.modes.size();
  const double kx = pw * static_cast<double>(slot % cols) + 40, ky = 50 + ph * static_cast<double>(slot / cols) + 40;
  text(cr, kx, ky, "needle mass / bf16", 12, 0.0, true);
  for (int i = 0; i <= 10; ++i) {
    const Rgb col = ratio_color(i / 10.0);
    cairo_set_source_rgb(cr, col.r, col.g, col.b);
    cairo_rectangle(cr, kx + 15.0 * i, ky + 10, 15, 20);
    cairo_fill(cr);
  }
  text(cr, kx, ky + 46, "0", 11, 0.5);
  text(cr, kx + 82, ky + 46, "0.5", 11, 0.5);
  text(cr, kx + 165, ky + 46, "1", 11, 0.5);
  text(cr, kx, ky + 72, "depth: needle position in the context", 11);
  const auto path = dir / ("needle_layer" + std::to_string(layer) + ".png");
  c.save(path);
  return path;
}

}  // namespace

std::vector<std::filesystem::path> write_plots(const EvalReport& r, const std::filesystem::path& dir) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec || !std::filesystem::is_directory(dir))
    throw Error("cannot create the figure folder '" + dir.string() + "'" + (ec ? ": " + ec.message() : ""));
  std::vector<std::filesystem::path> out;
  if (r.modes.empty()) return out;
  if (!r.sweep_rms.empty()) out.push_back(plot_magnitude(r, dir));
  if (!r.modes.front().latent_relative_error.empty() || !r.modes.front().attention_relative_error.empty())
    out.push_back(plot_per_layer(r, dir));
  for (size_t g = 0; g < r.needle_layers.size(); ++g) out.push_back(plot_needle(r, g, dir));
  // Drop cairo's and fontconfig's process-wide font caches: nothing of ours holds them now,
  // and leak checkers (the sanitizer CI run) would otherwise report them at exit. They are
  // rebuilt on the next use.
  cairo_debug_reset_static_data();
  FcFini();
  return out;
}

#endif

}  // namespace nvfp4mla::eval
