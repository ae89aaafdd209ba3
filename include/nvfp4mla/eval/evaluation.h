#pragma once
// `nvfp4mla eval`: the quality evaluation of every record format and scale mode on a workload.
//
// Stages (each can be switched off):
//   latent     capacity, latent reconstruction error and SNR, E4M3 group-scale health per layer;
//   attention  per layer, queries correlated with a few context tokens (peaked attention) attend
//              over a top-k selection of a long context; output error and KL divergence of the
//              attention distribution against the bf16 reference;
//   sweep      the same tokens scaled over many magnitudes: latent error vs magnitude;
//   needle     a needle whose key aligns with the query, planted at depths 0..100% of contexts
//              of several lengths among distractors: is it still the top-scoring token, and how
//              much attention mass does it keep relative to bf16.
//   pipeline   the whole DSA decode step (dsa_pipeline.h) on the DSA workload (dsa_workload.h):
//              needles at every depth of contexts to 1M tokens, selected by the indexer's FP8
//              keys and exact top-k, attended over every record format; the selection's
//              distribution over the context against an fp32 selection; the DCP4 mapping check.
#include <cstdint>
#include <filesystem>
#include <functional>
#include <string>
#include <vector>

#include "nvfp4mla/eval/backend.h"
#include "nvfp4mla/eval/dsa_workload.h"
#include "nvfp4mla/eval/metrics.h"
#include "nvfp4mla/eval/modes.h"
#include "nvfp4mla/eval/workload.h"

