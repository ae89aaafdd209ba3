#pragma once
// A DCP decode-step problem for the CPU and GPU suites: requests whose tokens live on N ranks
// (the writer slots of dcp.h through one shared virtual block table), the indexer logits of
// every row over the whole context and each rank's share of them, queries, the single-GPU cache
// and each rank's cache (unwritten records NaN-poisoned), and the single-GPU answer's selection
// (topk_reference of the whole rows). Logits: random quarter steps (many ties, NaN and -inf,
// NaN poison past each row's length), or with `indexer` the paged indexer's logits of small-
// integer index keys (exact in fp32 on the CPU and the GPU) written into a single-GPU index key
// cache and each rank's (through the same slots as the records). With `shared_pages` every
// request maps its positions to the same pages (written once, with the longest request's
// tokens), so a benchmark batch of many long requests needs one context's memory.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <thread>
#include <vector>

#include "nvfp4mla/codec.h"
#include "nvfp4mla/dcp.h"
#include "nvfp4mla/index_cache.h"
#include "nvfp4mla/indexer.h"
#include "nvfp4mla/record.h"
#include "nvfp4mla/sparse_mla.h"
#include "nvfp4mla/topk.h"
#include "nvfp4mla/testing/dsa_problem.h"
#include "nvfp4mla/testing/index_data.h"

namespace nvfp4mla::testing {

struct DcpStepShape {
  RecordSpec spec{CacheDtype::bf16, RopeEncoding::bf16, ScaleMode::implicit};
  DcpPlacement place{2, 1};
  std::vector<int32_t> context_lens{700, 333};  // one request each
  int next_n = 1;
  int heads = 16;
  int k = 64;
  int page = 64;  // each rank's page size (a multiple of the interleave)
  // Records written: all tokens, or only those of the single-GPU selection (every other record
  // NaN-poisoned, so a kernel that reads an unselected record fails).
  bool selected_only = false;
  bool indexer = false;
  int index_heads = 16;
  bool shared_pages = false;
  uint64_t seed = 1;
};

constexpr uint8_t kDcpPoisonByte = 0xFF;

// fn(begin, end) over [0, n) in contiguous chunks on up to 16 threads (a 1M-token benchmark
// problem takes minutes on one core). Every chunk draws from its own seeded generator, so the
// data do not depend on the thread count.
template <class Fn>
void dcp_parallel_chunks(int64_t n, Fn fn) {
  const int64_t threads = std::clamp<int64_t>(std::thread::hardware_concurrency(), 1, 16);
  const int64_t chunk = std::max<int64_t>(1, (n + threads - 1) / threads);
  std::vector<std::thread> pool;
  for (int64_t b = 0; b < n; b += chunk) pool.emplace_back(fn, b, std::min(n, b + chunk));
  for (auto& t : pool) t.join();
}
inline uint64_t dcp_stream_seed(uint64_t seed, uint64_t stream, uint64_t index) {
  return seed * 0x9E3779B97F4A7C15ull + stream * 0xC2B2AE3D27D4EB4Full + index;
}

struct DcpStepProblem {
  DcpStepShape shape;
  int requests = 0, rows = 0;
  int64_t max_context = 0, vpage = 0, vpages = 0, pages_total = 0, columns = 0;
  std::vector<int32_t> table;          // [requests, vpages] virtual page ids (shared by all ranks)
  std::vector<float> logits;           // [rows, max_context] of the whole context
  std::vector<int32_t> whole_lengths;  // [rows]
  std::vector<uint16_t> q;             // [rows, heads, 576]
  std::vector<uint8_t> single_cache;   // [pages_total * vpage, record_bytes]: slot = virtual slot
  std::vector<std::vector<float>> rank_logits;     // [N][rows, columns]
  std::vector<std::vector<int32_t>> rank_lengths;  // [N][rows]
  std::vector<std::vector<uint8_t>> rank_caches;   // [N][pages_total * page, record_bytes]
  // The single-GPU selection: global positions, lengths, values (topk_reference of the whole rows).
  std::vector<int32_t> want_indices, want_length;
  std::vector<float> want_values;
  // With `indexer`: the index key caches (0xFF where unwritten) and the index queries.
  std::vector<uint8_t> single_index;               // [pages_total, vpage * 132]
  std::vector<std::vector<uint8_t>> rank_index;    // [N][pages_total, page * 132]
  std::vector<uint8_t> index_q;                    // E4M3 [rows, index_heads, 128]
  std::vector<float> index_w;                      // [rows, index_heads]

