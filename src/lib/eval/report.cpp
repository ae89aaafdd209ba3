// The evaluation report as JSON and as a readable table. Both are written from the same
// EvalReport, so every number the table shows is in the JSON.
#include <algorithm>
#include <cmath>
#include <cstdarg>
#include <cstdio>
#include <functional>
#include <nlohmann/json.hpp>
#include <utility>

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

// `text` broken at spaces into lines of at most ~110 characters; continuation lines indented
// two more than `indent`.
std::string wrapped(const std::string& text, const std::string& indent) {
  constexpr size_t kWidth = 110;
  std::string out, line = indent;
  size_t i = 0;
  while (i < text.size()) {
    const size_t end = std::min(text.find(' ', i), text.size());
    const std::string word = text.substr(i, end - i);
    if (line.size() > indent.size() + 2 && line.size() + 1 + word.size() > kWidth) {
      out += line + "\n";
      line = indent + "  ";
    } else if (line.size() > indent.size() && line.back() != ' ') {
      line += ' ';
    }
    line += word;
    i = end + 1;
  }
  return out + line + "\n";
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

void append_attention_text(const EvalReport& r, std::string& s) {
  const AttentionOptions& a = r.options.attention;
  if (!a.enabled || r.modes.empty()) return;
  s += "\n" + printf_string("Attention vs bf16: top-%d of %s-token contexts, %d query rows x %d heads per layer\n", a.topk,
                            grouped(a.context).c_str(), a.rows, a.heads);
  s += printf_string("  %-20s %10s %10s %4s %10s %10s %4s\n", "format / scale", "out err", "out err", "", "KLD", "KLD", "");
  s += printf_string("  %-20s %10s %10s %4s %10s %10s %4s\n", "", "mean", "worst", "(L)", "mean", "worst", "(L)");
  for (const ModeResult& m : r.modes) {
    const auto& e = m.attention_relative_error_summary;
    const auto& k = m.attention_kld_summary;
    s += printf_string("  %-20s %10s %10s %4d %10s %10s %4d\n", m.mode.label.c_str(), sig3(e.mean).c_str(),
                       sig3(e.worst).c_str(), e.worst_layer, sig3(k.mean).c_str(), sig3(k.worst).c_str(), k.worst_layer);
  }
  s += "  out err: ||o - o_bf16|| / ||o_bf16||; KLD: KL(P_bf16 || P) in nats over the selected tokens; both the mean\n"
       "  over rows x heads, then the mean over layers and the worst layer (L).\n";
}

void append_sweep_text(const EvalReport& r, std::string& s) {
  if (r.sweep_rms.empty() || r.modes.empty()) return;
  // The decade points (every magnitude is in the JSON and the plot).
  std::vector<size_t> cols;
  for (size_t i = 0; i < r.sweep_rms.size(); ++i) {
    const double e = std::log10(r.sweep_rms[i]);
    if (std::fabs(e - std::round(e)) < 1e-9 || i + 1 == r.sweep_rms.size()) cols.push_back(i);
  }
  s += "\n" + wrapped("Magnitude sweep: latent relative error of " + r.sweep_source + " scaled to latent RMS", "");
  if (!r.sweep_token_indices.empty()) s += "  (their latent RMS as dumped: " + sig3(r.sweep_source_rms) + ")\n";
  s += printf_string("  %-20s", "format / scale");
  for (size_t c : cols) s += printf_string(" %9s", sig3(r.sweep_rms[c]).c_str());
  s += "\n";
  for (const ModeResult& m : r.modes) {
    s += printf_string("  %-20s", m.mode.label.c_str());
    for (size_t c : cols) s += printf_string(" %9s", sig3(m.sweep_relative_error[c]).c_str());
    s += "\n";
  }
  if (!r.layer_rms.empty())
    s += printf_string("  (the workload's layers have latent RMS %s (layer 0) .. %s (layer %d))\n", sig3(r.layer_rms.front()).c_str(),
                       sig3(r.layer_rms.back()).c_str(), r.num_layers - 1);
}

void append_needle_text(const EvalReport& r, std::string& s) {
  if (r.needle_layers.empty() || r.modes.empty()) return;
  const size_t depths = r.needle_depths.size();
  s += "\n" + printf_string("Needle retention: %zu layers x %zu context lengths x %zu depths; top-%d selection by exact logits\n",
                            r.needle_layers.size(), r.needle_lengths.size(), depths, r.options.attention.topk);
  if (r.needle_pool_tokens > 0) s += wrapped(r.needle_source, "  ");
  s += printf_string("  %-20s %9s %12s %11s %11s\n", "format / scale", "kept", "lost where", "mass ratio", "mass ratio");
  s += printf_string("  %-20s %9s %12s %11s %11s\n", "", "", "bf16 kept", "mean", "min");
  for (const ModeResult& m : r.modes)
    s += printf_string("  %-20s %9s %12d %11s %11s\n", m.mode.label.c_str(),
                       printf_string("%d/%d", m.needles_kept, m.needles_total).c_str(), m.needles_lost_where_reference_kept,
                       sig3(m.needle_mean_mass_ratio).c_str(), sig3(m.needle_min_mass_ratio).c_str());
  std::string depth_list;
  for (double d : r.needle_depths) depth_list += (depth_list.empty() ? "" : " ") + printf_string("%g", 100.0 * d);
  s += "  Grids: one character per depth (" + depth_list + " %), per context length: '#' the needle stays the top-scoring\n"
       "  token, '.' it does not.\n";
  // Layers where every mode keeps every needle are listed once instead of as grids.
  std::string all_kept;
  for (size_t g = 0; g < r.needle_layers.size(); ++g) {
    bool every = true;
    for (const ModeResult& m : r.modes)
      for (const NeedleCell& c : m.needle[g].cells) every = every && c.kept;
    if (every) {
      all_kept += (all_kept.empty() ? "" : ", ") + std::to_string(r.needle_layers[g]);
      continue;
    }
    s += printf_string("  layer %d (max |kv_c| ~%s)", r.needle_layers[g],
                       sig3(r.nominal_max_abs[static_cast<size_t>(r.needle_layers[g])]).c_str());
    s += "\n" + printf_string("    %-20s", "");
    for (int64_t len : r.needle_lengths) s += printf_string(" %*s", static_cast<int>(std::max<size_t>(depths, 7)), grouped(len).c_str());
    s += "\n";
    for (const ModeResult& m : r.modes) {
      s += printf_string("    %-20s", m.mode.label.c_str());
      for (size_t li = 0; li < r.needle_lengths.size(); ++li) {
        std::string row;
        for (size_t di = 0; di < depths; ++di) row += m.needle[g].cells[li * depths + di].kept ? '#' : '.';
        s += printf_string(" %*s", static_cast<int>(std::max<size_t>(depths, 7)), row.c_str());
      }
      s += "\n";
    }
  }
  if (!all_kept.empty())
    s += "  layer" + std::string(all_kept.find(',') == std::string::npos ? " " : "s ") + all_kept +
         ": every mode keeps every needle (the attention mass it keeps is in the JSON and the figures)\n";
}

void append_pipeline_grid(const EvalReport& r, std::string& s);

// Named [length][depth] arrays of a grid's cells, one per field, appended to `out`.
template <class Cell>
void cell_arrays(ojson& out, const std::vector<Cell>& cells, size_t lengths, size_t depths,
                 const std::vector<std::pair<const char*, std::function<ojson(const Cell&)>>>& fields) {
  for (const auto& [name, field] : fields) {
    ojson rows = ojson::array();
    for (size_t li = 0; li < lengths; ++li) {
      ojson row = ojson::array();
      for (size_t di = 0; di < depths; ++di) row.push_back(field(cells[li * depths + di]));
      rows.push_back(row);
    }
    out[name] = rows;
  }
}

// A pipeline grid as JSON: per length, per depth.
ojson grid_json(const PipelineGrid& g, const std::vector<int64_t>& lengths, size_t depths) {
  ojson out{{"lengths", lengths}, {"route", g.route.empty() ? ojson(nullptr) : ojson(g.route)},
            {"selected_total", g.selected}, {"top_total", g.top}, {"min_mass_ratio", g.min_mass_ratio}};
  cell_arrays<PipelineCell>(out, g.cells, lengths.size(), depths,
                            {{"selected", [](const PipelineCell& c) { return ojson(c.selected); }},
                             {"top", [](const PipelineCell& c) { return ojson(c.top); }},
                             {"mass", [](const PipelineCell& c) { return ojson(c.mass); }},
                             {"mass_ratio", [](const PipelineCell& c) { return ojson(c.mass_ratio); }}});
  return out;
}
void append_selection_text(const EvalReport& r, std::string& s);

void append_pipeline_text(const EvalReport& r, std::string& s) {
  if (r.pipeline_note.empty() || r.modes.empty()) return;
  const PipelineOptions& o = r.options.pipeline;
  s += "\nDSA pipeline: index keys (FP8) -> indexer logits -> exact top-" + std::to_string(o.topk) +
       " -> sparse attention over the records, every format\n";
  s += wrapped(r.pipeline_note, "  ");
  if (!r.pipeline_lengths.empty()) append_pipeline_grid(r, s);
  if (!r.selection.empty()) append_selection_text(r, s);
  for (const DcpMappingCheck& d : r.dcp)
    s += printf_string("  DCP%d mapping (interleave %d): global <-> (rank, local) %s through %s positions\n", d.ranks, d.interleave,
                       d.bijective ? "bijective" : "NOT bijective", grouped(d.positions).c_str());
}

// One pipeline grid per mode (`grid` picks it) over `lengths`.
void append_grid(const EvalReport& r, const std::vector<int64_t>& lengths, PipelineGrid ModeResult::*grid, std::string& s) {
  const size_t depths = r.pipeline_depths.size();
  s += printf_string("  %-20s %10s %10s %11s\n", "format / scale", "selected", "top", "mass ratio");
  s += printf_string("  %-20s %10s %10s %11s\n", "", "", "weight", "min");
  for (const ModeResult& m : r.modes) {
    const PipelineGrid& g = m.*grid;
    const std::string cells = "/" + std::to_string(g.cells.size());
    s += printf_string("  %-20s %10s %10s %11s\n", m.mode.label.c_str(), (std::to_string(g.selected) + cells).c_str(),
                       (std::to_string(g.top) + cells).c_str(), sig3(g.min_mass_ratio).c_str());
  }
  s += printf_string("    %-20s", "");
  for (int64_t len : lengths) s += printf_string(" %*s", static_cast<int>(std::max<size_t>(depths, 9)), grouped(len).c_str());
  s += "\n";
  for (const ModeResult& m : r.modes) {
    s += printf_string("    %-20s", m.mode.label.c_str());
    for (size_t li = 0; li < lengths.size(); ++li) {
      std::string row;
      for (size_t di = 0; di < depths; ++di) {
        const PipelineCell& c = (m.*grid).cells[li * depths + di];
        row += c.top ? '#' : c.selected ? '+' : '.';
      }
      s += printf_string(" %*s", static_cast<int>(std::max<size_t>(depths, 9)), row.c_str());
    }
    s += "\n";
  }
}

void append_pipeline_grid(const EvalReport& r, std::string& s) {
  const PipelineOptions& o = r.options.pipeline;
  std::string lengths;
  for (int64_t l : r.pipeline_lengths) lengths += (lengths.empty() ? "" : ", ") + grouped(l);
  s += printf_string("  contexts %s; %zu depths; one query row per depth, %d heads; indexer %d heads, margin %g, recency %g\n",
                     lengths.c_str(), r.pipeline_depths.size(), o.workload.heads, o.workload.index_heads,
                     o.workload.index_margin, o.workload.recency);
  s += "  Grids: one character per depth, per context: '#' selected and the top attention weight in every head, '+'\n"
       "  selected but not on top, '.' not selected by the indexer.\n";
  append_grid(r, r.pipeline_lengths, &ModeResult::pipeline, s);
  if (r.verifier_lengths.empty()) return;
  s += printf_string("\n  MTP verifier batch: each needle row as a request of %d query rows (the needle within every row's\n"
                     "  context); a cell counts when every row of it does. Routes (serving::decide_route, auto mode):\n",
                     o.verifier_width);
  for (const ModeResult& m : r.modes) s += wrapped(m.mode.label + ": " + m.verifier.route, "    ");
  append_grid(r, r.verifier_lengths, &ModeResult::verifier, s);
}

void append_selection_text(const EvalReport& r, std::string& s) {
  const PipelineOptions& o = r.options.pipeline;
  s += "\nSelection distribution: share of the top-" + std::to_string(o.topk) +
       " budget per quarter of the context (oldest first), mean over the rows;\n"
       "  fp32: the exact top-k of fp32 logits from BF16 keys and fp32 queries; overlap: shared entries / k\n";
  s += printf_string("  %12s %27s %27s %9s %8s %11s\n", "context", "pipeline (FP8 keys)", "fp32 selection", "newest", "overlap",
                     "same logits");
  for (const SelectionStats& st : r.selection) {
    auto quarters = [](const double* q) {
      return printf_string("%5.1f %5.1f %5.1f %5.1f%%", 100 * q[0], 100 * q[1], 100 * q[2], 100 * q[3]);
    };
    const std::string same = st.same_logits_overlap < 0 ? "-" : printf_string("%.4f", st.same_logits_overlap);
    s += printf_string("  %12s %27s %27s %+8.2f%% %8.4f %11s\n", grouped(st.length).c_str(), quarters(st.share).c_str(),
                       quarters(st.exact_share).c_str(), 100 * st.newest_shift, st.exact_overlap, same.c_str());
  }
  s += "  newest: pipeline minus fp32 share of the newest quarter; same logits: overlap with the exact top-k of the\n"
       "  GPU's own logits (1 = the selector is exact; '-' on the CPU, whose selector is that top-k)\n";
}

}  // namespace

