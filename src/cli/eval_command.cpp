// `nvfp4mla eval`: the quality evaluation of every record format and scale mode (the README's
// main job). The work is in the library (nvfp4mla/eval/); this file parses flags, draws the
// progress bar and writes the outputs.
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>

#include "commands.h"
#include "nvfp4mla/error.h"
#include "nvfp4mla/eval/evaluation.h"

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

void write_text_file(const std::filesystem::path& path, const std::string& text) {
  const std::filesystem::path partial = path.string() + ".partial";
  {
    std::ofstream out(partial, std::ios::binary | std::ios::trunc);
    out << text;
    if (!out) throw Error("cannot write '" + partial.string() + "' (does the folder exist and is it writable?)");
  }
  std::error_code ec;
  std::filesystem::rename(partial, path, ec);
  if (ec) {
    std::filesystem::remove(partial, ec);
    throw Error("cannot write '" + path.string() + "': " + ec.message());
  }
}

struct EvalFlags {
  eval::EvalOptions options;
  std::string json_path;
  bool no_progress = false;
};

}  // namespace

void add_eval_command(CLI::App& app) {
  auto flags = std::make_shared<EvalFlags>();
  auto* cmd = app.add_subcommand("eval",
                                 "Quality evaluation of every record format and scale mode on the embedded synthetic "
                                 "GLM-5.2-like workload (capacity, latent error, group-scale health)");
  cmd->add_option("--seed", flags->options.seed, "Workload seed (deterministic)")->capture_default_str();
  cmd->add_option("--tokens-per-layer", flags->options.tokens_per_layer, "Evaluation tokens per layer")
      ->capture_default_str();
  cmd->add_option("--calibration-tokens", flags->options.calibration_tokens,
                  "Tokens per layer of the separate calibration sample (static mode)")
      ->capture_default_str();
  cmd->add_option("--threads", flags->options.threads, "Worker threads (0: all hardware threads)")->capture_default_str();
  cmd->add_option("--save-calibration", flags->options.save_calibration,
                  "Keep the out-of-sample calibration file the static modes used");
  cmd->add_option("--json", flags->json_path, "Write the full report (every number, per layer) as JSON");
  cmd->add_flag("--no-progress", flags->no_progress, "Do not draw the progress bar on stderr");
  cmd->callback([flags] {
    ProgressBar bar(!flags->no_progress);
    const eval::EvalReport report =
        eval::run_evaluation(flags->options, [&bar](const std::string& stage, int64_t done, int64_t total) {
          bar.update(stage, done, total);
        });
    bar.done();
    if (!flags->json_path.empty()) write_text_file(flags->json_path, eval::report_to_json(report));
    std::fputs(eval::report_to_text(report).c_str(), stdout);
    if (!flags->json_path.empty()) std::printf("  JSON report: %s\n", flags->json_path.c_str());
  });
}

}  // namespace nvfp4mla::cli