namespace nvfp4mla::eval {

inline constexpr uint64_t kDefaultSeed = 52;
// Cache sizes the capacity columns are computed for (decimal gigabytes: 1 GB = 1e9 bytes).
inline constexpr double kGigabyte = 1e9;
inline constexpr double kCapacityGigabytes[2] = {80.0, 141.0};

struct AttentionOptions {
  bool enabled = true;
  int64_t context = 16384;      // tokens per layer the selection is made from
  int topk = 2048;              // tokens each query row attends over (DSA top-k)
  int rows = 2;                 // query rows per layer
  int heads = 8;                // heads per row (sharing the row's selection)
  int relevant_per_row = 16;    // context tokens a row's queries are correlated with
  int relevant_per_head = 4;    // of those, per head
  double peak_logit = 12.0;     // logit lift of a fully relevant token over the bulk
  double rope_logit_std = 0.5;  // spread of the RoPE part of the logits
};

struct SweepOptions {
  bool enabled = true;
  int tokens = 256;             // tokens scaled to every magnitude
  int layer = -1;               // whose tokens (a dump's) or channel shape they have; -1: the middle layer
  double min_rms = 1e-4;        // magnitude = RMS of the latent values
  double max_rms = 1e2;
  int points_per_decade = 4;
};

struct NeedleOptions {
  bool enabled = true;
  std::vector<int> layers;      // empty: the shallowest and deepest layer and the three quartiles
  std::vector<int64_t> lengths = {4096, 16384, 65536};
  std::vector<double> depths = {0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0};  // fraction of the context
  double needle_logit = 12.0;   // needle logit lift over the bulk
  // Hard distractors share part of the needle's content: their logit is a uniform fraction in
  // [min, max] of the needle's, carried by tokens larger than the needle (magnitude x1.2..x2.5).
  // One per 1024 context tokens, at least 4.
  double distractor_min = 0.5;
  double distractor_max = 0.9;
  double rope_logit_std = 0.1;
};

struct PipelineOptions {
  bool enabled = true;
  // Context lengths; empty: kPipelineLengthsGpu on CUDA, kPipelineLengthsCpu on the CPU (the
  // reference pipeline would take minutes at 1M tokens). Depths are the needle grid's.
  std::vector<int64_t> lengths;
  int topk = 2048;
  // MTP verifier batch: every needle row as a request of this many query rows (1 + speculative
  // tokens) on the route serving::decide_route picks for the format; 0 or 1: no verifier grid.
  // On the CPU it runs for contexts up to kPipelineVerifierCpuLength only.
  int verifier_width = 4;
  DsaWorkloadOptions workload;
};
inline constexpr int64_t kPipelineVerifierCpuLength = 16384;
inline const std::vector<int64_t> kPipelineLengthsGpu = {16384, 65536, 131072, 262144, 350000, 475000, 1048576};
inline const std::vector<int64_t> kPipelineLengthsCpu = {16384, 65536};

struct EvalOptions {
  uint64_t seed = kDefaultSeed;
  // A user's activation dump as the workload instead of the synthetic model (eval/dump.h);
  // empty: the synthetic model. Every stage runs on it: --tokens-per-layer and --context cap the
  // dump's evaluation half, queries from the dump set rows and heads, the sweep scales tokens of
  // one layer and the needle contexts are drawn from each needle layer's evaluation half.
  std::filesystem::path dump;
  WorkloadShape shape;
  int64_t tokens_per_layer = 2048;    // evaluation sample per layer (latent metrics)
  int64_t calibration_tokens = 2048;  // separate calibration sample per layer (static mode)
  bool latent = true;                 // the latent stage (capacity is always reported)
  AttentionOptions attention;
  SweepOptions sweep;
  NeedleOptions needle;
  PipelineOptions pipeline;
  // Which modes to evaluate, by key ("nvfp4_368_dynamic") or label ("nvfp4-368 dynamic"); empty:
  // all. The bf16 reference is always included (everything is measured against it).
  std::vector<std::string> modes;
  Device device = Device::automatic;  // auto: CUDA when its attention kernel is available
  int threads = 0;                    // 0: all hardware threads
  std::filesystem::path save_calibration;  // where to keep the calibration file (optional)
};

// Called from worker threads (serialized by the evaluation): stage name, units done, total.
using ProgressFn = std::function<void(const std::string& stage, int64_t done, int64_t total)>;

struct NeedleCell {
  bool kept = false;       // the needle is the single highest-scoring token
  double mass = 0.0;       // its attention probability
  double mass_ratio = 0.0; // mass / bf16 mass
  double margin = 0.0;     // needle logit minus the best other logit (negative: lost)
};

// One needle layer's grid for one mode: cells[length_index * depths + depth_index].
struct NeedleGrid {
  int layer = 0;
  std::vector<NeedleCell> cells;
};

// One pipeline needle cell (a context length and depth, one record format).
struct PipelineCell {
  bool selected = false;    // the needle is among the indexer's top-k of its row
  bool top = false;         // ... and has the highest attention score in every head
  double mass = 0.0;        // its attention probability, mean over the heads (0 when not selected)
  double mass_ratio = 0.0;  // mass / bf16 mass (0 when bf16's is 0)
};

// A pipeline needle grid of one record format: cells[length_index * depths + depth_index].
struct PipelineGrid {
  std::vector<PipelineCell> cells;
  int selected = 0;             // cells whose needle was selected
  int top = 0;                  // ... and had the top attention weight
  double min_mass_ratio = 0.0;  // over the cells where bf16 selected the needle
  std::string route;            // the attention route (verifier grid: decode or extend, and why)
};

// The selection of one context length (the same for every record format: the indexer reads its
// own key cache), means over the query rows.
struct SelectionStats {
  int64_t length = 0;
  double share[4] = {};        // of the top-k budget per quarter of the context, oldest first
  double exact_share[4] = {};  // the same for the fp32 selection (BF16 keys, fp32 queries, exact top-k)
  double newest_shift = 0.0;   // share[3] - exact_share[3]
  double exact_overlap = 0.0;  // |selection & fp32 selection| / |fp32 selection|
  // The GPU selection against topk_reference over the same (materialized GPU) logits: the
  // seed's measure of a top-k kernel's shift. Negative when not measured (CPU: the reference is
  // that top-k).
  double same_logits_overlap = -1.0;
  double same_logits_newest_shift = 0.0;
};

// The DCP mapping check, through the library's placement (dcp.h: dcp_locate,
// dcp_global_position, dcp_local_length): bijective when every position maps back to itself and
// each rank's local positions are exactly 0..dcp_local_length - 1. Throws Error for a placement
// the library rejects.
struct DcpMappingCheck {
  int64_t positions = 0;
  int ranks = 0;
  int interleave = 0;
  bool bijective = false;
};
DcpMappingCheck check_dcp_mapping(int64_t positions, int ranks, int interleave);

struct ModeResult {
  EvalMode mode;
  std::string identity;     // record identity (static mode names the calibration's SHA-256)
  int record_bytes = 0;     // per token per layer
  int64_t bytes_per_token = 0;                // record_bytes * num_layers (the layer stack)
  std::vector<int64_t> tokens_per_capacity;   // per kCapacityGigabytes entry
  // Latent reconstruction, per layer and summarised.
  std::vector<double> latent_relative_error;  // mean per-token ||x^ - x|| / ||x||
  std::vector<double> latent_snr_db;          // +inf when error-free
  Summary latent_relative_error_summary;
  Summary latent_snr_summary;                 // worst = lowest
  // NVFP4 group scales (empty for other dtypes).
  std::vector<GroupScaleCounts> group_scales;
  GroupScaleCounts group_scales_total;
  // Attention against the bf16 reference, per layer and summarised.
  std::vector<double> attention_relative_error;
  std::vector<double> attention_kld;
  Summary attention_relative_error_summary;
  Summary attention_kld_summary;
  // Magnitude sweep: per magnitude.
  std::vector<double> sweep_relative_error;
  std::vector<double> sweep_lost_scale_fraction;  // NVFP4 group scales subnormal or zero
  // Needle retention: per needle layer.
  std::vector<NeedleGrid> needle;
  int needles_total = 0;
  int needles_kept = 0;
  int needles_lost_where_reference_kept = 0;
  double needle_min_mass_ratio = 0.0;
  double needle_mean_mass_ratio = 0.0;
  // The pipeline's needle grid (one query row per needle), and the same needles through an MTP
  // verifier batch (a cell counts as selected or top when every verifier row of it is).
  PipelineGrid pipeline;
  PipelineGrid verifier;
};

struct EvalReport {
  EvalOptions options;
  std::string workload;                 // description of the workload
  std::string device;                   // where attention ran, and why
  int num_layers = 0;
  std::vector<double> nominal_max_abs;  // per layer
  std::vector<double> layer_max_abs;    // measured on the evaluation sample
  std::vector<double> layer_rms;        // RMS of the latent values (the sweep's magnitude)
  std::vector<double> calibration_max_abs;
  std::filesystem::path calibration_file;  // empty when it was temporary
  std::string calibration_sha256;
  std::vector<ModeResult> modes;
  std::vector<double> sweep_rms;        // magnitudes of the sweep
  int sweep_layer = -1;
  std::string sweep_source;             // which tokens the sweep scales
  double sweep_source_rms = 0.0;        // their latent RMS as drawn (before scaling)
  std::vector<int64_t> sweep_token_indices;        // a dump's tokens the sweep evaluates (empty: synthetic)
  std::vector<int64_t> sweep_calibration_indices;  // and calibrates the static mode on
  std::vector<int> needle_layers;
  std::string needle_source;            // where the needle contexts' distractors come from
  int64_t needle_pool_tokens = 0;       // a dump's evaluation tokens per layer (0: synthetic)
  std::vector<bool> needle_with_replacement;  // per length: drawn from the dump with replacement
  std::vector<int64_t> needle_lengths;
  std::vector<double> needle_depths;
  std::vector<int64_t> pipeline_lengths;
  std::vector<double> pipeline_depths;
  std::vector<int64_t> verifier_lengths;  // the contexts the verifier grid ran for
  std::string pipeline_note;             // where it ran, which contexts and why
  std::vector<SelectionStats> selection;  // per pipeline length
  std::vector<DcpMappingCheck> dcp;
  double seconds = 0.0;
};

// Runs the evaluation; throws Error for invalid options.
EvalReport run_evaluation(const EvalOptions& options, const ProgressFn& progress = {});

// The report as JSON (every number the table shows, and the per-layer data behind it).
// Infinite values (error-free SNR) are written as null.
std::string report_to_json(const EvalReport& report);
// The report as a readable table.
std::string report_to_text(const EvalReport& report);

}  // namespace nvfp4mla::eval