std::string report_to_json(const EvalReport& r) {
  ojson doc;
  doc["tool"] = "nvfp4mla eval";
  doc["report_version"] = 1;
  doc["seconds"] = r.seconds;
  ojson wl;
  wl["description"] = r.workload;
  wl["dump"] = r.options.dump.empty() ? ojson(nullptr) : ojson(r.options.dump.string());
  wl["seed"] = r.options.seed;
  wl["shape"] = shape_json(r.options.shape);
  wl["tokens_per_layer"] = r.options.tokens_per_layer;
  wl["calibration_tokens"] = r.options.calibration_tokens;
  wl["nominal_max_abs"] = r.nominal_max_abs;
  wl["layer_max_abs"] = r.layer_max_abs;
  wl["calibration_max_abs"] = r.calibration_max_abs;
  wl["calibration_file"] = r.calibration_file.empty() ? ojson(nullptr) : ojson(r.calibration_file.string());
  wl["calibration_sha256"] = r.calibration_sha256;
  wl["layer_rms"] = r.layer_rms;
  doc["workload"] = wl;
  doc["device"] = r.device;
  const AttentionOptions& ao = r.options.attention;
  doc["attention"] = ao.enabled ? ojson{{"context", ao.context}, {"topk", ao.topk}, {"rows", ao.rows}, {"heads", ao.heads},
                                        {"relevant_per_row", ao.relevant_per_row}, {"relevant_per_head", ao.relevant_per_head},
                                        {"peak_logit", ao.peak_logit}, {"rope_logit_std", ao.rope_logit_std}}
                                : ojson(nullptr);
  const auto or_null = [&r](const auto& v) { return r.options.dump.empty() ? ojson(nullptr) : ojson(v); };
  doc["sweep"] = r.options.sweep.enabled
                     ? ojson{{"layer", r.sweep_layer},
                             {"tokens", r.options.sweep.tokens},
                             {"rms", r.sweep_rms},
                             {"source", r.sweep_source},
                             {"source_rms", r.sweep_source_rms},
                             {"dump_token_indices", or_null(r.sweep_token_indices)},
                             {"dump_calibration_token_indices", or_null(r.sweep_calibration_indices)}}
                     : ojson(nullptr);
  const NeedleOptions& no = r.options.needle;
  doc["needle"] = no.enabled ? ojson{{"layers", r.needle_layers}, {"lengths", r.needle_lengths}, {"depths", r.needle_depths},
                                     {"topk", ao.topk}, {"needle_logit", no.needle_logit},
                                     {"distractor_min", no.distractor_min}, {"distractor_max", no.distractor_max},
                                     {"rope_logit_std", no.rope_logit_std}, {"source", r.needle_source},
                                     {"dump_pool_tokens", or_null(r.needle_pool_tokens)},
                                     {"with_replacement", or_null(r.needle_with_replacement)}}
                             : ojson(nullptr);
  const PipelineOptions& po = r.options.pipeline;
  if (!r.pipeline_note.empty()) {
    ojson sel = ojson::array(), dcp = ojson::array();
    for (const SelectionStats& st : r.selection)
      sel.push_back(ojson{{"length", st.length},
                          {"share", std::vector<double>(st.share, st.share + 4)},
                          {"exact_share", std::vector<double>(st.exact_share, st.exact_share + 4)},
                          {"newest_shift", st.newest_shift},
                          {"exact_overlap", st.exact_overlap},
                          {"same_logits_overlap", st.same_logits_overlap < 0 ? ojson(nullptr) : ojson(st.same_logits_overlap)},
                          {"same_logits_newest_shift", st.same_logits_overlap < 0 ? ojson(nullptr) : ojson(st.same_logits_newest_shift)}});
    for (const DcpMappingCheck& d : r.dcp)
      dcp.push_back(ojson{{"positions", d.positions}, {"ranks", d.ranks}, {"interleave", d.interleave}, {"bijective", d.bijective}});
    const DsaWorkloadOptions& w = po.workload;
    doc["pipeline"] = ojson{{"note", r.pipeline_note},
                            {"lengths", r.pipeline_lengths},
                            {"depths", r.pipeline_depths},
                            {"topk", po.topk},
                            {"verifier_width", po.verifier_width},
                            {"verifier_lengths", r.verifier_lengths},
                            {"workload", ojson{{"layer", w.layer}, {"heads", w.heads}, {"index_heads", w.index_heads},
                                               {"needle_logit", w.needle_logit}, {"index_margin", w.index_margin},
                                               {"index_noise", w.index_noise}, {"recency", w.recency}}},
                            {"selection", sel},
                            {"dcp", dcp}};
  } else {
    doc["pipeline"] = nullptr;
  }
  doc["capacity"] = ojson{
      {"definition", "tokens = floor(cache_bytes / (record_bytes * num_layers)): one record per token in every "
                     "layer of the stack; GB = 1e9 bytes; the DSA indexer keys are not included"},
      {"gigabytes", ojson(std::vector<double>(std::begin(kCapacityGigabytes), std::end(kCapacityGigabytes)))},
      {"num_layers", r.num_layers}};
  doc["definitions"] = ojson{
      {"latent_relative_error", "mean over tokens of ||x^ - x|| / ||x|| against the BF16 input, per layer"},
      {"latent_snr_db", "10 log10(sum ||x||^2 / sum ||x^ - x||^2) per layer; null = error-free (infinite)"},
      {"group_scales", "NVFP4 E4M3 group-scale bytes that are subnormal, zero, or saturated with clipped values"},
      {"attention_relative_error", "mean over query rows x heads of ||o - o_bf16|| / ||o_bf16||, per layer"},
      {"attention_kld", "mean over query rows x heads of KL(P_bf16 || P) in nats over the selected tokens, per layer"},
      {"sweep_relative_error", "latent relative error at each sweep magnitude (RMS of the latent values)"},
      {"needle", "kept: the needle is the single top-scoring token; mass: its attention probability; "
                 "mass_ratio: mass / bf16 mass; margin: needle logit minus the best other (nats)"},
      {"pipeline", "selected: the needle is in its row's indexer top-k (FP8 key cache, exact top-k); top: it has the "
                   "highest attention score over the selected records in every head; mass: its attention probability, "
                   "mean over heads; selection.share: top-k budget per context quarter, oldest first; exact_share: the "
                   "same for the exact top-k of fp32 logits from BF16 keys and fp32 queries"}};
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
    if (!m.attention_relative_error.empty())
      j["attention"] = ojson{{"relative_error", summary_json(m.attention_relative_error_summary)},
                             {"kld", summary_json(m.attention_kld_summary)},
                             {"per_layer", ojson{{"relative_error", m.attention_relative_error}, {"kld", m.attention_kld}}}};
    else
      j["attention"] = nullptr;
    if (!m.sweep_relative_error.empty())
      j["sweep"] = ojson{{"relative_error", m.sweep_relative_error}, {"lost_scale_fraction", m.sweep_lost_scale_fraction}};
    else
      j["sweep"] = nullptr;
    if (!m.needle.empty()) {
      ojson grids = ojson::array();
      const size_t depths = r.needle_depths.size();
      for (const NeedleGrid& g : m.needle) {
        ojson grid{{"layer", g.layer}};
        cell_arrays<NeedleCell>(grid, g.cells, r.needle_lengths.size(), depths,
                                {{"kept", [](const NeedleCell& c) { return ojson(c.kept); }},
                                 {"mass", [](const NeedleCell& c) { return ojson(c.mass); }},
                                 {"mass_ratio", [](const NeedleCell& c) { return ojson(c.mass_ratio); }},
                                 {"margin", [](const NeedleCell& c) { return ojson(c.margin); }}});
        grids.push_back(grid);
      }
      j["needle"] = ojson{{"total", m.needles_total},
                          {"kept", m.needles_kept},
                          {"lost_where_bf16_kept", m.needles_lost_where_reference_kept},
                          {"mean_mass_ratio", m.needle_mean_mass_ratio},
                          {"min_mass_ratio", m.needle_min_mass_ratio},
                          {"grids", grids}};
    } else {
      j["needle"] = nullptr;
    }
    j["pipeline"] = m.pipeline.cells.empty() ? ojson(nullptr) : grid_json(m.pipeline, r.pipeline_lengths, r.pipeline_depths.size());
    j["verifier"] = m.verifier.cells.empty() ? ojson(nullptr) : grid_json(m.verifier, r.verifier_lengths, r.pipeline_depths.size());
    modes.push_back(j);
  }
  doc["modes"] = modes;
  return doc.dump(2) + "\n";
}

std::string report_to_text(const EvalReport& r) {
  std::string s;
  auto line = [&](const std::string& x) { s += x + "\n"; };
  line("nvfp4mla eval: " + r.workload);
  std::string calibrated;
  if (!r.calibration_max_abs.empty())
    calibrated = "; static mode calibrated on a separate sample of " + grouped(r.options.calibration_tokens) +
                 " tokens per layer (out of sample)";
  line(printf_string("  %d layers; %s evaluation tokens per layer%s", r.num_layers, grouped(r.options.tokens_per_layer).c_str(),
                     calibrated.c_str()));
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
  append_attention_text(r, s);
  append_sweep_text(r, s);
  append_needle_text(r, s);
  append_pipeline_text(r, s);
  line("");
  if (r.options.attention.enabled || r.options.needle.enabled) line("  attention ran on: " + r.device);
  if (!r.calibration_file.empty()) line("  calibration written to " + r.calibration_file.string());
  line(printf_string("  (%.1f s)", r.seconds));
  return s;
}

}  // namespace nvfp4mla::eval
