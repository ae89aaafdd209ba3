#include "format_flags.h"

namespace nvfp4mla::cli {

std::shared_ptr<FormatFlags> FormatFlags::add_to(CLI::App* cmd) {
  auto f = std::make_shared<FormatFlags>();
  f->cache_dtype_opt_ = cmd->add_option("--cache-dtype", f->cache_dtype_,
                                        "Record format: nvfp4_ds_mla (default), fp8_ds_mla or bf16");
  f->rope_opt_ = cmd->add_option("--rope", f->rope_,
                                 "nvfp4_ds_mla RoPE storage: bf16 (432-byte record, default) or fp8 (368-byte)");
  f->scale_mode_opt_ = cmd->add_option("--scale-mode", f->scale_mode_,
                                       "nvfp4_ds_mla outer scale: implicit (default), static or dynamic (368 only)");
  f->layer_scale_opt_ = cmd->add_option("--layer-scale", f->layer_scale_,
                                        "Static mode: the layer's outer scale, without a calibration file");
  f->scales_file_opt_ = cmd->add_option("--scales-file", f->scales_file_,
                                        "Static mode: calibration file (JSON written by `nvfp4mla calibrate`)");
  f->layer_opt_ = cmd->add_option("--layer", f->layer_, "Static mode: which layer of the calibration file");
  cmd->add_flag("--unit-scale-for-missing-layer", f->unit_scale_for_missing_layer_,
                "Use scale 1.0 for a layer the calibration file does not cover (the MTP-layer convention)");
  return f;
}

FormatOptions FormatFlags::options() const {
  FormatOptions o;
  if (cache_dtype_opt_->count()) o.cache_dtype = parse_cache_dtype(cache_dtype_);
  if (rope_opt_->count()) o.rope = parse_rope(rope_);
  if (scale_mode_opt_->count()) o.scale_mode = parse_scale_mode(scale_mode_);
  if (scales_file_opt_->count()) o.scales_file = scales_file_;
  if (layer_opt_->count()) o.layer = layer_;
  if (layer_scale_opt_->count()) o.layer_scale = layer_scale_;
  o.unit_scale_for_missing_layer = unit_scale_for_missing_layer_;
  return o;
}

FormatConfig FormatFlags::config() const {
  return FormatConfig::create(options(), EnvironmentSettings::from_process());
}

}  // namespace nvfp4mla::cli
