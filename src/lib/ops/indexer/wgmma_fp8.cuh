#pragma once
// FP8 (E4M3) warpgroup MMAs for the indexer logits kernels (sm_90a): D[64xN] (+)= A[64x32] *
// B[32xN], fp32 accumulators, A and B K-major from shared memory in the 128-byte-swizzled
// layout (descriptor below). Accumulators are float[N/8][4] in the per-warp mma.sync m16n8
// layout, as in wgmma_sm90.cuh. Compiles to nothing off sm_90a; callers launch these kernels
// only there.
#include <cstdint>

#include "ops/sparse_mla/wgmma_sm90.cuh"

namespace nvfp4mla::cuda::wgmma {

// Descriptor of a K-major operand in the 128-byte-swizzled layout (layout type 1): rows of 128
// bytes, 8-row atoms `atom_stride` bytes apart (SBO), the start 1024-byte aligned or advanced
// from such an address by less than 128 bytes along K (the swizzle is a function of the address
// bits, so step s of K32 starts 32 s bytes in). The leading offset is unused for swizzled K-major
// operands whose K step fits in a row; it is set to 16 bytes, as CUTLASS does.
__device__ __forceinline__ uint64_t smem_desc_sw128(uint32_t smem_addr, uint32_t atom_stride) {
  return static_cast<uint64_t>((smem_addr & 0x3FFFF) >> 4) | (uint64_t{1} << 16) |
         (static_cast<uint64_t>((atom_stride & 0x3FFFF) >> 4) << 32) | (uint64_t{1} << 62);
}

#define NVFP4MLA_FP8_ACC4(j) "+f"(d[j][0]), "+f"(d[j][1]), "+f"(d[j][2]), "+f"(d[j][3])

// D[64x64] (+)= A[64x32] * B[32x64], E4M3 operands, both K-major from shared memory.
__device__ __forceinline__ void m64n64k32_e4m3(float (&d)[8][4], uint64_t desc_a, uint64_t desc_b, bool accumulate) {
#ifdef NVFP4MLA_WGMMA
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k32.f32.e4m3.e4m3 "
      "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,"
      "%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31}, "
      "%32, %33, p, 1, 1;\n}\n"
      : NVFP4MLA_FP8_ACC4(0), NVFP4MLA_FP8_ACC4(1), NVFP4MLA_FP8_ACC4(2), NVFP4MLA_FP8_ACC4(3),
        NVFP4MLA_FP8_ACC4(4), NVFP4MLA_FP8_ACC4(5), NVFP4MLA_FP8_ACC4(6), NVFP4MLA_FP8_ACC4(7)
      : "l"(desc_a), "l"(desc_b), "r"(static_cast<int>(accumulate)));
#endif
}

// D[64x128] (+)= A[64x32] * B[32x128], E4M3 operands, both K-major from shared memory.
__device__ __forceinline__ void m64n128k32_e4m3(float (&d)[16][4], uint64_t desc_a, uint64_t desc_b, bool accumulate) {
#ifdef NVFP4MLA_WGMMA
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k32.f32.e4m3.e4m3 "
      "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,"
      "%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31,"
      "%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,"
      "%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63}, "
      "%64, %65, p, 1, 1;\n}\n"
      : NVFP4MLA_FP8_ACC4(0), NVFP4MLA_FP8_ACC4(1), NVFP4MLA_FP8_ACC4(2), NVFP4MLA_FP8_ACC4(3),
        NVFP4MLA_FP8_ACC4(4), NVFP4MLA_FP8_ACC4(5), NVFP4MLA_FP8_ACC4(6), NVFP4MLA_FP8_ACC4(7),
        NVFP4MLA_FP8_ACC4(8), NVFP4MLA_FP8_ACC4(9), NVFP4MLA_FP8_ACC4(10), NVFP4MLA_FP8_ACC4(11),
        NVFP4MLA_FP8_ACC4(12), NVFP4MLA_FP8_ACC4(13), NVFP4MLA_FP8_ACC4(14), NVFP4MLA_FP8_ACC4(15)
      : "l"(desc_a), "l"(desc_b), "r"(static_cast<int>(accumulate)));
#endif
}

// D[64x256] (+)= A[64x32] * B[32x256], E4M3 operands, both K-major from shared memory.
__device__ __forceinline__ void m64n256k32_e4m3(float (&d)[32][4], uint64_t desc_a, uint64_t desc_b, bool accumulate) {
#ifdef NVFP4MLA_WGMMA
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %130, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n256k32.f32.e4m3.e4m3 "
      "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,"
      "%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31,"
      "%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,"
      "%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63,"
      "%64,%65,%66,%67,%68,%69,%70,%71,%72,%73,%74,%75,%76,%77,%78,%79,"
      "%80,%81,%82,%83,%84,%85,%86,%87,%88,%89,%90,%91,%92,%93,%94,%95,"
      "%96,%97,%98,%99,%100,%101,%102,%103,%104,%105,%106,%107,%108,%109,%110,%111,"
      "%112,%113,%114,%115,%116,%117,%118,%119,%120,%121,%122,%123,%124,%125,%126,%127}, "
      "%128, %129, p, 1, 1;\n}\n"
      : NVFP4MLA_FP8_ACC4(0), NVFP4MLA_FP8_ACC4(1), NVFP4MLA_FP8_ACC4(2), NVFP4MLA_FP8_ACC4(3),
        NVFP4MLA_FP8_ACC4(4), NVFP4MLA_FP8_ACC4(5), NVFP4MLA_FP8_ACC4(6), NVFP4MLA_FP8_ACC4(7),
        NVFP4MLA_FP8_ACC4(8), NVFP4MLA_FP8_ACC4(9), NVFP4MLA_FP8_ACC4(10), NVFP4MLA_FP8_ACC4(11),
        NVFP4MLA_FP8_ACC4(12), NVFP4MLA_FP8_ACC4(13), NVFP4MLA_FP8_ACC4(14), NVFP4MLA_FP8_ACC4(15),
        NVFP4MLA_FP8_ACC4(16), NVFP4MLA_FP8_ACC4(17), NVFP4MLA_FP8_ACC4(18), NVFP4MLA_FP8_ACC4(19),
        NVFP4MLA_FP8_ACC4(20), NVFP4MLA_FP8_ACC4(21), NVFP4MLA_FP8_ACC4(22), NVFP4MLA_FP8_ACC4(23),
        NVFP4MLA_FP8_ACC4(24), NVFP4MLA_FP8_ACC4(25), NVFP4MLA_FP8_ACC4(26), NVFP4MLA_FP8_ACC4(27),
        NVFP4MLA_FP8_ACC4(28), NVFP4MLA_FP8_ACC4(29), NVFP4MLA_FP8_ACC4(30), NVFP4MLA_FP8_ACC4(31)
      : "l"(desc_a), "l"(desc_b), "r"(static_cast<int>(accumulate)));
#endif
}

#undef NVFP4MLA_FP8_ACC4

// The m64nNk32 E4M3 MMA for N = 8 * NB (64, 128 or 256).
template <int NB>
__device__ __forceinline__ void m64nk32_e4m3(float (&d)[NB][4], uint64_t desc_a, uint64_t desc_b, bool accumulate) {
  static_assert(NB == 8 || NB == 16 || NB == 32);
  if constexpr (NB == 8) m64n64k32_e4m3(d, desc_a, desc_b, accumulate);
  else if constexpr (NB == 16) m64n128k32_e4m3(d, desc_a, desc_b, accumulate);
  else m64n256k32_e4m3(d, desc_a, desc_b, accumulate);
}

}  // namespace nvfp4mla::cuda::wgmma
