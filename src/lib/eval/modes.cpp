#include "nvfp4mla/eval/modes.h"

#include <string>

namespace nvfp4mla::eval {

FormatConfig EvalMode::config(const std::filesystem::path& calibration_file) const {
  FormatOptions o;
  o.cache_dtype = dtype;
  o.rope = rope;
  o.scale_mode = scale_mode;
  if (is_static()) o.scales_file = calibration_file.string();
  // Explicit options only: the evaluation must not change with the caller's environment.
  return FormatConfig::create(o, EnvironmentSettings{});
}

// One mode per record spec of the format module's list, in its order (bf16 first).
std::vector<EvalMode> all_eval_modes() {
  std::vector<EvalMode> modes;
  for (const RecordSpec& s : kAllRecordSpecs) {
    const std::string bytes = std::to_string(s.record_bytes());
    if (!s.is_nvfp4()) {
      const std::string name = std::string(to_string(s.dtype)) + "-" + bytes;
      modes.push_back({name, std::string(to_string(s.dtype)) + "_" + bytes, s.dtype, std::nullopt, std::nullopt});
    } else {
      const std::string mode = to_string(s.scale_mode);
      modes.push_back({"nvfp4-" + bytes + " " + mode, "nvfp4_" + bytes + "_" + mode, s.dtype, s.rope, s.scale_mode});
    }
  }
  return modes;
}

}  // namespace nvfp4mla::eval
