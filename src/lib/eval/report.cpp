// The evaluation report as JSON and as a readable table. Both are written from the same
// EvalReport, so every number the table shows is in the JSON.
#include <cmath>
#include <cstdarg>
#include <cstdio>
#include <nlohmann/json.hpp>

#include "nvfp4mla/eval/evaluation.h"

namespace nvfp4mla::eval {

namespace {

using ojson = nlohmann::ordered_json;

std::string printf_string(const char* fmt, ...) {
  char buf[512];
  va_list ap;
  va_start(ap, fmt);
  std::vsnprintf(buf, sizeof buf, fmt, ap);
  va_end(ap);
  return buf;
}

// 1234567 -> "1,234,567"
std::string grouped(int64_t v) {
  std::string digits = std::to_string(v < 0 ? -v : v), out;
  for (size_t i = 0; i < digits.size(); ++i) {
    if (i && (digits.size() - i) % 3 == 0) out.push_back(',');
    out.push_back(digits[i]);
  }
  return v < 0 ? "-" + out : out;
}

// Three significant digits; "0" for zero, "inf" for an infinite value.
std::string sig3(double v) {
  if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
  if (std::isnan(v)) return "n/a";
  if (v == 0.0) return "0";
  return printf_string("%.3g", v);
}

std::string db1(double v) {
  if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
  return printf_string("%.1f", v);
}

// Share in percent with three significant digits, so rare events (a few clipped groups in
// millions) still show.
std::string percent(int64_t part, int64_t whole) {
  if (whole == 0) return "-";
  if (part == 0) return "0";
  return printf_string("%.3g%%", 100.0 * static_cast<double>(part) / static_cast<double>(whole));
}

ojson summary_json(const Summary& s) {
  return ojson{{"mean", s.mean}, {"worst", s.worst}, {"worst_layer", s.worst_layer}};
}

ojson group_counts_json(const GroupScaleCounts& g) {
  return ojson{{"groups", g.groups}, {"subnormal", g.subnormal}, {"zero", g.zero}, {"saturated", g.saturated}};
}

ojson per_layer_counts_json(const std::vector<GroupScaleCounts>& v) {
  ojson groups = ojson::array(), sub = ojson::array(), zero = ojson::array(), sat = ojson::array();
  for (const auto& g : v) {
    groups.push_back(g.groups);
    sub.push_back(g.subnormal);
    zero.push_back(g.zero);
    sat.push_back(g.saturated);
  }
  return ojson{{"groups", groups}, {"subnormal", sub}, {"zero", zero}, {"saturated", sat}};
}

ojson shape_json(const WorkloadShape& s) {
  return ojson{{"num_layers", s.num_layers},           {"shallow_max_abs", s.shallow_max_abs},
               {"deep_max_abs", s.deep_max_abs},       {"token_sigma", s.token_sigma},
               {"channel_sigma", s.channel_sigma},     {"outlier_channels", s.outlier_channels},
               {"outlier_min", s.outlier_min},         {"outlier_max", s.outlier_max},
               {"rope_base", s.rope_base}};
}

}  // namespace

std::string report_to_json(const EvalReport& r) {
  ojson doc;
  doc["tool"] = "nvfp4mla eval";
  doc["report_version"] = 1;
  doc["seconds"] = r.seconds;
  ojson wl;
  wl["description"] = r.workload;
  wl["seed"] = r.options.seed;
  wl["shape"] = shape_json(r.options.shape);
  wl["tokens_per_layer"] = r.options.tokens_per_layer;
  wl["calibration_tokens"] = r.options.calibration_tokens;
  wl["nominal_max_abs"] = r.nominal_max_abs;
  wl["layer_max_abs"] = r.layer_max_abs;
  wl["calibration_max_abs"] = r.calibration_max_abs;
  wl["calibration_file"] = r.calibration_file.empty() ? ojson(nullptr) : ojson(r.calibration_file.string());
  wl["calibration_sha256"] = r.calibration_sha256;
  doc["workload"] = wl;
  doc["capacity"] = ojson{
      {"definition", "tokens = floor(cache_bytes / (record_bytes * num_layers)): one record per token in every "
                     "layer of the stack; GB = 1e9 bytes; the DSA indexer keys are not included"},
      {"gigabytes", ojson(std::vector<double>(std::begin(kCapacityGigabytes), std::end(kCapacityGigabytes)))},
      {"num_layers", r.num_layers}};
  doc["definitions"] = ojson{
      {"latent_relative_error", "mean over tokens of ||x^ - x|| / ||x|| against the BF16 input, per layer"},
      {"latent_snr_db", "10 log10(sum ||x||^2 / sum ||x^ - x||^2) per layer; null = error-free (infinite)"},
      {"group_scales", "NVFP4 E4M3 group-scale bytes that are subnormal, zero, or saturated with clipped values"}};
  ojson modes = ojson::array();
  for (const ModeResult& m : r.modes) {
    ojson j;
    j["label"] = m.mode.label;
    j["key"] = m.mode.key;
    j["identity"] = m.identity;
    j["record_bytes"] = m.record_bytes;
    j["bytes_per_token"] = m.bytes_per_token;
    ojson cap = ojson::object();
    for (size_t i = 0; i < m.tokens_per_capacity.size(); ++i)
      cap[printf_string("tokens_per_%.0f_gb", kCapacityGigabytes[i])] = m.tokens_per_capacity[i];
    j["capacity"] = cap;
    j["latent"] = ojson{{"relative_error", summary_json(m.latent_relative_error_summary)},
                        {"snr_db", summary_json(m.latent_snr_summary)},
                        {"per_layer", ojson{{"relative_error", m.latent_relative_error}, {"snr_db", m.latent_snr_db}}}};
    if (m.mode.is_nvfp4())
      j["group_scales"] = ojson{{"total", group_counts_json(m.group_scales_total)},
                                {"per_layer", per_layer_counts_json(m.group_scales)}};
    else
      j["group_scales"] = nullptr;
    modes.push_back(j);
  }
  doc["modes"] = modes;
  return doc.dump(2) + "\n";
}

std::string report_to_text(const EvalReport& r) {
  std::string s;
  auto line = [&](const std::string& x) { s += x + "\n"; };
  line("nvfp4mla eval: " + r.workload);
  line(printf_string("  %d layers; %s evaluation tokens per layer; static mode calibrated on a separate sample of %s "
                     "tokens per layer (out of sample)",
                     r.num_layers, grouped(r.options.tokens_per_layer).c_str(), grouped(r.options.calibration_tokens).c_str()));
  if (!r.layer_max_abs.empty())
    line(printf_string("  measured max |kv_c| per layer: %s (layer 0) .. %s (layer %d)", sig3(r.layer_max_abs.front()).c_str(),
                       sig3(r.layer_max_abs.back()).c_str(), r.num_layers - 1));
  line("");
  line("Capacity and latent reconstruction");
  line(printf_string("  %-20s %7s %9s %13s %13s %9s %9s %4s %7s %7s %4s %10s %10s %10s", "format / scale", "B/tok",
                     "B/tok", "tokens in", "tokens in", "rel.err", "rel.err", "", "SNR dB", "SNR dB", "", "subnormal",
                     "zero", "saturated"));
  line(printf_string("  %-20s %7s %9s %13s %13s %9s %9s %4s %7s %7s %4s %10s %10s %10s", "", "/layer",
                     printf_string("x%d", r.num_layers).c_str(), "80 GB", "141 GB", "mean", "worst", "(L)", "mean",
                     "worst", "(L)", "scales", "scales", "groups"));
  for (const ModeResult& m : r.modes) {
    const auto& e = m.latent_relative_error_summary;
    const auto& q = m.latent_snr_summary;
    const auto& g = m.group_scales_total;
    const bool nv = m.mode.is_nvfp4();
    line(printf_string("  %-20s %7d %9s %13s %13s %9s %9s %4d %7s %7s %4d %10s %10s %10s", m.mode.label.c_str(),
                       m.record_bytes, grouped(m.bytes_per_token).c_str(), grouped(m.tokens_per_capacity[0]).c_str(),
                       grouped(m.tokens_per_capacity[1]).c_str(), sig3(e.mean).c_str(), sig3(e.worst).c_str(),
                       e.worst_layer, db1(q.mean).c_str(), db1(q.worst).c_str(), q.worst_layer,
                       nv ? percent(g.subnormal, g.groups).c_str() : "-", nv ? percent(g.zero, g.groups).c_str() : "-",
                       nv ? percent(g.saturated, g.groups).c_str() : "-"));
  }
  line("");
  line("  B/tok x" + std::to_string(r.num_layers) +
       ": bytes one token occupies in the whole layer stack (record bytes x layers). tokens in N GB = "
       "floor(N * 1e9 / that); GB = 1e9 bytes; the DSA indexer keys are not included.");
  line("  rel.err: mean over tokens of ||x^ - x|| / ||x||, mean over layers and worst layer (L). SNR: 10 log10(signal / "
       "error power) per layer.");
  line("  group scales: share of NVFP4 E4M3 group scales that are subnormal or zero (precision lost), and groups "
       "saturated at 448 with clipped values.");
  if (!r.calibration_file.empty()) line("  calibration written to " + r.calibration_file.string());
  line(printf_string("  (%.1f s)", r.seconds));
  return s;
}

}  // namespace nvfp4mla::eval
