// DCP union-mode quality on the needle workload (eval/dcp_union.h).
#include "nvfp4mla/eval/dcp_union.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "eval/parallel.h"
#include "eval/stages.h"
#include "nvfp4mla/dcp.h"
#include "nvfp4mla/error.h"
#include "nvfp4mla/eval/dsa_workload.h"
#include "nvfp4mla/eval/workload.h"
#include "nvfp4mla/format.h"
#include "nvfp4mla/record.h"
#include "nvfp4mla/sparse_mla.h"
#include "nvfp4mla/topk.h"

namespace nvfp4mla::eval {
namespace {

constexpr RecordSpec kSpec{CacheDtype::bf16, RopeEncoding::bf16, ScaleMode::implicit};

// The top-k of `logits` (one row) over its positions: ascending global positions.
std::vector<int32_t> top_positions(const std::vector<float>& logits, int k) {
  std::vector<int32_t> idx(static_cast<size_t>(k)), len(1);
  TopkArgs t;
  t.values = logits.data();
  t.rows = 1;
  t.columns = t.stride = static_cast<int64_t>(logits.size());
  t.k = k;
  topk_reference(t, {idx.data(), len.data(), nullptr});
  idx.resize(static_cast<size_t>(len[0]));
  return idx;
}

// The union of every rank's top k_rank over its own positions (ascending).
std::vector<int32_t> union_selection(const std::vector<float>& logits, const DcpPlacement& p, int k_rank) {
  std::vector<int32_t> all;
  const int64_t context = static_cast<int64_t>(logits.size());
  for (int r = 0; r < p.ranks; ++r) {
    const int64_t n = dcp_local_length(p, r, context);
    if (n == 0) continue;
    std::vector<int32_t> global(static_cast<size_t>(n));
    dcp_global_positions(p, r, global.data(), n);
    std::vector<float> local(static_cast<size_t>(n));
    for (int64_t l = 0; l < n; ++l) local[static_cast<size_t>(l)] = logits[static_cast<size_t>(global[static_cast<size_t>(l)])];
    std::vector<int32_t> mine = top_positions(local, k_rank);
    dcp_local_to_global(p, r, mine.data(), static_cast<int64_t>(mine.size()));
    all.insert(all.end(), mine.begin(), mine.end());
  }
  std::sort(all.begin(), all.end());
  return all;
}

// Attention of one row (all heads) over `positions` of `cache`: slot = position, but the row's
// needle position reads `needle_slot` (each row's needle sits past the shared context).
std::vector<float> attend(const std::vector<uint16_t>& q, int heads, const std::vector<uint8_t>& cache, int64_t capacity,
                          const std::vector<int32_t>& positions, int64_t needle, int64_t needle_slot) {
  std::vector<float> out(static_cast<size_t>(heads) * kLatentDim), lse(static_cast<size_t>(heads));
  std::vector<int32_t> slots(positions);
  for (int32_t& s : slots)
    if (s == needle) s = static_cast<int32_t>(needle_slot);
  SparseMlaArgs a;
  a.q = q.data();
  a.rows = 1;
  a.heads = heads;
  a.cache = cache.data();
  a.capacity = capacity;
  a.indices = slots.data();
  a.topk = static_cast<int>(slots.size());
  a.sm_scale = detail::kSmScale;
  if (a.topk > 0) sparse_mla_reference(kSpec, a, out.data(), lse.data());
  return out;
}

}  // namespace

std::vector<DcpUnionCell> evaluate_dcp_union(const DcpUnionOptions& o) {
  if (o.context < 1 || o.context > INT32_MAX) throw Error("dcp union: context must be in 1..2^31-1");
  if (o.rows < 1) throw Error("dcp union: rows must be >= 1");
  if (o.k < 1 || o.k > kTopkMaxK) throw Error("dcp union: k must be in 1.." + std::to_string(kTopkMaxK));
  for (int n : o.ranks) validate_dcp_placement({n, 1});
  for (int il : o.interleaves) validate_dcp_placement({1, il});
  const int threads = detail::resolve_threads(o.threads);

  const SyntheticWorkload model(o.seed);
  const DsaWorkload w(model, DsaWorkloadOptions{});
  const int heads = w.options().heads, index_heads = w.options().index_heads;
  const DsaTokens base = w.tokens(0, o.context, threads);
  const int rb = kSpec.record_bytes();
  // The context's records, then one needle record per row (slot context + row).
  const int64_t capacity = o.context + o.rows;
  std::vector<uint8_t> cache(static_cast<size_t>(capacity) * rb);
  detail::parallel_for(o.context, threads, [&](int64_t t) {
    record::encode(kSpec, reinterpret_cast<const Bf16Bits*>(base.latents.kv_c_row(t)),
                   reinterpret_cast<const Bf16Bits*>(base.latents.k_pe_row(t)), 1.0f, &cache[static_cast<size_t>(t) * rb]);
  });

  // Per row: its needle, query, exact logits (needle in place) and exact selection.
  struct Row {
    int64_t needle = 0;
    DsaQueryRow query;
    std::vector<float> logits;
    std::vector<int32_t> exact;
  };
  std::vector<Row> rows(static_cast<size_t>(o.rows));
  for (int r = 0; r < o.rows; ++r) {
    Row& row = rows[static_cast<size_t>(r)];
    row.needle = std::llround((r + 0.5) / o.rows * static_cast<double>(o.context - 1));
    const DsaTokens n = w.needle(r, row.needle);
    row.query = w.query(r, n, o.context);
    record::encode(kSpec, reinterpret_cast<const Bf16Bits*>(n.latents.kv_c_row(0)),
                   reinterpret_cast<const Bf16Bits*>(n.latents.k_pe_row(0)), 1.0f,
                   &cache[static_cast<size_t>(o.context + r) * rb]);
    row.logits.resize(static_cast<size_t>(o.context));
    constexpr int64_t kTask = 8192;
    const int64_t tasks = (o.context + kTask - 1) / kTask;
    detail::parallel_for(tasks, threads, [&](int64_t i) {
      const int64_t first = i * kTask, count = std::min(kTask, o.context - first);
      DsaWorkload::exact_index_logits(row.query, index_heads, &base.index_k[static_cast<size_t>(first) * index_key::kDim], count,
                                      &row.logits[static_cast<size_t>(first)]);
    });
    DsaWorkload::exact_index_logits(row.query, index_heads, n.index_k.data(), 1, &row.logits[static_cast<size_t>(row.needle)]);
    row.exact = top_positions(row.logits, o.k);
  }

  // The cells: (ranks, interleave, k_rank) x rows, each with the row's needle in its cache copy.
  struct Task {
    int ranks, interleave, k_rank;
  };
  std::vector<Task> tasks;
  for (int n : o.ranks)
    for (int il : o.interleaves) {
      tasks.push_back({n, il, o.k});
      if (n > 1) tasks.push_back({n, il, std::max(1, o.k / n)});  // N = 1: k / N is k
    }
  struct RowResult {
    double recall = 0;
    int64_t size = 0;
    bool needle = false;
    std::vector<double> rel_l2, cos_diff;  // per head
  };
  std::vector<RowResult> results(tasks.size() * rows.size());
  std::vector<std::vector<float>> exact_out(rows.size());
  detail::parallel_for(static_cast<int64_t>(rows.size()), threads, [&](int64_t r) {
    const Row& row = rows[static_cast<size_t>(r)];
    exact_out[static_cast<size_t>(r)] = attend(row.query.q, heads, cache, capacity, row.exact, row.needle, o.context + r);
  });
  detail::parallel_for(static_cast<int64_t>(results.size()), threads, [&](int64_t i) {
    const Task& t = tasks[static_cast<size_t>(i) / rows.size()];
    const size_t r = static_cast<size_t>(i) % rows.size();
    const Row& row = rows[r];
    const std::vector<int32_t> u = union_selection(row.logits, {t.ranks, t.interleave}, t.k_rank);
    RowResult& res = results[static_cast<size_t>(i)];
    res.size = static_cast<int64_t>(u.size());
    int64_t kept = 0;
    for (int32_t e : row.exact) kept += std::binary_search(u.begin(), u.end(), e);
    res.recall = row.exact.empty() ? 1.0 : double(kept) / double(row.exact.size());
    res.needle = std::binary_search(u.begin(), u.end(), static_cast<int32_t>(row.needle));
    const std::vector<float> out = attend(row.query.q, heads, cache, capacity, u, row.needle, o.context + int64_t(r));
    const std::vector<float>& ex = exact_out[r];
    for (int h = 0; h < heads; ++h) {
      double diff = 0, norm = 0, dot = 0, n_out = 0;
      for (int d = 0; d < kLatentDim; ++d) {
        const double a = out[static_cast<size_t>(h) * kLatentDim + d], b = ex[static_cast<size_t>(h) * kLatentDim + d];
        diff += (a - b) * (a - b);
        norm += b * b;
        dot += a * b;
        n_out += a * a;
      }
      res.rel_l2.push_back(norm > 0 ? std::sqrt(diff / norm) : 0.0);
      res.cos_diff.push_back(norm > 0 && n_out > 0 ? 1.0 - dot / std::sqrt(norm * n_out) : 0.0);
    }
  });

  std::vector<DcpUnionCell> cells;
  for (size_t ti = 0; ti < tasks.size(); ++ti) {
    DcpUnionCell c;
    c.ranks = tasks[ti].ranks;
    c.interleave = tasks[ti].interleave;
    c.k_rank = tasks[ti].k_rank;
    c.rows = o.rows;
    c.min_recall = 1.0;
    int64_t heads_seen = 0;
    for (size_t r = 0; r < rows.size(); ++r) {
      const RowResult& res = results[ti * rows.size() + r];
      c.recall += res.recall / o.rows;
      c.min_recall = std::min(c.min_recall, res.recall);
      c.union_size += double(res.size) / o.k / o.rows;
      c.needles += res.needle;
      for (size_t h = 0; h < res.rel_l2.size(); ++h) {
        c.mean_rel_l2 += res.rel_l2[h];
        c.max_rel_l2 = std::max(c.max_rel_l2, res.rel_l2[h]);
        c.mean_cos_diff += res.cos_diff[h];
        c.max_cos_diff = std::max(c.max_cos_diff, res.cos_diff[h]);
        ++heads_seen;
      }
    }
    c.mean_rel_l2 /= std::max<int64_t>(heads_seen, 1);
    c.mean_cos_diff /= std::max<int64_t>(heads_seen, 1);
    cells.push_back(c);
  }
  return cells;
}

}  // namespace nvfp4mla::eval
