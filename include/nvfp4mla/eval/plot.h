#pragma once
// PNG figures of an evaluation report (cairo). Optional: a build without cairo reports that
// plotting is unavailable and write_plots() throws an Error saying what to install.
#include <filesystem>
#include <vector>

#include "nvfp4mla/eval/evaluation.h"

namespace nvfp4mla::eval {

// True when the library was built with cairo (PNG output).
bool plotting_available();

// Writes the figures the report has data for into `dir` (created if missing):
//   error_vs_magnitude.png   latent error vs latent RMS magnitude, per mode (sweep)
//   per_layer_error.png      latent error, attention output error and KLD per layer
//   needle_layer<L>.png      needle retention heatmaps (depth x context length) per mode
//   pipeline_needles.png     the DSA pipeline's needle grid per mode (selected, top weight, mass)
//   selection_quarters.png   the selection's top-k budget per context quarter vs the fp32 selection
// Returns the paths written. Throws Error when plotting is unavailable or a file cannot be written.
// Not for concurrent use: it resets cairo's process-wide font caches when done.
std::vector<std::filesystem::path> write_plots(const EvalReport& report, const std::filesystem::path& dir);

}  // namespace nvfp4mla::eval
