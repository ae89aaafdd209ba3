// Benchmarks on the GPU. Inputs are generated on the device (hash-based random values), so
// a million-token cache costs no host time.
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <vector>

#include "device/cuda_check.h"
#include "bench/bench_timing.cuh"
#include "nvfp4mla/bench.h"
#include "nvfp4mla/cuda/cache_write.h"
#include "nvfp4mla/cuda/sparse_decode.h"
#include "nvfp4mla/cuda/sparse_extend.h"
#include "nvfp4mla/decode_plan.h"
#include "nvfp4mla/device.h"
#include "nvfp4mla/error.h"

namespace nvfp4mla::bench {
namespace {

using nvfp4mla::cuda::check;

// Approximately normal BF16 values (sum of uniforms), scaled.
__global__ void fill_bf16(uint16_t* p, int64_t n, uint64_t seed, float scale) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const uint32_t h = hash32(seed * 0x9E3779B97F4A7C15ULL + i);
    const float u = ((h & 0xFFFF) + (h >> 16)) * (1.0f / 65536.0f) - 1.0f;
    const __nv_bfloat16 b = __float2bfloat16_rn(u * 1.7f * scale);
    p[i] = *reinterpret_cast<const uint16_t*>(&b);
  }
}
__global__ void fill_indices(int32_t* p, int64_t n, uint64_t seed, int64_t capacity) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    p[i] = static_cast<int32_t>(hash32(seed + 7919 * i) % capacity);
}
// Reads every record idx[i] once and folds the bytes into a word that is stored only if it matches
// an impossible key, so the loads cannot be dropped: the random-gather ceiling of a decode case.
// Each thread issues kGatherLoads 16-byte loads (of different records) before using any: a probe on
// the H200 gathered rows 128 x topk 2048 of 368-byte records in 37 us this way against 49 us with
// one warp per record and one load per lane, whose few loads in flight were the limit.
constexpr int kGatherLoads = 4;
__global__ void read_records(const uint8_t* __restrict__ cache, int record_bytes, const int32_t* __restrict__ idx,
                             int64_t n, uint32_t* __restrict__ sink) {
  const int chunks = record_bytes / 16;
  const int64_t total = n * chunks, stride = int64_t(gridDim.x) * blockDim.x;
  uint32_t acc = 0;
  for (int64_t base = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; base < total; base += stride * kGatherLoads) {
    uint4 v[kGatherLoads];
#pragma unroll
    for (int u = 0; u < kGatherLoads; ++u) {
      const int64_t c = base + u * stride;
      v[u] = c < total ? __ldcg(reinterpret_cast<const uint4*>(cache + int64_t(idx[c / chunks]) * record_bytes) + c % chunks)
                       : make_uint4(0, 0, 0, 0);
    }
#pragma unroll
    for (int u = 0; u < kGatherLoads; ++u) acc ^= v[u].x ^ v[u].y ^ v[u].z ^ v[u].w;
  }
  if (acc == 0x9E3779B9u) sink[0] = acc;
}
__global__ void fill_iota(int64_t* p, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) p[i] = i;
}
__global__ void count_nonfinite(const uint16_t* p, int64_t n, unsigned long long* bad) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    if ((p[i] & 0x7F80) == 0x7F80) atomicAdd(bad, 1ull);
}

// Keeps every SM and the memory busy (copies, and FMA chains in between) for `seconds` of wall
// time, at a power below the cap, so that the clocks have recovered from the ceilings' GEMMs and
// the timed launches see the clocks a busy GPU runs at.
__global__ void burn(float* sink, int iters) {
  float x = threadIdx.x * 1e-3f, y = blockIdx.x * 1e-3f;
  for (int i = 0; i < iters; ++i) x = fmaf(x, 0.999f, y), y = fmaf(y, 0.999f, x);
  if (x == 1234.5f) sink[0] = y;
}
void warm_up_device(double seconds, cudaStream_t s) {
  if (seconds <= 0) return;
  const size_t bytes = size_t(1) << 30;
  Dev<uint8_t> src(bytes), dst(bytes);
  Dev<float> sink(1);
  check(cudaMemset(src.p, 1, bytes), "memset");
  const auto t0 = std::chrono::steady_clock::now();
  while (std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() < seconds) {
    for (int i = 0; i < 4; ++i) {
      check(cudaMemcpyAsync(dst.p, src.p, bytes, cudaMemcpyDeviceToDevice, s), "warm-up copy");
      burn<<<kFillBlocks, kFillThreads, 0, s>>>(sink.p, 1 << 14);
    }
    check(cudaStreamSynchronize(s), "warm-up");
  }
}

}  // namespace

