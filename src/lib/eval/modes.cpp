#include "nvfp4mla/eval/modes.h"

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

std::vector<EvalMode> all_eval_modes() {
  using R = RopeEncoding;
  using S = ScaleMode;
  const auto nv = CacheDtype::nvfp4_ds_mla;
  return {
      {"bf16-1152", "bf16_1152", CacheDtype::bf16, std::nullopt, std::nullopt},
      {"fp8_ds_mla-656", "fp8_ds_mla_656", CacheDtype::fp8_ds_mla, std::nullopt, std::nullopt},
      {"nvfp4-432 implicit", "nvfp4_432_implicit", nv, R::bf16, S::implicit},
      {"nvfp4-432 static", "nvfp4_432_static", nv, R::bf16, S::static_calibrated},
      {"nvfp4-368 implicit", "nvfp4_368_implicit", nv, R::fp8, S::implicit},
      {"nvfp4-368 static", "nvfp4_368_static", nv, R::fp8, S::static_calibrated},
      {"nvfp4-368 dynamic", "nvfp4_368_dynamic", nv, R::fp8, S::dynamic},
  };
}

}  // namespace nvfp4mla::eval
