#pragma once
// Warpgroup MMA (sm_90a) for the attention kernels: shared-memory matrix descriptors for the
// no-swizzle ("interleaved") canonical layout, BF16 wgmma shapes the decode kernel uses, and
// the fences and group waits they need. Everything here compiles to nothing on other targets;
// callers only launch the kernels that use it on sm_90.
//
// The no-swizzle canonical layout is built from 8x8 core matrices: 8 rows of 8 BF16 values,
// each row 16 contiguous bytes, the whole core matrix 128 contiguous bytes. A descriptor gives
// the start address and two strides between core matrices:
//   K-major operand (rows along M/N, values along K): LBO = next 8 K values, SBO = next 8 rows;
//   MN-major operand (transposed B: rows along K, values along N): LBO = next 8 K rows,
//   SBO = next 8 N values.
// A K tile stored as core matrices of (8 tokens x 8 dims) serves both products of attention:
// K-major B for S = Q K^T (N = tokens) and MN-major B for O = P V (K = tokens, N = dims).
#include <cstdint>

#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define NVFP4MLA_WGMMA 1
#endif

namespace nvfp4mla::cuda::wgmma {

__device__ __forceinline__ uint64_t smem_desc(uint32_t smem_addr, uint32_t lbo_bytes, uint32_t sbo_bytes) {
  // Bits 0-13 address >> 4, 16-29 LBO >> 4, 32-45 SBO >> 4; swizzle mode 0 (none), base offset 0.
  return static_cast<uint64_t>((smem_addr & 0x3FFFF) >> 4) | (static_cast<uint64_t>((lbo_bytes & 0x3FFFF) >> 4) << 16) |
         (static_cast<uint64_t>((sbo_bytes & 0x3FFFF) >> 4) << 32);
}

// 128-byte swizzled layout (Swizzle<3,4,3>: the 16-byte chunk bits 4-6 of an address are XORed
// with its row bits 7-9, so the layout's atoms must start 1024-byte aligned). An atom is 8 rows of
// 128 contiguous bytes. K-major: rows along M/N, SBO = next 8 rows, LBO unused (K stays inside a
// row: advance the start by 32 bytes per 16 values). MN-major: rows along K, LBO = next 64 M/N
// values (the next atom column), SBO = next 8 K rows.
__device__ __forceinline__ uint64_t smem_desc_sw128(uint32_t smem_addr, uint32_t lbo_bytes, uint32_t sbo_bytes) {
  return smem_desc(smem_addr, lbo_bytes, sbo_bytes) | (uint64_t{1} << 62);
}

// The descriptor of the same layout `bytes` further on (a multiple of 16): the address field
// is the low 14 bits and tiles stay below 256 KB, so the add never carries into the strides.
// Keep `bytes` a compile-time constant in unrolled loops: the add then folds into the
// uniform-register arithmetic instead of rebuilding the descriptor per MMA.
__device__ __forceinline__ uint64_t desc_advance(uint64_t desc, uint32_t bytes) { return desc + (bytes >> 4); }

__device__ __forceinline__ void fence() {
#ifdef NVFP4MLA_WGMMA
  asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#endif
}
__device__ __forceinline__ void commit() {
#ifdef NVFP4MLA_WGMMA
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
#endif
}
template <int kPending>
__device__ __forceinline__ void wait() {
#ifdef NVFP4MLA_WGMMA
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(kPending) : "memory");
#endif
}
// Generic-proxy shared-memory stores (dequantized tiles, Q) made visible to the tensor cores'
// async proxy; each writing thread runs it before the barrier that publishes the data.
__device__ __forceinline__ void fence_proxy_async_smem() {
#ifdef NVFP4MLA_WGMMA
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
#endif
}

// Pins registers that an asynchronous wgmma reads or writes at this point of the program: the
// compiler may otherwise move plain arithmetic on them across the fences and waits above (which
// only order memory), computing an A fragment after the wgmma that reads it or reading an
// accumulator before the wait, and ptxas then serializes every wgmma (C7513/C7514).
template <int N>
__device__ __forceinline__ void fence_operand(float (&d)[N][4]) {
#pragma unroll
  for (int j = 0; j < N; ++j)
#pragma unroll
    for (int i = 0; i < 4; ++i) asm volatile("" : "+f"(d[j][i])::"memory");
}
__device__ __forceinline__ void fence_operand(uint32_t (&a)[4]) {
#pragma unroll
  for (int i = 0; i < 4; ++i) asm volatile("" : "+r"(a[i])::"memory");
}

// Accumulators are passed as float[N/8][4]: block j holds rows g, g+8 of the warp's 16 rows at
// columns 8j + 2*(lane%4) + {0,1}, the same per-warp layout as mma.sync m16n8 accumulators.
#define NVFP4MLA_ACC4(j) "+f"(d[j][0]), "+f"(d[j][1]), "+f"(d[j][2]), "+f"(d[j][3])

