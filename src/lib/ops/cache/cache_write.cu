// GPU cache writer: one warp per token, lane g owns latent group g (16 values) and RoPE values
// 2g, 2g+1. The bytes equal those of the CPU writer (record.h): maxima are exact, so warp
// reductions give the same scales, and the per-value divisions of the recipe are replaced by
// the exact division-free encoders of fast_encode.cuh (tests/unit/fast_encode_test.cpp).
#include <cuda_runtime.h>

#include <cstdint>
#include <string>

#include "device/cuda_check.h"
#include "nvfp4mla/codec.h"
#include "nvfp4mla/cuda/cache_write.h"
#include "nvfp4mla/error.h"
#include "nvfp4mla/record.h"
#include "ops/cache/fast_encode.cuh"

namespace nvfp4mla::cuda {
namespace {

constexpr int kWarpsPerBlock = 8;
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

// Load N consecutive input values with 16-byte (latent) or pair-sized (RoPE) accesses; the
// host wrapper checks the alignment these need.
template <int N>
__device__ __forceinline__ void load_values(const Bf16Bits* src, Bf16Bits (&dst)[N]) {
  static_assert(N == 16 || N == 2);
  if constexpr (N == 16) {
    const uint4* v = reinterpret_cast<const uint4*>(src);
    uint4 w[2] = {v[0], v[1]};
    const uint16_t* h = reinterpret_cast<const uint16_t*>(w);
#pragma unroll
    for (int i = 0; i < 16; ++i) dst[i].bits = h[i];
  } else {
    const uint32_t w = *reinterpret_cast<const uint32_t*>(src);
    dst[0].bits = static_cast<uint16_t>(w & 0xFFFF);
    dst[1].bits = static_cast<uint16_t>(w >> 16);
  }
}
template <int N>
__device__ __forceinline__ void load_values(const Fp16Bits* src, Fp16Bits (&dst)[N]) {
  load_values(reinterpret_cast<const Bf16Bits*>(src), reinterpret_cast<Bf16Bits(&)[N]>(dst));
}
template <int N>
__device__ __forceinline__ void load_values(const float* src, float (&dst)[N]) {
  if constexpr (N == 16) {
    const float4* v = reinterpret_cast<const float4*>(src);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const float4 f = v[i];
      dst[4 * i] = f.x; dst[4 * i + 1] = f.y; dst[4 * i + 2] = f.z; dst[4 * i + 3] = f.w;
    }
  } else {
    const float2 f = *reinterpret_cast<const float2*>(src);
    dst[0] = f.x; dst[1] = f.y;
  }
}

// Gather one byte from each of 4 consecutive lanes into a little-endian word held by the
// first of them (bytes of lanes 4k..4k+3 -> word k).
__device__ __forceinline__ uint32_t gather_bytes4(uint32_t byte, int lane) {
  const int base = lane & ~3;
  uint32_t w = 0;
#pragma unroll
  for (int i = 0; i < 4; ++i) w |= (__shfl_sync(kFull, byte, base + i) & 0xFFu) << (8 * i);
  return w;
}

template <class In>
__global__ void __launch_bounds__(kWarpsPerBlock * 32)
write_cache_kernel(RecordSpec spec, const In* __restrict__ kv_c, const In* __restrict__ k_pe, int64_t num_tokens,
                   int64_t kv_c_stride, int64_t k_pe_stride, const int64_t* __restrict__ slots,
                   uint8_t* __restrict__ cache, int64_t capacity, float layer_scale,
                   unsigned long long* error_count) {
  const int lane = threadIdx.x & 31;
  const int64_t t = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + (threadIdx.x >> 5);
  if (t >= num_tokens) return;
  const int64_t slot = slots[t];
  if (slot < 0) return;  // padded slot
  if (slot >= capacity) {
    if (lane == 0 && error_count) atomicAdd(error_count, 1ull);
    return;
  }
  const int rb = spec.record_bytes();
  uint8_t* rec = cache + slot * rb;
  In xin[16];
  load_values(kv_c + t * kv_c_stride + 16 * lane, xin);
  In rin[2];
  load_values(k_pe + t * k_pe_stride + 2 * lane, rin);
  if (spec.dtype == CacheDtype::bf16) {
    uint32_t w[8];
#pragma unroll
    for (int i = 0; i < 8; ++i)
      w[i] = record::bf16_bits_of(xin[2 * i]) | (static_cast<uint32_t>(record::bf16_bits_of(xin[2 * i + 1])) << 16);
    uint4* dst = reinterpret_cast<uint4*>(rec + layout::bf16::kLatentOffset + 32 * lane);
    dst[0] = make_uint4(w[0], w[1], w[2], w[3]);
    dst[1] = make_uint4(w[4], w[5], w[6], w[7]);
    *reinterpret_cast<uint32_t*>(rec + layout::bf16::kRopeOffset + 4 * lane) =
        record::bf16_bits_of(rin[0]) | (static_cast<uint32_t>(record::bf16_bits_of(rin[1])) << 16);
    return;
  }

  float x[16], r[2];
  bool finite = true;
#pragma unroll
  for (int i = 0; i < 16; ++i) {
    x[i] = record::to_fp32(xin[i]);
    finite &= fastenc::is_finite(x[i]);
  }
  r[0] = record::to_fp32(rin[0]);
  r[1] = record::to_fp32(rin[1]);
  finite &= fastenc::is_finite(r[0]) && fastenc::is_finite(r[1]);
  if (!finite) {  // rare: sanitize only lanes that hold NaN or Inf
#pragma unroll
    for (int i = 0; i < 16; ++i) x[i] = record::sanitize(x[i]);
    r[0] = record::sanitize(r[0]);
    r[1] = record::sanitize(r[1]);
  }

  const uint32_t rope_bf16 = codec::bf16_encode_satfinite(r[0]) |
                             (static_cast<uint32_t>(codec::bf16_encode_satfinite(r[1])) << 16);
  if (spec.dtype == CacheDtype::fp8_ds_mla) {
    namespace L = layout::fp8;
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

  // nvfp4_ds_mla
  namespace L = layout::nvfp4;
  const float gmax = abs_max16(x);
  const float token_amax = spec.scale_mode == ScaleMode::dynamic ? warp_max(gmax) : 0.0f;
  const float s = record::nvfp4_writer_scale(spec.scale_mode, layer_scale, token_amax);
  const bool unit = spec.scale_mode == ScaleMode::implicit;
  uint32_t nib[2];
  uint8_t scale_byte;
  if (unit || s == 0.0f || (s >= fastenc::kMinFastScale && s <= fastenc::kMaxFastScale)) {  // warp-uniform
    scale_byte = fastenc::nvfp4_group(x, gmax, s, unit, nib);
  } else {  // outer scales far from real activations: the recipe's divisions as written
    float gy = 0.0f;
#pragma unroll
    for (int i = 0; i < 16; ++i) {
      x[i] = record::nvfp4_prescale(x[i], s);
      gy = record::max_f(gy, record::abs_f(x[i]));
    }
    scale_byte = record::nvfp4_group_scale_byte(gy);
    const float d = codec::e4m3_decode(scale_byte);
    nib[0] = nib[1] = 0;
#pragma unroll
    for (int i = 0; i < 16; ++i) nib[i / 8] |= static_cast<uint32_t>(record::nvfp4_nibble(x[i], d)) << (4 * (i % 8));
  }
  *reinterpret_cast<uint2*>(rec + L::kLatentOffset + 8 * lane) = make_uint2(nib[0], nib[1]);
  const uint32_t scale_word = gather_bytes4(scale_byte, lane);
  if ((lane & 3) == 0) *reinterpret_cast<uint32_t*>(rec + L::kGroupScaleOffset + lane) = scale_word;

  if (spec.rope == RopeEncoding::fp8) {
    const float rs = record::rope_fp8_scale(warp_max(record::max_f(record::abs_f(r[0]), record::abs_f(r[1]))));
    const uint32_t two = rs == 0.0f ? 0u : fastenc::e4m3x2(r[0] / rs, r[1] / rs);  // as record::rope_fp8_byte
    // Lanes 2k and 2k+1 hold the four bytes of word k.
    const uint32_t other = __shfl_down_sync(kFull, two, 1);
    if ((lane & 1) == 0) *reinterpret_cast<uint32_t*>(rec + L::kRopeOffset + 2 * lane) = two | (other << 16);
    if (lane == 0) {
      record::store_f32(rec + L::kRopeScaleOffset, rs);
      record::store_f32(rec + L::kTokenScaleOffset, spec.scale_mode == ScaleMode::dynamic ? s : 0.0f);
      *reinterpret_cast<uint2*>(rec + L::kTokenScaleOffset + 4) = make_uint2(0, 0);  // [296, 304)
    }
  } else {
    *reinterpret_cast<uint32_t*>(rec + L::kRopeOffset + 4 * lane) = rope_bf16;
    if (lane < 4) *reinterpret_cast<uint32_t*>(rec + L::kRopeScaleOffset + 4 * lane) = 0u;  // [288, 304)
  }
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
  const unsigned blocks = static_cast<unsigned>((a.num_tokens + kWarpsPerBlock - 1) / kWarpsPerBlock);
  switch (a.input_type) {
    case InputType::bf16:
      write_cache_kernel<Bf16Bits><<<blocks, kWarpsPerBlock * 32, 0, stream>>>(
          spec, static_cast<const Bf16Bits*>(a.kv_c), static_cast<const Bf16Bits*>(a.k_pe), a.num_tokens,
          a.kv_c_stride, a.k_pe_stride, a.slot_mapping, a.cache, a.capacity, a.layer_scale, a.error_count);
      break;
    case InputType::fp16:
      write_cache_kernel<Fp16Bits><<<blocks, kWarpsPerBlock * 32, 0, stream>>>(
          spec, static_cast<const Fp16Bits*>(a.kv_c), static_cast<const Fp16Bits*>(a.k_pe), a.num_tokens,
          a.kv_c_stride, a.k_pe_stride, a.slot_mapping, a.cache, a.capacity, a.layer_scale, a.error_count);
      break;
    case InputType::f32:
      write_cache_kernel<float><<<blocks, kWarpsPerBlock * 32, 0, stream>>>(
          spec, static_cast<const float*>(a.kv_c), static_cast<const float*>(a.k_pe), a.num_tokens, a.kv_c_stride,
          a.k_pe_stride, a.slot_mapping, a.cache, a.capacity, a.layer_scale, a.error_count);
      break;
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
