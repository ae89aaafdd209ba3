#pragma once
// Thread-block clusters (sm_90) for the attention kernels: the 128-head decode
// runs its two 64-head CTAs as a cluster pair that dequantizes each K tile once, each CTA
// writing its half into both CTAs' shared memory (the peer's copy by st.async, counted in
// transaction bytes on the peer's mbarrier); every arrive and wait is CTA-scope (device/mbarrier.cuh).
// Addresses are 32-bit shared-window addresses (ptx::smem_addr); `peer` forms come from
// map_to_rank. Everything compiles to nothing below sm_90.
#include <cstdint>

#include "device/mbarrier.cuh"  // the CTA-scope arrive/wait the cluster kernels pair with these

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
#define NVFP4MLA_CLUSTER 1
#endif

namespace nvfp4mla::cuda::cluster {

__device__ __forceinline__ uint32_t rank() {
  uint32_t r = 0;
#ifdef NVFP4MLA_CLUSTER
  asm volatile("mov.u32 %0, %%cluster_ctarank;\n" : "=r"(r));
#endif
  return r;
}

// All threads of both CTAs: release this CTA's prior writes, acquire the peer's.
__device__ __forceinline__ void sync() {
#ifdef NVFP4MLA_CLUSTER
  asm volatile("barrier.cluster.arrive.release.aligned;\nbarrier.cluster.wait.acquire.aligned;\n" ::: "memory");
#endif
}

// The address of the same shared-memory location in CTA `r` of the cluster.
__device__ __forceinline__ uint32_t map_to_rank(uint32_t addr, uint32_t r) {
  uint32_t out = addr;
#ifdef NVFP4MLA_CLUSTER
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;\n" : "=r"(out) : "r"(addr), "r"(r));
#endif
  return out;
}

// 16 bytes into another CTA's shared memory (`addr` from map_to_rank) that count towards the
// transaction bytes of that CTA's mbarrier `remote_bar` (also from map_to_rank): the waiter on
// that barrier sees the data without any cluster-scope fence on the writer's side.
__device__ __forceinline__ void store_async(uint32_t addr, uint4 v, uint32_t remote_bar) {
#ifdef NVFP4MLA_CLUSTER
  asm volatile("st.async.shared::cluster.mbarrier::complete_tx::bytes.v4.b32 [%0], {%1, %2, %3, %4}, [%5];\n" ::"r"(addr),
               "r"(v.x), "r"(v.y), "r"(v.z), "r"(v.w), "r"(remote_bar)
               : "memory");
#endif
}
// The same for 4 bytes.
__device__ __forceinline__ void store_async(uint32_t addr, uint32_t v, uint32_t remote_bar) {
#ifdef NVFP4MLA_CLUSTER
  asm volatile("st.async.shared::cluster.mbarrier::complete_tx::bytes.b32 [%0], %1, [%2];\n" ::"r"(addr), "r"(v), "r"(remote_bar)
               : "memory");
#endif
}

// Arrive on another CTA's mbarrier (`bar` from map_to_rank). Used to say "done reading this
// buffer": nothing is published, so the release stays at CTA scope (no cluster membar).
__device__ __forceinline__ void arrive_remote(uint32_t bar) {
#ifdef NVFP4MLA_CLUSTER
  asm volatile("mbarrier.arrive.release.cta.shared::cluster.b64 _, [%0];\n" ::"r"(bar) : "memory");
#endif
}

}  // namespace nvfp4mla::cuda::cluster
