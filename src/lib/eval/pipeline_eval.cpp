// The pipeline stage: the whole DSA decode step (dsa_pipeline.h) on the DSA workload
// (dsa_workload.h). Per context length, one cache per record format holds the ordinary tokens
// with every depth's needle written at once, and one query row per depth looks for its own
// needle: the selection comes from the indexer's FP8 key cache and the exact top-k, the
// attention from the format's records.
#include <algorithm>
#include <cmath>
#include <iterator>
#include <limits>
#include <memory>
#include <numeric>
#include <string>
#include <vector>

#include "nvfp4mla/dsa_pipeline.h"
#include "nvfp4mla/dcp.h"
#include "nvfp4mla/error.h"
#include "nvfp4mla/eval/dsa_workload.h"
#include "nvfp4mla/eval/dump.h"
#include "nvfp4mla/serving/route.h"
#include "nvfp4mla/topk.h"
#include "parallel.h"
#include "stages.h"

#if defined(NVFP4MLA_WITH_CUDA)
#include <cuda_runtime_api.h>

#include "device_bytes.h"
#include "nvfp4mla/cuda/dsa_pipeline.h"
#include "nvfp4mla/cuda/indexer.h"
#include "nvfp4mla/cuda/sparse_decode.h"
#include "nvfp4mla/cuda/sparse_scores.h"
#endif

