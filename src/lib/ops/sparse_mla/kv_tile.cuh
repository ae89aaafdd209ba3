#pragma once
// Turning raw records into BF16 K rows in shared memory, shared by the decode and extend
// kernels. A K row is the dequantized latent (512) followed by the dequantized RoPE (64); V
// is its first 512 values. Every format is read through format.h offsets and the reader
// expressions of record.h: x = (e2m1 * d) * s, r = e4m3 * rs, fp8: e4m3 * p.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <cstdint>
#include <type_traits>

#include "nvfp4mla/codec.h"
#include "nvfp4mla/format.h"
#include "nvfp4mla/record.h"
#include "ops/sparse_mla/mma_sm80.cuh"

namespace nvfp4mla::cuda {

// A record format fixed at compile time (the kernels are instantiated per format).
template <CacheDtype D, RopeEncoding R, ScaleMode M>
struct Format {
  static constexpr RecordSpec spec{D, R, M};
  static constexpr int kRecordBytes = spec.record_bytes();
  // bf16 records are already K rows: they are copied straight into the K tile.
  static constexpr bool kRawIsKRow = D == CacheDtype::bf16;
};

// A K row is dequantized in 36 units of 16 values: 32 latent groups, then 4 RoPE chunks.
inline constexpr int kUnitsPerRow = kQkDim / 16;
inline constexpr int kLatentUnits = kLatentDim / 16;

// 16 K-row values go to shared memory as two 8-value (16-byte) halves: `lo` takes values 0..7,
// `hi` values 8..15. Row-major tiles pass hi = lo + 8; core-matrix tiles (wgmma) pass the two
// core-matrix rows that hold them.
struct Dst16 {
  __nv_bfloat16* lo;
  __nv_bfloat16* hi;
};
__device__ __forceinline__ Dst16 contiguous(__nv_bfloat16* dst) { return {dst, dst + 8}; }

__device__ __forceinline__ void store_16_words(Dst16 dst, uint4 w0, uint4 w1) {
  *reinterpret_cast<uint4*>(dst.lo) = w0;
  *reinterpret_cast<uint4*>(dst.hi) = w1;
}

__device__ __forceinline__ void store_16_zero(Dst16 dst) { store_16_words(dst, make_uint4(0, 0, 0, 0), make_uint4(0, 0, 0, 0)); }

// Aligned fp32 field of a record in shared memory (record widths and fp32 offsets are
// multiples of 4).
__device__ __forceinline__ float load_f32_aligned(const uint8_t* p) { return *reinterpret_cast<const float*>(p); }

// One E4M3 byte to fp32 through the hardware E4M3 -> FP16 conversion (exact, no branches).
__device__ __forceinline__ float e4m3_to_float(uint8_t b) {
  const __half_raw h = __nv_cvt_fp8_to_halfraw(static_cast<__nv_fp8_storage_t>(b), __NV_E4M3);
  return __half2float(*reinterpret_cast<const __half*>(&h));
}

// Two E4M3 bytes (the low 16 bits of `b`) to fp32 through the hardware E4M3 -> FP16 pair
// conversion (exact: E4M3 is a subset of FP16, subnormals included).
__device__ __forceinline__ float2 e4m3x2_to_float2(uint32_t b) {
  const __half2_raw h = __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(b), __NV_E4M3);
  return __half22float2(*reinterpret_cast<const __half2*>(&h));
}
// Eight E4M3 bytes (lo: values 0..3, hi: 4..7) times a scale as eight BF16 values: exact pair
// conversions, fp32 products, one rounding each.
__device__ __forceinline__ uint4 e4m3x8_scaled_words(uint32_t lo, uint32_t hi, float scale) {
  uint32_t w[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float2 f = e4m3x2_to_float2((i < 2 ? lo : hi) >> (16 * (i % 2)));
    w[i] = ptx::pack_bf16x2(f.x * scale, f.y * scale);
  }
  return make_uint4(w[0], w[1], w[2], w[3]);
}

