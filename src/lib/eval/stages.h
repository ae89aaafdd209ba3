#pragma once
// The evaluation's stages (internal): each measures one aspect for every mode and writes into
// the report. Shared helpers for building records and queries live here too.
#include <cstdint>
#include <filesystem>
#include <functional>
#include <string>
#include <vector>

#include "nvfp4mla/calibration.h"
#include "nvfp4mla/config.h"
#include "nvfp4mla/eval/backend.h"
#include "nvfp4mla/eval/dump.h"
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
// A layer's token shape (the synthetic model's, or one measured on a dump's calibration half):
// a token is value_scale * magnitude * channel_scale[c] * z[c] with the RoPE key
// rope_scale * rope(base, position); `seed` keys the streams queries and needles draw from.
struct LayerModel {
  uint64_t seed = 0;
  const std::vector<float>* channel_scale = nullptr;
  double value_scale = 1.0;
  double rope_scale = 1.0;
  std::function<void(const double*, int64_t, double*)> rope;
  // One token from unit-variance content z (512), a magnitude factor and a RoPE base (64); BF16 bits.
  void make_token(const double* z, double magnitude, const double* rope_base, int64_t position, uint16_t* kv_c,
                  uint16_t* k_pe) const;
};
LayerModel synthetic_layer_model(const SyntheticWorkload& workload, int layer);
// A dump layer: channel RMS and RoPE RMS of its calibration half; its keys carry their own
// positions, so `rope` leaves the base as it is.
LayerModel dump_layer_model(const DumpLayer& layer, uint64_t seed);

// Queries correlated with a few tokens of the context (peaked attention), synthesized from the
// layer's stream: channel_scale shapes the matched directions, rope_scale sets the spread of the
// RoPE logits and rope places the RoPE part.
LayerQueries synthesize_queries(const LayerModel& model, int layer, const TokenBlock& context, const AttentionOptions& options);
// Given BF16 queries [rows, heads, 576], the indexer's proxy queries.
LayerQueries queries_from_bf16(std::vector<uint16_t> q, int rows, int heads);

// Per-layer attention metrics of every mode against the first (bf16 reference) mode.
struct LayerAttention {
  std::vector<double> relative_error;  // per mode: mean over rows x heads of ||o - o_ref|| / ||o_ref||
  std::vector<double> kld;             // per mode: mean over rows x heads of KL(P_ref || P)
};
LayerAttention evaluate_layer_attention(int layer, const TokenBlock& context, const LayerQueries& queries, int topk,
                                        const std::vector<FormatConfig>& configs, Device device);

// Tokens `rows` of a block, latent scaled by `scale` (rounded to BF16 again), RoPE key as it is.
TokenBlock pick_tokens(const TokenBlock& tokens, const std::vector<int64_t>& rows, double scale = 1.0);
TokenBlock first_tokens(const TokenBlock& tokens, int64_t count);

// The magnitude sweep's tokens: tokens(Sample::sweep or Sample::sweep_calibration, scale) is the
// evaluated or the calibration sample with its latent scaled by `scale` (1: as drawn).
struct SweepSource {
  int layer = 0;
  int64_t count = 0;
  std::function<TokenBlock(Sample, double)> tokens;
  std::string description;                     // for the report
  std::vector<int64_t> token_indices;          // a dump's: which of its tokens (evaluated, calibration)
  std::vector<int64_t> calibration_indices;
};
SweepSource synthetic_sweep_source(const SyntheticWorkload& workload, int layer, int64_t count);
// `count` evenly spaced tokens of each half of a dump layer (at most the half's size).
SweepSource dump_sweep_source(const DumpWorkload& dump, int layer, int64_t count);

// The magnitude sweep (all modes), written into report.sweep_* and each mode's sweep fields.
void run_magnitude_sweep(const SweepSource& source, const SweepOptions& options, EvalReport& report,
                         const ProgressFn& progress, int threads);

// A needle layer's tokens: the model its needle, hard distractors and query are built from, and
// `length` context tokens (the ordinary distractors).
struct NeedleSource {
  LayerModel model;
  std::function<TokenBlock(int64_t length)> context;
};
NeedleSource synthetic_needle_source(const SyntheticWorkload& workload, int layer);
// Contexts from the layer's evaluation half: its first `length` tokens, or, for a longer
// context, `length` draws with replacement.
NeedleSource dump_needle_source(const DumpWorkload& dump, int layer, uint64_t seed);

// One needle grid (layer x lengths x depths) for every mode.
std::vector<NeedleGrid> run_needle_layer(const NeedleSource& source, int layer, const NeedleOptions& options, int topk,
                                         const std::vector<FormatConfig>& configs, Device device,
                                         const std::function<void()>& cell_done);

// The DSA pipeline stage (pipeline_eval.cpp): its needle grid into each mode's `pipeline`, the
// selection statistics and the DCP mapping checks into the report.
// With a dump: the selection of its index tensors (no needles), or a note that it has none.
void run_pipeline_stage(const SyntheticWorkload& model, const DumpWorkload* dump, const EvalOptions& options,
                        const std::vector<FormatConfig>& configs, Device device, EvalReport& report, const ProgressFn& progress,
                        int threads);

}  // namespace nvfp4mla::eval::detail
