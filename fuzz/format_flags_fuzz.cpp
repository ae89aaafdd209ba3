// Fuzzes the format flags every format-aware subcommand shares (src/cli/format_flags.cpp): CLI11
// parsing of --cache-dtype, --rope, --scale-mode, --layer-scale, --scales-file, --layer and
// --unit-scale-for-missing-layer, then FormatConfig::create with the vLLM environment variables.
// No process is spawned and nothing runs.
//
// Input: one argument per line; a line "env:NAME=VALUE" sets one of the three environment
// variables instead (read back through EnvironmentSettings::from_process). Calibration paths
// are confined to fixtures this target writes: "valid.json" (2 layers), "bad.json" (malformed);
// any other non-blank path becomes a missing file, so no input reads outside the fixtures.
//
// Properties of an accepted configuration: its record width agrees with its identity, the
// identity exists exactly when the configuration names a calibration file (or needs none), a
// store namespace can be built on it, and its layer scale is finite and positive.
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "cli/format_flags.h"
#include "fuzz_support.h"
#include "nvfp4mla/calibration.h"
#include "nvfp4mla/config.h"
#include "nvfp4mla/offload/namespace.h"

using namespace nvfp4mla;

namespace {

constexpr const char* kEnvironment[] = {"VLLM_NVFP4_MLA_DYNAMIC_SCALE", "KV_FP8_ROPE", "VLLM_NVFP4_MLA_SCALES_FILE"};
constexpr const char* kFixtures[] = {"valid.json", "bad.json"};

void write_fixtures() {
  std::ofstream(fuzz::scratch_dir() / "valid.json") << Calibration::from_max_abs({3.0f, 5.0f}).to_json();
  std::ofstream(fuzz::scratch_dir() / "bad.json") << "{\"format\": \"nvfp4_ds_mla_outer_scale_v1\", \"num_layers\": 2";
}

std::optional<std::string> confined(const std::optional<std::string>& path) {
  if (!path) return path;
  if (path->find_first_not_of(" \t\n\r\f\v") == std::string::npos) return path;  // blank: the library's rules
  for (const char* f : kFixtures)
    if (*path == f) return (fuzz::scratch_dir() / f).string();
  return (fuzz::scratch_dir() / "absent.json").string();
}

void check_config(const FormatConfig& c) {
  fuzz::require(c.record_bytes() == c.spec().record_bytes(), "record width disagrees with the spec");
  fuzz::require(!c.describe().empty(), "empty description");
  if (!c.spec().is_nvfp4())
    fuzz::require(c.rope() == RopeEncoding::bf16 && c.scale_mode() == ScaleMode::implicit,
                  "RoPE or scale mode set for a dtype without them");
  if (c.scale_mode() == ScaleMode::dynamic) fuzz::require(c.spec().rope_is_fp8(), "dynamic mode without FP8 RoPE");

  const bool bare_static = c.scale_mode() == ScaleMode::static_calibrated && c.calibration() == nullptr;
  std::string identity;
  const bool has_identity = fuzz::accepts([&] { identity = c.identity(); });
  fuzz::require(has_identity != bare_static, "identity exists for a bare layer scale, or is missing otherwise");
  fuzz::require(fuzz::accepts([&] { (void)c.identity(IdentityCompat::vllm); }) == has_identity,
                "the vLLM identity and the native one disagree on existing");
  if (has_identity) {
    fuzz::require(offload::record_bytes_of_identity(identity) == c.record_bytes(), "identity names another width");
    (void)offload::NamespaceParams::for_format(c, 64, 1, "fuzz");
  }

  float scale = 0.0f;
  const bool needs_layer = c.scale_mode() == ScaleMode::static_calibrated && c.calibration() && !c.layer();
  if (fuzz::accepts([&] { scale = c.layer_scale(); })) {
    fuzz::require(!needs_layer, "static mode gave a scale without a layer");
    fuzz::require(std::isfinite(scale) && scale > 0.0f, "layer scale is not finite and positive");
  } else {
    fuzz::require(needs_layer, "layer_scale() refused a configuration that has one");
  }
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  write_fixtures();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::vector<std::string> args;
  for (const char* name : kEnvironment) ::unsetenv(name);
  for (const std::string& line : fuzz::lines(data, size)) {
    bool is_env = false;
    for (const char* name : kEnvironment) {
      const std::string prefix = std::string("env:") + name + "=";
      if (line.starts_with(prefix)) {
        ::setenv(name, line.c_str() + prefix.size(), 1);
        is_env = true;
      }
    }
    if (!is_env) args.push_back(line);
  }

  CLI::App app{"fuzz"};
  const auto flags = cli::FormatFlags::add_to(&app);
  std::vector<std::string> reversed(args.rbegin(), args.rend());  // CLI11 takes them last first
  try {
    app.parse(reversed);
  } catch (const CLI::ParseError&) {
    return 0;
  }

  FormatOptions options;
  EnvironmentSettings env;
  if (!fuzz::accepts([&] {
        options = flags->options();
        env = EnvironmentSettings::from_process();
      }))
    return 0;
  options.scales_file = confined(options.scales_file);
  env.scales_file = confined(env.scales_file);
  FormatConfig config;
  if (!fuzz::accepts([&] { config = FormatConfig::create(options, env); })) return 0;
  check_config(config);
  return 0;
}