// Eight BF16 values of one NVFP4 group, (e2m1[c] * d) * s for the 8 magnitudes c, as byte
// tables for __byte_perm: hi[0..1] hold the high bytes of c = 0..7, lo[0..1] the low bytes.
// Building the table costs 8 products per 16 elements; each element is then a byte lookup.
struct E2m1Table {
  uint32_t hi[2], lo[2];
};
__device__ __forceinline__ E2m1Table e2m1_table(float d, float s, bool unit) {
  uint32_t w[4];
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    // E2M1 magnitudes from the codec (constant-folded); products with d are exact.
    float a = codec::e2m1_decode(static_cast<uint8_t>(2 * k)) * d, b = codec::e2m1_decode(static_cast<uint8_t>(2 * k + 1)) * d;
    if (!unit) {
      a *= s;
      b *= s;
    }
    w[k] = ptx::pack_bf16x2(a, b);
  }
  E2m1Table t;
  t.hi[0] = __byte_perm(w[0], w[1], 0x7531);
  t.hi[1] = __byte_perm(w[2], w[3], 0x7531);
  t.lo[0] = __byte_perm(w[0], w[1], 0x6420);
  t.lo[1] = __byte_perm(w[2], w[3], 0x6420);
  return t;
}

// Eight E2M1 nibbles (element j in bits 4j..4j+3) to eight BF16 values (four packed words):
// magnitudes by table lookup, signs moved from bit 3 of each nibble to bit 15 of each value.
__device__ __forceinline__ void e2m1x8_lookup(uint32_t nib, const E2m1Table& t, uint32_t (&out)[4]) {
  const uint32_t sign_odd = nib & 0x88888888u;  // byte k's msb: sign of element 2k + 1
  const uint32_t sign_even = sign_odd << 4;     // byte k's msb: sign of element 2k
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const uint32_t sel = (nib >> (16 * half)) & 0x7777u;
    const uint32_t hi = __byte_perm(t.hi[0], t.hi[1], sel), lo = __byte_perm(t.lo[0], t.lo[1], sel);
#pragma unroll
    for (int p = 0; p < 2; ++p) {
      const int k = 2 * half + p;  // output word: elements 2k, 2k + 1
      const uint32_t v = __byte_perm(lo, hi, p == 0 ? 0x5140 : 0x7362);
      const uint32_t sg = __byte_perm(sign_even, sign_odd, 0x4000 + 0x1010 * k);
      out[k] = v | (sg & 0x80008000u);
    }
  }
}

// codec::e2m1x8_to_bf16_pairs values times e2m1_pair_scale(d) are e2m1 * d *
// 2^-codec::kE2m1PairShift exactly; the caller multiplies 2^kE2m1PairShift back in fp32.
__device__ __forceinline__ uint32_t e2m1_pair_scale(float d) {
  const float f = d * codec::kE2m1PairScale;
  return ptx::pack_bf16x2(f, f);
}
__device__ __forceinline__ uint32_t bf16x2_mul(uint32_t a, uint32_t b) {
  const __nv_bfloat162 r = __hmul2(*reinterpret_cast<const __nv_bfloat162*>(&a), *reinterpret_cast<const __nv_bfloat162*>(&b));
  return *reinterpret_cast<const uint32_t*>(&r);
}
// Both 16-head kernels put the pairs of codec::e2m1x8_to_bf16_pairs straight into MMA fragments:
// a lane's 32-dim block (16 bytes of nibbles) feeds 8 k16 steps kk, two fragment registers
// (`slot`: k rows 2c, 2c + 1 or 2c + 8, 2c + 9 of lane c) each. The dim within the block of step
// kk, register `slot` and pair half `h` is that of pair e = 2 (kk % 2) + slot of the block's
// word kk / 2, whose halves are nibbles e and e + 4.
__host__ __device__ constexpr int perm_dim(int kk, int slot, int h) { return 8 * (kk / 2) + 2 * (kk % 2) + slot + 4 * h; }
// Two E4M3 bytes (low half of `b`) to a BF16 pair (exact: E4M3 is a subset of BF16).
__device__ __forceinline__ uint32_t e4m3x2_to_bf16x2(uint32_t b) {
  const float2 f = e4m3x2_to_float2(b);
  return ptx::pack_bf16x2(f.x, f.y);
}

