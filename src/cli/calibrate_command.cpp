// calibrate: per-layer outer scales for the static NVFP4 mode from captured activations.
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "commands.h"
#include "nvfp4mla/calibration.h"
#include "nvfp4mla/error.h"
#include "nvfp4mla/format.h"
#include "nvfp4mla/layer_tensors.h"
#include "nvfp4mla/record.h"
#include "nvfp4mla/safetensors.h"

namespace nvfp4mla::cli {
namespace {

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
    const std::vector<std::string> names = layer_tensor_names(in, "kv_c", args->input);

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
