// PNG figures of `nvfp4mla bench ... --json` files: decode times per shape, writer bandwidth.
#include <algorithm>
#include <cmath>
#include <fstream>
#include <optional>
#include <nlohmann/json.hpp>
#include <set>
#include <string>

#include "nvfp4mla/bench.h"
#include "nvfp4mla/config.h"
#include "nvfp4mla/error.h"
#include "plot/chart.h"

namespace nvfp4mla::bench {
namespace {

using nlohmann::json;

// One result reduced to what a figure needs: its series, its x category, its value.
struct Point {
  std::string format, category;
  double value;
  int topk = 0;
};

struct Results {
  std::vector<Point> decode, write;
  std::vector<std::string> decode_devices, write_devices;
};

// Field access that names the file and the field on failure.
class Reader {
 public:
  explicit Reader(std::filesystem::path file) : file_(std::move(file)) {}
  const json& field(const json& obj, const std::string& key, const std::string& where) const {
    const std::string name = where.empty() ? key : where + "." + key;
    if (!obj.is_object() || !obj.contains(key)) fail("missing field '" + name + "'");
    return obj.at(key);
  }
  double number(const json& obj, const std::string& key, const std::string& where) const {
    const json& v = field(obj, key, where);
    if (!v.is_number()) fail("field '" + where + "." + key + "' is not a number");
    return v.get<double>();
  }
  std::string string(const json& obj, const std::string& key, const std::string& where) const {
    const json& v = field(obj, key, where);
    if (!v.is_string()) fail("field '" + (where.empty() ? key : where + "." + key) + "' is not a string");
    return v.get<std::string>();
  }
  [[noreturn]] void fail(const std::string& what) const {
    throw Error("bench plot: '" + file_.string() + "': " + what);
  }

