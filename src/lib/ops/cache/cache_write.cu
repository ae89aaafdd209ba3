// GPU cache writer: one warp per token (BF16 inputs: 4 consecutive tokens per warp, the next
// one loading while the current one encodes), lane g owns latent group g (16 values) and RoPE
// values 2g, 2g+1. One kernel per input type and record format, so the format's branches and
// constants are resolved at compile time. The bytes equal those of the CPU writer (record.h):
// maxima are exact, so warp reductions give the same scales, and the divisions of the recipe
// are replaced by the exact division-free encoders of fast_encode.cuh
// (tests/unit/fast_encode_test.cpp); BF16 inputs without Inf/NaN are encoded two values at a
// time (packed BF16 maxima and compares).
#include <cuda_runtime.h>

#include <cstdint>
#include <string>
#include <type_traits>

#include "device/cuda_check.h"
#include "nvfp4mla/codec.h"
#include "nvfp4mla/cuda/cache_write.h"
#include "nvfp4mla/error.h"
#include "nvfp4mla/record.h"
#include "ops/cache/fast_encode.cuh"
#include "ops/sparse_mla/format_dispatch.cuh"

namespace nvfp4mla::cuda {
namespace {

constexpr int kWarpsPerBlock = 8;
// Tokens per warp: BF16 inputs encode one token while the next one loads (two register buffers
// taking turns); the fp32 path of FP16/F32 inputs needs the registers for itself.
template <class In>
constexpr int kTokensPerWarp = std::is_same_v<In, Bf16Bits> ? 4 : 1;
// Resident blocks per SM the register allocation must allow: 4 (64 registers) for BF16, 3 for
// the others (their fp32 path would spill at 64). BF16 into 368-byte records spills a few bytes
// at 64 registers (ptxas: 10-14 bytes) and still writes faster than with 3 blocks and ~80
// registers (H200, 2^20 tokens: 83.0-88.5% of copy bandwidth against 78.6-85.0%).
template <class In, class F>
constexpr int kMinBlocks = std::is_same_v<In, Bf16Bits> ? 4 : 3;
constexpr unsigned kFull = 0xFFFFFFFFu;

__device__ __forceinline__ float warp_max(float v, int width = 32) {
  for (int o = width / 2; o > 0; o >>= 1) v = record::max_f(v, __shfl_xor_sync(kFull, v, o));
  return v;
}

// max |x| of 16 finite values.
__device__ __forceinline__ float abs_max16(const float (&x)[16]) {
  float m = 0.0f;
#pragma unroll
  for (int i = 0; i < 16; ++i) m = fmaxf(m, fabsf(x[i]));
  return m;
}

// One token's raw input of one lane: latent values 16 lane .. 16 lane + 15 and RoPE values
// 2 lane, 2 lane + 1 (16-byte and pair-sized loads; the host wrapper checks the alignment),
// and the token's slot. Loaded one token ahead of the encoding (prefetch).
template <class In>
struct RawToken {
  static constexpr int kVecs = sizeof(In) == 4 ? 4 : 2;
  uint4 v[kVecs];
  uint32_t r[sizeof(In) == 4 ? 2 : 1];
  int64_t slot;
};

// Reads a warp's consecutive tokens in order: the lane's pointers into the current token's
// rows, advanced by one row per token (no per-token 64-bit index arithmetic; the strides stay
// kernel parameters rather than registers).
template <class In>
struct TokenReader {
  const uint4* v;  // latent values 16 lane .. 16 lane + 15
  const In* r;     // RoPE values 2 lane, 2 lane + 1
  const int64_t* slot;

  __device__ __forceinline__ TokenReader(const In* kv_c, const In* k_pe, const int64_t* slots, int64_t t,
                                         int64_t kv_c_stride, int64_t k_pe_stride, int lane)
      : v(reinterpret_cast<const uint4*>(kv_c + t * kv_c_stride + 16 * lane)),
        r(k_pe + t * k_pe_stride + 2 * lane),
        slot(slots + t) {}

