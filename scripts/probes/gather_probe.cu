// Gather probe: how fast the H200 reads rows x topk records of 368 bytes at random (or
// sequential) slots of a 2^20-slot cache, by five ways of issuing the loads. Standalone, not part
// of the build; results and their use are in docs/PERF.md (seventh session) and
// docs/perf/gather-probe-2026-11-29-s7.txt.
//   nvcc -O3 -std=c++17 -arch=sm_90a -o gather_probe scripts/probes/gather_probe.cu && ./gather_probe
#include <cuda_runtime.h>
#include <cstdio>
#include <cstdint>
#include <vector>
#include <algorithm>
#define CK(x) do { cudaError_t e = (x); if (e != cudaSuccess) { printf("%s: %s\n", #x, cudaGetErrorString(e)); exit(1);} } while (0)
constexpr int RB = 368;
__device__ uint32_t hash32(uint64_t x) { x ^= x >> 33; x *= 0xff51afd7ed558ccdULL; x ^= x >> 33; x *= 0xc4ceb9fe1a85ec53ULL; x ^= x >> 33; return uint32_t(x); }
__global__ void fill_idx(int32_t* p, int64_t n, int64_t cap, int mode) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    p[i] = mode == 0 ? int32_t(hash32(40 + 7919 * i) % cap) : int32_t(i % cap);
}
__global__ void fill_bytes(uint4* p, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    p[i] = make_uint4(hash32(i), hash32(i + 1), hash32(i + 2), 0);
}
// K1: one warp per record (the bench's reference kernel).
__global__ void k_warp(const uint8_t* __restrict__ cache, const int32_t* __restrict__ idx, int64_t n, uint32_t* sink) {
  const int64_t i = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) >> 5;
  const int lane = threadIdx.x & 31;
  if (i >= n) return;
  const uint4* src = reinterpret_cast<const uint4*>(cache + int64_t(idx[i]) * RB);
  uint32_t acc = 0;
  for (int c = lane; c < RB / 16; c += 32) { uint4 v = __ldcg(src + c); acc ^= v.x ^ v.y ^ v.z ^ v.w; }
  if (acc == 0x9E3779B9u) sink[0] = acc;
}
// K2: each thread loads U chunks (of different records) before using any.
template <int U>
__global__ void k_mlp(const uint8_t* __restrict__ cache, const int32_t* __restrict__ idx, int64_t n, uint32_t* sink) {
  constexpr int C = RB / 16;
  const int64_t total = n * C;
  uint32_t acc = 0;
  for (int64_t base = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x); base < total; base += int64_t(gridDim.x) * blockDim.x * U) {
    uint4 v[U];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int64_t c = base + int64_t(u) * gridDim.x * blockDim.x;
      if (c < total) v[u] = __ldcg(reinterpret_cast<const uint4*>(cache + int64_t(idx[c / C]) * RB) + c % C);
      else v[u] = make_uint4(0, 0, 0, 0);
    }