// Unit `u` (0..35) of one record dequantized to 16 BF16 K-row values, as two 16-byte words
// (values 0..7, 8..15), so a caller can store them wherever its tile layout puts them.
struct Words16 {
  uint4 lo, hi;
};
__device__ __forceinline__ Words16 load_words16(const uint8_t* src) {
  const uint4* w = reinterpret_cast<const uint4*>(src);
  return {w[0], w[1]};
}
// The outer scales of one record: the latent's (token scale in dynamic mode, the layer scale in
// static mode, 1 otherwise) and the FP8 RoPE's. Callers that dequantize several units of a record
// read them once.
struct RecordScales {
  float latent = 1.0f, rope = 1.0f;
};
// The latent's outer scale by scale mode: the record's token scale (dynamic), the layer's
// (static), else 1. Read only in dynamic mode, `token_scale` may be anything otherwise.
template <class F>
__device__ __forceinline__ float latent_outer_scale(float token_scale, float layer_scale) {
  if constexpr (F::spec.scale_mode == ScaleMode::dynamic) return token_scale;
  else if constexpr (F::spec.scale_mode == ScaleMode::static_calibrated) return layer_scale;
  else return 1.0f;
}
template <class F>
__device__ __forceinline__ RecordScales record_scales(const uint8_t* rec, float layer_scale) {
  RecordScales sc;
  if constexpr (F::spec.dtype == CacheDtype::nvfp4_ds_mla) {
    namespace L = layout::nvfp4;
    constexpr bool kDynamic = F::spec.scale_mode == ScaleMode::dynamic;
    sc.latent = latent_outer_scale<F>(kDynamic ? load_f32_aligned(rec + L::kTokenScaleOffset) : 0.0f, layer_scale);
    if constexpr (F::spec.rope == RopeEncoding::fp8) sc.rope = load_f32_aligned(rec + L::kRopeScaleOffset);
  }
  return sc;
}

// The outer scales of a record whose latent values enter the MMAs as e2m1 * d *
// 2^-codec::kE2m1PairShift (e2m1_pair_scale): the latent scale times 2^kE2m1PairShift, which
// restores e2m1 * d * s; the RoPE scale as is.
template <class F>
__device__ __forceinline__ RecordScales pair_scaled_record_scales(const uint8_t* rec, float layer_scale) {
  RecordScales sc = record_scales<F>(rec, layer_scale);
  sc.latent *= float(1 << codec::kE2m1PairShift);
  return sc;
}

// One NVFP4 latent group (8 bytes of E2M1 nibbles, its E4M3 scale byte) as 16 BF16 values
// (e2m1 * d) * s, exactly the reader expression of record.h.
template <class F>
__device__ __forceinline__ Words16 nvfp4_group_words_decoded(uint2 nib, float d, float latent_scale) {
  const E2m1Table table = e2m1_table(d, latent_scale, F::spec.scale_mode == ScaleMode::implicit);
  uint32_t w0[4], w1[4];
  e2m1x8_lookup(nib.x, table, w0);
  e2m1x8_lookup(nib.y, table, w1);
  return {make_uint4(w0[0], w0[1], w0[2], w0[3]), make_uint4(w1[0], w1[1], w1[2], w1[3])};
}
template <class F>
__device__ __forceinline__ Words16 nvfp4_group_words(uint2 nib, uint32_t scale_byte, float latent_scale) {
  return nvfp4_group_words_decoded<F>(nib, e4m3_to_float(static_cast<uint8_t>(scale_byte)), latent_scale);
}

template <class F>
__device__ __forceinline__ Words16 dequant_unit_words(const uint8_t* rec, int u, const RecordScales& sc) {
  if constexpr (F::spec.dtype == CacheDtype::nvfp4_ds_mla) {
    namespace L = layout::nvfp4;
    if (u < kLatentUnits) {
      return nvfp4_group_words<F>(*reinterpret_cast<const uint2*>(rec + L::kLatentOffset + 8 * u),
                                  rec[L::kGroupScaleOffset + u], sc.latent);
    } else if constexpr (F::spec.rope == RopeEncoding::fp8) {
      const uint4 b = *reinterpret_cast<const uint4*>(rec + L::kRopeOffset + 16 * (u - kLatentUnits));
      return {e4m3x8_scaled_words(b.x, b.y, sc.rope), e4m3x8_scaled_words(b.z, b.w, sc.rope)};
    } else {
      return load_words16(rec + L::kRopeOffset + 32 * (u - kLatentUnits));
    }
  } else if constexpr (F::spec.dtype == CacheDtype::bf16) {
    // A bf16 record is a K row already: unit u is bytes [32u, 32u + 32).
    return load_words16(rec + 32 * u);
  } else {
    static_assert(F::spec.dtype == CacheDtype::fp8_ds_mla);
    namespace L = layout::fp8;
    if (u < kLatentUnits) {
      const float p = load_f32_aligned(rec + L::kTileScaleOffset + 4 * (u * 16 / L::kTileDim));
      const uint4 b = *reinterpret_cast<const uint4*>(rec + L::kLatentOffset + 16 * u);
      return {e4m3x8_scaled_words(b.x, b.y, p), e4m3x8_scaled_words(b.z, b.w, p)};
    }
    return load_words16(rec + L::kRopeOffset + 32 * (u - kLatentUnits));
  }
}
template <class F>
__device__ __forceinline__ Words16 dequant_unit_words(const uint8_t* rec, int u, float layer_scale) {
  return dequant_unit_words<F>(rec, u, record_scales<F>(rec, layer_scale));
}