  // The current token's raw input (16-byte and pair-sized loads; the host wrapper checks the
  // alignment); then moves to the next token.
  __device__ __forceinline__ RawToken<In> next(int64_t kv_c_stride, int64_t k_pe_stride) {
    RawToken<In> raw;
    raw.slot = __ldcs(slot);
#pragma unroll
    for (int i = 0; i < RawToken<In>::kVecs; ++i) raw.v[i] = __ldcs(v + i);
    if constexpr (sizeof(In) == 4) {
      const uint2 w = __ldcs(reinterpret_cast<const uint2*>(r));
      raw.r[0] = w.x;
      raw.r[1] = w.y;
    } else {
      raw.r[0] = __ldcs(reinterpret_cast<const unsigned int*>(r));
    }
    v = reinterpret_cast<const uint4*>(reinterpret_cast<const In*>(v) + kv_c_stride);
    r += k_pe_stride;
    ++slot;
    return raw;
  }
};

// The 16 latent and 2 RoPE values of a lane as fp32 (not sanitized).
template <class In>
__device__ __forceinline__ float latent_value(const RawToken<In>& raw, int i) {
  const uint32_t* w = reinterpret_cast<const uint32_t*>(raw.v);
  if constexpr (sizeof(In) == 4) {
    return __uint_as_float(w[i]);
  } else {
    const In h{static_cast<uint16_t>(i & 1 ? w[i / 2] >> 16 : w[i / 2] & 0xFFFFu)};
    return record::to_fp32(h);
  }
}
template <class In>
__device__ __forceinline__ float rope_value(const RawToken<In>& raw, int i) {
  if constexpr (sizeof(In) == 4) {
    return __uint_as_float(raw.r[i]);
  } else {
    const In h{static_cast<uint16_t>(i ? raw.r[0] >> 16 : raw.r[0] & 0xFFFFu)};
    return record::to_fp32(h);
  }
}

// Warp maximum of non-negative finite floats (they order like their bit patterns).
__device__ __forceinline__ float warp_max_nonneg(float v) {
  return __uint_as_float(__reduce_max_sync(kFull, __float_as_uint(v)));
}

// One NVFP4 group through the fp32 path: the division-free encoder when the outer scale is in
// its range, else the recipe's divisions as written.
struct GroupCode {
  uint32_t nib[2];
  uint8_t scale_byte;
};
template <class In>
__device__ __forceinline__ GroupCode encode_group_fp32(const RawToken<In>& raw, float gmax, float s, bool unit,
                                                       bool fast_scale) {
  GroupCode c;
  float x[16];
#pragma unroll
  for (int i = 0; i < 16; ++i) x[i] = record::sanitize(latent_value(raw, i));
  if (fast_scale) {
    c.scale_byte = fastenc::nvfp4_group(x, gmax, s, unit, c.nib);
    return c;
  }
  float gy = 0.0f;
#pragma unroll
  for (int i = 0; i < 16; ++i) {
    x[i] = record::nvfp4_prescale(x[i], s);
    gy = record::max_f(gy, record::abs_f(x[i]));
  }
  c.scale_byte = record::nvfp4_group_scale_byte(gy);
  const float d = codec::e4m3_decode(c.scale_byte);
  c.nib[0] = c.nib[1] = 0;
#pragma unroll
  for (int i = 0; i < 16; ++i) c.nib[i / 8] |= static_cast<uint32_t>(record::nvfp4_nibble(x[i], d)) << (4 * (i % 8));
  return c;
}

template <class In, class F>
__device__ __forceinline__ void encode_token(const RawToken<In>& raw, uint8_t* cache, int64_t capacity,
                                             float layer_scale, float layer_inv_scale, const uint4* static_bounds,
                                             unsigned long long* error_count, int lane, bool packed_ok) {
  constexpr RecordSpec spec = F::spec;
  const int64_t slot = raw.slot;
  if (slot < 0) return;  // padded slot
  if (slot >= capacity) {
    if (lane == 0 && error_count) atomicAdd(error_count, 1ull);
    return;
  }
  uint8_t* rec = cache + slot * F::kRecordBytes;
  constexpr bool kBf16In = std::is_same_v<In, Bf16Bits>;
  if constexpr (spec.dtype == CacheDtype::bf16) {
    uint32_t w[8];
    if constexpr (kBf16In) {
      const uint32_t* src = reinterpret_cast<const uint32_t*>(raw.v);
#pragma unroll
      for (int i = 0; i < 8; ++i) w[i] = src[i];
    } else {
#pragma unroll
      for (int i = 0; i < 8; ++i) {
        In a, b;
        if constexpr (sizeof(In) == 4) {
          a = latent_value(raw, 2 * i);
          b = latent_value(raw, 2 * i + 1);
        } else {
          const uint32_t* src = reinterpret_cast<const uint32_t*>(raw.v);
          a.bits = static_cast<uint16_t>(src[i] & 0xFFFFu);
          b.bits = static_cast<uint16_t>(src[i] >> 16);
        }
        w[i] = record::bf16_bits_of(a) | (static_cast<uint32_t>(record::bf16_bits_of(b)) << 16);
      }
    }
    uint4* dst = reinterpret_cast<uint4*>(rec + layout::bf16::kLatentOffset + 32 * lane);
    dst[0] = make_uint4(w[0], w[1], w[2], w[3]);
    dst[1] = make_uint4(w[4], w[5], w[6], w[7]);
    uint32_t rw;
    if constexpr (kBf16In) {
      rw = raw.r[0];
    } else if constexpr (sizeof(In) == 4) {
      rw = record::bf16_bits_of(rope_value(raw, 0)) | (static_cast<uint32_t>(record::bf16_bits_of(rope_value(raw, 1))) << 16);
    } else {
      rw = record::bf16_bits_of(In{static_cast<uint16_t>(raw.r[0] & 0xFFFFu)}) |
           (static_cast<uint32_t>(record::bf16_bits_of(In{static_cast<uint16_t>(raw.r[0] >> 16)})) << 16);
    }
    *reinterpret_cast<uint32_t*>(rec + layout::bf16::kRopeOffset + 4 * lane) = rw;
    return;
  }

  // The lane's two RoPE values, sanitized, their BF16 record word and max |r| (non-negative,
  // so its bits order like the value). Finite BF16 pairs come through unchanged.
  float r[2];
  uint32_t rope_bf16, rope_abs_bits;
  uint32_t rbits = 0x7F80u;
  if constexpr (kBf16In) rbits = fastenc::bf16_abs_max_bits(reinterpret_cast<const uint32_t(&)[1]>(raw.r[0]));
  if (rbits < 0x7F80u) {
    r[0] = __uint_as_float(raw.r[0] << 16);
    r[1] = __uint_as_float(raw.r[0] & 0xFFFF0000u);
    rope_bf16 = raw.r[0];
    rope_abs_bits = rbits << 16;
  } else {
    r[0] = record::sanitize(rope_value(raw, 0));
    r[1] = record::sanitize(rope_value(raw, 1));
    rope_bf16 = codec::bf16_encode_satfinite(r[0]) | (static_cast<uint32_t>(codec::bf16_encode_satfinite(r[1])) << 16);
    rope_abs_bits = __float_as_uint(fmaxf(fabsf(r[0]), fabsf(r[1])));
  }
  if constexpr (spec.dtype == CacheDtype::fp8_ds_mla) {
    namespace L = layout::fp8;
    float x[16];
#pragma unroll
    for (int i = 0; i < 16; ++i) x[i] = record::sanitize(latent_value(raw, i));
    const float amax = warp_max(abs_max16(x), L::kTileDim / 16);  // lanes of one 128-dim tile
    const float p = record::fp8_tile_scale(amax);
    const float inv = fastenc::fp8_inverse_scale(p);
    uint32_t w[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) w[i] = fastenc::fp8_word(x[4 * i], x[4 * i + 1], x[4 * i + 2], x[4 * i + 3], inv);
    *reinterpret_cast<uint4*>(rec + L::kLatentOffset + 16 * lane) = make_uint4(w[0], w[1], w[2], w[3]);
    if (lane % (L::kTileDim / 16) == 0) record::store_f32(rec + L::kTileScaleOffset + 4 * (lane / (L::kTileDim / 16)), p);
    *reinterpret_cast<uint32_t*>(rec + L::kRopeOffset + 4 * lane) = rope_bf16;
    return;
  }

  // nvfp4_ds_mla. BF16 lanes without Inf/NaN take the packed path (fast_encode.cuh); other
  // lanes and inputs the fp32 one.
  namespace L = layout::nvfp4;
  const uint32_t* w = reinterpret_cast<const uint32_t*>(raw.v);
  uint32_t gbits = 0x7F80u;
  if constexpr (kBf16In) gbits = fastenc::bf16_abs_max_bits(reinterpret_cast<const uint32_t(&)[8]>(*w));
  const bool packed = packed_ok && gbits < 0x7F80u;  // all 16 latent values finite
  float gmax;
  if (packed) {
    gmax = __uint_as_float(gbits << 16);
  } else {
    gmax = 0.0f;
#pragma unroll
    for (int i = 0; i < 16; ++i) gmax = fmaxf(gmax, fabsf(record::sanitize(latent_value(raw, i))));
  }
  // The warp reductions side by side: their latencies overlap, and they share one convergence
  // region.
  const float token_amax = spec.scale_mode == ScaleMode::dynamic ? warp_max_nonneg(gmax) : 0.0f;
  const float rope_amax = spec.rope == RopeEncoding::fp8 ? warp_max_nonneg(__uint_as_float(rope_abs_bits)) : 0.0f;
  const float s = record::nvfp4_writer_scale(spec.scale_mode, layer_scale, token_amax);
  constexpr bool unit = spec.scale_mode == ScaleMode::implicit;
  const bool fast_scale = unit || s == 0.0f || (s >= fastenc::kMinFastScale && s <= fastenc::kMaxFastScale);  // warp-uniform
  uint32_t nib[2];
  uint8_t scale_byte;
  if (packed && fast_scale) {
    const uint32_t(&words)[8] = reinterpret_cast<const uint32_t(&)[8]>(*w);
    if constexpr (spec.scale_mode == ScaleMode::static_calibrated) {
      // The layer's scale is fixed: divide through its reciprocal (taken once per thread) and
      // read the group's bounds from the block's table (one row per scale byte).
      scale_byte = fastenc::e4m3_byte_div6(fastenc::nvfp4_prescale_by_rcp(gmax, s, layer_inv_scale));
      const uint4 row = static_bounds[scale_byte];
      uint32_t b[7];
      fastenc::nvfp4_bounds_bf16x2_from4({row.x, row.y, row.z, row.w}, b);
      fastenc::nvfp4_nibbles_bf16(words, b, scale_byte == 0, nib);
    } else {
      const float ymax = unit ? gmax : record::nvfp4_prescale(gmax, s);
      scale_byte = fastenc::nvfp4_group_bf16<unit>(words, ymax, s, nib);
    }
  } else {
    const GroupCode c = encode_group_fp32(raw, gmax, s, unit, fast_scale);
    nib[0] = c.nib[0];
    nib[1] = c.nib[1];
    scale_byte = c.scale_byte;
  }
  *reinterpret_cast<uint2*>(rec + L::kLatentOffset + 8 * lane) = make_uint2(nib[0], nib[1]);
  rec[L::kGroupScaleOffset + lane] = scale_byte;

  static_assert(L::kRopeScaleOffset % 16 == 0 && L::kRopeScaleOffset + 16 == L::kRopeOffset);
  if constexpr (spec.rope == RopeEncoding::fp8) {
    const float rs = record::rope_fp8_scale(rope_amax);
    const uint32_t two = fastenc::rope_fp8_pair(r[0], r[1], rs);
    *reinterpret_cast<uint16_t*>(rec + L::kRopeOffset + 2 * lane) = static_cast<uint16_t>(two);
    if (lane == 0)  // rope scale, token scale, zero padding [296, 304)
      *reinterpret_cast<uint4*>(rec + L::kRopeScaleOffset) =
          make_uint4(__float_as_uint(rs), __float_as_uint(spec.scale_mode == ScaleMode::dynamic ? s : 0.0f), 0u, 0u);
  } else {
    *reinterpret_cast<uint32_t*>(rec + L::kRopeOffset + 4 * lane) = rope_bf16;
    if (lane == 0) *reinterpret_cast<uint4*>(rec + L::kRopeScaleOffset) = make_uint4(0u, 0u, 0u, 0u);  // [288, 304)
  }
}

template <class F>
constexpr int kPairUnroll = F::spec.is_nvfp4() ? 1 : 2;

// Each warp encodes kTokensPerWarp consecutive tokens, loading the next one while it encodes.
// One kernel per input type and record format F (format_dispatch.cuh).
template <class In, class F>
__global__ void __launch_bounds__(kWarpsPerBlock * 32, kMinBlocks<In, F>)
write_cache_kernel(const In* __restrict__ kv_c, const In* __restrict__ k_pe, int64_t num_tokens,
                   int64_t kv_c_stride, int64_t k_pe_stride, const int64_t* __restrict__ slots,
                   uint8_t* __restrict__ cache, int64_t capacity, float layer_scale,
                   unsigned long long* error_count) {
  const int lane = threadIdx.x & 31;
  constexpr int kTpw = kTokensPerWarp<In>;
  // The packed path counts on HSET2's all-ones halves for set.{ge,gt}.u32.bf16x2 (the PTX text
  // is ambiguous on it); checked once, else every lane takes the fp32 path.
  const bool packed_ok = fastenc::bf16x2_ge_mask(0x3F803F80u, 0x3F800000u) == 0xFFFFFFFFu &&
                         fastenc::bf16x2_gt_mask(0x3F813F80u, 0x3F803F80u) == 0xFFFF0000u;
  // Static mode, BF16 inputs: the first four BF16 bounds of every scale byte under the layer's
  // scale (nvfp4_bounds_bf16x2_first4), built once per block; rows of scales outside the fast
  // range are unused (those groups take the fp32 path).
  constexpr bool kStaticTable = F::spec.scale_mode == ScaleMode::static_calibrated && std::is_same_v<In, Bf16Bits>;
  __shared__ uint4 static_bounds[kStaticTable ? 128 : 1];
  const int warp = threadIdx.x >> 5;
  const int64_t t = (static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + warp) * kTpw;
  TokenReader<In> reader(kv_c, k_pe, slots, t, kv_c_stride, k_pe_stride, lane);
  // The warp's first token is loaded before the static table is built, not after it.
  const int count = num_tokens - t < kTpw ? static_cast<int>(num_tokens - t) : kTpw;  // <= 0: no token
  RawToken<In> cur;
  if (count > 0) cur = reader.next(kv_c_stride, k_pe_stride);
  if constexpr (kStaticTable) {
    const bool fast = layer_scale == 0.0f || (layer_scale >= fastenc::kMinFastScale && layer_scale <= fastenc::kMaxFastScale);
    for (int byte = threadIdx.x; byte < 128; byte += blockDim.x) {
      uint32_t b[4] = {0u, 0u, 0u, 0u};
      if (fast && byte >= 1 && byte <= codec::kE4M3MaxByte)
        fastenc::nvfp4_bounds_bf16x2_first4(fastenc::e4m3_decode(static_cast<uint8_t>(byte)), layer_scale, b);
      static_bounds[byte] = make_uint4(b[0], b[1], b[2], b[3]);
    }
    __syncthreads();
  }
  if (count <= 0) return;
  const float layer_inv_scale =
      F::spec.scale_mode == ScaleMode::static_calibrated ? fastenc::nvfp4_inverse_scale(layer_scale) : 0.0f;
  if constexpr (kTpw == 1) {
    encode_token<In, F>(cur, cache, capacity, layer_scale, layer_inv_scale, static_bounds, error_count, lane, packed_ok);
  } else {
    // Two token buffers taking turns (a copy from one into the other would cost a move per
    // register and token). bf16 and fp8 records unroll fully; NVFP4 records keep the pair loop
    // rolled (unrolled, the fp32 fallback path beside the packed one would spill at 64 registers).
    static_assert(kTpw % 2 == 0);
#pragma unroll(kPairUnroll<F>)
    for (int i = 0; i < kTpw; i += 2) {  // a trip count known at compile time: unrolls cleanly
      if (i >= count) break;
      RawToken<In> next;
      const bool pair = i + 1 < count;
      if (pair) next = reader.next(kv_c_stride, k_pe_stride);
      encode_token<In, F>(cur, cache, capacity, layer_scale, layer_inv_scale, static_bounds, error_count, lane, packed_ok);
      if (pair) {
        if (i + 2 < count) cur = reader.next(kv_c_stride, k_pe_stride);
        encode_token<In, F>(next, cache, capacity, layer_scale, layer_inv_scale, static_bounds, error_count, lane, packed_ok);
      }
    }
  }
}

template <class In>
void launch_write(const RecordSpec& spec, const CacheWriteArgs& a, cudaStream_t stream) {
  constexpr int64_t per_block = int64_t(kWarpsPerBlock) * kTokensPerWarp<In>;
  const auto blocks = static_cast<unsigned>((a.num_tokens + per_block - 1) / per_block);
  with_record_format(spec, "write_cache", [&](auto format) {
    write_cache_kernel<In, decltype(format)><<<blocks, kWarpsPerBlock * 32, 0, stream>>>(
        static_cast<const In*>(a.kv_c), static_cast<const In*>(a.k_pe), a.num_tokens, a.kv_c_stride, a.k_pe_stride,
        a.slot_mapping, a.cache, a.capacity, a.layer_scale, a.error_count);
  });
}

// One warp per slot, 16-byte copies (every record width is a multiple of 16).
__global__ void copy_records_kernel(int record_bytes, const uint8_t* __restrict__ src_base, int64_t src_capacity,
                                    const int64_t* __restrict__ slots, int64_t n, uint8_t* __restrict__ dst_base,
                                    int64_t dst_capacity, bool gather, unsigned long long* error_count) {
  const int lane = threadIdx.x & 31;
  const int64_t i = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + (threadIdx.x >> 5);
  if (i >= n) return;
  const int64_t slot = slots[i];
  const int64_t capacity = gather ? src_capacity : dst_capacity;
  const bool valid = slot >= 0 && slot < capacity;
  if (slot >= capacity && lane == 0 && error_count) atomicAdd(error_count, 1ull);
  const int vecs = record_bytes / 16;
  if (gather) {
    uint4* dst = reinterpret_cast<uint4*>(dst_base + i * record_bytes);
    const uint4* src = valid ? reinterpret_cast<const uint4*>(src_base + slot * record_bytes) : nullptr;
    for (int v = lane; v < vecs; v += 32) dst[v] = valid ? src[v] : make_uint4(0, 0, 0, 0);
  } else if (valid) {
    const uint4* src = reinterpret_cast<const uint4*>(src_base + i * record_bytes);
    uint4* dst = reinterpret_cast<uint4*>(dst_base + slot * record_bytes);
    for (int v = lane; v < vecs; v += 32) dst[v] = src[v];
  }
}

bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; }

}  // namespace

