// nvfp4mla bench dcp: the DCP merge kernels and the in-process all-gathers (bench.h), timed like
// the other benchmarks (CUDA events, L2 flushed before each launch, medians).
#include <cuda_runtime.h>

#include <memory>
#include <string>
#include <vector>

#include "bench/bench_timing.cuh"
#include "nvfp4mla/bench.h"
#include "nvfp4mla/cuda/dcp.h"
#include "nvfp4mla/cuda/dcp_comm.h"
#include "nvfp4mla/device.h"
#include "nvfp4mla/error.h"
#include "nvfp4mla/topk.h"

namespace nvfp4mla::bench {
namespace {

// BF16 partial outputs in [-1, 1), LSEs in [0, 8), and per rank ascending candidate positions
// (rank r holds positions j N + r) with values in [-4, 4) and full lengths.
__global__ void fill_partials(uint16_t* out, int64_t n, float* lse, int64_t lse_n, uint64_t seed) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const float v = float(hash32(seed + 2 * i) >> 8) * (2.0f / 16777216.0f) - 1.0f;
    out[i] = static_cast<uint16_t>(__float_as_uint(v) >> 16);
  }
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < lse_n; i += int64_t(gridDim.x) * blockDim.x)
    lse[i] = float(hash32(seed + 2 * i + 1) >> 8) * (8.0f / 16777216.0f);
}
__global__ void fill_candidates(int32_t* idx, float* val, int32_t* len, int ranks, int rows, int k, uint64_t seed) {
  const int64_t n = int64_t(ranks) * rows * k;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const int r = static_cast<int>(i / (int64_t(rows) * k)), j = static_cast<int>(i % k);
    idx[i] = j * ranks + r;
    val[i] = float(hash32(seed + i) >> 8) * (8.0f / 16777216.0f) - 4.0f;
  }
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < int64_t(ranks) * rows; i += int64_t(gridDim.x) * blockDim.x)
    len[i] = k;
}

}  // namespace

std::vector<DcpResult> run_dcp(const std::vector<DcpCase>& cases, const Options& opt) {
  if (cuda_device_count() == 0) throw Error("no CUDA device");
  int dev = 0, sms = 0;
  check(cudaGetDevice(&dev), "cudaGetDevice");
  check(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev), "SM count");
  L2Flusher flush(opt.l2_flush);
  const cudaStream_t s = nullptr;
  std::vector<DcpResult> results;
  for (const DcpCase& c : cases) {
    if (c.rows < 1 || c.heads < 1 || c.ranks < 1 || c.k < 1 || c.k > kTopkMaxK) throw Error("bench dcp: bad case");
    if (opt.progress)
      opt.progress("dcp rows " + std::to_string(c.rows) + " heads " + std::to_string(c.heads) + " ranks " + std::to_string(c.ranks));
    const int n = c.ranks;
    const int64_t rh = int64_t(c.rows) * c.heads, part = rh * kDcpLatentDim, cand = int64_t(c.rows) * c.k;
    // Every rank's gathered buffers ([N, ...]); each rank's own block is its send buffer.
    std::vector<std::unique_ptr<Dev<uint16_t>>> out(n);
    std::vector<std::unique_ptr<Dev<float>>> lse(n), val(n);
    std::vector<std::unique_ptr<Dev<int32_t>>> idx(n), len(n);
    for (int r = 0; r < n; ++r) {
      out[r] = std::make_unique<Dev<uint16_t>>(size_t(n) * part);
      lse[r] = std::make_unique<Dev<float>>(size_t(n) * rh);
      idx[r] = std::make_unique<Dev<int32_t>>(size_t(n) * cand);
      val[r] = std::make_unique<Dev<float>>(size_t(n) * cand);
      len[r] = std::make_unique<Dev<int32_t>>(size_t(n) * c.rows);
      fill_partials<<<kFillBlocks, kFillThreads>>>(out[r]->p, n * part, lse[r]->p, n * rh, 11 + r);
      fill_candidates<<<kFillBlocks, kFillThreads>>>(idx[r]->p, val[r]->p, len[r]->p, n, c.rows, c.k, 23);
      check(cudaGetLastError(), "bench dcp inputs");
    }
    Dev<uint16_t> merged{size_t(part)};
    Dev<float> merged_lse{size_t(rh)}, top_val{size_t(cand)};
    Dev<int32_t> top_idx{size_t(cand)}, top_len{size_t(c.rows)};
    DcpResult res;
    res.c = c;

    DcpMergeArgs m;
    m.ranks = n;
    m.rows = c.rows;
    m.heads = c.heads;
    m.partial_out = out[0]->p;
    m.partial_type = DcpPartialType::bf16;
    m.partial_lse = lse[0]->p;
    const Runs merge = time_runs([&] { cuda::dcp_merge(m, {merged.p, DcpPartialType::bf16, merged_lse.p}, s); }, opt, flush, s);
    res.merge_us = median(merge) * 1e3;
    res.clock_mhz = merge.clock_mhz;

    cuda::InProcessDcpCommunicator comm(n);
    std::vector<cudaStream_t> streams(n, s);
    auto gather = [&](auto& bufs, size_t bytes) {
      std::vector<const void*> send(n);
      std::vector<void*> recv(n);
      for (int r = 0; r < n; ++r) {
        recv[r] = bufs[r]->p;
        send[r] = reinterpret_cast<const char*>(bufs[r]->p) + size_t(r) * bytes;
      }
      comm.all_gather(send.data(), recv.data(), bytes, streams.data());
    };
    res.gather_partials_us =
        median(time_runs([&] {
          gather(out, size_t(part) * 2);
          gather(lse, size_t(rh) * 4);
        }, opt, flush, s)) * 1e3;
    res.gather_candidates_us =
        median(time_runs([&] {
          gather(idx, size_t(cand) * 4);
          gather(val, size_t(cand) * 4);
          gather(len, size_t(c.rows) * 4);
        }, opt, flush, s)) *
        1e3;

    DcpTopkMergeArgs t{n, c.rows, c.k, idx[0]->p, val[0]->p, len[0]->p, c.k};
    const TopkPlan plan = plan_topk(c.rows, int64_t(n) * c.k, sms);
    const size_t ws_bytes = dcp_merge_topk_workspace(t, plan).total_bytes;
    Dev<uint8_t> ws(ws_bytes);
    res.merge_topk_us =
        median(time_runs([&] { cuda::dcp_merge_topk(t, plan, ws.p, ws_bytes, {top_idx.p, top_len.p, top_val.p}, nullptr, s); },
                         opt, flush, s)) *
        1e3;
    res.partial_bytes = int64_t(n - 1) * rh * (kDcpLatentDim * 2 + 4);
    res.candidate_bytes = int64_t(n - 1) * c.rows * (int64_t(c.k) * 8 + 4);
    results.push_back(res);
  }
  return results;
}

}  // namespace nvfp4mla::bench