Ceilings measure_ceilings(const Options& opt) {
  if (cuda_device_count() == 0) throw Error("no CUDA device");
  Ceilings c;
  c.device = cuda_device_description(0);
  int dev = 0, khz = 0;
  check(cudaGetDevice(&dev), "cudaGetDevice");
  check(cudaDeviceGetAttribute(&khz, cudaDevAttrClockRate, dev), "clock rate");
  c.max_clock_mhz = khz / 1000.0;
  cudaStream_t s = nullptr;
  L2Flusher flush(opt.l2_flush);
  {  // device-to-device copy of 2 GiB
    const size_t bytes = size_t(2) << 30;
    Dev<uint8_t> src(bytes), dst(bytes);
    check(cudaMemset(src.p, 1, bytes), "memset");
    const auto ms = time_runs([&] { check(cudaMemcpyAsync(dst.p, src.p, bytes, cudaMemcpyDeviceToDevice, s), "copy"); },
                              opt, flush, s);
    c.copy_gbps = 2.0 * bytes / (median(ms) * 1e-3) / 1e9;
  }
  {  // cuBLAS BF16 GEMM, 8192^3, random data
    const int n = 8192;
    Dev<uint16_t> A(size_t(n) * n), B(size_t(n) * n), C(size_t(n) * n);
    fill_bf16<<<kFillBlocks, kFillThreads>>>(A.p, int64_t(n) * n, 1, 1.0f);
    fill_bf16<<<kFillBlocks, kFillThreads>>>(B.p, int64_t(n) * n, 2, 1.0f);
    cublasHandle_t h;
    if (cublasCreate(&h) != CUBLAS_STATUS_SUCCESS) throw Error("cublasCreate failed");
    const float alpha = 1.0f, beta = 0.0f;
    auto gemm = [&] {
      if (cublasGemmEx(h, CUBLAS_OP_N, CUBLAS_OP_N, n, n, n, &alpha, A.p, CUDA_R_16BF, n, B.p, CUDA_R_16BF, n, &beta, C.p,
                       CUDA_R_16BF, n, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT) != CUBLAS_STATUS_SUCCESS)
        throw Error("cublasGemmEx failed");
    };
    const auto ms = time_runs(gemm, opt, flush, s);
    c.bf16_tflops = 2.0 * n * double(n) * n / (median(ms) * 1e-3) / 1e12;
    cublasDestroy(h);
  }
  // The GEMMs leave the GPU power-capped at lowered clocks for a while (clock_probe); busy at a
  // moderate power it recovers before the cases are timed.
  warm_up_device(opt.warmup_seconds, nullptr);
  return c;
}

