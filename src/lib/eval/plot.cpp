// PNG figures with cairo: small line charts with log axes and needle heatmaps.
#include "nvfp4mla/eval/plot.h"

#include "nvfp4mla/error.h"
#include "plot/chart.h"

#if defined(NVFP4MLA_WITH_CAIRO)
#include <algorithm>
#include <functional>
#include <string>
#endif

namespace nvfp4mla::eval {

bool plotting_available() { return plot::available(); }

#if !defined(NVFP4MLA_WITH_CAIRO)

std::vector<std::filesystem::path> write_plots(const EvalReport&, const std::filesystem::path&) { plot::unavailable(); }

#else

namespace {

using namespace nvfp4mla::plot;

// One look per mode, the same in every figure (plot::format_style).
Style mode_style(const EvalMode& m) { return format_style(m.dtype, m.rope.value_or(RopeEncoding::fp8), m.scale_mode); }

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
  ChartExtras extras;
  if (!r.layer_rms.empty()) {
    extras.band = Rect{*std::min_element(r.layer_rms.begin(), r.layer_rms.end()), 0,
                       *std::max_element(r.layer_rms.begin(), r.layer_rms.end()), 0};
    extras.band_label = "the workload's layers";
  }
  draw_chart(c.cr(), Rect{0, 0, 720, 560},
             "Latent error vs magnitude (" + std::string(r.options.dump.empty() ? "layer " : "dump layer ") +
                 std::to_string(r.sweep_layer) + (r.options.dump.empty() ? " shape, " : ", ") +
                 std::to_string(r.options.sweep.tokens) + " tokens)",
             x, y, series, extras);
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

// A heatmap cell: the colour's mass ratio and an optional mark.
enum class Mark { none, cross, ring };
struct HeatCell {
  double ratio = 0.0;
  Mark mark = Mark::none;
};

// One heatmap per mode (x: context length, y: depth), a colour key in the next slot.
struct HeatmapFigure {
  std::string title, subtitle, key_note;
  std::vector<int64_t> lengths;
  std::vector<double> depths;
  std::function<HeatCell(const ModeResult&, size_t length, size_t depth)> cell;
  std::function<std::string(const ModeResult&)> summary;
};

void draw_mark(cairo_t* cr, Mark mark, double cx, double cy, double s) {
  cairo_set_source_rgb(cr, 0.05, 0.05, 0.05);
  cairo_set_line_width(cr, 1.5);
  if (mark == Mark::cross) {
    cairo_move_to(cr, cx - s, cy - s);
    cairo_line_to(cr, cx + s, cy + s);
    cairo_move_to(cr, cx + s, cy - s);
    cairo_line_to(cr, cx - s, cy + s);
  } else if (mark == Mark::ring) {
    cairo_new_sub_path(cr);
    cairo_arc(cr, cx, cy, s, 0, 6.283185307179586);
  }
  cairo_stroke(cr);
}

std::filesystem::path plot_heatmaps(const EvalReport& r, const HeatmapFigure& f, const std::filesystem::path& path) {
  const size_t lengths = f.lengths.size(), depths = f.depths.size();
  const int cols = 4;
  const double pw = 240, ph = 250;
  const int rows = static_cast<int>((r.modes.size() + 1 + cols - 1) / cols);
  Canvas c(static_cast<int>(pw * cols) + 10, static_cast<int>(ph * rows) + 60);
  cairo_t* cr = c.cr();
  text(cr, 10, 22, f.title, 15, 0.0, true);
  text(cr, 10, 40, f.subtitle, 12);
  for (size_t mi = 0; mi < r.modes.size(); ++mi) {
    const ModeResult& m = r.modes[mi];
    const double ox = pw * static_cast<double>(mi % cols), oy = 50 + ph * static_cast<double>(mi / cols);
    const Rect p{ox + 60, oy + 30, pw - 80, ph - 80};
    text(cr, p.x + p.w / 2, oy + 20, m.mode.label, 13, 0.5, true);
    const double cw = p.w / static_cast<double>(lengths), ch = p.h / static_cast<double>(depths);
    for (size_t li = 0; li < lengths; ++li) {
      for (size_t di = 0; di < depths; ++di) {
        const HeatCell cell = f.cell(m, li, di);
        const Rgb col = ratio_color(cell.ratio);
        const double x0 = p.x + cw * static_cast<double>(li), y0 = p.y + ch * static_cast<double>(di);
        cairo_set_source_rgb(cr, col.r, col.g, col.b);
        cairo_rectangle(cr, x0, y0, cw, ch);
        cairo_fill(cr);
        if (cell.mark != Mark::none) draw_mark(cr, cell.mark, x0 + cw / 2, y0 + ch / 2, std::min(cw, ch) * 0.3);
      }
      text(cr, p.x + cw * (static_cast<double>(li) + 0.5), p.y + p.h + 15, length_label(f.lengths[li]), 11, 0.5);
    }
    for (size_t di = 0; di < depths; ++di)
      if (depths <= 6 || di % 2 == 0 || di + 1 == depths)
        text(cr, p.x - 5, p.y + ch * (static_cast<double>(di) + 0.5) + 4, fmt("%g%%", 100.0 * f.depths[di]), 10, 1.0);
    text(cr, p.x + p.w / 2, p.y + p.h + 32, "context length", 11, 0.5);
    text(cr, p.x + p.w / 2, p.y + p.h + 46, f.summary(m), 11, 0.5);
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
  if (!f.key_note.empty()) text(cr, kx, ky + 92, f.key_note, 11);
  c.save(path);
  return path;
}

std::filesystem::path plot_needle(const EvalReport& r, size_t g, const std::filesystem::path& dir) {
  const int layer = r.needle_layers[g];
  const size_t depths = r.needle_depths.size();
  HeatmapFigure f;
  f.title = "Needle retention, layer " + std::to_string(layer) + " (max |kv_c| ~" +
            fmt("%.3g", r.nominal_max_abs[static_cast<size_t>(layer)]) + ")";
  f.subtitle = "colour: the needle's attention mass relative to bf16; x: the needle is no longer the top-scoring token";
  f.lengths = r.needle_lengths;
  f.depths = r.needle_depths;
  f.cell = [g, depths](const ModeResult& m, size_t li, size_t di) {
    const NeedleCell& c = m.needle[g].cells[li * depths + di];
    return HeatCell{c.mass_ratio, c.kept ? Mark::none : Mark::cross};
  };
  f.summary = [g](const ModeResult& m) {
    int kept = 0;
    for (const NeedleCell& cell : m.needle[g].cells) kept += cell.kept;
    return std::to_string(kept) + "/" + std::to_string(m.needle[g].cells.size()) + " kept";
  };
  return plot_heatmaps(r, f, dir / ("needle_layer" + std::to_string(layer) + ".png"));
}

std::filesystem::path plot_pipeline(const EvalReport& r, const std::filesystem::path& dir) {
  const size_t depths = r.pipeline_depths.size();
  HeatmapFigure f;
  f.title = "DSA pipeline needles: FP8 index keys -> exact top-" + std::to_string(r.options.pipeline.topk) +
            " -> sparse attention over the records";
  f.subtitle = "colour: the needle's attention mass relative to bf16; x: not selected by the indexer; o: selected, not the top weight";
  f.key_note = "ran on: " + r.pipeline_note.substr(0, r.pipeline_note.find(':'));
  f.lengths = r.pipeline_lengths;
  f.depths = r.pipeline_depths;
  f.cell = [depths](const ModeResult& m, size_t li, size_t di) {
    const PipelineCell& c = m.pipeline.cells[li * depths + di];
    return HeatCell{c.mass_ratio, !c.selected ? Mark::cross : c.top ? Mark::none : Mark::ring};
  };
  f.summary = [](const ModeResult& m) {
    return std::to_string(m.pipeline.selected) + " selected, " + std::to_string(m.pipeline.top) + " top of " +
           std::to_string(m.pipeline.cells.size());
  };
  return plot_heatmaps(r, f, dir / "pipeline_needles.png");
}

// Stacked bars per context: the top-k budget per quarter of the context, the pipeline's
// selection beside the fp32 selection.
std::filesystem::path plot_selection(const EvalReport& r, const std::filesystem::path& dir) {
  const double bar_h = 16, gap = 14, left = 150, width = 600;
  const double group_h = 2 * bar_h + gap;
  Canvas c(960, std::max(320, static_cast<int>(90 + group_h * static_cast<double>(r.selection.size()) + 70)));
  cairo_t* cr = c.cr();
  text(cr, 10, 22, "Selection distribution: share of the top-" + std::to_string(r.options.pipeline.topk) +
                       " budget per quarter of the context", 15, 0.0, true);
  text(cr, 10, 40, "upper bar: the pipeline (FP8 index keys, exact top-k); lower bar: exact top-k of fp32 logits (BF16 keys)", 12);
  const Rgb quarter[4] = {{0.75, 0.80, 0.90}, {0.50, 0.62, 0.82}, {0.28, 0.44, 0.72}, {0.10, 0.22, 0.52}};
  for (size_t i = 0; i < r.selection.size(); ++i) {
    const SelectionStats& st = r.selection[i];
    const double y = 60 + group_h * static_cast<double>(i);
    text(cr, left - 10, y + bar_h + 4, length_label(st.length), 12, 1.0);
    for (int b = 0; b < 2; ++b) {
      const double* share = b == 0 ? st.share : st.exact_share;
      double x = left;
      for (int q = 0; q < 4; ++q) {
        cairo_set_source_rgb(cr, quarter[q].r, quarter[q].g, quarter[q].b);
        cairo_rectangle(cr, x, y + b * bar_h, width * share[q], bar_h - 2);
        cairo_fill(cr);
        x += width * share[q];
      }
    }
    text(cr, left + width + 10, y + bar_h + 4, fmt("newest %+.2f%%", 100 * st.newest_shift) + fmt(", overlap %.3f", st.exact_overlap), 11);
  }
  const double ky = 70 + group_h * static_cast<double>(r.selection.size());
  const char* names[4] = {"oldest quarter", "second", "third", "newest quarter"};
  for (int q = 0; q < 4; ++q) {
    cairo_set_source_rgb(cr, quarter[q].r, quarter[q].g, quarter[q].b);
    cairo_rectangle(cr, left + 150.0 * q, ky, 14, 14);
    cairo_fill(cr);
    text(cr, left + 150.0 * q + 20, ky + 12, names[q], 11);
  }
  const auto path = dir / "selection_quarters.png";
  c.save(path);
  return path;
}

}  // namespace

std::vector<std::filesystem::path> write_plots(const EvalReport& r, const std::filesystem::path& dir) {
  make_folder(dir);
  std::vector<std::filesystem::path> out;
  if (r.modes.empty()) return out;
  if (!r.sweep_rms.empty()) out.push_back(plot_magnitude(r, dir));
  if (!r.modes.front().latent_relative_error.empty() || !r.modes.front().attention_relative_error.empty())
    out.push_back(plot_per_layer(r, dir));
  for (size_t g = 0; g < r.needle_layers.size(); ++g) out.push_back(plot_needle(r, g, dir));
  if (!r.pipeline_lengths.empty() && !r.modes.front().pipeline.cells.empty()) out.push_back(plot_pipeline(r, dir));
  if (!r.selection.empty()) out.push_back(plot_selection(r, dir));
  release_font_caches();
  return out;
}

#endif

}  // namespace nvfp4mla::eval