void write_cache(const RecordSpec& spec, const CacheWriteArgs& a, cudaStream_t stream) {
  if (a.num_tokens < 0 || a.capacity < 0) throw Error("write_cache: negative token count or capacity");
  if (a.num_tokens == 0) return;
  if (!a.kv_c || !a.k_pe || !a.slot_mapping || (!a.cache && a.capacity > 0))
    throw Error("write_cache: kv_c, k_pe, slot_mapping and cache must be device pointers");
  const size_t elem = a.input_type == InputType::f32 ? 4 : 2;
  if (a.kv_c_stride < kLatentDim || a.k_pe_stride < kRopeDim)
    throw Error("write_cache: row strides must cover 512 latent and 64 RoPE values");
  if (!aligned16(a.kv_c) || !aligned16(a.cache) || (a.kv_c_stride * elem) % 16 != 0 ||
      (reinterpret_cast<uintptr_t>(a.k_pe) % (2 * elem)) != 0 || (a.k_pe_stride % 2) != 0)
    throw Error("write_cache: kv_c rows and the cache must be 16-byte aligned; k_pe rows aligned to a value pair");
  switch (a.input_type) {
    case InputType::bf16: launch_write<Bf16Bits>(spec, a, stream); break;
    case InputType::fp16: launch_write<Fp16Bits>(spec, a, stream); break;
    case InputType::f32: launch_write<float>(spec, a, stream); break;
  }
  check_launch("write_cache kernel launch");
}