std::vector<DecodeResult> run_decode(const std::vector<DecodeCase>& cases, const Ceilings& ceil, const Options& opt) {
  if (cuda_device_count() == 0) throw Error("no CUDA device");
  std::vector<DecodeResult> out;
  cudaStream_t s = nullptr;
  L2Flusher flush(opt.l2_flush);
  const ArchSpec arch = current_device_arch();
  const int sms = arch.sm_count;
  for (const auto& c : cases) {
    if (opt.progress) opt.progress("decode rows " + std::to_string(c.rows) + " heads " + std::to_string(c.heads) + " topk " + std::to_string(c.topk) + " " + to_string(c.spec.dtype) + "-" + std::to_string(c.spec.record_bytes()) + " " + to_string(c.spec.scale_mode));
    // A cache of c.capacity tokens (default 1M, far larger than the L2; rounded up to whole fill
    // chunks), random indices into it.
    const int64_t chunk = 1 << 16, capacity = (c.capacity + chunk - 1) / chunk * chunk;
    const int rb = c.spec.record_bytes();
    Dev<uint8_t> cache(size_t(capacity) * rb);
    {
      Dev<uint16_t> kv(size_t(chunk) * kLatentDim), pe(size_t(chunk) * kRopeDim);
      Dev<int64_t> slots(chunk);
      for (int64_t base = 0; base < capacity; base += chunk) {
        fill_bf16<<<kFillBlocks, kFillThreads>>>(kv.p, chunk * kLatentDim, 10 + base, 1.0f);
        fill_bf16<<<kFillBlocks, kFillThreads>>>(pe.p, chunk * kRopeDim, 20 + base, 1.0f);
        fill_iota<<<kFillBlocks, kFillThreads>>>(slots.p, chunk);
        cuda::CacheWriteArgs w;
        w.kv_c = kv.p;
        w.k_pe = pe.p;
        w.num_tokens = chunk;
        w.slot_mapping = slots.p;
        w.cache = cache.p + size_t(base) * rb;
        w.capacity = chunk;
        w.layer_scale = 0.01f;
        cuda::write_cache(c.spec, w, s);
      }
    }
    const size_t q_elems = size_t(c.rows) * c.heads * kQkDim;
    Dev<uint16_t> q(q_elems), o(size_t(c.rows) * c.heads * kLatentDim);
    Dev<float> lse(size_t(c.rows) * c.heads);
    Dev<int32_t> idx(size_t(c.rows) * c.topk);
    fill_bf16<<<kFillBlocks, kFillThreads>>>(q.p, int64_t(q_elems), 30, 1.0f);
    fill_indices<<<kFillBlocks, kFillThreads>>>(idx.p, int64_t(c.rows) * c.topk, 40, capacity);
    if (c.staged && (c.kernel != DecodeKernel::automatic || c.forced_splits > 1))
      throw Error("bench: the staged extend picks its own kernel and runs one split per row");
    cuda::ExtendStagedPlan staged_plan;
    if (c.staged) {
      staged_plan = cuda::plan_extend_staged(c.rows, c.heads, c.topk, arch);
      if (c.walk_only) staged_plan = {staged_plan.walk, c.rows, {}, 0};
    }
    const DecodePlan plan = c.staged ? staged_plan.walk
                                     : plan_sparse_decode(c.spec, c.rows, c.heads, c.topk, arch, c.forced_splits, c.kernel);
    const size_t ws_bytes = c.staged ? cuda::extend_staging_layout(capacity, c.rows, c.topk).total_bytes
                                     : decode_workspace_layout(plan, c.rows, c.heads).total_bytes;
    Dev<uint8_t> ws(ws_bytes);
    SparseMlaArgs a;
    a.q = q.p;
    a.rows = c.rows;
    a.heads = c.heads;
    a.cache = cache.p;
    a.capacity = capacity;
    a.indices = idx.p;
    a.topk = c.topk;
    a.sm_scale = 1.0f / 24.0f;
    a.layer_scale = 0.01f;
    const auto ms = time_runs(
        [&] {
          if (c.staged) cuda::sparse_extend_staged(c.spec, a, staged_plan, ws.p, ws_bytes, o.p, lse.p, s);
          else cuda::sparse_decode(c.spec, a, plan, ws.p, ws_bytes, o.p, lse.p, s);
        },
        opt, flush, s);
    double staging_us = 0;
    if (c.staged)
      staging_us = median(time_runs([&] { cuda::stage_records(c.spec, a, ws.p, ws_bytes, s); }, opt, flush, s)) * 1e3;
    Dev<uint32_t> sink(1);
    const int64_t records = int64_t(c.rows) * c.topk;
    const auto gather_ms = time_runs(
        [&] {
          read_records<<<static_cast<unsigned>(8 * sms), 256, 0, s>>>(cache.p, rb, idx.p, records, sink.p);
        },
        opt, flush, s);
    Dev<unsigned long long> bad(1);
    check(cudaMemset(bad.p, 0, 8), "memset");
    count_nonfinite<<<kFillBlocks, kFillThreads>>>(o.p, int64_t(c.rows) * c.heads * kLatentDim, bad.p);
    unsigned long long nbad = 0;
    check(cudaMemcpy(&nbad, bad.p, 8, cudaMemcpyDeviceToHost), "copy back");
    DecodeResult r;
    r.c = c;
    r.splits = plan.splits;
    r.head_group = plan.head_group;
    r.kernel = plan.kernel;
    r.median_us = median(ms) * 1e3;
    r.min_us = ms.ms.front() * 1e3;
    r.clock_mhz = ms.clock_mhz;
    const double attended = double(c.rows) * c.topk;
    r.tflops = 2.0 * c.heads * attended * (kQkDim + kLatentDim) / (r.median_us * 1e-6) / 1e12;
    const double bytes = attended * rb + q_elems * 2.0 + double(c.rows) * c.heads * kLatentDim * 2.0 + attended * 4.0;
    r.gbps = bytes / (r.median_us * 1e-6) / 1e9;
    r.frac_copy = ceil.copy_gbps > 0 ? r.gbps / ceil.copy_gbps : 0;
    r.frac_mma = ceil.bf16_tflops > 0 ? r.tflops / ceil.bf16_tflops : 0;
    r.staging_us = staging_us;
    r.tail_rows = staged_plan.tail_rows;
    r.tail_splits = staged_plan.tail_rows > 0 ? staged_plan.tail.splits : 0;
    r.gather_us = median(gather_ms) * 1e3;
    r.frac_gather = r.gather_us / r.median_us;
    r.finite = nbad == 0;
    out.push_back(r);
  }
  return out;
}

