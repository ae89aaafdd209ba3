#pragma once
// The formats and scale modes the evaluation compares, in report order.
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "nvfp4mla/config.h"
#include "nvfp4mla/format.h"

namespace nvfp4mla::eval {

struct EvalMode {
  std::string label;  // "nvfp4-368 dynamic": what the table prints
  std::string key;    // "nvfp4_368_dynamic": JSON key and file-name part
  CacheDtype dtype = CacheDtype::bf16;
  std::optional<RopeEncoding> rope;       // nvfp4 only
  std::optional<ScaleMode> scale_mode;    // nvfp4 only

  bool is_reference() const { return dtype == CacheDtype::bf16; }
  bool is_nvfp4() const { return dtype == CacheDtype::nvfp4_ds_mla; }
  bool is_static() const { return scale_mode == ScaleMode::static_calibrated; }
  // The validated configuration of this mode; static mode reads `calibration_file`.
  FormatConfig config(const std::filesystem::path& calibration_file) const;
};

// bf16-1152 (the reference, first), fp8_ds_mla-656, nvfp4-432 implicit/static,
// nvfp4-368 implicit/static/dynamic.
std::vector<EvalMode> all_eval_modes();

}  // namespace nvfp4mla::eval
