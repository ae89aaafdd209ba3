// `nvfp4mla eval`: the quality evaluation of every record format and scale mode (the README's
// main job). The work is in the library (nvfp4mla/eval/); this file parses flags, draws the
// progress bar and writes the outputs.
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "commands.h"
#include "nvfp4mla/error.h"
#include "nvfp4mla/eval/evaluation.h"
#include "nvfp4mla/eval/plot.h"
#include "nvfp4mla/safetensors.h"

namespace nvfp4mla::cli {

namespace {

// A one-line progress bar on stderr, redrawn in place on a terminal. Without a terminal
// (logs, CI) it prints one line per stage instead of carriage-return noise.
class ProgressBar {
 public:
  explicit ProgressBar(bool enabled) : enabled_(enabled), tty_(isatty(fileno(stderr)) != 0) {}
  ~ProgressBar() { finish_line(); }
  // Ends the bar's line so what follows starts on a fresh one.
  void done() { finish_line(); }
  void update(const std::string& stage, int64_t done, int64_t total) {
    if (!enabled_) return;
    if (stage != stage_) {
      finish_line();
      stage_ = stage;
      if (!tty_) std::fprintf(stderr, "nvfp4mla eval: %s ...\n", stage.c_str());
    }
    if (!tty_) return;
    const auto now = std::chrono::steady_clock::now();
    if (done < total && now - last_draw_ < std::chrono::milliseconds(100)) return;
    last_draw_ = now;
    constexpr int kWidth = 30;
    const double f = total > 0 ? static_cast<double>(done) / static_cast<double>(total) : 1.0;
    const int filled = static_cast<int>(f * kWidth);
    std::string bar(static_cast<size_t>(filled), '#');
    bar.resize(kWidth, '.');
    std::fprintf(stderr, "\r%-24s [%s] %3d%% (%lld/%lld)", stage.c_str(), bar.c_str(), static_cast<int>(f * 100.0),
                 static_cast<long long>(done), static_cast<long long>(total));
    std::fflush(stderr);
    drawn_ = true;
  }