std::vector<WriteResult> run_write(const std::vector<WriteCase>& cases, const Ceilings& ceil, const Options& opt) {
  if (cuda_device_count() == 0) throw Error("no CUDA device");
  std::vector<WriteResult> out;
  cudaStream_t s = nullptr;
  L2Flusher flush(opt.l2_flush);
  for (const auto& c : cases) {
    if (opt.progress) opt.progress("write " + std::to_string(c.tokens) + " tokens " + to_string(c.spec.dtype) + "-" + std::to_string(c.spec.record_bytes()));
    const int rb = c.spec.record_bytes();
    Dev<uint16_t> kv(size_t(c.tokens) * kLatentDim), pe(size_t(c.tokens) * kRopeDim);
    Dev<int64_t> slots(c.tokens);
    Dev<uint8_t> cache(size_t(c.tokens) * rb);
    fill_bf16<<<kFillBlocks, kFillThreads>>>(kv.p, c.tokens * kLatentDim, 1, 1.0f);
    fill_bf16<<<kFillBlocks, kFillThreads>>>(pe.p, c.tokens * kRopeDim, 2, 1.0f);
    fill_iota<<<kFillBlocks, kFillThreads>>>(slots.p, c.tokens);
    cuda::CacheWriteArgs w;
    w.kv_c = kv.p;
    w.k_pe = pe.p;
    w.num_tokens = c.tokens;
    w.slot_mapping = slots.p;
    w.cache = cache.p;
    w.capacity = c.tokens;
    w.layer_scale = 0.01f;
    const auto ms = time_runs([&] { cuda::write_cache(c.spec, w, s); }, opt, flush, s);
    WriteResult r;
    r.c = c;
    r.median_us = median(ms) * 1e3;
    r.clock_mhz = ms.clock_mhz;
    r.gbps = double(c.tokens) * (kQkDim * 2.0 + 8.0 + rb) / (r.median_us * 1e-6) / 1e9;
    r.frac_copy = ceil.copy_gbps > 0 ? r.gbps / ceil.copy_gbps : 0;
    out.push_back(r);
  }
  return out;
}

}  // namespace nvfp4mla::bench