#pragma unroll
    for (int u = 0; u < U; ++u) acc ^= v[u].x ^ v[u].y ^ v[u].z ^ v[u].w;
  }
  if (acc == 0x9E3779B9u) sink[0] = acc;
}
// K3: cp.async pipeline, CTA of T threads, 32 records per stage, S stages; each CTA walks `per_cta` records.
template <int T, int S>
__global__ void k_cpasync(const uint8_t* __restrict__ cache, const int32_t* __restrict__ idx, int per_cta, uint32_t* sink) {
  extern __shared__ __align__(16) uint8_t sm[];
  constexpr int C = RB / 16, SUB = 32;
  const int32_t* my = idx + int64_t(blockIdx.x) * per_cta;
  const int subs = per_cta / SUB;
  auto issue = [&](int u) {
    if (u < subs) {
      uint8_t* dst = sm + (u % S) * SUB * RB;
      for (int c = threadIdx.x; c < SUB * C; c += T) {
        const int t = c / C, ch = c % C;
        const uint8_t* src = cache + int64_t(my[u * SUB + t]) * RB + 16 * ch;
        asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(uint32_t(__cvta_generic_to_shared(dst + t * RB + 16 * ch))), "l"(src));
      }
    }
    asm volatile("cp.async.commit_group;\n");
  };
  for (int u = 0; u < S - 1; ++u) issue(u);
  uint32_t acc = 0;
  for (int u = 0; u < subs; ++u) {
    issue(u + S - 1);
    asm volatile("cp.async.wait_group %0;\n" ::"n"(S - 1) : "memory");
    __syncthreads();
    acc ^= reinterpret_cast<const uint32_t*>(sm + (u % S) * SUB * RB)[threadIdx.x];
    __syncthreads();
  }
  if (acc == 0x9E3779B9u) sink[0] = acc;
}
// K4: TMA bulk copies, one per record (lane r of warp 0 issues record r), S stages of 32 records.
__device__ __forceinline__ void mbar_init(uint32_t bar, int count) { asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count)); }
__device__ __forceinline__ void mbar_expect(uint32_t bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes) : "memory");
}
__device__ __forceinline__ void mbar_wait(uint32_t bar, int phase) {
  asm volatile("{\n.reg .pred p;\nW: mbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1;\n@!p bra W;\n}\n" ::"r"(bar), "r"(phase) : "memory");
}
template <int T, int S>
__global__ void k_bulk(const uint8_t* __restrict__ cache, const int32_t* __restrict__ idx, int per_cta, uint32_t* sink) {
  extern __shared__ __align__(16) uint8_t sm[];
  constexpr int SUB = 32;
  __shared__ __align__(8) uint64_t bars[S];
  const int32_t* my = idx + int64_t(blockIdx.x) * per_cta;
  const int subs = per_cta / SUB;
  if (threadIdx.x == 0) for (int s = 0; s < S; ++s) mbar_init(uint32_t(__cvta_generic_to_shared(&bars[s])), 1);
  asm volatile("fence.mbarrier_init.release.cluster;\n");
  __syncthreads();
  auto issue = [&](int u) {
    if (u < subs && threadIdx.x < 32) {
      const uint32_t bar = uint32_t(__cvta_generic_to_shared(&bars[u % S]));
      if (threadIdx.x == 0) mbar_expect(bar, SUB * RB);
      __syncwarp();
      uint8_t* dst = sm + (u % S) * SUB * RB + threadIdx.x * RB;
      const uint8_t* src = cache + int64_t(my[u * SUB + threadIdx.x]) * RB;
      asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n"
                   ::"r"(uint32_t(__cvta_generic_to_shared(dst))), "l"(src), "r"(RB), "r"(bar) : "memory");
    }
  };
  for (int u = 0; u < S - 1; ++u) issue(u);
  uint32_t acc = 0;
  for (int u = 0; u < subs; ++u) {
    issue(u + S - 1);
    mbar_wait(uint32_t(__cvta_generic_to_shared(&bars[u % S])), (u / S) & 1);
    acc ^= reinterpret_cast<const uint32_t*>(sm + (u % S) * SUB * RB)[threadIdx.x];
    __syncthreads();  // everyone read stage u before it is refilled (at u + 1 issue of u + S)
  }
  if (acc == 0x9E3779B9u) sink[0] = acc;
}
int main() {
  const int64_t cap = 1 << 20, rows = 128, topk = 2048, n = rows * topk;
  uint8_t* cache; int32_t* idx; uint32_t* sink; uint8_t* flush;
  CK(cudaMalloc(&cache, cap * RB)); CK(cudaMalloc(&idx, n * 4)); CK(cudaMalloc(&sink, 4)); CK(cudaMalloc(&flush, 512 << 20));
  fill_bytes<<<1024, 256>>>(reinterpret_cast<uint4*>(cache), cap * RB / 16);
  cudaEvent_t a, b; cudaEventCreate(&a); cudaEventCreate(&b);
  int sms; cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0);
  auto timeit = [&](const char* name, auto launch) {
    std::vector<float> ms;
    for (int it = 0; it < 12; ++it) {
      CK(cudaMemsetAsync(flush, it, 512 << 20));
      cudaEventRecord(a); launch(); cudaEventRecord(b); CK(cudaEventSynchronize(b));
      float t; cudaEventElapsedTime(&t, a, b); if (it >= 2) ms.push_back(t);
    }
    CK(cudaGetLastError());
    std::sort(ms.begin(), ms.end());
    const double us = ms[ms.size() / 2] * 1e3;
    printf("%-44s %8.1f us %7.0f GB/s\n", name, us, n * double(RB) / (us * 1e3));
  };
  for (int mode = 0; mode < 2; ++mode) {
    fill_idx<<<1024, 256>>>(idx, n, cap, mode);
    printf("== indices: %s\n", mode == 0 ? "random slots (bench pattern)" : "sequential slots");
    timeit("warp per record (bench reference)", [&] { k_warp<<<(n * 32 + 255) / 256, 256>>>(cache, idx, n, sink); });
    timeit("thread MLP x4", [&] { k_mlp<4><<<sms * 8, 256>>>(cache, idx, n, sink); });
    timeit("thread MLP x8", [&] { k_mlp<8><<<sms * 8, 256>>>(cache, idx, n, sink); });
    const int per_cta = 1024, ctas = int(n / per_cta);
    {
      auto k = k_cpasync<128, 5>; const int sm = 5 * 32 * RB; CK(cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, sm));
      timeit("cp.async 128 thr, 5 stages x 32 (h16-like)", [&] { k<<<ctas, 128, sm>>>(cache, idx, per_cta, sink); });
    }
    {
      auto k = k_cpasync<128, 8>; const int sm = 8 * 32 * RB; CK(cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, sm));
      timeit("cp.async 128 thr, 8 stages x 32", [&] { k<<<ctas, 128, sm>>>(cache, idx, per_cta, sink); });
    }
    {
      auto k = k_bulk<128, 5>; const int sm = 5 * 32 * RB; CK(cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, sm));
      timeit("bulk TMA per record, 5 stages x 32", [&] { k<<<ctas, 128, sm>>>(cache, idx, per_cta, sink); });
    }
    {
      auto k = k_bulk<128, 8>; const int sm = 8 * 32 * RB; CK(cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, sm));
      timeit("bulk TMA per record, 8 stages x 32", [&] { k<<<ctas, 128, sm>>>(cache, idx, per_cta, sink); });
    }
    {
      auto k = k_bulk<128, 3>; const int sm = 3 * 32 * RB; CK(cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, sm));
      timeit("bulk TMA per record, 3 stages x 32", [&] { k<<<ctas, 128, sm>>>(cache, idx, per_cta, sink); });
    }
    {
      auto k = k_bulk<128, 5>; const int sm = 5 * 32 * RB; CK(cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, sm));
      timeit("bulk TMA, 5x32, 256 records per CTA", [&] { k<<<int(n / 256), 128, sm>>>(cache, idx, 256, sink); });
    }
  }
  return 0;
}
