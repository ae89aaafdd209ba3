// calibrate: per-layer outer scales for the static NVFP4 mode from captured activations.
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "commands.h"
#include "nvfp4mla/calibration.h"
#include "nvfp4mla/error.h"
#include "nvfp4mla/format.h"
#include "nvfp4mla/record.h"
#include "nvfp4mla/safetensors.h"

namespace nvfp4mla::cli {
namespace {

constexpr const char* kLayerPrefix = "layers.";
constexpr const char* kLatentSuffix = ".kv_c";

// The layer index of a tensor named layers.<i>.kv_c, or -1 for a tensor of another kind
// (ignored). A malformed index (layers.x.kv_c, layers.01.kv_c) is an error, not a silent skip.
int latent_layer_index(const std::string& name, const std::string& origin) {
  const std::string prefix = kLayerPrefix, suffix = kLatentSuffix;
  if (name.size() < prefix.size() + suffix.size() || name.compare(0, prefix.size(), prefix) != 0 ||
      name.compare(name.size() - suffix.size(), suffix.size(), suffix) != 0)
    return -1;
  const std::string digits = name.substr(prefix.size(), name.size() - prefix.size() - suffix.size());
  if (digits.empty() || digits.find_first_not_of("0123456789") != std::string::npos || digits.size() > 6 ||
      (digits.size() > 1 && digits[0] == '0'))
    throw Error(origin + ": tensor '" + name + "' does not name a layer; expected " + kLayerPrefix + "<i>" +
                kLatentSuffix + " with i = 0, 1, 2, ...");
  return std::stoi(digits);
}

struct LayerStats {
  int64_t tokens = 0;
  float max_abs = 0.0f;
};

LayerStats latent_stats(const TensorMap& m, const std::string& name, const std::string& origin) {
  const Tensor& t = require_tensor(m, name, origin, {DType::BF16, DType::F16, DType::F32}, {kAnyExtent, kLatentDim});
  const std::vector<float> values = to_f32(t, name, origin);
  LayerStats s{t.shape[0], 0.0f};
  for (size_t i = 0; i < values.size(); ++i) {
    if (!std::isfinite(values[i]))
      throw Error(origin + ": tensor '" + name + "' holds a non-finite value at token " +
                  std::to_string(i / kLatentDim) + ", dim " + std::to_string(i % kLatentDim) +
                  "; calibrate from finite activations");
    s.max_abs = record::max_f(s.max_abs, record::abs_f(values[i]));
  }
  if (s.max_abs == 0.0f)
    throw Error(origin + ": tensor '" + name + "' is " + (s.tokens == 0 ? "empty" : "all zeros") +
                "; its scale would be 0, which is not a valid outer scale");
  return s;
}

struct CalibrateArgs {
  std::string input, output;
};

}  // namespace

void add_calibrate_command(CLI::App& app) {
  auto* cmd = app.add_subcommand("calibrate", "Compute per-layer outer scales (static mode) from latent activations");
  auto args = std::make_shared<CalibrateArgs>();
  cmd->add_option("--input", args->input,
                  "safetensors file with tensors layers.<i>.kv_c [tokens, 512] (BF16, F16 or F32), layers 0..N-1")
      ->required();
  cmd->add_option("--output", args->output, "calibration JSON to write")->required();
  cmd->callback([args] {
    const TensorMap in = read_safetensors(args->input);
    std::vector<std::string> names;  // names[i] = tensor of layer i
    for (const auto& [name, tensor] : in) {
      const int layer = latent_layer_index(name, args->input);
      if (layer < 0) continue;
      if (layer >= static_cast<int>(names.size())) names.resize(layer + 1);
      names[layer] = name;
    }
    if (names.empty())
      throw Error(args->input + ": no tensors named " + kLayerPrefix + "<i>" + kLatentSuffix +
                  " (expected one per layer, layers 0..N-1)");
    for (size_t i = 0; i < names.size(); ++i)
      if (names[i].empty())
        throw Error(args->input + ": tensor " + kLayerPrefix + std::to_string(i) + kLatentSuffix + " is missing (found " +
                    kLayerPrefix + "<i>" + kLatentSuffix + " up to layer " + std::to_string(names.size() - 1) +
                    "; every layer 0..N-1 must be present)");

    std::vector<LayerStats> stats;
    std::vector<float> max_abs;
    for (const std::string& name : names) {
      stats.push_back(latent_stats(in, name, args->input));
      max_abs.push_back(stats.back().max_abs);
    }
    const Calibration calibration = Calibration::from_max_abs(max_abs);
    const std::string json = calibration.to_json();
    // Never write a file the reader would refuse.
    Calibration::parse(json, args->output);
    write_file_atomic(args->output, json.data(), json.size());

    std::printf("%-6s %10s %14s %16s\n", "layer", "tokens", "max |kv_c|", "outer scale");
    for (size_t i = 0; i < stats.size(); ++i)
      std::printf("%-6zu %10lld %14.7g %16.9g\n", i, static_cast<long long>(stats[i].tokens), stats[i].max_abs,
                  calibration.scales[i]);
    std::printf("wrote %s: %zu layers, sha256 %s\n", args->output.c_str(), stats.size(),
                sha256_hex(json.data(), json.size()).c_str());
  });
}

}  // namespace nvfp4mla::cli