// Dequantize unit `u` (0..35) of one record into dst (16 BF16 values of the K row).
template <class F>
__device__ __forceinline__ void dequant_unit(const uint8_t* rec, int u, float layer_scale, Dst16 dst) {
  const Words16 w = dequant_unit_words<F>(rec, u, layer_scale);
  store_16_words(dst, w.lo, w.hi);
}

template <class F>
__device__ __forceinline__ void dequant_unit(const uint8_t* rec, int u, float layer_scale, __nv_bfloat16* dst) {
  dequant_unit<F>(rec, u, layer_scale, contiguous(dst));
}

// The eighth of a record that one of eight threads per entry dequantizes in the 64-entry
// warp-specialized kernel, loaded from global memory straight into registers: latent units
// [4 part, 4 part + 4) (dims [64 part, 64 part + 64)) and RoPE values [8 part, 8 part + 8), with
// the scale fields they need. A masked entry's slice is all zero bits, which dequantize to exact
// zeros. One slice type per record format (RecordSlice), each with the same interface:
// load_record_slice, slice_latent_scale, slice_group_words (unit j of the four, 16 BF16 values)
// and slice_rope_words (the eight RoPE values as one word).
inline constexpr int kSliceParts = 8, kSliceUnits = kLatentUnits / kSliceParts, kSliceRopeValues = kRopeDim / kSliceParts;
static_assert(kSliceUnits == 4 && kSliceRopeValues == 8);

// NVFP4: the part's four groups of nibbles and scale bytes, the RoPE scale and token scale.
template <class F>
struct Nvfp4Slice {
  static_assert(F::spec.dtype == CacheDtype::nvfp4_ds_mla);
  static constexpr int kParts = kSliceParts, kGroups = kSliceUnits, kRopeValues = kSliceRopeValues;
  static constexpr bool kFp8Rope = F::spec.rope == RopeEncoding::fp8;
  static_assert(layout::nvfp4::kNumGroups == kParts * kGroups && layout::nvfp4::kGroupSize == 16,
                "two 16-byte nibble loads, four scale bytes");
  uint4 nib[2];
  uint32_t group_scales;
  uint2 outer;  // RoPE scale, token scale (fp32 bits)
  uint4 rope;   // fp8: .x .y hold 8 E4M3 bytes; bf16: 8 values
};
template <class F>
__device__ __forceinline__ void load_record_slice(const uint8_t* __restrict__ rec, int part, bool valid, Nvfp4Slice<F>& x) {
  namespace L = layout::nvfp4;
  using S = Nvfp4Slice<F>;
  static_assert(L::kTokenScaleOffset == L::kRopeScaleOffset + 4 && L::kRopeScaleOffset % 8 == 0);
  if (!valid) {
    x.nib[0] = x.nib[1] = x.rope = make_uint4(0, 0, 0, 0);
    x.group_scales = 0;
    x.outer = make_uint2(0, 0);
    return;
  }
  // The part's offsets are recomputed at every call: hoisted out of the caller's loop they became
  // per-part 64-bit base pointers, which ptxas spilled, and whose reloads from local memory
  // missed the L1 the record gathers keep thrashing (ncu: the producers' longest stalls).
  asm volatile("" : "+r"(part));
  const uint4* nib = reinterpret_cast<const uint4*>(rec + L::kLatentOffset + S::kGroups * (L::kGroupSize / 2) * part);
  x.nib[0] = __ldg(nib);
  x.nib[1] = __ldg(nib + 1);
  x.group_scales = __ldg(reinterpret_cast<const uint32_t*>(rec + L::kGroupScaleOffset + S::kGroups * part));
  x.outer = __ldg(reinterpret_cast<const uint2*>(rec + L::kRopeScaleOffset));
  if constexpr (S::kFp8Rope) {
    const uint2 r = __ldg(reinterpret_cast<const uint2*>(rec + L::kRopeOffset + S::kRopeValues * part));
    x.rope = make_uint4(r.x, r.y, 0, 0);
  } else {
    x.rope = __ldg(reinterpret_cast<const uint4*>(rec + L::kRopeOffset + 2 * S::kRopeValues * part));
  }
}
// The slice's latent outer scale; latent group `j` (0..3) as 16 BF16 values; its eight RoPE
// values as one word.
template <class F>
__device__ __forceinline__ float slice_latent_scale(const Nvfp4Slice<F>& x, float layer_scale) {
  return latent_outer_scale<F>(__uint_as_float(x.outer.y), layer_scale);
}
// Latent group j's E4M3 scale, decoded; and the group's values given that decoded scale (a
// caller can decode the first scale early: it is the first instruction that reads the slice).
template <class F>
__device__ __forceinline__ float slice_group_scale(const Nvfp4Slice<F>& x, int j) {
  return e4m3_to_float(static_cast<uint8_t>(x.group_scales >> (8 * j)));
}
template <class F>
__device__ __forceinline__ Words16 slice_group_words(const Nvfp4Slice<F>& x, int j, float latent_scale, float group_scale) {
  const uint4& n = x.nib[j / 2];
  const uint2 nib = j % 2 == 0 ? make_uint2(n.x, n.y) : make_uint2(n.z, n.w);
  return nvfp4_group_words_decoded<F>(nib, group_scale, latent_scale);
}
template <class F>
__device__ __forceinline__ Words16 slice_group_words(const Nvfp4Slice<F>& x, int j, float latent_scale) {
  return slice_group_words(x, j, latent_scale, slice_group_scale(x, j));
}
template <class F>
__device__ __forceinline__ uint4 slice_rope_words(const Nvfp4Slice<F>& x) {
  if constexpr (Nvfp4Slice<F>::kFp8Rope) return e4m3x8_scaled_words(x.rope.x, x.rope.y, __uint_as_float(x.outer.x));
  else return x.rope;
}

