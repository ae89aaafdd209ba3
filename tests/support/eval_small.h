#pragma once
// A small, fast evaluation configuration for the tests: few layers spanning the same
// magnitudes, short contexts, few tokens. Debug (sanitizer) builds get the same shape.
#include "nvfp4mla/eval/evaluation.h"

namespace nvfp4mla::testing {

inline eval::EvalOptions small_eval_options() {
  eval::EvalOptions o;
  o.shape.num_layers = 6;
  o.tokens_per_layer = 64;
  o.calibration_tokens = 64;
  o.attention.context = 256;
  o.attention.topk = 64;
  o.attention.rows = 1;
  o.attention.heads = 4;
  o.sweep.tokens = 16;
  o.sweep.points_per_decade = 2;
  o.needle.layers = {0, 5};
  o.needle.lengths = {256, 512};
  o.needle.depths = {0.0, 0.5, 1.0};
  o.pipeline.lengths = {1024, 3000};
  o.pipeline.topk = 128;
  o.pipeline.workload.index_heads = 8;
  o.pipeline.workload.heads = 2;
  o.threads = 2;
  return o;
}

// Computed once per test process.
inline const eval::EvalReport& small_eval_report() {
  static const eval::EvalReport r = eval::run_evaluation(small_eval_options());
  return r;
}

inline const eval::ModeResult& mode_of(const eval::EvalReport& r, const std::string& key) {
  for (const auto& m : r.modes)
    if (m.mode.key == key) return m;
  throw std::runtime_error("no mode " + key);
}

}  // namespace nvfp4mla::testing