namespace {
void launch_copy(int record_bytes, const uint8_t* src, int64_t src_cap, const int64_t* slots, int64_t n, uint8_t* dst,
                 int64_t dst_cap, bool gather, unsigned long long* error_count, cudaStream_t stream) {
  if (record_bytes <= 0 || record_bytes % 16 != 0) throw Error("record copy: record width must be a positive multiple of 16");
  if (n < 0) throw Error("record copy: negative count");
  if (n == 0) return;
  if (!src || !dst || !slots) throw Error("record copy: null device pointer");
  if (!aligned16(src) || !aligned16(dst)) throw Error("record copy: buffers must be 16-byte aligned");
  const unsigned blocks = static_cast<unsigned>((n + kWarpsPerBlock - 1) / kWarpsPerBlock);
  copy_records_kernel<<<blocks, kWarpsPerBlock * 32, 0, stream>>>(record_bytes, src, src_cap, slots, n, dst, dst_cap,
                                                                  gather, error_count);
  check_launch(gather ? "gather_records kernel launch" : "scatter_records kernel launch");
}
}  // namespace

void gather_records(int record_bytes, const uint8_t* cache, int64_t capacity, const int64_t* slots, int64_t n,
                    uint8_t* dst, unsigned long long* error_count, cudaStream_t stream) {
  launch_copy(record_bytes, cache, capacity, slots, n, dst, 0, true, error_count, stream);
}

void scatter_records(int record_bytes, const uint8_t* src, const int64_t* slots, int64_t n, uint8_t* cache,
                     int64_t capacity, unsigned long long* error_count, cudaStream_t stream) {
  launch_copy(record_bytes, src, 0, slots, n, cache, capacity, false, error_count, stream);
}

}  // namespace nvfp4mla::cuda
