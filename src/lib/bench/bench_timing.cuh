#pragma once
// The benchmarks' timing harness: device buffers, the L2 flush, the SM clock probe and
// event-timed runs (bench.h describes the method). Included by each benchmark's .cu file; the
// kernels here have internal linkage, one copy per file.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <vector>

#include "device/cuda_check.h"
#include "nvfp4mla/bench.h"

namespace nvfp4mla::bench {
namespace {

using nvfp4mla::cuda::check;

__device__ __forceinline__ uint32_t hash32(uint64_t x) {
  x ^= x >> 33; x *= 0xff51afd7ed558ccdULL; x ^= x >> 33; x *= 0xc4ceb9fe1a85ec53ULL; x ^= x >> 33;
  return static_cast<uint32_t>(x);
}
template <class T>
struct Dev {
  T* p = nullptr;
  explicit Dev(size_t n) { check(cudaMalloc(reinterpret_cast<void**>(&p), std::max<size_t>(n, 1) * sizeof(T)), "cudaMalloc"); }
  ~Dev() { cudaFree(p); }
  Dev(const Dev&) = delete;
  Dev& operator=(const Dev&) = delete;
};

constexpr int kFillBlocks = 1024, kFillThreads = 256;

// Reads a buffer (16-byte loads cached in L2 only) and keeps a word only if it matches an
// impossible key, so that the loads stay.
__global__ void read_buffer(const uint4* __restrict__ p, int64_t n, uint32_t* __restrict__ sink) {
  uint32_t acc = 0;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const uint4 v = __ldcg(p + i);
    acc ^= v.x ^ v.y ^ v.z ^ v.w;
  }
  if (acc == 0x9E3779B9u) sink[0] = acc;
}

// Flushes L2 by streaming through a buffer 8x its size: reading it (clean lines left behind) or
// writing it (dirty lines left behind; bench.h says why the default reads).
struct L2Flusher {
  static constexpr size_t kBytes = size_t(512) << 20;
  L2Flush mode;
  Dev<uint8_t> buf{kBytes};
  Dev<uint32_t> sink{1};
  explicit L2Flusher(L2Flush m) : mode(m) { check(cudaMemset(buf.p, 0, kBytes), "L2 flush buffer"); }
  void operator()(cudaStream_t s) {
    if (mode == L2Flush::write) {
      check(cudaMemsetAsync(buf.p, 0, kBytes, s), "L2 flush");
      return;
    }
    read_buffer<<<kFillBlocks, kFillThreads, 0, s>>>(reinterpret_cast<const uint4*>(buf.p), int64_t(kBytes / 16), sink.p);
    check(cudaGetLastError(), "L2 flush");
  }
};

// The SM clock a timed launch ran at: one thread spins for kProbeCycles SM cycles and reads the
// global nanosecond timer at both ends. On the H200 the cuBLAS ceiling runs put the GPU under its
// software power cap, and for about half a second after them the SM clock stayed at 1545-1905 MHz
// instead of 1980, which a latency-bound kernel timed in that window pays in full (docs/PERF.md,
// "Machine and method"); the probe makes such a state visible in the results.
constexpr long long kProbeCycles = 100000;  // ~50 us at 2 GHz: 2% even if the timer moves only every microsecond
__global__ void clock_probe(unsigned long long* out) {
  unsigned long long t0, t1;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
  const long long c0 = clock64();
  long long c1 = c0;
  while (c1 - c0 < kProbeCycles) c1 = clock64();
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t1));
  out[0] = static_cast<unsigned long long>(c1 - c0);
  out[1] = t1 - t0;
}

// Sorts `v` (non-empty) and returns its middle element.
template <class T>
T sorted_median(std::vector<T>& v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// Event-timed runs of `fn`, sorted, with the L2 flushed before each, and the median SM clock (MHz)
// probed right after each run (outside the timed interval).
struct Runs {
  std::vector<float> ms;
  double clock_mhz = 0;
};
template <class Fn>
Runs time_runs(Fn&& fn, const Options& opt, L2Flusher& flush, cudaStream_t s) {
  cudaEvent_t a, b;
  check(cudaEventCreate(&a), "cudaEventCreate");
  check(cudaEventCreate(&b), "cudaEventCreate");
  Dev<unsigned long long> probe(2 * size_t(opt.iters));
  for (int i = 0; i < opt.warmup; ++i) fn();
  Runs r;
  for (int i = 0; i < opt.iters; ++i) {
    flush(s);
    check(cudaEventRecord(a, s), "cudaEventRecord");
    fn();
    check(cudaEventRecord(b, s), "cudaEventRecord");
    clock_probe<<<1, 1, 0, s>>>(probe.p + 2 * i);
    check(cudaGetLastError(), "clock probe");
    check(cudaEventSynchronize(b), "cudaEventSynchronize");
    float t = 0;
    check(cudaEventElapsedTime(&t, a, b), "cudaEventElapsedTime");
    r.ms.push_back(t);
  }
  std::vector<unsigned long long> ticks(2 * size_t(opt.iters));
  check(cudaMemcpy(ticks.data(), probe.p, ticks.size() * sizeof(ticks[0]), cudaMemcpyDeviceToHost), "clock probe copy");
  std::vector<double> mhz;
  for (int i = 0; i < opt.iters; ++i)
    if (ticks[2 * i + 1] > 0) mhz.push_back(1e3 * double(ticks[2 * i]) / double(ticks[2 * i + 1]));
  if (!mhz.empty()) r.clock_mhz = sorted_median(mhz);
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  sorted_median(r.ms);
  return r;
}
float median(const Runs& r) { return r.ms[r.ms.size() / 2]; }

// A whole call timed as above on the default stream, with its own L2 flush.
struct Timing {
  double median_us = 0, min_us = 0, clock_mhz = 0;
};
template <class Fn>
Timing time_launches(Fn&& launch, const Options& opt) {
  L2Flusher flush(opt.l2_flush);
  const Runs runs = time_runs(launch, opt, flush, nullptr);
  return {median(runs) * 1e3, runs.ms.front() * 1e3, runs.clock_mhz};
}

}  // namespace
}  // namespace nvfp4mla::bench
