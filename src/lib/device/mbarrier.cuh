#pragma once
// CTA-scope mbarriers and register reallocation (sm_90) shared by the warp-specialized kernels
// (the sparse MLA decode, the indexer logits): full/empty handoffs between producer and
// consumer roles of one CTA. Addresses are 32-bit shared-window addresses (ptx::smem_addr).
// Everything compiles to nothing below sm_90; callers launch these kernels only there.
#include <cstdint>

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
#define NVFP4MLA_MBARRIER 1
#endif

// setmaxnreg (sm_90a): a warpgroup gives registers back to the CTA's pool (dec) or takes them
// (inc, which waits until the pool has them); every warp of the warpgroup runs the same one.
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define NVFP4MLA_SETMAXNREG(dir, n) asm volatile("setmaxnreg." #dir ".sync.aligned.u32 %0;\n" ::"n"(n))
#else
#define NVFP4MLA_SETMAXNREG(dir, n)
#endif

namespace nvfp4mla::cuda::mbarrier {

__device__ __forceinline__ void init(uint32_t bar, uint32_t arrivals) {
#ifdef NVFP4MLA_MBARRIER
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(arrivals) : "memory");
#endif
}
// Makes initialized mbarriers visible to the cluster and the async proxy (TMA, st.async), before
// the CTA or cluster barrier that publishes them.
__device__ __forceinline__ void fence_init() {
#ifdef NVFP4MLA_MBARRIER
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
#endif
}

// Arrive on this CTA's mbarrier with release semantics at CTA scope: this thread's earlier
// shared-memory writes are visible to whoever completes a wait on the phase. (Cluster scope would
// add a cluster-level memory barrier before every arrive and an L1 invalidation after every wait;
// data from a peer CTA arrives by st.async with transaction bytes instead.)
__device__ __forceinline__ void arrive(uint32_t bar) {
#ifdef NVFP4MLA_MBARRIER
  asm volatile("mbarrier.arrive.release.cta.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
#endif
}
// The same, counting as `count` of the phase's expected arrivals.
__device__ __forceinline__ void arrive(uint32_t bar, uint32_t count) {
#ifdef NVFP4MLA_MBARRIER
  asm volatile("mbarrier.arrive.release.cta.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
#endif
}
// Arrive on this CTA's mbarrier and add `bytes` to the transaction count its phase waits for
// (bytes that TMA or st.async from another CTA will deliver).
__device__ __forceinline__ void arrive_expect_tx(uint32_t bar, uint32_t bytes) {
#ifdef NVFP4MLA_MBARRIER
  asm volatile("mbarrier.arrive.expect_tx.release.cta.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes) : "memory");
#endif
}

// Arrive on this CTA's mbarrier once every cp.async this thread issued before has landed. The
// arrival is one of the barrier's expected arrivals (.noinc), counted in its init count.
__device__ __forceinline__ void arrive_on_async_copies(uint32_t bar) {
#ifdef NVFP4MLA_MBARRIER
  asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];\n" ::"r"(bar) : "memory");
#endif
}

// Wait until the phase with parity `parity` of this CTA's mbarrier has completed (acquire, CTA scope).
__device__ __forceinline__ void wait(uint32_t bar, uint32_t parity) {
#ifdef NVFP4MLA_MBARRIER
  asm volatile(
      "{\n.reg .pred done;\n"
      "WAIT_%=:\n"
      "mbarrier.try_wait.parity.acquire.cta.shared::cta.b64 done, [%0], %1;\n"
      "@!done bra WAIT_%=;\n}\n" ::"r"(bar),
      "r"(parity)
      : "memory");
#endif
}

}  // namespace nvfp4mla::cuda::mbarrier
