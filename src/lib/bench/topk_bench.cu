// nvfp4mla bench topk: the exact top-k kernels, timed like the other benchmarks, against CUB's
// segmented radix sort (pairs, descending) of the same rows in the same run.
#include <cuda_runtime.h>

#include <algorithm>
#include <cub/device/device_segmented_radix_sort.cuh>
#include <string>
#include <vector>

#include "bench/bench_timing.cuh"
#include "nvfp4mla/bench.h"
#include "nvfp4mla/cuda/topk.h"
#include "nvfp4mla/device.h"
#include "nvfp4mla/error.h"
#include "nvfp4mla/topk.h"

namespace nvfp4mla::bench {
namespace {

// Logits in [-4, 4) from two 24-bit uniforms (a triangular density): about 2^25 distinct values,
// so a 1M row has a few ties, as real logits do.
__global__ void fill_logits(float* p, int64_t n, uint64_t seed) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const uint32_t a = hash32(seed * 0x9E3779B97F4A7C15ULL + 2 * i), b = hash32(seed * 0x9E3779B97F4A7C15ULL + 2 * i + 1);
    p[i] = (float((a >> 8) + (b >> 8)) * (1.0f / 16777216.0f) - 1.0f) * 4.0f;
  }
}
__global__ void fill_columns(int32_t* p, int64_t n, int64_t columns) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    p[i] = static_cast<int32_t>(i % columns);
}
__global__ void fill_offsets(int* p, int rows, int64_t columns) {
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i <= rows; i += gridDim.x * blockDim.x)
    p[i] = static_cast<int>(i * columns);
}

}  // namespace

std::vector<TopkResult> run_topk(const std::vector<TopkCase>& cases, const Options& opt) {
  if (cuda_device_count() == 0) throw Error("no CUDA device");
  int dev = 0, sms = 0;
  check(cudaGetDevice(&dev), "cudaGetDevice");
  check(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev), "SM count");
  std::vector<TopkResult> out;
  cudaStream_t s = nullptr;
  L2Flusher flush(opt.l2_flush);
  for (const auto& c : cases) {
    if (opt.progress) opt.progress("topk rows " + std::to_string(c.rows) + " columns " + std::to_string(c.columns) + " k " + std::to_string(c.k));
    const int64_t n = int64_t(c.rows) * c.columns;
    if (c.rows < 1 || c.columns < 1 || n > INT32_MAX) throw Error("bench topk: rows x columns must be in 1..2^31-1");
    Dev<float> logits(n), sorted_keys(n);
    Dev<int32_t> columns(n), sorted_columns(n), indices(size_t(c.rows) * c.k), lengths(c.rows);
    Dev<int> offsets(c.rows + 1);
    fill_logits<<<kFillBlocks, kFillThreads>>>(logits.p, n, 17 + c.rows);
    fill_columns<<<kFillBlocks, kFillThreads>>>(columns.p, n, c.columns);
    fill_offsets<<<1, 256>>>(offsets.p, c.rows, c.columns);
    check(cudaGetLastError(), "bench topk inputs");

    TopkArgs a;
    a.values = logits.p;
    a.rows = c.rows;
    a.columns = c.columns;
    a.stride = c.columns;
    a.k = c.k;
    const TopkPlan plan = c.segments == 0 ? plan_topk(c.rows, c.columns, sms)
                          : c.segments == 1 ? TopkPlan{TopkKernel::row_per_cta, 1, c.columns}
                          : c.resident      ? resident_topk_plan(c.columns, c.segments)
                                            : split_topk_plan(c.columns, c.segments);
    const size_t ws_bytes = topk_workspace_bytes(plan, c.rows);
    Dev<uint8_t> ws(ws_bytes);
    const TopkOutputs o{indices.p, lengths.p, nullptr};
    const auto ms = time_runs([&] { cuda::topk(a, plan, ws.p, ws_bytes, o, nullptr, s); }, opt, flush, s);

    size_t sort_bytes = 0;
    auto sort = [&](void* temp) {
      check(cub::DeviceSegmentedRadixSort::SortPairsDescending(temp, sort_bytes, logits.p, sorted_keys.p, columns.p,
                                                               sorted_columns.p, static_cast<int>(n), c.rows, offsets.p,
                                                               offsets.p + 1, 0, 32, s),
            "CUB segmented radix sort");
    };
    sort(nullptr);
    Dev<uint8_t> sort_temp(sort_bytes);
    const auto sort_ms = time_runs([&] { sort(sort_temp.p); }, opt, flush, s);

    // The stable descending sort's first k columns of each row, ascending, are the exact top-k.
    std::vector<int32_t> got(size_t(c.rows) * c.k), first(size_t(c.rows) * c.k), got_len(c.rows);
    check(cudaMemcpy(got.data(), indices.p, got.size() * 4, cudaMemcpyDeviceToHost), "copy back");
    check(cudaMemcpy(got_len.data(), lengths.p, got_len.size() * 4, cudaMemcpyDeviceToHost), "copy back");
    const int64_t kk = std::min<int64_t>(c.k, c.columns);
    check(cudaMemcpy2D(first.data(), size_t(c.k) * 4, sorted_columns.p, size_t(c.columns) * 4, size_t(kk) * 4, c.rows,
                       cudaMemcpyDeviceToHost),
          "copy back");
    bool match = true;
    for (int r = 0; r < c.rows; ++r) {
      auto row = first.begin() + int64_t(r) * c.k;
      std::sort(row, row + kk);
      std::fill(row + kk, row + c.k, -1);
      match = match && got_len[r] == kk && std::equal(row, row + c.k, got.begin() + int64_t(r) * c.k);
    }

    TopkResult r;
    r.c = c;
    r.kernel = to_string(plan.kernel);
    r.segments = plan.segments;
    r.median_us = median(ms) * 1e3;
    r.min_us = ms.ms.front() * 1e3;
    r.clock_mhz = ms.clock_mhz;
    r.gbps = double(n) * 4.0 / (r.median_us * 1e-6) / 1e9;
    r.sort_us = median(sort_ms) * 1e3;
    r.matches_sort = match;
    out.push_back(r);
  }
  return out;
}

}  // namespace nvfp4mla::bench
