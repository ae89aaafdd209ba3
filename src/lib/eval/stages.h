#pragma once
// The evaluation's stages (internal): each measures one aspect for every mode and writes into
// the report. Shared helpers for building records and queries live here too.
#include <cstdint>
#include <filesystem>
#include <functional>
#include <vector>

#include "nvfp4mla/calibration.h"
#include "nvfp4mla/config.h"
#include "nvfp4mla/eval/backend.h"
#include "nvfp4mla/eval/evaluation.h"
#include "nvfp4mla/eval/workload.h"

namespace nvfp4mla::eval::detail {

// Softmax scale of the synthetic attention: 1/sqrt(576) = 1/24. Queries are built to reach
// target logits, so the value only fixes the units.
inline constexpr float kSmScale = 1.0f / 24.0f;

// A calibration written where the user asked, or to a temporary file that is removed when
// this object goes away (static FormatConfigs read and hash it at construction).
class CalibrationFile {
 public:
  CalibrationFile(const Calibration& calibration, const std::filesystem::path& keep = {});
  ~CalibrationFile();
  CalibrationFile(const CalibrationFile&) = delete;
  CalibrationFile& operator=(const CalibrationFile&) = delete;
  const std::filesystem::path& path() const { return path_; }
  bool temporary() const { return temporary_; }

 private:
  std::filesystem::path path_;
  bool temporary_;
};

// Records of the chosen tokens (all when `which` is empty), [count, record_bytes].
std::vector<uint8_t> encode_tokens(const FormatConfig& config, float layer_scale, const TokenBlock& tokens,
                                   const std::vector<int64_t>& which = {});

// Encodes and decodes the first `count` tokens (all when negative): latent error and, for
// NVFP4, the group-scale classes.
struct LatentMeasure {
  LatentError error;
  GroupScaleCounts scales;
};
LatentMeasure measure_latent(const FormatConfig& config, float layer_scale, const TokenBlock& tokens, int64_t count = -1);

// Adds weight * (x / c^2) / ||x / c||^2 to q_nope (512): the "matched" query direction of a
// token x with channel scales c. It scores x itself at weight and an unrelated token y at about
// weight * N(0,1) * |y| / (|x| sqrt(512)), where |.| is the per-token magnitude.
void add_matched_query(const uint16_t* kv_c, const std::vector<float>& channel_scale, double weight, double* q_nope);

// Exact logits of keys (BF16 tokens) against a fp32 query of 576 values, sm_scale applied.
void exact_logits(const TokenBlock& tokens, const double* q, std::vector<float>& logits);

// Positions of the k largest values (ties: lower position first), in ascending position order.
std::vector<int64_t> top_k_positions(const std::vector<float>& values, int64_t k);

// Queries of one layer: [rows, heads, 576] BF16, plus the indexer's proxy query per row (the
// sum of the row's head queries, fp32).
struct LayerQueries {
  int rows = 0, heads = 0;
  std::vector<uint16_t> q;
  std::vector<double> indexer;  // [rows, 576]
};
// Queries correlated with a few tokens of the context (peaked attention), synthesized from the
// layer's stream `seed`: channel_scale shapes the matched directions, rope_scale (RMS of the RoPE
// key values) sets the spread of the RoPE logits and rope(in, position, out) places the RoPE part.
struct QueryModel {
  uint64_t seed = 0;
  const std::vector<float>* channel_scale = nullptr;
  double rope_scale = 1.0;
  std::function<void(const double*, int64_t, double*)> rope;
};
LayerQueries synthesize_queries(const QueryModel& model, int layer, const TokenBlock& context, const AttentionOptions& options);
// The synthetic workload's model of a layer's queries.
QueryModel synthetic_query_model(const SyntheticWorkload& workload, int layer);
// Given BF16 queries [rows, heads, 576], the indexer's proxy queries.
LayerQueries queries_from_bf16(std::vector<uint16_t> q, int rows, int heads);

// Per-layer attention metrics of every mode against the first (bf16 reference) mode.
struct LayerAttention {
  std::vector<double> relative_error;  // per mode: mean over rows x heads of ||o - o_ref|| / ||o_ref||
  std::vector<double> kld;             // per mode: mean over rows x heads of KL(P_ref || P)
};
LayerAttention evaluate_layer_attention(int layer, const TokenBlock& context, const LayerQueries& queries, int topk,
                                        const std::vector<FormatConfig>& configs, Device device);

// The magnitude sweep (all modes), written into report.sweep_* and each mode's sweep fields.
void run_magnitude_sweep(const SyntheticWorkload& workload, const SweepOptions& options, EvalReport& report,
                         const ProgressFn& progress, int threads);

// One needle grid (layer x lengths x depths) for every mode.
std::vector<NeedleGrid> run_needle_layer(const SyntheticWorkload& workload, int layer, const NeedleOptions& options,
                                         int topk, const std::vector<FormatConfig>& configs, Device device,
                                         const std::function<void()>& cell_done);

}  // namespace nvfp4mla::eval::detail
