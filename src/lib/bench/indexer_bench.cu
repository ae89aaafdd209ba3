// Benchmark of the indexer logits (nvfp4mla bench indexer). Inputs are generated on the device
// from a hash: E4M3 bytes of magnitude below 2 (never NaN), power-of-two key scales, small
// weights.
#include <cuda_runtime.h>

#include <cstdint>
#include <string>
#include <vector>

#include "bench_timing.cuh"
#include "device/cuda_check.h"
#include "nvfp4mla/bench.h"
#include "nvfp4mla/cuda/fused_select.h"
#include "nvfp4mla/cuda/indexer.h"
#include "nvfp4mla/device.h"
#include "nvfp4mla/error.h"
#include "nvfp4mla/index_key.h"

namespace nvfp4mla::bench {
namespace {


#define NVFP4MLA_GRID_STRIDE(i, n) \
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < (n); i += int64_t(gridDim.x) * blockDim.x)

// E4M3 codes 0x00..0x3F with a random sign: magnitudes below 2, never NaN.
__global__ void fill_e4m3(uint8_t* p, int64_t n, uint64_t seed) {
  NVFP4MLA_GRID_STRIDE(i, n) {
    const uint32_t h = hash32(seed * 0x9E3779B97F4A7C15ULL + i);
    p[i] = static_cast<uint8_t>((h & 0x80u) | (h >> 8) % 0x40u);
  }
}
// Scales 2^-8 .. 2^7 in a fused paged cache (`page` > 0) or a plain array (`page` = 0).
__global__ void fill_scales(uint8_t* cache, float* plain, int64_t n, int64_t page, uint64_t seed) {
  NVFP4MLA_GRID_STRIDE(i, n) {
    const float s = exp2f(static_cast<float>(int(hash32(seed + i) % 16u) - 8));
    if (page > 0) *reinterpret_cast<float*>(cache + index_key::scale_offset(i, page)) = s;
    else plain[i] = s;
  }
}
__global__ void fill_weights(float* p, int64_t n, uint64_t seed) {
  NVFP4MLA_GRID_STRIDE(i, n) p[i] = (static_cast<float>(hash32(seed + i) >> 8) * 0x1p-24f - 0.5f) * 0.1f;
}
// Row i of `rows` causal rows over `keys` keys: [0, keys - rows + i + 1).
__global__ void fill_causal(int32_t* starts, int32_t* ends, int64_t rows, int64_t keys) {
  NVFP4MLA_GRID_STRIDE(i, rows) {
    starts[i] = 0;
    ends[i] = static_cast<int32_t>(keys - rows + i + 1);
  }
}
// Requests' pages scattered over the cache: entry i holds page (i * a + 13) mod pages, a
// bijection for `a` coprime with the page count.
__global__ void fill_table(int32_t* table, int64_t n, int64_t pages, int64_t a) {
  NVFP4MLA_GRID_STRIDE(i, n) table[i] = static_cast<int32_t>((i * a + 13) % pages);
}
__global__ void fill_int(int32_t* p, int64_t n, int32_t v) {
  NVFP4MLA_GRID_STRIDE(i, n) p[i] = v;
}
__global__ void count_nan(const float* p, int64_t n, unsigned long long* bad) {
  NVFP4MLA_GRID_STRIDE(i, n) if (isnan(p[i])) atomicAdd(bad, 1ull);
}
#undef NVFP4MLA_GRID_STRIDE

int64_t gcd(int64_t a, int64_t b) { return b == 0 ? a : gcd(b, a % b); }

bool no_nan(const float* logits, int64_t n) {
  Dev<unsigned long long> bad(1);
  check(cudaMemset(bad.p, 0, sizeof(unsigned long long)), "memset");
  count_nan<<<kFillBlocks, kFillThreads>>>(logits, n, bad.p);
  unsigned long long nbad = 0;
  check(cudaMemcpy(&nbad, bad.p, sizeof nbad, cudaMemcpyDeviceToHost), "copy back");
  return nbad == 0;
}

IndexerResult run_case(const IndexerCase& c, const Ceilings& ceil, const Options& opt) {
  const bool decode = c.form == IndexerCase::Form::decode;
  const int64_t rows = decode ? c.rows * c.next_n : c.rows;
  if (c.rows < 1 || c.keys < 1 || (!decode && c.rows > c.keys))
    throw Error("bench indexer: needs rows >= 1 and keys >= rows (prefill) or >= 1 (decode)");
  Dev<uint8_t> q(size_t(rows) * c.heads * index_key::kDim);
  Dev<float> w(size_t(rows) * c.heads), logits(size_t(rows) * c.keys);
  Dev<unsigned long long> invalid(1);
  fill_e4m3<<<kFillBlocks, kFillThreads>>>(q.p, rows * c.heads * index_key::kDim, 1);
  fill_weights<<<kFillBlocks, kFillThreads>>>(w.p, rows * c.heads, 2);
  const auto mma = static_cast<cuda::IndexerMma>(c.mma);
  double sum_lengths = 0, key_bytes = 0, fused_us = 0;
  int64_t fused_chunk = 0, fused_bytes = 0;
  Timing t;
  if (!decode) {
    Dev<uint8_t> values(size_t(c.keys) * index_key::kDim);
    Dev<float> scales(c.keys);
    Dev<int32_t> starts(rows), ends(rows);
    fill_e4m3<<<kFillBlocks, kFillThreads>>>(values.p, c.keys * index_key::kDim, 3);
    fill_scales<<<kFillBlocks, kFillThreads>>>(nullptr, scales.p, c.keys, 0, 4);
    fill_causal<<<kFillBlocks, kFillThreads>>>(starts.p, ends.p, rows, c.keys);
    IndexerRaggedArgs a;
    a.q = q.p;
    a.weights = w.p;
    a.rows = rows;
    a.heads = c.heads;
    a.key_values = values.p;
    a.key_scales = scales.p;
    a.num_keys = c.keys;
    a.row_starts = starts.p;
    a.row_ends = ends.p;
    a.logits = logits.p;
    a.logits_stride = c.keys;
    t = time_launches([&] { cuda::indexer_logits(a, invalid.p, nullptr, mma); }, opt);
    for (int64_t i = 0; i < rows; ++i) sum_lengths += double(c.keys - rows + i + 1);
    key_bytes = double(c.keys) * index_key::kRecordBytes;
  } else {
    const int64_t pages_per_request = (c.keys + c.page_size - 1) / c.page_size, pages = c.rows * pages_per_request;
    Dev<uint8_t> cache(size_t(pages) * c.page_size * index_key::kRecordBytes);
    Dev<int32_t> table(static_cast<size_t>(pages)), lens(static_cast<size_t>(c.rows));
    fill_e4m3<<<kFillBlocks, kFillThreads>>>(cache.p, pages * c.page_size * index_key::kRecordBytes, 5);
    fill_scales<<<kFillBlocks, kFillThreads>>>(cache.p, nullptr, pages * c.page_size, c.page_size, 6);
    int64_t stride = 7919;
    while (gcd(stride, pages) != 1) stride += 2;
    fill_table<<<kFillBlocks, kFillThreads>>>(table.p, pages, pages, stride);
    fill_int<<<kFillBlocks, kFillThreads>>>(lens.p, c.rows, static_cast<int32_t>(c.keys));
    IndexerPagedArgs a;
    a.q = q.p;
    a.weights = w.p;
    a.requests = c.rows;
    a.next_n = c.next_n;
    a.heads = c.heads;
    a.cache = cache.p;
    a.num_pages = pages;
    a.page_size = c.page_size;
    a.block_table = table.p;
    a.block_table_stride = pages_per_request;
    a.context_lens = lens.p;
    a.logits = logits.p;
    a.logits_stride = c.keys;
    t = time_launches([&] { cuda::indexer_logits(a, invalid.p, nullptr, mma); }, opt);
    if (c.fused) {
      FusedSelectArgs fa;
      fa.keys = a;
      fa.keys.logits = nullptr;
      fa.keys.logits_stride = 0;
      fa.max_context = c.keys;
      fa.k = c.fused_k;
      int dev = 0, sms = 0;
      check(cudaGetDevice(&dev), "cudaGetDevice");
      check(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev), "SM count");
      const FusedSelectPlan plan = plan_fused_select(fa, 0, sms);
      Dev<uint8_t> ws(plan.workspace_bytes);
      Dev<int32_t> indices(size_t(rows) * c.fused_k), lengths(rows);
      Dev<unsigned long long> fused_invalid(1);
      const Timing ft = time_launches(
          [&] {
            cuda::fused_select(fa, plan, ws.p, plan.workspace_bytes, {indices.p, lengths.p, nullptr}, fused_invalid.p, nullptr, mma);
          },
          opt);
      unsigned long long fbad = 0;
      check(cudaMemcpy(&fbad, fused_invalid.p, sizeof fbad, cudaMemcpyDeviceToHost), "copy back");
      if (fbad != 0) throw Error("bench indexer: fused selection reported invalid metadata");
      fused_us = ft.median_us;
      fused_chunk = plan.chunk;
      fused_bytes = static_cast<int64_t>(plan.workspace_bytes);
    }
    for (int i = 0; i < c.next_n; ++i) sum_lengths += double(c.rows) * double(paged_row_length(c.keys, c.next_n, i));
    key_bytes = double(c.rows) * double(c.keys) * index_key::kRecordBytes;
  }
  unsigned long long nbad = 0;
  check(cudaMemcpy(&nbad, invalid.p, sizeof nbad, cudaMemcpyDeviceToHost), "copy back");
  if (nbad != 0) throw Error("bench indexer: the kernel reported invalid metadata");
  IndexerResult r;
  r.c = c;
  r.median_us = t.median_us;
  r.min_us = t.min_us;
  r.clock_mhz = t.clock_mhz;
  r.tflops = 2.0 * c.heads * index_key::kDim * sum_lengths / (t.median_us * 1e-6) / 1e12;
  r.key_tbps = key_bytes / (t.median_us * 1e-6) / 1e12;
  r.frac_copy = ceil.copy_gbps > 0 ? r.key_tbps * 1e3 / (ceil.copy_gbps / 2) : 0;  // the copy's read half
  r.finite = no_nan(logits.p, rows * c.keys);
  r.fused_median_us = fused_us;
  r.fused_chunk = fused_chunk;
  r.fused_workspace_bytes = fused_bytes;
  return r;
}

}  // namespace

std::vector<IndexerResult> run_indexer(const std::vector<IndexerCase>& cases, const Ceilings& ceil, const Options& opt) {
  if (cuda_device_count() == 0) throw Error("no CUDA device");
  std::vector<IndexerResult> out;
  for (const auto& c : cases) {
    if (opt.progress)
      opt.progress(std::string(c.form == IndexerCase::Form::decode ? "indexer decode " : "indexer prefill ") +
                   std::to_string(c.rows) + " x " + std::to_string(c.keys) + " heads " + std::to_string(c.heads));
    out.push_back(run_case(c, ceil, opt));
  }
  return out;
}

}  // namespace nvfp4mla::bench
