// The evaluation driver: builds the workload, the out-of-sample calibration and the format
// configurations, then measures every mode layer by layer.
#include "nvfp4mla/eval/evaluation.h"

#include <chrono>
#include <cmath>
#include <fstream>
#include <random>

#include "nvfp4mla/calibration.h"
#include "nvfp4mla/codec.h"
#include "nvfp4mla/error.h"
#include "nvfp4mla/record.h"
#include "parallel.h"

namespace nvfp4mla::eval {

namespace {

void validate(const EvalOptions& o) {
  if (o.tokens_per_layer < 1 || o.tokens_per_layer > (int64_t{1} << 24))
    throw Error("--tokens-per-layer must be in [1, 16777216], got " + std::to_string(o.tokens_per_layer));
  if (o.calibration_tokens < 1 || o.calibration_tokens > (int64_t{1} << 24))
    throw Error("--calibration-tokens must be in [1, 16777216], got " + std::to_string(o.calibration_tokens));
  if (o.threads < 0) throw Error("--threads must not be negative");
}

// Writes the calibration where the user asked, or to a temporary file that is removed once
// the static configurations have read and hashed it.
class CalibrationFile {
 public:
  CalibrationFile(const Calibration& c, const std::filesystem::path& keep) : temporary_(keep.empty()) {
    if (temporary_) {
      std::random_device rd;
      path_ = std::filesystem::temp_directory_path() /
              ("nvfp4mla-eval-calibration-" + std::to_string(rd()) + std::to_string(rd()) + ".json");
    } else {
      path_ = keep;
    }
    const std::filesystem::path partial = path_.string() + ".partial";
    {
      std::ofstream out(partial, std::ios::binary | std::ios::trunc);
      out << c.to_json();
      if (!out) throw Error("cannot write the calibration file '" + partial.string() + "'");
    }
    std::error_code ec;
    std::filesystem::rename(partial, path_, ec);
    if (ec) {
      std::filesystem::remove(partial, ec);
      throw Error("cannot write the calibration file '" + path_.string() + "'");
    }
  }
  ~CalibrationFile() {
    if (!temporary_) return;
    std::error_code ec;
    std::filesystem::remove(path_, ec);
  }
  CalibrationFile(const CalibrationFile&) = delete;
  CalibrationFile& operator=(const CalibrationFile&) = delete;
  const std::filesystem::path& path() const { return path_; }
  bool temporary() const { return temporary_; }

