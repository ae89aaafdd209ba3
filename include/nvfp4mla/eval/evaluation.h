#pragma once
// `nvfp4mla eval`: the quality evaluation of every record format and scale mode on a workload.
#include <cstdint>
#include <filesystem>
#include <functional>
#include <string>
#include <vector>

#include "nvfp4mla/eval/metrics.h"
#include "nvfp4mla/eval/modes.h"
#include "nvfp4mla/eval/workload.h"

namespace nvfp4mla::eval {

inline constexpr uint64_t kDefaultSeed = 52;
// Cache sizes the capacity columns are computed for (decimal gigabytes: 1 GB = 1e9 bytes).
inline constexpr double kGigabyte = 1e9;
inline constexpr double kCapacityGigabytes[2] = {80.0, 141.0};

struct EvalOptions {
  uint64_t seed = kDefaultSeed;
  WorkloadShape shape;
  int64_t tokens_per_layer = 2048;    // evaluation sample per layer (latent metrics)
  int64_t calibration_tokens = 2048;  // separate calibration sample per layer (static mode)
  int threads = 0;                    // 0: all hardware threads
  std::filesystem::path save_calibration;  // where to keep the calibration file (optional)
};

// Called from worker threads (serialized by the evaluation): stage name, units done, total.
using ProgressFn = std::function<void(const std::string& stage, int64_t done, int64_t total)>;

struct ModeResult {
  EvalMode mode;
  std::string identity;     // record identity (static mode names the calibration's SHA-256)
  int record_bytes = 0;     // per token per layer
  int64_t bytes_per_token = 0;                // record_bytes * num_layers (the layer stack)
  std::vector<int64_t> tokens_per_capacity;   // per kCapacityGigabytes entry
  // Latent reconstruction, per layer and summarised.
  std::vector<double> latent_relative_error;  // mean per-token ||x^ - x|| / ||x||
  std::vector<double> latent_snr_db;          // +inf when error-free
  Summary latent_relative_error_summary;
  Summary latent_snr_summary;                 // worst = lowest
  // NVFP4 group scales (empty for other dtypes).
  std::vector<GroupScaleCounts> group_scales;
  GroupScaleCounts group_scales_total;
};

struct EvalReport {
  EvalOptions options;
  std::string workload;                 // description of the workload
  int num_layers = 0;
  std::vector<double> nominal_max_abs;  // per layer
  std::vector<double> layer_max_abs;    // measured on the evaluation sample
  std::vector<double> calibration_max_abs;
  std::filesystem::path calibration_file;  // empty when it was temporary
  std::string calibration_sha256;
  std::vector<ModeResult> modes;
  double seconds = 0.0;
};

// Runs the evaluation; throws Error for invalid options.
EvalReport run_evaluation(const EvalOptions& options, const ProgressFn& progress = {});

// The report as JSON (every number the table shows, and the per-layer data behind it).
// Infinite values (error-free SNR) are written as null.
std::string report_to_json(const EvalReport& report);
// The report as a readable table.
std::string report_to_text(const EvalReport& report);

}  // namespace nvfp4mla::eval