 private:
  void finish_line() {
    if (drawn_) std::fprintf(stderr, "\n");
    drawn_ = false;
  }
  bool enabled_, tty_;
  bool drawn_ = false;
  std::string stage_;
  std::chrono::steady_clock::time_point last_draw_{};
};

// Atomically: a failed write reports its errno and leaves neither the file nor a temporary.
void write_text_file(const std::filesystem::path& path, const std::string& text) {
  write_file_atomic(path, text.data(), text.size());
}

struct EvalFlags {
  eval::EvalOptions options;
  std::string json_path;
  std::string plot_dir;
  std::string device = "auto";
  std::string sections;  // empty: every section
  std::string needle_layers, needle_lengths, needle_depths, modes, pipeline_lengths;
  bool no_progress = false;
};

std::vector<std::string> split_list(const std::string& s) {
  std::vector<std::string> out;
  std::string cur;
  for (char c : s + ",") {
    if (c == ',') {
      if (!cur.empty()) out.push_back(cur);
      cur.clear();
    } else if (c != ' ') {
      cur.push_back(c);
    }
  }
  return out;
}

// "4096", "64k", "1M" (k = 1024, M = 1048576).
int64_t parse_length(const std::string& s) {
  size_t used = 0;
  long long v = 0;
  try {
    v = std::stoll(s, &used);
  } catch (const std::exception&) {
    throw Error("invalid context length '" + s + "': use a token count such as 4096, 64k or 1M");
  }
  const std::string suffix = s.substr(used);
  long long unit = 1;
  if (suffix == "k" || suffix == "K") unit = 1024;
  else if (suffix == "m" || suffix == "M") unit = 1024 * 1024;
  else if (!suffix.empty()) throw Error("invalid context length '" + s + "': use a token count such as 4096, 64k or 1M");
  if (v < 0) throw Error("invalid context length '" + s + "': it is negative; use a token count such as 4096, 64k or 1M");
  if (__builtin_mul_overflow(v, unit, &v)) throw Error("invalid context length '" + s + "': it is too large");
  return v;
}

double parse_number(const std::string& s, const std::string& what) {
  size_t used = 0;
  double v = 0;
  try {
    v = std::stod(s, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used != s.size()) throw Error("invalid " + what + " '" + s + "'");
  return v;
}

// Applies the list-valued and named flags to the options.
void apply_flags(EvalFlags& f) {
  eval::EvalOptions& o = f.options;
  o.device = eval::parse_device(f.device);
  o.latent = o.attention.enabled = o.sweep.enabled = o.needle.enabled = o.pipeline.enabled = false;
  const std::string sections = f.sections.empty() ? "latent,attention,sweep,needle,pipeline" : f.sections;
  for (const std::string& s : split_list(sections)) {
    if (s == "latent") o.latent = true;
    else if (s == "attention") o.attention.enabled = true;
    else if (s == "sweep") o.sweep.enabled = true;
    else if (s == "needle") o.needle.enabled = true;
    else if (s == "pipeline") o.pipeline.enabled = true;
    else throw Error("unknown section '" + s + "' in --sections: use latent, attention, sweep, needle, pipeline");
  }
  o.modes = split_list(f.modes);
  if (!f.needle_layers.empty()) {
    o.needle.layers.clear();
    for (const std::string& s : split_list(f.needle_layers)) {
      const double layer = parse_number(s, "needle layer");
      if (layer != std::floor(layer) || layer < 0 || layer > 1e6) throw Error("invalid needle layer '" + s + "': use a layer index");
      o.needle.layers.push_back(static_cast<int>(layer));
    }
  }
  if (!f.needle_lengths.empty()) {
    o.needle.lengths.clear();
    for (const std::string& s : split_list(f.needle_lengths)) o.needle.lengths.push_back(parse_length(s));
  }
  if (!f.pipeline_lengths.empty()) {
    o.pipeline.lengths.clear();
    for (const std::string& s : split_list(f.pipeline_lengths)) o.pipeline.lengths.push_back(parse_length(s));
  }
  if (!f.needle_depths.empty()) {
    o.needle.depths.clear();
    for (const std::string& s : split_list(f.needle_depths)) o.needle.depths.push_back(parse_number(s, "needle depth") / 100.0);
  }
}

}  // namespace

void add_eval_command(CLI::App& app) {
  auto flags = std::make_shared<EvalFlags>();
  auto* cmd = app.add_subcommand("eval",
                                 "Quality evaluation of every record format and scale mode on the embedded synthetic "
                                 "GLM-5.2-like workload or your own dump: capacity, latent error, group-scale health, attention "
                                 "error and KL divergence, magnitude sweep, needle retention, and the whole DSA pipeline (indexer, "
                                 "exact top-k, sparse attention) with needles to 1M tokens and its selection distribution");
  cmd->add_option("--seed", flags->options.seed, "Workload seed (deterministic)")->capture_default_str();
  cmd->add_option("--tokens-per-layer", flags->options.tokens_per_layer, "Evaluation tokens per layer")
      ->capture_default_str();
  cmd->add_option("--calibration-tokens", flags->options.calibration_tokens,
                  "Tokens per layer of the separate calibration sample (static mode)")
      ->capture_default_str();
  cmd->add_option("--threads", flags->options.threads, "Worker threads (0: all hardware threads)")->capture_default_str();
  cmd->add_option("--save-calibration", flags->options.save_calibration,
                  "Keep the out-of-sample calibration file the static modes used");
  cmd->add_option("--modes", flags->modes,
                  "Evaluate only these modes, comma-separated: fp8_ds_mla_656, nvfp4_432_implicit, nvfp4_432_static, "
                  "nvfp4_368_implicit, nvfp4_368_static, nvfp4_368_dynamic (default: all); the bf16_1152 reference is "
                  "always included");
  cmd->add_option("--sections", flags->sections,
                  "Which parts to run: latent,attention,sweep,needle,pipeline (default: all)");
  cmd->add_option("--dump", flags->options.dump,
                  "Evaluate your own activations instead of the synthetic model: a safetensors file with "
                  "layers.<i>.kv_c [tokens, 512], layers.<i>.k_pe [tokens, 64] and optional layers.<i>.q "
                  "[rows, heads, 576] (BF16, F16 or F32), and optional DSA indexer tensors layers.<i>.index_k "
                  "[tokens, 128], layers.<i>.index_q [rows, heads, 128], layers.<i>.index_w [rows, heads] for the "
                  "pipeline section's selection report; the first half of the tokens calibrates the static mode, "
                  "the second half is evaluated (the sweep scales tokens of its middle layer, the needle contexts are "
                  "drawn from its tokens)")
      ->check(CLI::ExistingFile);
  cmd->add_option("--context", flags->options.attention.context, "Attention: context tokens per layer the top-k is selected from")
      ->capture_default_str();
  cmd->add_option("--topk", flags->options.attention.topk, "Attention and needle: tokens each query attends over")
      ->capture_default_str();
  cmd->add_option("--query-rows", flags->options.attention.rows, "Attention: query rows per layer")->capture_default_str();
  cmd->add_option("--heads", flags->options.attention.heads, "Attention: heads per query row")->capture_default_str();
  cmd->add_option("--sweep-tokens", flags->options.sweep.tokens, "Magnitude sweep: tokens scaled to every magnitude")
      ->capture_default_str();
  cmd->add_option("--needle-layers", flags->needle_layers,
                  "Needle: layers, comma-separated (default: first, quartiles, last: 0,19,39,58,77)");
  cmd->add_option("--needle-lengths", flags->needle_lengths, "Needle: context lengths, e.g. 4k,16k,64k (default)");
  cmd->add_option("--needle-depths", flags->needle_depths,
                  "Needle and pipeline grids: depths in percent, e.g. 0,50,100 (default 0,10,..,100)");
  cmd->add_option("--pipeline-lengths", flags->pipeline_lengths,
                  "DSA pipeline: context lengths, e.g. 16k,64k (default: 16k,64k,128k,256k,350000,475000,1M on CUDA; "
                  "16k,64k on the CPU)");
  auto& pw = flags->options.pipeline.workload;
  cmd->add_option("--pipeline-topk", flags->options.pipeline.topk, "DSA pipeline: tokens the indexer selects per row")
      ->capture_default_str();
  cmd->add_option("--verifier-width", flags->options.pipeline.verifier_width,
                  "DSA pipeline: query rows per request of the MTP verifier grid (0 or 1: none; on the CPU only for "
                  "contexts up to 16k)")
      ->capture_default_str();
  cmd->add_option("--pipeline-layer", pw.layer, "DSA pipeline: the synthetic layer whose latents it uses (-1: the middle one)")
      ->capture_default_str();
  cmd->add_option("--pipeline-heads", pw.heads, "DSA pipeline: attention heads per query row")->capture_default_str();
  cmd->add_option("--index-heads", pw.index_heads, "DSA pipeline: indexer heads (1..64)")->capture_default_str();
  cmd->add_option("--index-margin", pw.index_margin,
                  "DSA pipeline: the needle's indexer lift over the bulk, in standard deviations (before recency)")
      ->capture_default_str();
  cmd->add_option("--index-recency", pw.recency, "DSA pipeline: the indexer's lift of the newest token over old ones")
      ->capture_default_str();
  cmd->add_option("--device", flags->device, "Where attention runs: cpu, cuda or auto (auto uses CUDA when available)")
      ->capture_default_str();
  cmd->add_option("--json", flags->json_path, "Write the full report (every number, per layer) as JSON");
  cmd->add_option("--plot", flags->plot_dir, "Write PNG figures into this folder (created if missing)");
  cmd->add_flag("--no-progress", flags->no_progress, "Do not draw the progress bar on stderr");
  cmd->callback([flags] {
    apply_flags(*flags);
    if (!flags->plot_dir.empty() && !eval::plotting_available())
      throw Error("--plot needs PNG support, which this build lacks: install cairo (libcairo2-dev, see "
                  "scripts/install-deps.sh), then reconfigure and rebuild");
    ProgressBar bar(!flags->no_progress);
    const eval::EvalReport report =
        eval::run_evaluation(flags->options, [&bar](const std::string& stage, int64_t done, int64_t total) {
          bar.update(stage, done, total);
        });
    bar.done();
    if (!flags->json_path.empty()) write_text_file(flags->json_path, eval::report_to_json(report));
    std::vector<std::filesystem::path> figures;
    if (!flags->plot_dir.empty()) figures = eval::write_plots(report, flags->plot_dir);
    std::fputs(eval::report_to_text(report).c_str(), stdout);
    if (!flags->json_path.empty()) std::printf("  JSON report: %s\n", flags->json_path.c_str());
    for (const auto& f : figures) std::printf("  figure: %s\n", f.string().c_str());
  });
}

}  // namespace nvfp4mla::cli