 private:
  std::filesystem::path path_;
  bool temporary_;
};

std::vector<Bf16Bits> as_bf16(const uint16_t* bits, int n) {
  std::vector<Bf16Bits> v(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) v[static_cast<size_t>(i)] = Bf16Bits{bits[i]};
  return v;
}

// Latent reconstruction of one layer's evaluation sample in every mode.
void evaluate_layer_latent(const TokenBlock& tokens, int layer, const std::vector<FormatConfig>& configs,
                           std::vector<ModeResult>& results) {
  std::vector<uint8_t> rec(layout::bf16::kRecordBytes);
  float original[kLatentDim], latent[kLatentDim], rope[kRopeDim];
  for (size_t m = 0; m < configs.size(); ++m) {
    const FormatConfig& cfg = configs[m];
    const RecordSpec& spec = cfg.spec();
    const float layer_scale = cfg.layer_scale_for(layer);
    LatentError err;
    GroupScaleCounts scales;
    for (int64_t t = 0; t < tokens.count; ++t) {
      const auto kv = as_bf16(tokens.kv_c_row(t), kLatentDim);
      const auto pe = as_bf16(tokens.k_pe_row(t), kRopeDim);
      record::encode(spec, kv.data(), pe.data(), layer_scale, rec.data());
      record::decode(spec, rec.data(), layer_scale, latent, rope);
      for (int i = 0; i < kLatentDim; ++i) original[i] = codec::bf16_decode(kv[static_cast<size_t>(i)].bits);
      err.add_token(original, latent, kLatentDim);
      if (spec.is_nvfp4()) count_group_scales(rec.data(), original, record::nvfp4_outer_scale(spec, rec.data(), layer_scale), scales);
    }
    ModeResult& r = results[m];
    r.latent_relative_error[static_cast<size_t>(layer)] = err.mean_relative_error();
    r.latent_snr_db[static_cast<size_t>(layer)] = err.snr_db();
    if (spec.is_nvfp4()) r.group_scales[static_cast<size_t>(layer)] = scales;
  }
}

}  // namespace

EvalReport run_evaluation(const EvalOptions& options, const ProgressFn& progress) {
  validate(options);
  const auto start = std::chrono::steady_clock::now();
  const SyntheticWorkload workload(options.seed, options.shape);
  const int layers = workload.num_layers();
  const int threads = detail::resolve_threads(options.threads);

  EvalReport report;
  report.options = options;
  report.num_layers = layers;
  report.workload = "synthetic GLM-5.2-like model (embedded, seed " + std::to_string(options.seed) + ")";
  for (int l = 0; l < layers; ++l) report.nominal_max_abs.push_back(workload.nominal_max_abs(l));

  // Static mode is calibrated on a separate sample of the same workload (out of sample).
  std::vector<float> calibration_max(static_cast<size_t>(layers));
  {
    detail::StageProgress stage(progress, "calibration sample", layers);
    detail::parallel_for(layers, threads, [&](int64_t l) {
      calibration_max[static_cast<size_t>(l)] =
          workload.tokens(static_cast<int>(l), Sample::calibration, 0, 0, options.calibration_tokens).max_abs_kv_c();
      stage.advance();
    });
  }
  const Calibration calibration = Calibration::from_max_abs(calibration_max);
  report.calibration_max_abs.assign(calibration_max.begin(), calibration_max.end());

  std::vector<FormatConfig> configs;
  {
    const CalibrationFile file(calibration, options.save_calibration);
    for (const EvalMode& mode : all_eval_modes()) {
      configs.push_back(mode.config(file.path()));
      ModeResult r;
      r.mode = mode;
      r.identity = configs.back().identity();
      r.record_bytes = configs.back().record_bytes();
      r.bytes_per_token = static_cast<int64_t>(r.record_bytes) * layers;
      for (double gb : kCapacityGigabytes) r.tokens_per_capacity.push_back(tokens_per_cache(gb * kGigabyte, r.record_bytes, layers));
      r.latent_relative_error.assign(static_cast<size_t>(layers), 0.0);
      r.latent_snr_db.assign(static_cast<size_t>(layers), 0.0);
      if (mode.is_nvfp4()) r.group_scales.assign(static_cast<size_t>(layers), GroupScaleCounts{});
      report.modes.push_back(std::move(r));
    }
    if (!file.temporary()) report.calibration_file = file.path();
    for (const FormatConfig& c : configs)
      if (c.calibration()) report.calibration_sha256 = c.calibration()->sha256_hex;
  }

  report.layer_max_abs.assign(static_cast<size_t>(layers), 0.0);
  {
    detail::StageProgress stage(progress, "latent reconstruction", layers);
    detail::parallel_for(layers, threads, [&](int64_t l) {
      const TokenBlock tokens = workload.tokens(static_cast<int>(l), Sample::evaluation, 0, 0, options.tokens_per_layer);
      report.layer_max_abs[static_cast<size_t>(l)] = tokens.max_abs_kv_c();
      evaluate_layer_latent(tokens, static_cast<int>(l), configs, report.modes);
      stage.advance();
    });
  }

  for (ModeResult& r : report.modes) {
    r.latent_relative_error_summary = summarize(r.latent_relative_error);
    r.latent_snr_summary = summarize(r.latent_snr_db, /*lower_is_worse=*/true);
    for (const GroupScaleCounts& g : r.group_scales) r.group_scales_total.merge(g);
  }
  report.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return report;
}

}  // namespace nvfp4mla::eval
