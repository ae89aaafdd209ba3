// The evaluation driver: builds the workload, the out-of-sample calibration and the format
// configurations, then measures every mode layer by layer.
#include "nvfp4mla/eval/evaluation.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>
#include <memory>

#include "nvfp4mla/calibration.h"
#include "nvfp4mla/codec.h"
#include "nvfp4mla/error.h"
#include "nvfp4mla/eval/dump.h"
#include "nvfp4mla/record.h"
#include "parallel.h"
#include "stages.h"

namespace nvfp4mla::eval {

namespace {

void require(bool ok, const std::string& message) {
  if (!ok) throw Error(message);
}

// `layers`: the workload's (the dump's or the synthetic model's).
void validate(const EvalOptions& o, int layers) {
  constexpr int64_t kMaxTokens = int64_t{1} << 24;
  require(o.tokens_per_layer >= 1 && o.tokens_per_layer <= kMaxTokens,
          "--tokens-per-layer must be in [1, 16777216], got " + std::to_string(o.tokens_per_layer));
  require(o.calibration_tokens >= 1 && o.calibration_tokens <= kMaxTokens,
          "--calibration-tokens must be in [1, 16777216], got " + std::to_string(o.calibration_tokens));
  require(o.threads >= 0, "--threads must not be negative");
  const AttentionOptions& a = o.attention;
  if (a.enabled || o.needle.enabled) require(a.topk >= 1, "--topk must be at least 1");
  if (a.enabled) {
    require(a.context >= 1 && a.context <= kMaxTokens, "--context must be in [1, 16777216], got " + std::to_string(a.context));
    require(a.rows >= 1 && a.heads >= 1, "--query-rows and --heads must be at least 1");
    require(a.relevant_per_row >= 1 && a.relevant_per_head >= 1, "relevant tokens per row and per head must be at least 1");
  }
  const NeedleOptions& n = o.needle;
  if (n.enabled) {
    require(!n.lengths.empty() && !n.depths.empty(), "--needle-lengths and --needle-depths must not be empty");
    for (int64_t len : n.lengths)
      require(len >= 1 && len <= (int64_t{1} << 27), "needle context lengths must be in [1, 134217728], got " + std::to_string(len));
    for (double d : n.depths) require(d >= 0.0 && d <= 1.0, "needle depths must be within 0..100%");
    for (int l : n.layers)
      require(l >= 0 && l < layers, "needle layer " + std::to_string(l) + " is not a layer of the workload (0.." +
                                        std::to_string(layers - 1) + ")");
    require(n.distractor_min > 0.0 && n.distractor_min <= n.distractor_max && n.distractor_max < 1.0,
            "hard distractor logit fractions must satisfy 0 < min <= max < 1");
  }
  const PipelineOptions& p = o.pipeline;
  if (p.enabled) {
    require(!n.depths.empty(), "--needle-depths must not be empty (the pipeline grid uses them)");
    for (double d : n.depths) require(d >= 0.0 && d <= 1.0, "needle depths must be within 0..100%");
    require(p.topk >= 1 && p.topk <= 4096, "--pipeline-topk must be in [1, 4096], got " + std::to_string(p.topk));
    for (int64_t len : p.lengths)
      require(len >= static_cast<int64_t>(n.depths.size()) && len <= (int64_t{1} << 24),
              "pipeline context lengths must be in [number of depths, 16777216], got " + std::to_string(len));
    require(p.workload.layer < layers, "--pipeline-layer " + std::to_string(p.workload.layer) + " is not a layer of the workload");
    require(p.workload.index_heads >= 1 && p.workload.index_heads <= 64, "--index-heads must be in [1, 64]");
    require(p.workload.heads >= 1, "--pipeline-heads must be at least 1");
    require(p.verifier_width >= 0 && p.verifier_width <= 16, "--verifier-width must be in [0, 16]");
  }
}

// Per mode: how many needles stay on top, how many are lost where bf16 keeps them, and the
// attention mass kept relative to bf16.
void summarize_needles(EvalReport& report) {
  if (report.modes.empty()) return;
  const ModeResult& reference = report.modes.front();
  for (ModeResult& m : report.modes) {
    m.needles_total = m.needles_kept = m.needles_lost_where_reference_kept = 0;
    double sum = 0.0, lowest = std::numeric_limits<double>::infinity();
    for (size_t g = 0; g < m.needle.size(); ++g) {
      for (size_t c = 0; c < m.needle[g].cells.size(); ++c) {
        const NeedleCell& cell = m.needle[g].cells[c];
        ++m.needles_total;
        m.needles_kept += cell.kept;
        m.needles_lost_where_reference_kept += !cell.kept && reference.needle[g].cells[c].kept;
        sum += cell.mass_ratio;
        lowest = std::min(lowest, cell.mass_ratio);
      }
    }
    m.needle_mean_mass_ratio = m.needles_total ? sum / m.needles_total : 0.0;
    m.needle_min_mass_ratio = m.needles_total ? lowest : 0.0;
  }
}

std::vector<int> default_needle_layers(int layers) {
  std::vector<int> v;
  for (int q = 0; q <= 4; ++q) v.push_back(static_cast<int>(std::lround(q * (layers - 1) / 4.0)));
  v.erase(std::unique(v.begin(), v.end()), v.end());
  return v;
}

// The requested modes in report order, the bf16 reference first.
std::vector<EvalMode> selected_modes(const std::vector<std::string>& wanted) {
  const std::vector<EvalMode> all = all_eval_modes();
  if (wanted.empty()) return all;
  for (const std::string& w : wanted) {
    const bool known = std::any_of(all.begin(), all.end(), [&](const EvalMode& m) { return m.key == w || m.label == w; });
    if (!known) {
      std::string keys;
      for (const EvalMode& m : all) keys += (keys.empty() ? "" : ", ") + m.key;
      throw Error("unknown mode '" + w + "' in --modes: use " + keys);
    }
  }
  std::vector<EvalMode> out;
  for (const EvalMode& m : all)
    if (m.is_reference() || std::find_if(wanted.begin(), wanted.end(), [&](const std::string& w) {
                              return m.key == w || m.label == w;
                            }) != wanted.end())
      out.push_back(m);
  return out;
}

// The options a dump is evaluated with: the calibration half's size, the evaluation half
// capped by --tokens-per-layer and --context, rows and heads from the dump's queries.
EvalOptions options_for_dump(const EvalOptions& o, const DumpWorkload& d) {
  EvalOptions out = o;
  const DumpLayer& first = d.layers.front();
  out.calibration_tokens = first.calibration.count;
  out.tokens_per_layer = std::min(o.tokens_per_layer, first.evaluation.count);
  out.attention.context = std::min(o.attention.context, first.evaluation.count);
  out.sweep.tokens = static_cast<int>(std::min<int64_t>(o.sweep.tokens, first.calibration.count));
  if (d.has_queries) {
    out.attention.rows = std::min(o.attention.rows, first.q_rows);
    out.attention.heads = first.q_heads;
  }
  return out;
}

// A layer's queries: the dump's own (its last `rows` query rows: with one query per token, the
// queries of the evaluated tokens' end), or synthesized, correlated with the context.
detail::LayerQueries layer_queries(const SyntheticWorkload& w, const DumpWorkload* dump, int layer, const TokenBlock& ctx,
                                   const AttentionOptions& o) {
  if (!dump) return detail::synthesize_queries(detail::synthetic_layer_model(w, layer), layer, ctx, o);
  const DumpLayer& d = dump->layers[static_cast<size_t>(layer)];
  if (dump->has_queries) {
    require(o.rows >= 1 && o.rows <= d.q_rows, "layer " + std::to_string(layer) + " of the dump has " +
                                                   std::to_string(d.q_rows) + " query rows; " + std::to_string(o.rows) +
                                                   " were asked for");
    const size_t per_row = static_cast<size_t>(d.q_heads) * kQkDim;
    std::vector<uint16_t> q(d.q.end() - static_cast<std::ptrdiff_t>(o.rows * per_row), d.q.end());
    return detail::queries_from_bf16(std::move(q), o.rows, d.q_heads);
  }
  return detail::synthesize_queries(detail::dump_layer_model(d, w.seed()), layer, ctx, o);
}

// Where a dump's needle contexts come from, and which lengths draw with replacement.
void describe_dump_needles(const DumpWorkload& d, EvalReport& report) {
  const int64_t pool = d.layers.front().evaluation.count;
  report.needle_pool_tokens = pool;
  std::string longer;
  for (int64_t len : report.needle_lengths) {
    report.needle_with_replacement.push_back(len > pool);
    if (len > pool) longer += (longer.empty() ? "" : ", ") + std::to_string(len);
  }
  report.needle_source = "distractors from each needle layer's " + std::to_string(pool) +
                         " evaluated dump tokens (a context of n tokens takes the first n" +
                         (longer.empty() ? "" : "; contexts of " + longer + " tokens draw them with replacement") +
                         "); needle, hard distractors and query built as in the synthetic test from the layer's "
                         "calibration-half channel RMS";
}

}  // namespace

EvalReport run_evaluation(const EvalOptions& requested, const ProgressFn& progress) {
  const std::vector<EvalMode> modes = selected_modes(requested.modes);
  const auto start = std::chrono::steady_clock::now();
  // With a dump, its tokens replace the synthetic model's samples in every stage.
  std::unique_ptr<DumpWorkload> dump;
  if (!requested.dump.empty()) dump = std::make_unique<DumpWorkload>(read_dump(requested.dump));
  validate(requested, dump ? dump->num_layers() : requested.shape.num_layers);
  const ResolvedDevice device = resolve_device(requested.device);
  const EvalOptions options = dump ? options_for_dump(requested, *dump) : requested;
  const SyntheticWorkload workload(options.seed, options.shape);
  const int layers = dump ? dump->num_layers() : workload.num_layers();
  const int threads = detail::resolve_threads(options.threads);
  const bool attention = options.attention.enabled;

  EvalReport report;
  report.options = options;
  report.num_layers = layers;
  report.device = device.note;
  report.workload = dump ? dump->describe() : "synthetic GLM-5.2-like model (embedded, seed " + std::to_string(options.seed) + ")";
  for (int l = 0; l < layers; ++l)
    report.nominal_max_abs.push_back(dump ? dump->layers[static_cast<size_t>(l)].max_abs : workload.nominal_max_abs(l));

  // Static mode is calibrated on a separate sample of the same workload (out of sample); the
  // sample is drawn only when a static mode is evaluated.
  const bool any_static = std::any_of(modes.begin(), modes.end(), [](const EvalMode& m) { return m.is_static(); });
  if (!any_static && !options.save_calibration.empty())
    throw Error("--save-calibration keeps the static modes' calibration, but no static mode is evaluated (see --modes)");
  std::vector<float> calibration_max;
  if (any_static) {
    calibration_max.resize(static_cast<size_t>(layers));
    detail::StageProgress stage(progress, "calibration sample", layers);
    detail::parallel_for(layers, threads, [&](int64_t l) {
      calibration_max[static_cast<size_t>(l)] =
          dump ? dump->layers[static_cast<size_t>(l)].calibration.max_abs_kv_c()
               : workload.tokens(static_cast<int>(l), Sample::calibration, 0, 0, options.calibration_tokens).max_abs_kv_c();
      stage.advance();
    });
  }
  report.calibration_max_abs.assign(calibration_max.begin(), calibration_max.end());

  std::vector<FormatConfig> configs;
  {
    std::unique_ptr<detail::CalibrationFile> file;
    if (any_static) file = std::make_unique<detail::CalibrationFile>(Calibration::from_max_abs(calibration_max), options.save_calibration);
    for (const EvalMode& mode : modes) {
      configs.push_back(mode.config(file ? file->path() : std::filesystem::path()));
      ModeResult r;
      r.mode = mode;
      r.identity = configs.back().identity();
      r.record_bytes = configs.back().record_bytes();
      r.bytes_per_token = static_cast<int64_t>(r.record_bytes) * layers;
      for (double gb : kCapacityGigabytes) r.tokens_per_capacity.push_back(tokens_per_cache(gb * kGigabyte, r.record_bytes, layers));
      if (options.latent) {
        r.latent_relative_error.assign(static_cast<size_t>(layers), 0.0);
        r.latent_snr_db.assign(static_cast<size_t>(layers), 0.0);
        if (mode.is_nvfp4()) r.group_scales.assign(static_cast<size_t>(layers), GroupScaleCounts{});
      }
      if (attention) {
        r.attention_relative_error.assign(static_cast<size_t>(layers), 0.0);
        r.attention_kld.assign(static_cast<size_t>(layers), 0.0);
      }
      report.modes.push_back(std::move(r));
    }
    if (file && !file->temporary()) report.calibration_file = file->path();
    for (const FormatConfig& c : configs)
      if (c.calibration()) report.calibration_sha256 = c.calibration()->sha256_hex;
  }

  // Per layer: one evaluation sample serves the latent metrics (its first tokens_per_layer
  // tokens) and the attention context (its first `context` tokens).
  if (options.latent || attention) {
    const int64_t sample = std::max(options.latent ? options.tokens_per_layer : 0, attention ? options.attention.context : 0);
    report.layer_max_abs.assign(static_cast<size_t>(layers), 0.0);
    report.layer_rms.assign(static_cast<size_t>(layers), 0.0);
    detail::StageProgress stage(progress, attention ? "layers (latent+attention)" : "layers (latent)", layers);
    detail::parallel_for(layers, threads, [&](int64_t li) {
      const int l = static_cast<int>(li);
      TokenBlock tokens = dump ? detail::first_tokens(dump->layers[static_cast<size_t>(li)].evaluation, sample) : workload.tokens(l, Sample::evaluation, 0, 0, sample);
      const int64_t latent_count = std::min(sample, options.tokens_per_layer);
      double sum2 = 0.0;
      float amax = 0.0f;
      for (int64_t i = 0; i < latent_count * kLatentDim; ++i) {
        const float x = codec::bf16_decode(tokens.kv_c[static_cast<size_t>(i)]);
        sum2 += static_cast<double>(x) * x;
        amax = std::max(amax, std::fabs(x));
      }
      report.layer_max_abs[li] = amax;
      report.layer_rms[li] = std::sqrt(sum2 / static_cast<double>(latent_count * kLatentDim));
      if (options.latent) {
        for (size_t m = 0; m < configs.size(); ++m) {
          const detail::LatentMeasure r = detail::measure_latent(configs[m], configs[m].layer_scale_for(l), tokens, latent_count);
          ModeResult& mr = report.modes[m];
          mr.latent_relative_error[li] = r.error.mean_relative_error();
          mr.latent_snr_db[li] = r.error.snr_db();
          if (mr.mode.is_nvfp4()) mr.group_scales[li] = r.scales;
        }
      }
      if (attention) {
        tokens.count = std::min(sample, options.attention.context);  // the context: the first `context` tokens
        const detail::LayerAttention a = detail::evaluate_layer_attention(
            l, tokens, layer_queries(workload, dump.get(), l, tokens, options.attention), options.attention.topk, configs,
            device.device);
        for (size_t m = 0; m < configs.size(); ++m) {
          report.modes[m].attention_relative_error[li] = a.relative_error[m];
          report.modes[m].attention_kld[li] = a.kld[m];
        }
      }
      stage.advance();
    });
  }

  if (options.sweep.enabled) {
    const int layer = options.sweep.layer < 0 ? layers / 2 : options.sweep.layer;
    if (layer >= layers) throw Error("--sweep-layer " + std::to_string(layer) + " is not a layer of the workload");
    detail::run_magnitude_sweep(dump ? detail::dump_sweep_source(*dump, layer, options.sweep.tokens)
                                     : detail::synthetic_sweep_source(workload, layer, options.sweep.tokens),
                                options.sweep, report, progress, threads);
  }

  if (options.needle.enabled) {
    report.needle_layers = options.needle.layers.empty() ? default_needle_layers(layers) : options.needle.layers;
    report.needle_lengths = options.needle.lengths;
    report.needle_depths = options.needle.depths;
    if (dump) describe_dump_needles(*dump, report);
    else report.needle_source = "synthetic distractors of the layer";
    const int64_t cells = static_cast<int64_t>(report.needle_layers.size() * report.needle_lengths.size() * report.needle_depths.size());
    detail::StageProgress stage(progress, "needle retention", cells);
    std::vector<std::vector<NeedleGrid>> per_layer(report.needle_layers.size());
    detail::parallel_for(static_cast<int64_t>(per_layer.size()), threads, [&](int64_t i) {
      const int layer = report.needle_layers[static_cast<size_t>(i)];
      per_layer[static_cast<size_t>(i)] = detail::run_needle_layer(
          dump ? detail::dump_needle_source(*dump, layer, options.seed) : detail::synthetic_needle_source(workload, layer), layer,
          options.needle, options.attention.topk, configs, device.device, [&stage] { stage.advance(); });
    });
    for (const auto& grids : per_layer)
      for (size_t m = 0; m < grids.size(); ++m) report.modes[m].needle.push_back(grids[m]);
  }

  if (options.pipeline.enabled)
    detail::run_pipeline_stage(workload, dump.get(), options, configs, device.device, report, progress, threads);

  for (ModeResult& r : report.modes) {
    r.latent_relative_error_summary = summarize(r.latent_relative_error);
    r.latent_snr_summary = summarize(r.latent_snr_db, /*lower_is_worse=*/true);
    for (const GroupScaleCounts& g : r.group_scales) r.group_scales_total.merge(g);
    r.attention_relative_error_summary = summarize(r.attention_relative_error);
    r.attention_kld_summary = summarize(r.attention_kld);
  }
  summarize_needles(report);
  report.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return report;
}

}  // namespace nvfp4mla::eval