  float sm_scale() const { return 1.0f / 24.0f; }
  int64_t rank_capacity() const { return pages_total * shape.page; }
  int64_t single_capacity() const { return pages_total * vpage; }

  TopkArgs whole_topk_args() const {
    TopkArgs t;
    t.values = logits.data();
    t.rows = rows;
    t.columns = max_context;
    t.stride = max_context;
    t.lengths = whole_lengths.data();
    t.k = shape.k;
    return t;
  }
  // Positions -> slots of the single-GPU cache (pages of vpage positions).
  TopkSlotMap single_slots(const int32_t* block_table) const {
    TopkSlotMap m;
    m.block_table = block_table;
    m.requests = requests;
    m.pages = vpages;
    m.table_stride = vpages;
    m.page_size = static_cast<int>(vpage);
    m.rows_per_request = shape.next_n;
    m.capacity = single_capacity();
    return m;
  }
  // The step's arguments (slot map without a table: each rank passes the shared table).
  DcpStepArgs step_args(DcpSelection selection) const {
    DcpStepArgs a;
    a.placement = shape.place;
    a.selection = selection;
    a.spec = shape.spec;
    a.rows = rows;
    a.heads = shape.heads;
    a.k = shape.k;
    a.columns = columns;
    a.logits_stride = columns;
    a.slots.requests = requests;
    a.slots.pages = vpages;
    a.slots.table_stride = vpages;
    a.slots.page_size = shape.page;
    a.slots.rows_per_request = shape.next_n;
    a.slots.capacity = rank_capacity();
    a.sm_scale = sm_scale();
    if (shape.indexer) {
      a.index_heads = shape.index_heads;
      a.index_pages = pages_total;
      a.next_n = shape.next_n;
    }
    return a;
  }
  // The single-GPU indexer's paged arguments over `index` (pages of vpage keys) and `table`.
  IndexerPagedArgs single_index_args(const uint8_t* iq, const float* iw, const uint8_t* index, const int32_t* block_table,
                                     const int32_t* context_lens) const {
    IndexerPagedArgs k;
    k.q = iq;
    k.weights = iw;
    k.requests = requests;
    k.next_n = shape.next_n;
    k.heads = shape.index_heads;
    k.cache = index;
    k.num_pages = pages_total;
    k.page_size = vpage;
    k.block_table = block_table;
    k.block_table_stride = vpages;
    k.context_lens = context_lens;
    return k;
  }
  // Single-GPU attention arguments over `slots` (the selection mapped to single-cache slots).
  SparseMlaArgs single_attention_args(const uint16_t* q_, const uint8_t* cache, const int32_t* slots,
                                      const int32_t* lengths) const {
    SparseMlaArgs s;
    s.q = q_;
    s.rows = rows;
    s.heads = shape.heads;
    s.cache = cache;
    s.capacity = single_capacity();
    s.indices = slots;
    s.topk = shape.k;
    s.topk_length = lengths;
    s.sm_scale = sm_scale();
    return s;
  }
};

inline DcpStepProblem make_dcp_step_problem(const DcpStepShape& shape) {
  DcpStepProblem p;
  p.shape = shape;
  const int n = shape.place.ranks, nn = shape.next_n, rb = shape.spec.record_bytes();
  p.requests = static_cast<int>(shape.context_lens.size());
  p.rows = p.requests * nn;
  p.max_context = std::max<int64_t>(1, *std::max_element(shape.context_lens.begin(), shape.context_lens.end()));
  p.vpage = int64_t(shape.page) * n;
  p.vpages = (p.max_context + p.vpage - 1) / p.vpage;
  const int64_t table_rows = shape.shared_pages ? 1 : p.requests;  // distinct page sets
  p.pages_total = p.vpages * table_rows + 2;
  std::mt19937_64 rng(shape.seed);
  // Shuffled distinct pages for every request.
  std::vector<int32_t> ids(p.pages_total);
  for (int64_t i = 0; i < p.pages_total; ++i) ids[i] = static_cast<int32_t>(i);
  std::shuffle(ids.begin(), ids.end(), rng);
  for (int b = 0; b < p.requests; ++b) {
    const auto first = ids.begin() + p.vpages * (b % table_rows);
    p.table.insert(p.table.end(), first, first + p.vpages);
  }

  // Logits: quarter steps of a normal (many ties), a few NaN and -inf, NaN past each row's length;
  // or the indexer's over small-integer keys.
  const float nan = std::numeric_limits<float>::quiet_NaN();
  p.logits.assign(size_t(p.rows) * p.max_context, nan);
  p.whole_lengths.resize(p.rows);
  for (int row = 0; row < p.rows; ++row)
    p.whole_lengths[row] = static_cast<int32_t>(paged_row_length(shape.context_lens[row / nn], nn, row % nn));
  if (!shape.indexer)
    dcp_parallel_chunks(p.rows, [&](int64_t r0, int64_t r1) {
      for (int64_t row = r0; row < r1; ++row) {
        std::mt19937_64 row_rng(dcp_stream_seed(shape.seed, 1, row));
        std::normal_distribution<float> row_normal(0.0f, 1.0f);
        std::uniform_real_distribution<float> row_u(0.0f, 1.0f);
        for (int64_t c = 0; c < p.whole_lengths[row]; ++c) {
          const float x = row_u(row_rng);
          p.logits[row * p.max_context + c] =
              x < 0.01f ? nan : x < 0.02f ? -INFINITY : std::round(row_normal(row_rng) * 8.0f) / 4.0f;
        }
      }
    });
  if (shape.indexer) {
    p.single_index.assign(size_t(p.pages_total) * p.vpage * index_key::kRecordBytes, kDcpPoisonByte);
    p.rank_index.assign(n, std::vector<uint8_t>(size_t(p.pages_total) * shape.page * index_key::kRecordBytes, kDcpPoisonByte));
    for (int b = 0; b < p.requests; ++b) {
      const int64_t ctx = shape.context_lens[b];
      const std::vector<uint16_t> keys = small_integer_bf16(size_t(ctx) * index_key::kDim, shape.seed * 31 + b);
      std::vector<int64_t> slots(ctx), local(ctx);
      for (int64_t i = 0; i < ctx; ++i) slots[i] = int64_t(p.table[b * p.vpages + i / p.vpage]) * p.vpage + i % p.vpage;
      const auto* k = reinterpret_cast<const Bf16Bits*>(keys.data());
      write_index_cache(k, ctx, slots, IndexCacheView{p.single_index.data(), p.pages_total, p.vpage});
      for (int r = 0; r < n; ++r) {
        dcp_local_slot_mapping(shape.place, shape.page, r, slots.data(), ctx, local.data());
        write_index_cache(k, ctx, local, IndexCacheView{p.rank_index[r].data(), p.pages_total, shape.page});
      }
    }
    p.index_q = small_integer_e4m3(size_t(p.rows) * shape.index_heads * index_key::kDim, shape.seed + 3);
    p.index_w = small_integer_weights(size_t(p.rows) * shape.index_heads, shape.seed + 4);
    IndexerPagedArgs k =
        p.single_index_args(p.index_q.data(), p.index_w.data(), p.single_index.data(), p.table.data(), shape.context_lens.data());
    k.logits = p.logits.data();
    k.logits_stride = p.max_context;
    indexer_logits_reference(k);
  }
  // Each rank's share: its local row lengths and the logits of its positions.
  p.rank_logits.resize(n);
  p.rank_lengths.resize(n);
  for (int r = 0; r < n; ++r) p.columns = std::max(p.columns, dcp_local_length(shape.place, r, p.max_context));
  p.columns = std::max<int64_t>(p.columns, 1);
  for (int r = 0; r < n; ++r) {
    p.rank_lengths[r].resize(p.rows);
    dcp_local_row_lengths(shape.place, r, shape.context_lens.data(), p.requests, nn, p.rank_lengths[r].data());
    p.rank_logits[r].assign(size_t(p.rows) * p.columns, nan);
    dcp_parallel_chunks(p.rows, [&](int64_t r0, int64_t r1) {
      for (int64_t row = r0; row < r1; ++row)
        for (int64_t l = 0; l < p.rank_lengths[r][row]; ++l)
          p.rank_logits[r][row * p.columns + l] = p.logits[row * p.max_context + dcp_global_position(shape.place, r, l)];
    });
  }
  // The single-GPU selection.
  p.want_indices.resize(size_t(p.rows) * shape.k);
  p.want_length.resize(p.rows);
  p.want_values.resize(size_t(p.rows) * shape.k);
  dcp_parallel_chunks(p.rows, [&](int64_t r0, int64_t r1) {
    TopkArgs t = p.whole_topk_args();
    t.values += r0 * p.max_context;
    t.lengths += r0;
    t.rows = static_cast<int>(r1 - r0);
    const size_t at = size_t(r0) * shape.k;
    topk_reference(t, {p.want_indices.data() + at, p.want_length.data() + r0, p.want_values.data() + at});
  });

  // Queries.
  p.q.resize(size_t(p.rows) * shape.heads * kQkDim);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (auto& v : p.q) v = codec::bf16_encode_rn(normal(rng));

  // Records: the single cache at virtual slots, each rank's through its writer slots.
  // With shared pages request 0 stands for all: one write per position, the longest context.
  std::vector<char> wanted(size_t(table_rows) * p.max_context, !shape.selected_only);
  for (int row = 0; row < p.rows; ++row)
    for (int j = 0; j < shape.k; ++j) {
      const int32_t pos = p.want_indices[size_t(row) * shape.k + j];
      if (pos >= 0) wanted[size_t(row / nn % table_rows) * p.max_context + pos] = 1;
    }
  p.single_cache.assign(size_t(p.single_capacity()) * rb, kDcpPoisonByte);
  p.rank_caches.assign(n, std::vector<uint8_t>(size_t(p.rank_capacity()) * rb, kDcpPoisonByte));
  constexpr int64_t kRecordChunk = 4096;  // tokens per generator stream
  for (int b = 0; b < table_rows; ++b) {
    const int64_t ctx = shape.shared_pages ? p.max_context : shape.context_lens[b];
    dcp_parallel_chunks((ctx + kRecordChunk - 1) / kRecordChunk, [&](int64_t c0, int64_t c1) {
      std::vector<uint16_t> kv_c(kLatentDim), k_pe(kRopeDim);
      std::vector<uint8_t> rec(rb);
      for (int64_t chunk = c0; chunk < c1; ++chunk) {
        std::mt19937_64 chunk_rng(dcp_stream_seed(shape.seed, 2 + b, chunk));
        std::normal_distribution<float> chunk_normal(0.0f, 1.0f);
        for (int64_t i = chunk * kRecordChunk; i < std::min(ctx, (chunk + 1) * kRecordChunk); ++i) {
          if (!wanted[size_t(b) * p.max_context + i]) continue;
          for (auto& v : kv_c) v = codec::bf16_encode_rn(chunk_normal(chunk_rng) * 0.5f);
          for (auto& v : k_pe) v = codec::bf16_encode_rn(chunk_normal(chunk_rng) * 0.5f);
          record::encode(shape.spec, reinterpret_cast<const Bf16Bits*>(kv_c.data()),
                         reinterpret_cast<const Bf16Bits*>(k_pe.data()), 1.0f, rec.data());
          const int64_t global_slot = int64_t(p.table[b * p.vpages + i / p.vpage]) * p.vpage + i % p.vpage;
          std::copy(rec.begin(), rec.end(), p.single_cache.begin() + global_slot * rb);
          for (int r = 0; r < n; ++r) {
            int64_t local = -1;
            dcp_local_slot_mapping(shape.place, shape.page, r, &global_slot, 1, &local);
            if (local >= 0) std::copy(rec.begin(), rec.end(), p.rank_caches[r].begin() + local * rb);
          }
        }
      }
    });
  }
  return p;
}

}  // namespace nvfp4mla::testing