// FP8: the part's 64 E4M3 latent bytes, the scale of the 128-dim tile they lie in, and its eight
// BF16 RoPE values.
template <class F>
struct Fp8Slice {
  static_assert(F::spec.dtype == CacheDtype::fp8_ds_mla);
  static constexpr int kParts = kSliceParts, kGroups = kSliceUnits, kRopeValues = kSliceRopeValues;
  static constexpr int kPartDims = kLatentDim / kParts;
  static_assert(layout::fp8::kTileDim % kPartDims == 0, "a part's latent dims share one tile scale");
  uint4 latent[kGroups];  // 16 E4M3 bytes per unit
  float tile_scale;
  uint4 rope;  // 8 BF16 values
};
template <class F>
__device__ __forceinline__ void load_record_slice(const uint8_t* __restrict__ rec, int part, bool valid, Fp8Slice<F>& x) {
  namespace L = layout::fp8;
  using S = Fp8Slice<F>;
  if (!valid) {
#pragma unroll
    for (int j = 0; j < S::kGroups; ++j) x.latent[j] = make_uint4(0, 0, 0, 0);
    x.tile_scale = 0.0f;
    x.rope = make_uint4(0, 0, 0, 0);
    return;
  }
  asm volatile("" : "+r"(part));  // offsets recomputed per call, as for NVFP4 slices
  const uint4* latent = reinterpret_cast<const uint4*>(rec + L::kLatentOffset + S::kPartDims * part);
#pragma unroll
  for (int j = 0; j < S::kGroups; ++j) x.latent[j] = __ldg(latent + j);
  x.tile_scale = __ldg(reinterpret_cast<const float*>(rec + L::kTileScaleOffset) + S::kPartDims * part / L::kTileDim);
  x.rope = __ldg(reinterpret_cast<const uint4*>(rec + L::kRopeOffset + 2 * S::kRopeValues * part));
}
template <class F>
__device__ __forceinline__ float slice_latent_scale(const Fp8Slice<F>& x, float) {
  return x.tile_scale;
}
// Unit j of the part: e4m3 * tile scale in fp32, rounded once to BF16 (as dequant_unit_words).
template <class F>
__device__ __forceinline__ Words16 slice_group_words(const Fp8Slice<F>& x, int j, float latent_scale) {
  const uint4& b = x.latent[j];
  return {e4m3x8_scaled_words(b.x, b.y, latent_scale), e4m3x8_scaled_words(b.z, b.w, latent_scale)};
}
template <class F>
__device__ __forceinline__ uint4 slice_rope_words(const Fp8Slice<F>& x) {
  return x.rope;
}

// The register slice of format F's records.
template <class F>
using RecordSlice = std::conditional_t<F::spec.dtype == CacheDtype::nvfp4_ds_mla, Nvfp4Slice<F>, Fp8Slice<F>>;

}  // namespace nvfp4mla::cuda
