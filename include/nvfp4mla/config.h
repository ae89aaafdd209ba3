#pragma once
// FormatConfig: the one immutable, validated description of how KV records are written and
// read, and its identity (the record ABI) that names everything persistent.
#include <map>
#include <memory>
#include <optional>
#include <string>

#include "nvfp4mla/calibration.h"
#include "nvfp4mla/format.h"

namespace nvfp4mla {

// Requested settings, each optional: unset fields fall back to the environment, then to the
// defaults (nvfp4_ds_mla, bf16 RoPE, implicit scale).
struct FormatOptions {
  std::optional<CacheDtype> cache_dtype;
  std::optional<RopeEncoding> rope;
  std::optional<ScaleMode> scale_mode;
  std::optional<std::string> scales_file;  // static mode: calibration file
  std::optional<int> layer;                // static mode: which layer's scale this config serves
  std::optional<float> layer_scale;        // static mode without a file (encode/decode/inspect only)
  bool unit_scale_for_missing_layer = false;  // MTP-layer convention, asked for explicitly
};

// The vLLM environment variables, read once by from_environment().
struct EnvironmentSettings {
  std::optional<std::string> dynamic_scale;  // VLLM_NVFP4_MLA_DYNAMIC_SCALE ("1" enables)
  std::optional<std::string> fp8_rope;       // KV_FP8_ROPE ("1" enables)
  std::optional<std::string> scales_file;    // VLLM_NVFP4_MLA_SCALES_FILE
  static EnvironmentSettings from_process();  // reads getenv once
};

enum class IdentityCompat { native, vllm };

class FormatConfig {
 public:
  // Validates; throws Error with a message that says what to change.
  static FormatConfig create(const FormatOptions& flags, const EnvironmentSettings& env = {});

  CacheDtype cache_dtype() const { return spec_.dtype; }
  RopeEncoding rope() const { return spec_.rope; }
  ScaleMode scale_mode() const { return spec_.scale_mode; }
  const RecordSpec& spec() const { return spec_; }
  int record_bytes() const { return spec_.record_bytes(); }

  // Static mode: the calibration (null when only a bare layer scale was given).
  const Calibration* calibration() const { return calibration_.get(); }
  std::optional<int> layer() const { return layer_; }
  // The scale a writer/reader passes as `layer_scale`: the calibrated scale of layer() (or the
  // bare --layer-scale) in static mode, 1 otherwise. Throws if static mode has no layer chosen.
  float layer_scale() const;
  float layer_scale_for(int layer) const;  // any layer of the calibration

  // Record identity, e.g. "nvfp4_ds_mla:fp8-rope-368:dynamic-token-v1". Throws Error for a
  // static configuration without a calibration file (a bare scale has no identity).
  std::string identity(IdentityCompat compat = IdentityCompat::native) const;
  // One-line human description.
  std::string describe() const;

 private:
  RecordSpec spec_{};
  std::shared_ptr<const Calibration> calibration_;
  std::optional<int> layer_;
  std::optional<float> bare_layer_scale_;
  bool unit_scale_for_missing_layer_ = false;
};

// Parsers for flag and file values (throw Error naming the accepted values).
CacheDtype parse_cache_dtype(const std::string& s);
RopeEncoding parse_rope(const std::string& s);
ScaleMode parse_scale_mode(const std::string& s);

}  // namespace nvfp4mla