// D[64x16] (+)= A[64x16] * B[16x16]: A from registers (the mma.sync m16n8k16 A layout per warp,
// rows 16w..16w+15 for warp w of the warpgroup), B K-major from shared memory.
__device__ __forceinline__ void m64n16k16_rs(float (&d)[2][4], const uint32_t (&a)[4], uint64_t desc_b, bool accumulate) {
#ifdef NVFP4MLA_WGMMA
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %13, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n16k16.f32.bf16.bf16 "
      "{%0,%1,%2,%3,%4,%5,%6,%7}, {%8,%9,%10,%11}, %12, p, 1, 1, 0;\n}\n"
      : NVFP4MLA_ACC4(0), NVFP4MLA_ACC4(1)
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(static_cast<int>(accumulate)));
#endif
}
// D[64x16] += A[64x16] * B[16x16], A and B K-major from shared memory.
__device__ __forceinline__ void m64n16k16_ss(float (&d)[2][4], uint64_t desc_a, uint64_t desc_b) {
#ifdef NVFP4MLA_WGMMA
  asm volatile(
      "wgmma.mma_async.sync.aligned.m64n16k16.f32.bf16.bf16 "
      "{%0,%1,%2,%3,%4,%5,%6,%7}, %8, %9, 1, 1, 1, 0, 0;\n"
      : NVFP4MLA_ACC4(0), NVFP4MLA_ACC4(1)
      : "l"(desc_a), "l"(desc_b));
#endif
}

// D[64x32] (+)= A[64x16] * B[16x32], A and B K-major from shared memory.
__device__ __forceinline__ void m64n32k16_ss(float (&d)[4][4], uint64_t desc_a, uint64_t desc_b, bool accumulate) {
#ifdef NVFP4MLA_WGMMA
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %18, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 "
      "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15}, %16, %17, p, 1, 1, 0, 0;\n}\n"
      : NVFP4MLA_ACC4(0), NVFP4MLA_ACC4(1), NVFP4MLA_ACC4(2), NVFP4MLA_ACC4(3)
      : "l"(desc_a), "l"(desc_b), "r"(static_cast<int>(accumulate)));
#endif
}

// D[64x64] (+)= A[64x16] * B[16x64], A and B K-major from shared memory.
__device__ __forceinline__ void m64n64k16_ss(float (&d)[8][4], uint64_t desc_a, uint64_t desc_b, bool accumulate) {
#ifdef NVFP4MLA_WGMMA
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 "
      "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,"
      "%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31}, %32, %33, p, 1, 1, 0, 0;\n}\n"
      : NVFP4MLA_ACC4(0), NVFP4MLA_ACC4(1), NVFP4MLA_ACC4(2), NVFP4MLA_ACC4(3), NVFP4MLA_ACC4(4), NVFP4MLA_ACC4(5),
        NVFP4MLA_ACC4(6), NVFP4MLA_ACC4(7)
      : "l"(desc_a), "l"(desc_b), "r"(static_cast<int>(accumulate)));
#endif
}
// The score product of a KV tile of 8 * NT entries (NT = 4 or 8).
template <int NT>
__device__ __forceinline__ void m64nk16_ss(float (&d)[NT][4], uint64_t desc_a, uint64_t desc_b, bool accumulate) {
  static_assert(NT == 4 || NT == 8);
  if constexpr (NT == 4) m64n32k16_ss(d, desc_a, desc_b, accumulate);
  else m64n64k16_ss(d, desc_a, desc_b, accumulate);
}

#define NVFP4MLA_ACC32(b) NVFP4MLA_ACC4(b), NVFP4MLA_ACC4(b + 1), NVFP4MLA_ACC4(b + 2), NVFP4MLA_ACC4(b + 3), \
                          NVFP4MLA_ACC4(b + 4), NVFP4MLA_ACC4(b + 5), NVFP4MLA_ACC4(b + 6), NVFP4MLA_ACC4(b + 7)

// D[64x128] += A[64x16] * B[16x128]: A from registers (four BF16x2 per thread, the mma.sync
// m16n8k16 A layout per warp), B MN-major (transposed) from shared memory. `d` is the 16-block
// slice of a larger accumulator array starting at block `first`.
template <int first, int blocks>
__device__ __forceinline__ void m64n128k16_rs_tb(float (&d)[blocks][4], const uint32_t (&a)[4], uint64_t desc_b) {
  static_assert(first + 16 <= blocks);
#ifdef NVFP4MLA_WGMMA
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 "
      "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,"
      "%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31,"
      "%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,"
      "%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63}, "
      "{%64,%65,%66,%67}, %68, p, 1, 1, 1;\n}\n"
      : NVFP4MLA_ACC32(first), NVFP4MLA_ACC32(first + 8)
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(1));
#endif
}

// D[64x128] += A[64x16] * B[16x128]: A K-major from shared memory, B MN-major (transposed).
template <int first, int blocks>
__device__ __forceinline__ void m64n128k16_ss_tb(float (&d)[blocks][4], uint64_t desc_a, uint64_t desc_b) {
  static_assert(first + 16 <= blocks);
#ifdef NVFP4MLA_WGMMA
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 "
      "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,"
      "%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31,"
      "%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,"
      "%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63}, "
      "%64, %65, p, 1, 1, 0, 1;\n}\n"
      : NVFP4MLA_ACC32(first), NVFP4MLA_ACC32(first + 8)
      : "l"(desc_a), "l"(desc_b), "r"(1));
#endif
}

#undef NVFP4MLA_ACC32
#undef NVFP4MLA_ACC4

}  // namespace nvfp4mla::cuda::wgmma