namespace nvfp4mla::eval {

DcpMappingCheck check_dcp_mapping(int64_t positions, int ranks, int interleave) {
  if (positions < 0) throw Error("DCP mapping check: positions must be >= 0");
  const DcpPlacement p{ranks, interleave};
  validate_dcp_placement(p);  // the library's rules: ranks >= 1, interleave a power of two
  DcpMappingCheck c{positions, ranks, interleave, false};
  // Through the library's placement: every position's (rank, local) maps back to it, and each
  // rank's local positions come out as 0, 1, 2, ... (dense, no repeats), as many as
  // dcp_local_length says.
  std::vector<int64_t> next(static_cast<size_t>(ranks), 0);
  for (int64_t i = 0; i < positions; ++i) {
    const DcpLocation at = dcp_locate(p, i);
    if (at.rank < 0 || at.rank >= ranks || at.local != next[static_cast<size_t>(at.rank)] ||
        dcp_global_position(p, at.rank, at.local) != i)
      return c;
    ++next[static_cast<size_t>(at.rank)];
  }
  for (int rank = 0; rank < ranks; ++rank)
    if (dcp_local_length(p, rank, positions) != next[static_cast<size_t>(rank)]) return c;
  c.bijective = true;
  return c;
}

namespace detail {
namespace {

constexpr int64_t kPageSize = 64;
constexpr int64_t kLogitTask = 65536;  // tokens per task of the fp32 logits

// One context length's step: the needles (the step's new tokens, one per request) and the
// query rows (next_n per request, each request over the whole context).
struct Step {
  int64_t length = 0, pages = 0;
  int requests = 0, next_n = 1, heads = 0, index_heads = 0;
  std::vector<int64_t> positions;  // per request: its needle's position (= its cache slot); empty: no needles
  DsaTokens needles;               // concatenated, one per request
  std::vector<DsaQueryRow> rows;
  std::vector<uint16_t> q;
  std::vector<uint8_t> index_q;
  std::vector<float> index_w;
  std::vector<int32_t> table, context_lens;
  int rows_count() const { return requests * next_n; }
  // A request over the same pages as every other (slot = position), `length` long.
  void add_request() {
    for (int64_t p = 0; p < pages; ++p) table.push_back(static_cast<int32_t>(p));
    context_lens.push_back(static_cast<int32_t>(length));
    ++requests;
  }
  void add_query_row(DsaQueryRow r) {
    index_q.insert(index_q.end(), r.index_q_e4m3.begin(), r.index_q_e4m3.end());
    index_w.insert(index_w.end(), r.index_w_scaled.begin(), r.index_w_scaled.end());
    q.insert(q.end(), r.q.begin(), r.q.end());
    rows.push_back(std::move(r));
  }
};

// Where needle i of a context of `length` tokens lies: depths[i] of the part every one of the
// next_n query rows sees.
int64_t needle_position(double depth, int64_t length, int next_n) {
  return std::llround(depth * static_cast<double>(length - next_n));
}

// All needles share one cache, so two depths at the same position would overwrite each other's
// needle and every format, bf16 included, would miss one of them.
void require_distinct_needle_positions(const std::vector<double>& depths, int64_t length, int next_n, const char* grid) {
  std::vector<int64_t> positions;
  for (double d : depths) positions.push_back(needle_position(d, length, next_n));
  std::sort(positions.begin(), positions.end());
  if (const auto same = std::adjacent_find(positions.begin(), positions.end()); same != positions.end())
    throw Error(std::string(grid) + ": at a context of " + std::to_string(length) + " tokens two needle depths fall on position " +
                std::to_string(*same) + "; use depths further apart or longer contexts");
}

// Request i looks for needle i at depths[i] of the context with next_n query rows; row j is the
// query after the first length - next_n + j + 1 tokens, and the needle lies within all of them.
Step make_step(const DsaWorkload& w, int64_t length, const std::vector<double>& depths, int next_n) {
  Step s;
  s.length = length;
  s.next_n = next_n;
  s.pages = (length + kPageSize - 1) / kPageSize;
  s.heads = w.options().heads;
  s.index_heads = w.options().index_heads;
  for (size_t i = 0; i < depths.size(); ++i) {
    const int row = static_cast<int>(i);
    const int64_t pos = needle_position(depths[i], length, next_n);
    s.positions.push_back(pos);
    const DsaTokens n = w.needle(row, pos);
    s.needles.latents.kv_c.insert(s.needles.latents.kv_c.end(), n.latents.kv_c.begin(), n.latents.kv_c.end());
    s.needles.latents.k_pe.insert(s.needles.latents.k_pe.end(), n.latents.k_pe.begin(), n.latents.k_pe.end());
    s.needles.index_k.insert(s.needles.index_k.end(), n.index_k.begin(), n.index_k.end());
    s.add_request();
    for (int j = 0; j < next_n; ++j) s.add_query_row(w.query(row, n, length - next_n + j + 1));
  }
  s.needles.latents.count = static_cast<int64_t>(depths.size());
  return s;
}

// A dump layer's step: its tokens as the context, its index query rows (each over the whole
// context), no needles; one attention head of zeros (only the selection is measured).
Step dump_step(const DumpLayer& d, int64_t length) {
  Step s;
  s.length = length;
  s.pages = (length + kPageSize - 1) / kPageSize;
  s.heads = 1;
  s.index_heads = d.index_heads;
  const size_t per_row = static_cast<size_t>(d.index_heads) * index_key::kDim;
  for (int r = 0; r < d.index_rows; ++r) {
    DsaQueryRow row;
    row.index_q.assign(d.index_q.begin() + r * per_row, d.index_q.begin() + (r + 1) * per_row);
    row.index_w.assign(d.index_w.begin() + r * d.index_heads, d.index_w.begin() + (r + 1) * d.index_heads);
    quantize_index_queries(row, d.index_heads);
    row.q.assign(kQkDim, 0);
    s.add_request();
    s.add_query_row(std::move(row));
  }
  return s;
}

// The step's arguments over the given buffers; `tokens` as the caller fills them.
DsaDecodeArgs step_args(const Step& s, const FormatConfig& config, int layer, const DsaWorkloadOptions& o, int k) {
  DsaDecodeArgs a;
  a.spec = config.spec();
  a.layer_scale = config.layer_scale_for(layer);
  a.caches.num_pages = s.pages;
  a.caches.page_size = kPageSize;
  a.requests = s.requests;
  a.next_n = s.next_n;
  a.block_table = s.table.data();
  a.block_table_stride = s.pages;
  a.context_lens = s.context_lens.data();
  a.max_context = s.length;
  a.q = s.q.data();
  a.heads = s.heads;
  a.index_q = s.index_q.data();
  a.index_w = s.index_w.data();
  a.index_heads = s.index_heads;
  a.k = k;
  a.sm_scale = kSmScale;
  return a;
}

// What one format's step gives the metrics: each row's selection and the attention scores of it.
struct StepOutput {
  std::vector<int32_t> indices, length;  // [rows, k], [rows]
  std::vector<float> scores;             // [rows, heads, k]
};

// The needle metrics of one row from its selection and scores.
PipelineCell needle_cell(const StepOutput& out, int row, int heads, int k, int64_t needle) {
  PipelineCell c;
  const int32_t* idx = &out.indices[static_cast<size_t>(row) * k];
  int at = -1;
  for (int e = 0; e < out.length[static_cast<size_t>(row)]; ++e)
    if (idx[e] == needle) at = e;
  c.selected = at >= 0;
  if (!c.selected) return c;
  c.top = true;
  double mass = 0.0;
  for (int h = 0; h < heads; ++h) {
    const float* s = &out.scores[(static_cast<size_t>(row) * heads + h) * k];
    double best_other = -std::numeric_limits<double>::infinity(), top = -std::numeric_limits<double>::infinity();
    for (int e = 0; e < out.length[static_cast<size_t>(row)]; ++e) {
      top = std::max(top, double(s[e]));
      if (e != at) best_other = std::max(best_other, double(s[e]));
    }
    double sum = 0.0;
    for (int e = 0; e < out.length[static_cast<size_t>(row)]; ++e)
      if (std::isfinite(s[e])) sum += std::exp(double(s[e]) - top);
    mass += std::exp(double(s[at]) - top) / sum;
    c.top = c.top && s[at] > best_other;
  }
  c.mass = mass / heads;
  return c;
}

// fp32 selection of every row: BF16 keys (needles in place), fp32 queries, exact top-k.
std::vector<std::vector<int32_t>> exact_selection(const Step& s, const DsaTokens& base, int index_heads, int k, int threads) {
  const int rows = s.rows_count();
  const int64_t tasks = (s.length + kLogitTask - 1) / kLogitTask;
  std::vector<std::vector<float>> logits(static_cast<size_t>(rows), std::vector<float>(static_cast<size_t>(s.length)));
  parallel_for(rows * tasks, threads, [&](int64_t i) {
    const int r = static_cast<int>(i / tasks);
    const int64_t first = (i % tasks) * kLogitTask, count = std::min(kLogitTask, s.length - first);
    DsaWorkload::exact_index_logits(s.rows[static_cast<size_t>(r)], index_heads, &base.index_k[first * index_key::kDim], count,
                                    &logits[static_cast<size_t>(r)][static_cast<size_t>(first)]);
  });
  std::vector<std::vector<int32_t>> selected(static_cast<size_t>(rows));
  parallel_for(rows, threads, [&](int64_t r) {
    auto& l = logits[static_cast<size_t>(r)];
    for (size_t j = 0; j < s.positions.size(); ++j)
      DsaWorkload::exact_index_logits(s.rows[static_cast<size_t>(r)], index_heads, &s.needles.index_k[j * index_key::kDim], 1,
                                      &l[static_cast<size_t>(s.positions[j])]);
    std::vector<int32_t> idx(static_cast<size_t>(k)), len(1);
    TopkArgs t;
    t.values = l.data();
    t.rows = 1;
    t.columns = t.stride = s.length;
    t.k = k;
    topk_reference(t, {idx.data(), len.data(), nullptr});
    idx.resize(static_cast<size_t>(len[0]));
    selected[static_cast<size_t>(r)] = std::move(idx);
  });
  return selected;
}

// Shares of the selection per quarter of the context, and overlap with another selection.
void quarter_shares(const std::vector<int32_t>& sel, int64_t length, double* share) {
  for (int q = 0; q < 4; ++q) share[q] = 0.0;
  if (sel.empty()) return;
  for (int32_t p : sel) share[std::min<int64_t>(3, int64_t(p) * 4 / length)] += 1.0;
  for (int q = 0; q < 4; ++q) share[q] /= static_cast<double>(sel.size());
}
double overlap(const std::vector<int32_t>& a, const std::vector<int32_t>& b) {
  if (b.empty()) return 1.0;
  std::vector<int32_t> both;
  std::set_intersection(a.begin(), a.end(), b.begin(), b.end(), std::back_inserter(both));
  return static_cast<double>(both.size()) / static_cast<double>(b.size());
}
std::vector<int32_t> row_selection(const StepOutput& out, int row, int k) {
  const int32_t* idx = &out.indices[static_cast<size_t>(row) * k];
  return std::vector<int32_t>(idx, idx + out.length[static_cast<size_t>(row)]);
}

// Means over the rows of the selection statistics against the fp32 selection (and, when given,
// against the exact top-k of the same logits).
SelectionStats selection_stats(const Step& s, const StepOutput& out, int k, const std::vector<std::vector<int32_t>>& exact,
                               const std::vector<std::vector<int32_t>>* same_logits) {
  SelectionStats st;
  st.length = s.length;
  const int rows = s.rows_count();
  double same_newest = 0.0, same_overlap = 0.0;
  for (int r = 0; r < rows; ++r) {
    const std::vector<int32_t> sel = row_selection(out, r, k);
    double a[4], b[4];
    quarter_shares(sel, s.length, a);
    quarter_shares(exact[static_cast<size_t>(r)], s.length, b);
    for (int q = 0; q < 4; ++q) {
      st.share[q] += a[q] / rows;
      st.exact_share[q] += b[q] / rows;
    }
    st.exact_overlap += overlap(sel, exact[static_cast<size_t>(r)]) / rows;
    if (same_logits) {
      quarter_shares((*same_logits)[static_cast<size_t>(r)], s.length, b);
      same_newest += (a[3] - b[3]) / rows;
      same_overlap += overlap(sel, (*same_logits)[static_cast<size_t>(r)]) / rows;
    }
  }
  st.newest_shift = st.share[3] - st.exact_share[3];
  if (same_logits) {
    st.same_logits_overlap = same_overlap;
    st.same_logits_newest_shift = same_newest;
  }
  return st;
}

// The CPU: the reference pipeline. The selection does not depend on the record format (the
// indexer reads its own key cache), so it is computed once, with the first format; every other
// format writes its caches through the same reference and attends over that selection.
std::vector<StepOutput> run_cpu(const Step& s, const DsaTokens& base, const std::vector<FormatConfig>& configs, int layer,
                                const PipelineOptions& o, int threads, StageProgress& stage) {
  const int rows = s.rows_count(), heads = s.heads, k = o.topk;
  std::vector<StepOutput> outs(configs.size());
  auto write_and_attend = [&](size_t m, bool select) {
    const FormatConfig& cfg = configs[m];
    std::vector<uint8_t> latent(static_cast<size_t>(s.pages * kPageSize) * cfg.record_bytes()),
        index(static_cast<size_t>(s.pages * kPageSize) * index_key::kRecordBytes);
    std::vector<int64_t> slots(static_cast<size_t>(s.length));
    std::iota(slots.begin(), slots.end(), int64_t(0));
    DsaDecodeArgs a = step_args(s, cfg, layer, o.workload, k);
    a.caches.latent = latent.data();
    a.caches.index = index.data();
    DsaDecodeArgs write = a;
    write.requests = 0;
    write.tokens = {base.latents.kv_c.data(), base.latents.k_pe.data(), base.index_k.data(), slots.data(), s.length};
    dsa_decode_reference(write, 0, {});
    a.tokens = {s.needles.latents.kv_c.data(), s.needles.latents.k_pe.data(), s.needles.index_k.data(), s.positions.data(),
                static_cast<int64_t>(s.positions.size())};
    StepOutput& out = outs[m];
    if (select) {
      out.indices.resize(static_cast<size_t>(rows) * k);
      out.length.resize(static_cast<size_t>(rows));
      std::vector<float> o_out(static_cast<size_t>(rows) * heads * kLatentDim), lse(static_cast<size_t>(rows) * heads);
      dsa_decode_reference(a, 0, {o_out.data(), lse.data(), out.indices.data(), out.length.data(), nullptr});
    } else {
      write.tokens = a.tokens;
      dsa_decode_reference(write, 0, {});
      out.indices = outs[0].indices;
      out.length = outs[0].length;
    }
    out.scores.resize(static_cast<size_t>(rows) * heads * k);
    sparse_mla_scores_reference(cfg.spec(), dsa_attention_args(a, out.indices.data(), out.length.data()), out.scores.data());
    stage.advance();
  };
  write_and_attend(0, true);
  parallel_for(static_cast<int64_t>(configs.size()) - 1, threads, [&](int64_t m) { write_and_attend(static_cast<size_t>(m) + 1, false); });
  return outs;
}

#if defined(NVFP4MLA_WITH_CUDA)
// The GPU: cuda::dsa_decode for every format (ordinary tokens written first, then the step
// with the needles as its new tokens), the scores of the selection from cuda::sparse_scores; for
// the first format also the materialized indexer logits, whose exact top-k (topk_reference)
// the selection is compared with.
struct GpuBase {
  DeviceBytes kv_c, k_pe, index_k, slots;
  GpuBase(const DsaTokens& base, const std::vector<int64_t>& slot_ids, cudaStream_t stream)
      : kv_c(base.latents.kv_c.data(), base.latents.kv_c.size() * 2, stream),
        k_pe(base.latents.k_pe.data(), base.latents.k_pe.size() * 2, stream),
        index_k(base.index_k.data(), base.index_k.size() * 2, stream),
        slots(slot_ids.data(), slot_ids.size() * 8, stream) {}
};

std::vector<StepOutput> run_cuda(const Step& s, const GpuBase& base, const std::vector<FormatConfig>& configs, int layer,
                                 const PipelineOptions& o, int threads, StageProgress& stage,
                                 std::vector<std::vector<int32_t>>* same_logits, const std::vector<int>& forced_splits) {
  const cudaStream_t stream = cudaStreamPerThread;
  const int rows = s.rows_count(), heads = s.heads, k = o.topk;
  const size_t capacity = static_cast<size_t>(s.pages * kPageSize);
  int max_record = 0;
  for (const FormatConfig& c : configs) max_record = std::max(max_record, c.record_bytes());
  const DeviceBytes latent(capacity * max_record), index(capacity * index_key::kRecordBytes);
  const DeviceBytes n_kv(s.needles.latents.kv_c.data(), s.needles.latents.kv_c.size() * 2, stream),
      n_pe(s.needles.latents.k_pe.data(), s.needles.latents.k_pe.size() * 2, stream),
      n_key(s.needles.index_k.data(), s.needles.index_k.size() * 2, stream),
      n_slots(s.positions.data(), s.positions.size() * 8, stream), q(s.q.data(), s.q.size() * 2, stream),
      index_q(s.index_q.data(), s.index_q.size(), stream), index_w(s.index_w.data(), s.index_w.size() * 4, stream),
      table(s.table.data(), s.table.size() * 4, stream), lens(s.context_lens.data(), s.context_lens.size() * 4, stream);
  const DeviceBytes out(static_cast<size_t>(rows) * heads * kLatentDim * 2), lse(static_cast<size_t>(rows) * heads * 4),
      indices(static_cast<size_t>(rows) * k * 4), length(static_cast<size_t>(rows) * 4),
      scores(static_cast<size_t>(rows) * heads * k * 4), errors(sizeof(DsaDecodeErrors));
  std::vector<StepOutput> outs(configs.size());
  for (size_t m = 0; m < configs.size(); ++m) {
    DsaDecodeArgs a = step_args(s, configs[m], layer, o.workload, k);
    a.caches.latent = latent.as<uint8_t>();
    a.caches.index = index.as<uint8_t>();
    a.block_table = table.as<int32_t>();
    a.context_lens = lens.as<int32_t>();
    a.q = q.as<uint16_t>();
    a.index_q = index_q.as<uint8_t>();
    a.index_w = index_w.as<float>();
    const DsaDecodeOutputs outputs{out.as<uint16_t>(), lse.as<float>(), indices.as<int32_t>(), length.as<int32_t>(), nullptr};
    DsaDecodeErrors found[2];
    for (int call = 0; call < 2; ++call) {
      DsaDecodeArgs step = a;
      if (call == 0) {  // the ordinary tokens, no query rows
        step.requests = 0;
        step.tokens = {base.kv_c.as<uint16_t>(), base.k_pe.as<uint16_t>(), base.index_k.as<uint16_t>(), base.slots.as<int64_t>(),
                       s.length};
      } else {
        step.tokens = {n_kv.as<uint16_t>(), n_pe.as<uint16_t>(), n_key.as<uint16_t>(), n_slots.as<int64_t>(),
                       static_cast<int64_t>(s.positions.size())};
      }
      const DsaDecodePlan plan = plan_dsa_decode(step, cuda::current_sm_count(), 0, forced_splits[m]);
      const DeviceBytes workspace(plan.workspace_bytes);
      cuda::dsa_decode(step, plan, workspace.as<void>(), plan.workspace_bytes, outputs, errors.as<DsaDecodeErrors>(), stream);
      errors.download(&found[call], stream);
      cuda_ok(cudaStreamSynchronize(stream), "DSA decode step");
    }
    for (const DsaDecodeErrors& e : found)
      if (e.latent_slots || e.index_slots || e.selection) throw Error("internal: the pipeline stage's DSA step reported device errors");
    StepOutput& so = outs[m];
    so.indices.resize(static_cast<size_t>(rows) * k);
    so.length.resize(static_cast<size_t>(rows));
    so.scores.resize(static_cast<size_t>(rows) * heads * k);
    cuda::sparse_scores(a.spec, dsa_attention_args(a, indices.as<int32_t>(), length.as<int32_t>()), scores.as<float>(), stream);
    indices.download(so.indices.data(), stream);
    length.download(so.length.data(), stream);
    scores.download(so.scores.data(), stream);
    cuda_ok(cudaStreamSynchronize(stream), "sparse scores");
    if (m == 0 && same_logits) {
      // The same logits materialized, then the host's exact top-k of each row.
      const DeviceBytes logits(static_cast<size_t>(rows) * s.length * 4), counter(8);
      IndexerPagedArgs ia = dsa_select_args(a).keys;
      ia.logits = logits.as<float>();
      ia.logits_stride = s.length;
      cuda::indexer_logits(ia, counter.as<unsigned long long>(), stream);
      std::vector<float> host(static_cast<size_t>(rows) * s.length);
      logits.download(host.data(), stream);
      cuda_ok(cudaStreamSynchronize(stream), "indexer logits");
      same_logits->assign(static_cast<size_t>(rows), {});
      parallel_for(rows, threads, [&](int64_t r) {
        std::vector<int32_t> idx(static_cast<size_t>(k)), len(1);
        TopkArgs t;
        t.values = &host[static_cast<size_t>(r) * s.length];
        t.rows = 1;
        t.columns = t.stride = s.length;
        t.k = k;
        topk_reference(t, {idx.data(), len.data(), nullptr});
        idx.resize(static_cast<size_t>(len[0]));
        (*same_logits)[static_cast<size_t>(r)] = std::move(idx);
      });
    }
    stage.advance();
  }
  return outs;
}
#endif

// A dump's selection through the pipeline: its index keys as the context of one layer, its index
// query rows; the record format does not change the selection, so the first one alone runs.
void run_dump_selection(const DumpWorkload& dump, const EvalOptions& options, const std::vector<FormatConfig>& configs,
                        bool gpu, EvalReport& report, const ProgressFn& progress, int threads) {
  const PipelineOptions& o = options.pipeline;
  const int layer = o.workload.layer < 0 ? dump.num_layers() / 2 : o.workload.layer;
  if (!dump.has_index) {
    report.pipeline_note = "skipped: the dump has no DSA indexer tensors (layers.<i>.index_k [tokens, 128], "
                           "layers.<i>.index_q [rows, heads, 128], layers.<i>.index_w [rows, heads])";
    return;
  }
  const DumpLayer& d = dump.layers.at(static_cast<size_t>(layer));
  DsaTokens base;
  base.latents.count = dump.tokens;
  for (const TokenBlock* half : {&d.calibration, &d.evaluation}) {
    base.latents.kv_c.insert(base.latents.kv_c.end(), half->kv_c.begin(), half->kv_c.end());
    base.latents.k_pe.insert(base.latents.k_pe.end(), half->k_pe.begin(), half->k_pe.end());
  }
  base.index_k = d.index_k;
  const Step s = dump_step(d, dump.tokens);
  report.pipeline_note = std::string(gpu ? "cuda: cuda::dsa_decode" : "cpu: dsa_decode_reference") + "; dump layer " +
                         std::to_string(layer) + ": its " + std::to_string(d.index_rows) + " index query rows (" +
                         std::to_string(d.index_heads) + " heads) each over all its " + std::to_string(dump.tokens) +
                         " tokens; selection only (no needles in a dump)";
  StageProgress stage(progress, "DSA pipeline (dump)", 1);
  const std::vector<FormatConfig> first(configs.begin(), configs.begin() + 1);
  std::vector<std::vector<int32_t>> same_logits;
  std::vector<StepOutput> outs;
#if defined(NVFP4MLA_WITH_CUDA)
  if (gpu) {
    std::vector<int64_t> slots(static_cast<size_t>(dump.tokens));
    std::iota(slots.begin(), slots.end(), int64_t(0));
    const GpuBase device_base(base, slots, cudaStreamPerThread);
    outs = run_cuda(s, device_base, first, layer, o, threads, stage, &same_logits, {0});
  }
#endif
  if (!gpu) outs = run_cpu(s, base, first, layer, o, threads, stage);
  const auto exact = exact_selection(s, base, s.index_heads, o.topk, threads);
  report.selection.push_back(selection_stats(s, outs[0], o.topk, exact, same_logits.empty() ? nullptr : &same_logits));
}

// Mass ratios against bf16's grid, and the counts.
void summarize_grid(PipelineGrid& g, const PipelineGrid& reference) {
  g.selected = g.top = 0;
  g.min_mass_ratio = std::numeric_limits<double>::infinity();
  for (size_t c = 0; c < g.cells.size(); ++c) {
    PipelineCell& cell = g.cells[c];
    const double ref = reference.cells[c].mass;
    cell.mass_ratio = ref > 0.0 ? cell.mass / ref : 0.0;
    g.selected += cell.selected;
    g.top += cell.top;
    if (ref > 0.0) g.min_mass_ratio = std::min(g.min_mass_ratio, cell.mass_ratio);
  }
  if (!std::isfinite(g.min_mass_ratio)) g.min_mass_ratio = 0.0;  // bf16 found no needle
}

void add_dcp_checks(EvalReport& report) {
  for (int64_t n : {int64_t(475000), int64_t(1048576)})
    for (int interleave : {1, 64}) report.dcp.push_back(check_dcp_mapping(n, 4, interleave));
}

}  // namespace

void run_pipeline_stage(const SyntheticWorkload& model, const DumpWorkload* dump, const EvalOptions& options,
                        const std::vector<FormatConfig>& configs, Device device, EvalReport& report, const ProgressFn& progress,
                        int threads) {
  const PipelineOptions& o = options.pipeline;
  const bool gpu = device == Device::cuda;
  if (o.topk < 1 || o.topk > kTopkMaxK) throw Error("--pipeline-topk must be in 1.." + std::to_string(kTopkMaxK));
  if (dump) {
    run_dump_selection(*dump, options, configs, gpu, report, progress, threads);
    add_dcp_checks(report);
    return;
  }
  report.pipeline_lengths = !o.lengths.empty() ? o.lengths : gpu ? kPipelineLengthsGpu : kPipelineLengthsCpu;
  const std::vector<double>& depths = options.needle.depths;
  report.pipeline_depths = depths;
  for (int64_t l : report.pipeline_lengths)
    if (l < static_cast<int64_t>(depths.size()) || l > INT32_MAX)
      throw Error("pipeline context length " + std::to_string(l) + " must be at least the number of depths and below 2^31");
  const DsaWorkload w(model, o.workload);
  report.pipeline_note = std::string(gpu ? "cuda: cuda::dsa_decode for every format" : "cpu: dsa_decode_reference") +
                         (o.lengths.empty() ? gpu ? " (the default contexts)" : " (contexts capped on the CPU; --device cuda runs them to 1M)"
                                            : " (contexts as requested)") +
                         "; synthetic layer " + std::to_string(w.layer());
  const int64_t longest = *std::max_element(report.pipeline_lengths.begin(), report.pipeline_lengths.end());
  const int width = o.verifier_width;
  if (width > 1)
    for (int64_t l : report.pipeline_lengths)
      if ((gpu || l <= kPipelineVerifierCpuLength) && l >= width + static_cast<int64_t>(depths.size()))
        report.verifier_lengths.push_back(l);
  for (int64_t l : report.pipeline_lengths) require_distinct_needle_positions(depths, l, 1, "DSA pipeline");
  for (int64_t l : report.verifier_lengths) require_distinct_needle_positions(depths, l, width, "DSA pipeline verifier grid");
  StageProgress stage(progress, "DSA pipeline",
                      static_cast<int64_t>((report.pipeline_lengths.size() + report.verifier_lengths.size()) * configs.size()));
  const DsaTokens base = w.tokens(0, longest, threads);
  // The attention route of a verifier batch per format: decode unless the policy sends it to
  // extend (one split per row).
  std::vector<int> decode_splits(configs.size(), 0), verifier_splits(configs.size(), 0);
  for (size_t m = 0; m < configs.size(); ++m) {
    report.modes[m].pipeline.route = "decode";
    if (width <= 1) continue;
    serving::VerifierBatchShape shape;
    shape.num_speculative_tokens = width - 1;
    shape.max_query_len = width;
    shape.decode_rows = shape.decode_row_budget = static_cast<int64_t>(depths.size()) * width;
    const serving::RouteDecision d = serving::decide_route(serving::SpecDecodeMode::automatic, configs[m].cache_dtype(), shape);
    verifier_splits[m] = d.route == serving::Route::extend ? 1 : 0;
    report.modes[m].verifier.route = std::string(serving::to_string(d.route)) + " (" + d.reason + ")";
  }
#if defined(NVFP4MLA_WITH_CUDA)
  std::unique_ptr<GpuBase> gpu_base;
  if (gpu) {
    std::vector<int64_t> slots(static_cast<size_t>(longest));
    std::iota(slots.begin(), slots.end(), int64_t(0));
    gpu_base = std::make_unique<GpuBase>(base, slots, cudaStreamPerThread);
  }
#endif
  auto run = [&](const Step& s, const std::vector<int>& splits, std::vector<std::vector<int32_t>>* same_logits) {
    std::vector<StepOutput> outs;
#if defined(NVFP4MLA_WITH_CUDA)
    if (gpu) outs = run_cuda(s, *gpu_base, configs, w.layer(), o, threads, stage, same_logits, splits);
#endif
    if (!gpu) outs = run_cpu(s, base, configs, w.layer(), o, threads, stage);
    return outs;
  };
  // A request's cell: every one of its rows selected (and on top); the mass averaged over them.
  auto request_cell = [&](const StepOutput& out, const Step& s, int b) {
    PipelineCell c{true, true, 0.0, 0.0};
    for (int j = 0; j < s.next_n; ++j) {
      const PipelineCell row = needle_cell(out, b * s.next_n + j, s.heads, o.topk, s.positions[static_cast<size_t>(b)]);
      c.selected = c.selected && row.selected;
      c.top = c.top && row.top;
      c.mass += row.mass / s.next_n;
    }
    return c;
  };
  for (ModeResult& m : report.modes) {
    m.pipeline.cells.assign(report.pipeline_lengths.size() * depths.size(), PipelineCell{});
    m.verifier.cells.assign(report.verifier_lengths.size() * depths.size(), PipelineCell{});
  }
  for (size_t li = 0; li < report.pipeline_lengths.size(); ++li) {
    const Step s = make_step(w, report.pipeline_lengths[li], depths, 1);
    std::vector<std::vector<int32_t>> same_logits;
    const std::vector<StepOutput> outs = run(s, decode_splits, &same_logits);
    const auto exact = exact_selection(s, base, s.index_heads, o.topk, threads);
    report.selection.push_back(selection_stats(s, outs[0], o.topk, exact, same_logits.empty() ? nullptr : &same_logits));
    for (size_t m = 0; m < configs.size(); ++m)
      for (int b = 0; b < s.requests; ++b)
        report.modes[m].pipeline.cells[li * depths.size() + static_cast<size_t>(b)] = request_cell(outs[m], s, b);
  }
  for (size_t li = 0; li < report.verifier_lengths.size(); ++li) {
    const Step s = make_step(w, report.verifier_lengths[li], depths, width);
    const std::vector<StepOutput> outs = run(s, verifier_splits, nullptr);
    for (size_t m = 0; m < configs.size(); ++m)
      for (int b = 0; b < s.requests; ++b)
        report.modes[m].verifier.cells[li * depths.size() + static_cast<size_t>(b)] = request_cell(outs[m], s, b);
  }
  for (PipelineGrid ModeResult::*grid : {&ModeResult::pipeline, &ModeResult::verifier})
    for (ModeResult& m : report.modes) summarize_grid(m.*grid, report.modes.front().*grid);
  add_dcp_checks(report);
}

}  // namespace detail
}  // namespace nvfp4mla::eval
