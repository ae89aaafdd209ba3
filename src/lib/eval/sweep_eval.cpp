// Magnitude sweep: the same tokens (synthetic or a dump's, see SweepSource) scaled to latent RMS
// magnitudes from min_rms to max_rms; the latent error of every mode at each magnitude. Static
// mode is calibrated at each magnitude on a separate sample scaled the same way (one calibration
// "layer" per magnitude).
#include <cmath>

#include "nvfp4mla/codec.h"
#include "nvfp4mla/error.h"
#include "parallel.h"
#include "stages.h"

namespace nvfp4mla::eval::detail {

namespace {

double rms_of(const TokenBlock& b) {
  double s = 0.0;
  for (uint16_t v : b.kv_c) {
    const double x = codec::bf16_decode(v);
    s += x * x;
  }
  return b.kv_c.empty() ? 0.0 : std::sqrt(s / static_cast<double>(b.kv_c.size()));
}

}  // namespace

void run_magnitude_sweep(const SweepSource& src, const SweepOptions& o, EvalReport& report, const ProgressFn& progress,
                         int threads) {
  if (o.tokens < 1) throw Error("--sweep-tokens must be at least 1");
  if (!(o.min_rms > 0.0) || !(o.max_rms >= o.min_rms) || o.points_per_decade < 1)
    throw Error("the sweep needs 0 < min magnitude <= max magnitude and at least one point per decade");
  report.sweep_layer = src.layer;
  report.sweep_source = src.description;
  report.sweep_token_indices = src.token_indices;
  report.sweep_calibration_indices = src.calibration_indices;
  report.sweep_rms.clear();
  const double decades = std::log10(o.max_rms / o.min_rms);
  const int points = static_cast<int>(std::floor(decades * o.points_per_decade + 1e-9)) + 1;
  for (int i = 0; i < points; ++i) report.sweep_rms.push_back(o.min_rms * std::pow(10.0, static_cast<double>(i) / o.points_per_decade));

  // The tokens as drawn fix the shape; a scale factor then sets the magnitude of the same tokens.
  const double unit_rms = rms_of(src.tokens(Sample::sweep, 1.0));
  if (!(unit_rms > 0.0))
    throw Error("the magnitude sweep's tokens (layer " + std::to_string(src.layer) + ") are all zero: nothing to scale");
  report.sweep_source_rms = unit_rms;
  std::vector<float> calibration_max(static_cast<size_t>(points));
  for (int i = 0; i < points; ++i) {
    const double scale = report.sweep_rms[static_cast<size_t>(i)] / unit_rms;
    calibration_max[static_cast<size_t>(i)] = src.tokens(Sample::sweep_calibration, scale).max_abs_kv_c();
  }
  const CalibrationFile file(Calibration::from_max_abs(calibration_max));
  std::vector<FormatConfig> configs;
  for (ModeResult& m : report.modes) {
    configs.push_back(m.mode.config(file.path()));
    m.sweep_relative_error.assign(static_cast<size_t>(points), 0.0);
    m.sweep_lost_scale_fraction.assign(static_cast<size_t>(points), 0.0);
  }
  StageProgress stage(progress, "magnitude sweep", points);
  parallel_for(points, threads, [&](int64_t i) {
    const double scale = report.sweep_rms[static_cast<size_t>(i)] / unit_rms;
    const TokenBlock tokens = src.tokens(Sample::sweep, scale);
    for (size_t m = 0; m < configs.size(); ++m) {
      const LatentMeasure r = measure_latent(configs[m], configs[m].layer_scale_for(static_cast<int>(i)), tokens);
      report.modes[m].sweep_relative_error[static_cast<size_t>(i)] = r.error.mean_relative_error();
      if (r.scales.groups)
        report.modes[m].sweep_lost_scale_fraction[static_cast<size_t>(i)] =
            static_cast<double>(r.scales.subnormal + r.scales.zero) / static_cast<double>(r.scales.groups);
    }
    stage.advance();
  });
}

}  // namespace nvfp4mla::eval::detail