 private:
  std::filesystem::path file_;
};

void read_file(const std::filesystem::path& file, Results& out) {
  std::ifstream in(file);
  if (!in) throw Error("bench plot: cannot read '" + file.string() + "'");
  const Reader rd(file);
  json j;
  try {
    j = json::parse(in);
  } catch (const json::exception& e) {
    rd.fail(std::string("not valid JSON: ") + e.what());
  }
  const std::string device = rd.string(rd.field(j, "ceilings", ""), "device", "ceilings");
  if (!j.is_object() || (!j.contains("decode") && !j.contains("write")))
    rd.fail("missing field 'decode' or 'write' (not a file of nvfp4mla bench --json?)");
  for (const char* kind : {"decode", "write"}) {
    if (!j.contains(kind)) continue;
    const json& arr = j.at(kind);
    if (!arr.is_array()) rd.fail(std::string("field '") + kind + "' is not an array");
    const bool decode = std::string(kind) == "decode";
    for (size_t i = 0; i < arr.size(); ++i) {
      const std::string where = std::string(kind) + "[" + std::to_string(i) + "]";
      Point p{rd.string(arr[i], "format", where), "", 0.0};
      if (decode) {
        p.category = std::to_string(std::lround(rd.number(arr[i], "rows", where))) + "x" +
                     std::to_string(std::lround(rd.number(arr[i], "heads", where)));
        p.topk = static_cast<int>(std::lround(rd.number(arr[i], "topk", where)));
        p.value = rd.number(arr[i], "median_us", where);
      } else {
        p.category = p.format;
        p.value = 100.0 * rd.number(arr[i], "frac_copy", where);
      }
      (decode ? out.decode : out.write).push_back(p);
    }
    auto& devices = decode ? out.decode_devices : out.write_devices;
    if (!arr.empty() && std::find(devices.begin(), devices.end(), device) == devices.end()) devices.push_back(device);
  }
}

#if defined(NVFP4MLA_WITH_CAIRO)

std::string joined(const std::vector<std::string>& v) {
  std::string s;
  for (const auto& e : v) s += (s.empty() ? "" : ", ") + e;
  return s;
}

// The look of a format name "dtype-bytes[-scale]" as bench writes it; purple when unknown.
plot::Style style_of(const std::string& format) {
  try {
    const size_t a = format.find('-'), b = format.find('-', a == std::string::npos ? a : a + 1);
    const CacheDtype dtype = parse_cache_dtype(format.substr(0, a));
    const std::string bytes = a == std::string::npos ? "" : format.substr(a + 1, b == std::string::npos ? b : b - a - 1);
    std::optional<ScaleMode> scale;
    if (b != std::string::npos) scale = parse_scale_mode(format.substr(b + 1));
    return plot::format_style(dtype, bytes == "432" ? RopeEncoding::bf16 : RopeEncoding::fp8, scale);
  } catch (const Error&) {
    return {{0.5, 0.2, 0.6}, false};
  }
}

// The position of `name` in `names`, appended when new.
size_t find_or_add(std::vector<std::string>& names, const std::string& name) {
  const auto it = std::find(names.begin(), names.end(), name);
  if (it != names.end()) return static_cast<size_t>(it - names.begin());
  names.push_back(name);
  return names.size() - 1;
}

// Categories in first-seen order; one series per format over them (NaN where it has no value).
std::vector<plot::Series> series_of(const std::vector<Point>& points, std::vector<std::string>& categories, plot::Mark mark) {
  for (const Point& p : points) find_or_add(categories, p.category);
  std::vector<std::string> formats;
  std::vector<plot::Series> series;
  for (const Point& p : points) {
    const size_t s = find_or_add(formats, p.format);
    if (s == series.size()) {
      series.push_back({p.format, style_of(p.format), {}, std::vector<double>(categories.size(), std::nan("")), mark});
      for (size_t i = 0; i < categories.size(); ++i) series.back().x.push_back(static_cast<double>(i));
    }
    series[s].y[find_or_add(categories, p.category)] = p.value;
  }
  return series;
}

std::filesystem::path plot_decode(std::vector<Point> points, const std::vector<std::string>& devices,
                                  const std::filesystem::path& dir) {
  std::set<int> topks;
  for (const Point& p : points) topks.insert(p.topk);
  if (topks.size() > 1)  // several top-k values: they are part of the shape
    for (Point& p : points) p.category += " k" + std::to_string(p.topk);
  std::vector<std::string> shapes;
  const auto series = series_of(points, shapes, plot::Mark::line_points);
  plot::Canvas c(960, 560);
  const plot::Axis x = plot::category_axis(shapes, "shape: query rows x heads (file order)", topks.size() > 1);
  plot::Axis y = plot::log_axis_for(plot::ys(series), "median time per launch (us)");
  y.log_minor = true;
  plot::ChartExtras extras;
  if (topks.size() > 1) extras.bottom = 125;
  plot::draw_chart(c.cr(), plot::Rect{0, 0, 720, 560}, "Sparse MLA decode time, " + joined(devices), x, y, series, extras);
  plot::draw_legend(c.cr(), 730, 60, series);
  plot::text(c.cr(), 730, 60 + 18.0 * static_cast<double>(series.size()) + 10, "dashed: 432-byte record", 11);
  const auto path = dir / "decode_time.png";
  c.save(path);
  return path;
}

std::filesystem::path plot_write(const std::vector<Point>& points, const std::vector<std::string>& devices,
                                 const std::filesystem::path& dir) {
  std::vector<std::string> formats;
  auto series = series_of(points, formats, plot::Mark::bars);
  double top = 100.0;
  for (const Point& p : points)
    if (std::isfinite(p.value)) top = std::max(top, p.value * 1.1);
  for (auto& s : series) s.value_format = "%.1f%%";
  plot::Canvas c(720, 640);
  plot::Axis x = plot::category_axis(formats, "format", true);
  const plot::Axis y{0.0, top, false, "% of the measured copy bandwidth (read + write)"};
  plot::ChartExtras extras;
  extras.bottom = 185;
  extras.right = 100;
  extras.y_reference = 50.0;
  extras.y_reference_label = "issue 3: 50%";
  plot::draw_chart(c.cr(), plot::Rect{0, 0, 720, 640}, "Cache writer bandwidth, " + joined(devices), x, y, series, extras);
  const auto path = dir / "writer_bandwidth.png";
  c.save(path);
  return path;
}

#endif

}  // namespace

std::vector<std::filesystem::path> write_plots(const std::vector<std::filesystem::path>& json_files,
                                               const std::filesystem::path& dir) {
  if (!plot::available()) plot::unavailable();
  if (json_files.empty()) throw Error("bench plot: no JSON file given");
  Results r;
  for (const auto& f : json_files) read_file(f, r);
  if (r.decode.empty() && r.write.empty()) throw Error("bench plot: the files hold no decode, extend or write results");
  std::vector<std::filesystem::path> out;
#if defined(NVFP4MLA_WITH_CAIRO)
  plot::make_folder(dir);
  if (!r.decode.empty()) out.push_back(plot_decode(r.decode, r.decode_devices, dir));
  if (!r.write.empty()) out.push_back(plot_write(r.write, r.write_devices, dir));
  plot::release_font_caches();
#else
  (void)dir;
#endif
  return out;
}

}  // namespace nvfp4mla::bench
