#pragma once
// Thread-block clusters and mbarriers (sm_90) for the attention kernels: the 128-head decode
// runs its two 64-head CTAs as a cluster pair that dequantizes each K tile once, each CTA
// writing its half into both CTAs' shared memory (the peer's copy by st.async, counted in
// transaction bytes on the peer's mbarrier); every arrive and wait is CTA-scope.
// Addresses are 32-bit shared-window addresses (ptx::smem_addr); `peer` forms come from
// map_to_rank. Everything compiles to nothing below sm_90.
#include <cstdint>

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

// sync() in two halves: every thread arrives, then later waits, once each and in that order
// before the next sync. Work in between (global loads, nothing that touches the peer or the
// barriers the arrival publishes) overlaps the barrier's latency.
__device__ __forceinline__ void arrive() {
#ifdef NVFP4MLA_CLUSTER
  asm volatile("barrier.cluster.arrive.release.aligned;\n" ::: "memory");
#endif
}
__device__ __forceinline__ void wait_arrivals() {
#ifdef NVFP4MLA_CLUSTER
  asm volatile("barrier.cluster.wait.acquire.aligned;\n" ::: "memory");
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

__device__ __forceinline__ void mbarrier_init(uint32_t bar, uint32_t arrivals) {
#ifdef NVFP4MLA_CLUSTER
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(arrivals) : "memory");
#endif
}
// Makes initialized mbarriers visible to the cluster (before the cluster sync that publishes them).
__device__ __forceinline__ void fence_mbarrier_init() {
#ifdef NVFP4MLA_CLUSTER
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
#endif
}

// Arrive on this CTA's mbarrier with release semantics at CTA scope: this thread's earlier
// shared-memory writes are visible to whoever completes a wait on the phase. (Cluster scope would
// add a cluster-level memory barrier before every arrive and an L1 invalidation after every wait;
// data from the peer CTA arrives by st.async with transaction bytes instead.)
__device__ __forceinline__ void arrive_local(uint32_t bar) {
#ifdef NVFP4MLA_CLUSTER
  asm volatile("mbarrier.arrive.release.cta.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
#endif
}
// Arrive on another CTA's mbarrier (`bar` from map_to_rank). Used to say "done reading this
// buffer": nothing is published, so the release stays at CTA scope (no cluster membar).
__device__ __forceinline__ void arrive_remote(uint32_t bar) {
#ifdef NVFP4MLA_CLUSTER
  asm volatile("mbarrier.arrive.release.cta.shared::cluster.b64 _, [%0];\n" ::"r"(bar) : "memory");
#endif
}
// Arrive on this CTA's mbarrier and add `bytes` to the transaction count its phase waits for
// (bytes that st.async from another CTA will deliver).
__device__ __forceinline__ void arrive_expect_tx(uint32_t bar, uint32_t bytes) {
#ifdef NVFP4MLA_CLUSTER
  asm volatile("mbarrier.arrive.expect_tx.release.cta.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes) : "memory");
#endif
}

// Wait until the phase with parity `parity` of this CTA's mbarrier has completed (acquire, CTA scope).
__device__ __forceinline__ void wait(uint32_t bar, uint32_t parity) {
#ifdef NVFP4MLA_CLUSTER
  asm volatile(
      "{\n.reg .pred done;\n"
      "WAIT_%=:\n"
      "mbarrier.try_wait.parity.acquire.cta.shared::cta.b64 done, [%0], %1;\n"
      "@!done bra WAIT_%=;\n}\n" ::"r"(bar),
      "r"(parity)
      : "memory");
#endif
}

}  // namespace nvfp4mla::cuda::cluster
