#pragma once
// The format flags every format-aware subcommand accepts, and their one translation into a
// validated FormatConfig (flags given explicitly win over the vLLM environment variables,
// which win over the defaults).
#include <memory>
#include <string>

#include <CLI/CLI.hpp>

#include "nvfp4mla/config.h"

namespace nvfp4mla::cli {

class FormatFlags {
 public:
  // Registers --cache-dtype, --rope, --scale-mode, --layer-scale, --scales-file, --layer and
  // --unit-scale-for-missing-layer on `cmd`. The returned object must outlive parsing.
  static std::shared_ptr<FormatFlags> add_to(CLI::App* cmd);

  FormatOptions options() const;  // only the flags that were given
  FormatConfig config() const;    // FormatConfig::create(options(), the process environment)

 private:
  std::string cache_dtype_, rope_, scale_mode_, scales_file_;
  float layer_scale_ = 0.0f;
  int layer_ = 0;
  bool unit_scale_for_missing_layer_ = false;
  CLI::Option* cache_dtype_opt_ = nullptr;
  CLI::Option* rope_opt_ = nullptr;
  CLI::Option* scale_mode_opt_ = nullptr;
  CLI::Option* scales_file_opt_ = nullptr;
  CLI::Option* layer_scale_opt_ = nullptr;
  CLI::Option* layer_opt_ = nullptr;
};

}  // namespace nvfp4mla::cli
