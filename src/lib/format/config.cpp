#include "nvfp4mla/config.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdlib>

#include "nvfp4mla/error.h"

namespace nvfp4mla {

namespace {

std::string lower_trimmed(const std::string& s) {
  size_t b = 0, e = s.size();
  while (b < e && std::isspace(static_cast<unsigned char>(s[b]))) ++b;
  while (e > b && std::isspace(static_cast<unsigned char>(s[e - 1]))) --e;
  std::string out = s.substr(b, e - b);
  std::transform(out.begin(), out.end(), out.begin(), [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return out;
}

// A vLLM on/off variable: "1" enables, "0" or empty disables, anything else is an error.
bool env_flag(const std::optional<std::string>& value, const char* name) {
  if (!value) return false;
  const std::string v = lower_trimmed(*value);
  if (v.empty() || v == "0") return false;
  if (v == "1") return true;
  throw Error(std::string(name) + "='" + *value + "' is not valid: use 1 to enable or 0 to disable");
}

std::optional<std::string> getenv_opt(const char* name) {
  const char* v = std::getenv(name);
  if (!v) return std::nullopt;
  return std::string(v);
}

}  // namespace

CacheDtype parse_cache_dtype(const std::string& s) {
  const std::string v = lower_trimmed(s);
  if (v == "nvfp4_ds_mla") return CacheDtype::nvfp4_ds_mla;
  if (v == "fp8_ds_mla") return CacheDtype::fp8_ds_mla;
  if (v == "bf16") return CacheDtype::bf16;
  throw Error("unknown cache dtype '" + s + "': use nvfp4_ds_mla, fp8_ds_mla or bf16");
}

RopeEncoding parse_rope(const std::string& s) {
  const std::string v = lower_trimmed(s);
  if (v == "fp8") return RopeEncoding::fp8;
  if (v == "bf16") return RopeEncoding::bf16;
  throw Error("unknown RoPE encoding '" + s + "': use fp8 (368-byte record) or bf16 (432-byte record)");
}

ScaleMode parse_scale_mode(const std::string& s) {
  const std::string v = lower_trimmed(s);
  if (v == "implicit") return ScaleMode::implicit;
  if (v == "static") return ScaleMode::static_calibrated;
  if (v == "dynamic") return ScaleMode::dynamic;
  throw Error("unknown scale mode '" + s + "': use implicit, static or dynamic");
}

EnvironmentSettings EnvironmentSettings::from_process() {
  EnvironmentSettings e;
  e.dynamic_scale = getenv_opt("VLLM_NVFP4_MLA_DYNAMIC_SCALE");
  e.fp8_rope = getenv_opt("KV_FP8_ROPE");
  e.scales_file = getenv_opt("VLLM_NVFP4_MLA_SCALES_FILE");
  if (e.scales_file && lower_trimmed(*e.scales_file).empty()) e.scales_file.reset();
  return e;
}

FormatConfig FormatConfig::create(const FormatOptions& flags, const EnvironmentSettings& env) {
  FormatConfig c;
  c.spec_.dtype = flags.cache_dtype.value_or(CacheDtype::nvfp4_ds_mla);
  c.unit_scale_for_missing_layer_ = flags.unit_scale_for_missing_layer;

  if (c.spec_.dtype != CacheDtype::nvfp4_ds_mla) {
    // The RoPE encoding and the outer scale exist only in the NVFP4 record. The vLLM
    // variables configure nvfp4_ds_mla only and are not consulted for other dtypes.
    const std::string d = to_string(c.spec_.dtype);
    if (flags.rope) throw Error("--rope applies to nvfp4_ds_mla only; " + d + " always stores RoPE as BF16: remove --rope");
    if (flags.scale_mode) throw Error("--scale-mode applies to nvfp4_ds_mla only; " + d + " has no outer scale: remove --scale-mode");
    if (flags.scales_file || flags.layer_scale || flags.layer)
      throw Error("--scales-file/--layer-scale/--layer apply to nvfp4_ds_mla static mode only; remove them for " + d);
    return c;
  }

  // Explicit flags win over the environment; the environment wins over the defaults.
  const bool env_dynamic = env_flag(env.dynamic_scale, "VLLM_NVFP4_MLA_DYNAMIC_SCALE");
  const bool env_fp8_rope = env_flag(env.fp8_rope, "KV_FP8_ROPE");
  c.spec_.rope = flags.rope.value_or(env_fp8_rope ? RopeEncoding::fp8 : RopeEncoding::bf16);

  std::optional<std::string> scales_file = flags.scales_file;
  ScaleMode mode;
  if (flags.scale_mode) {
    mode = *flags.scale_mode;
  } else if (flags.scales_file || flags.layer_scale) {
    mode = ScaleMode::static_calibrated;
  } else {
    if (env_dynamic && env.scales_file)
      throw Error("VLLM_NVFP4_MLA_DYNAMIC_SCALE=1 and VLLM_NVFP4_MLA_SCALES_FILE are mutually exclusive: "
                  "per-token dynamic scales replace the per-layer calibration; unset one of them");
    mode = env_dynamic ? ScaleMode::dynamic : env.scales_file ? ScaleMode::static_calibrated : ScaleMode::implicit;
  }
  if (mode == ScaleMode::static_calibrated && !scales_file && !flags.layer_scale && env.scales_file) scales_file = env.scales_file;
  c.spec_.scale_mode = mode;

  switch (mode) {
    case ScaleMode::dynamic:
      if (scales_file || flags.layer_scale)
        throw Error("dynamic scale mode and a calibration (--scales-file/--layer-scale) are mutually exclusive: "
                    "the per-token scale replaces the per-layer one; drop one of them");
      if (flags.layer) throw Error("--layer selects a calibrated scale and has no meaning in dynamic mode: remove it");
      if (c.spec_.rope != RopeEncoding::fp8)
        throw Error("dynamic scale mode requires the 368-byte record (the per-token scale lives in its padding): "
                    "use --rope fp8 (or KV_FP8_ROPE=1)");
      break;
    case ScaleMode::implicit:
      if (scales_file || flags.layer_scale || flags.layer)
        throw Error("--scales-file/--layer-scale/--layer need --scale-mode static; implicit mode uses an outer scale of 1");
      break;
    case ScaleMode::static_calibrated:
      if (scales_file && flags.layer_scale)
        throw Error("give either --scales-file (with --layer) or a bare --layer-scale, not both");
      if (!scales_file && !flags.layer_scale)
        throw Error("static scale mode needs a calibration: --scales-file F --layer L (or VLLM_NVFP4_MLA_SCALES_FILE), "
                    "or a bare --layer-scale S for encode/decode/inspect");
      if (flags.layer_scale) {
        const float s = *flags.layer_scale;
        if (!std::isfinite(s) || !(s > 0.0f)) throw Error("--layer-scale must be a finite positive number");
        if (flags.layer) throw Error("--layer selects a scale from --scales-file; with a bare --layer-scale remove --layer");
        c.bare_layer_scale_ = s;
      } else {
        c.calibration_ = std::make_shared<const Calibration>(Calibration::load(*scales_file));
        if (flags.layer) {
          if (*flags.layer < 0) throw Error("--layer must not be negative");
          // Validate now so an impossible layer fails at construction, not at first use.
          (void)c.calibration_->layer_scale(*flags.layer, c.unit_scale_for_missing_layer_ ? MissingLayer::unit_scale
                                                                                          : MissingLayer::error);
        }
      }
      c.layer_ = flags.layer;
      break;
  }
  return c;
}

float FormatConfig::layer_scale() const {
  if (spec_.scale_mode != ScaleMode::static_calibrated) return 1.0f;
  if (bare_layer_scale_) return *bare_layer_scale_;
  if (!layer_) throw Error("static scale mode: choose which layer's calibrated scale to use (--layer L)");
  return layer_scale_for(*layer_);
}

float FormatConfig::layer_scale_for(int layer) const {
  if (spec_.scale_mode != ScaleMode::static_calibrated) return 1.0f;
  if (bare_layer_scale_) return *bare_layer_scale_;
  return calibration_->layer_scale(layer, unit_scale_for_missing_layer_ ? MissingLayer::unit_scale : MissingLayer::error);
}

std::string FormatConfig::identity(IdentityCompat compat) const {
  switch (spec_.dtype) {
    case CacheDtype::bf16:
      return compat == IdentityCompat::vllm ? "vllm-default-v1" : "bf16:1152:v1";
    case CacheDtype::fp8_ds_mla:
      return compat == IdentityCompat::vllm ? "vllm-default-v1" : "fp8_ds_mla:656:v1";
    case CacheDtype::nvfp4_ds_mla:
      break;
  }
  const std::string rope = spec_.rope == RopeEncoding::fp8 ? "fp8-rope-368" : "bf16-rope-432";
  switch (spec_.scale_mode) {
    case ScaleMode::implicit:
      return compat == IdentityCompat::vllm ? "vllm-default-v1" : "nvfp4_ds_mla:" + rope + ":implicit-unit-v1";
    case ScaleMode::dynamic:
      return "nvfp4_ds_mla:" + rope + ":dynamic-token-v1";
    case ScaleMode::static_calibrated:
      break;
  }
  if (!calibration_)
    throw Error("a static record identity names its calibration file's SHA-256: give --scales-file "
                "(a bare --layer-scale serves encode, decode and inspect only)");
  return "nvfp4_ds_mla:" + rope + ":static-calibrated-v1:" + calibration_->sha256_hex;
}

std::string FormatConfig::describe() const {
  std::string s = std::string(to_string(spec_.dtype)) + ", " + std::to_string(record_bytes()) + " bytes/token";
  if (spec_.dtype == CacheDtype::nvfp4_ds_mla) {
    s += ", RoPE " + std::string(to_string(spec_.rope)) + ", scale " + to_string(spec_.scale_mode);
    if (bare_layer_scale_) s += " (layer scale " + std::to_string(*bare_layer_scale_) + ")";
    if (calibration_) s += " (" + calibration_->source.string() + (layer_ ? ", layer " + std::to_string(*layer_) : "") + ")";
  }
  return s;
}

}  // namespace nvfp4mla
