// GPU writer and gathers of the index key cache: one warp per key, lane i owns values
// 4i .. 4i+3. The writer's bytes equal the CPU reference's (index_key.h): the maximum is exact
// in any order, and x * (1 / p) is the same correctly rounded value as x / p for the
// power-of-two scale p (fast_encode.cuh, tests/unit/fast_encode_test.cpp).
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <type_traits>

#include "device/alignment.h"
#include "device/cuda_check.h"
#include "nvfp4mla/cuda/index_cache.h"
#include "nvfp4mla/error.h"
#include "nvfp4mla/index_key.h"
#include "nvfp4mla/record.h"
#include "ops/cache/fast_encode.cuh"

namespace nvfp4mla::cuda {
namespace {

constexpr int kWarpsPerBlock = 8;
constexpr unsigned kFull = 0xFFFFFFFFu;
constexpr int kCheckBlocks = 256, kCheckThreads = 256;

// Counts the slots outside [0, capacity) (negative ones too unless `allow_negative`).
__global__ void count_bad_slots(const int64_t* __restrict__ slots, int64_t n, int64_t capacity, bool allow_negative,
                                unsigned long long* __restrict__ count) {
  unsigned bad = 0;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t s = slots[i];
    bad += (s >= capacity || (s < 0 && !allow_negative)) ? 1u : 0u;
  }
  bad = __reduce_add_sync(kFull, bad);
  if ((threadIdx.x & 31) == 0 && bad) atomicAdd(count, static_cast<unsigned long long>(bad));
}

// Four consecutive input values of a lane as fp32.
template <class In>
__device__ __forceinline__ void load_four(const In* p, float (&x)[4]) {
  if constexpr (std::is_same_v<In, float>) {
    const float4 v = __ldcs(reinterpret_cast<const float4*>(p));
    x[0] = v.x, x[1] = v.y, x[2] = v.z, x[3] = v.w;
  } else {
    const uint2 v = __ldcs(reinterpret_cast<const uint2*>(p));
    const uint32_t w[2] = {v.x, v.y};
#pragma unroll
    for (int i = 0; i < 4; ++i) x[i] = record::to_fp32(In{static_cast<uint16_t>(w[i / 2] >> (16 * (i % 2)))});
  }
}

template <class In>
__global__ void __launch_bounds__(kWarpsPerBlock * 32)
write_index_kernel(const In* __restrict__ keys, int64_t num_tokens, int64_t key_stride, const int64_t* __restrict__ slots,
                   uint8_t* __restrict__ cache, int64_t page_size, const unsigned long long* __restrict__ invalid) {
  if (*invalid != 0) return;  // a slot past the cache: write nothing
  const int lane = threadIdx.x & 31;
  const int64_t t = int64_t(blockIdx.x) * kWarpsPerBlock + (threadIdx.x >> 5);
  if (t >= num_tokens) return;
  const int64_t slot = slots[t];
  if (slot < 0) return;  // padded slot
  float x[4];
  load_four(keys + t * key_stride + 4 * lane, x);
  float m = 0.0f;
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    x[i] = record::sanitize(x[i]);
    m = fmaxf(m, fabsf(x[i]));
  }
  // Non-negative floats order like their bit patterns.
  const float amax = __uint_as_float(__reduce_max_sync(kFull, __float_as_uint(m)));
  const float p = index_key::scale_of_amax(amax);
  const uint32_t word = fastenc::fp8_word(x[0], x[1], x[2], x[3], fastenc::fp8_inverse_scale(p));
  *reinterpret_cast<uint32_t*>(cache + index_key::value_offset(slot, page_size) + 4 * lane) = word;
  if (lane == 0) *reinterpret_cast<float*>(cache + index_key::scale_offset(slot, page_size)) = p;
}

// One warp per slot: records [n, 132] when `records` is set, else values [n, 128] + scales [n].
__global__ void __launch_bounds__(kWarpsPerBlock * 32)
gather_index_kernel(const uint8_t* __restrict__ cache, int64_t page_size, const int64_t* __restrict__ slots, int64_t n,
                    uint8_t* __restrict__ records, uint8_t* __restrict__ values, float* __restrict__ scales,
                    const unsigned long long* __restrict__ invalid) {
  if (*invalid != 0) return;
  const int lane = threadIdx.x & 31;
  const int64_t i = int64_t(blockIdx.x) * kWarpsPerBlock + (threadIdx.x >> 5);
  if (i >= n) return;
  const int64_t slot = slots[i];
  const uint32_t word = *reinterpret_cast<const uint32_t*>(cache + index_key::value_offset(slot, page_size) + 4 * lane);
  const float scale = *reinterpret_cast<const float*>(cache + index_key::scale_offset(slot, page_size));
  if (records) {
    uint8_t* rec = records + i * index_key::kRecordBytes;
    *reinterpret_cast<uint32_t*>(rec + 4 * lane) = word;
    if (lane == 0) *reinterpret_cast<float*>(rec + index_key::kScaleOffset) = scale;
  } else {
    *reinterpret_cast<uint32_t*>(values + i * index_key::kValueBytes + 4 * lane) = word;
    if (lane == 0) scales[i] = scale;
  }
}

unsigned warp_blocks(int64_t n) { return static_cast<unsigned>((n + kWarpsPerBlock - 1) / kWarpsPerBlock); }

// Host checks of the view; returns the capacity.
int64_t check_view(const IndexCacheView& v, const char* op) {
  validate_index_cache(v, op);
  if (!aligned(v.data, 4)) throw Error(std::string(op) + ": the cache must be 4-byte aligned");
  return v.num_pages * v.page_size;
}

// Zeroes the caller's counter and counts the bad slots into it.
void count_slots(const int64_t* slots, int64_t n, int64_t capacity, bool allow_negative, unsigned long long* invalid_count,
                 cudaStream_t stream, const char* op) {
  check(cudaMemsetAsync(invalid_count, 0, sizeof(unsigned long long), stream), op);
  if (n == 0) return;
  const unsigned blocks = static_cast<unsigned>(std::min<int64_t>(kCheckBlocks, (n + kCheckThreads - 1) / kCheckThreads));
  count_bad_slots<<<blocks, kCheckThreads, 0, stream>>>(slots, n, capacity, allow_negative, invalid_count);
  check_launch(op);
}

void gather(const IndexCacheView& cache, const int64_t* slots, int64_t n, uint8_t* records, uint8_t* values,
            float* scales, unsigned long long* invalid_count, cudaStream_t stream, const char* op) {
  const int64_t capacity = check_view(cache, op);
  if (n < 0) throw Error(std::string(op) + ": negative slot count " + std::to_string(n));
  if (!invalid_count) throw Error(std::string(op) + ": invalid_count (a device word) is required");
  if (n > 0 && !slots) throw Error(std::string(op) + ": slots is null");
  if (n > 0 && !records && (!values || !scales)) throw Error(std::string(op) + ": no output buffer");
  if (!aligned(records, 4) || !aligned(values, 16) || !aligned(scales, 4))
    throw Error(std::string(op) + ": records and scales must be 4-byte aligned, values 16-byte aligned");
  count_slots(slots, n, capacity, /*allow_negative=*/false, invalid_count, stream, op);
  if (n == 0) return;
  gather_index_kernel<<<warp_blocks(n), kWarpsPerBlock * 32, 0, stream>>>(cache.data, cache.page_size, slots, n, records,
                                                                          values, scales, invalid_count);
  check_launch(op);
}

}  // namespace

void write_index_cache(const IndexCacheWriteArgs& a, cudaStream_t stream) {
  constexpr const char* kOp = "write_index_cache (GPU)";
  const int64_t capacity = check_view(a.cache, kOp);
  if (a.num_tokens < 0) throw Error(std::string(kOp) + ": negative token count " + std::to_string(a.num_tokens));
  if (!a.invalid_count) throw Error(std::string(kOp) + ": invalid_count (a device word) is required");
  const size_t elem = a.input_type == InputType::f32 ? 4 : 2;
  if (a.key_stride < index_key::kDim)
    throw Error(std::string(kOp) + ": key_stride must be at least 128 values (got " + std::to_string(a.key_stride) + ")");
  if (a.num_tokens > 0) {
    if (!a.keys || !a.slot_mapping) throw Error(std::string(kOp) + ": keys and slot_mapping must be device pointers");
    if (!aligned(a.keys, 16) || (a.key_stride * elem) % 16 != 0)
      throw Error(std::string(kOp) + ": key rows must be 16-byte aligned (pointer and key_stride)");
  }
  count_slots(a.slot_mapping, a.num_tokens, capacity, /*allow_negative=*/true, a.invalid_count, stream, kOp);
  if (a.num_tokens == 0) return;
  const unsigned blocks = warp_blocks(a.num_tokens);
  constexpr unsigned threads = kWarpsPerBlock * 32;
  switch (a.input_type) {
    case InputType::bf16:
      write_index_kernel<Bf16Bits><<<blocks, threads, 0, stream>>>(static_cast<const Bf16Bits*>(a.keys), a.num_tokens,
                                                                   a.key_stride, a.slot_mapping, a.cache.data,
                                                                   a.cache.page_size, a.invalid_count);
      break;
    case InputType::fp16:
      write_index_kernel<Fp16Bits><<<blocks, threads, 0, stream>>>(static_cast<const Fp16Bits*>(a.keys), a.num_tokens,
                                                                   a.key_stride, a.slot_mapping, a.cache.data,
                                                                   a.cache.page_size, a.invalid_count);
      break;
    case InputType::f32:
      write_index_kernel<float><<<blocks, threads, 0, stream>>>(static_cast<const float*>(a.keys), a.num_tokens,
                                                                a.key_stride, a.slot_mapping, a.cache.data,
                                                                a.cache.page_size, a.invalid_count);
      break;
  }
  check_launch(kOp);
}

void gather_index_records(const IndexCacheView& cache, const int64_t* slots, int64_t n, uint8_t* records,
                          unsigned long long* invalid_count, cudaStream_t stream) {
  if (n > 0 && !records) throw Error("gather_index_records (GPU): records is null");
  gather(cache, slots, n, records, nullptr, nullptr, invalid_count, stream, "gather_index_records (GPU)");
}

void gather_index_keys(const IndexCacheView& cache, const int64_t* slots, int64_t n, uint8_t* values,
                       float* scales, unsigned long long* invalid_count, cudaStream_t stream) {
  if (n > 0 && (!values || !scales)) throw Error("gather_index_keys (GPU): values and scales are required");
  gather(cache, slots, n, nullptr, values, scales, invalid_count, stream, "gather_index_keys (GPU)");
}

}  // namespace nvfp4mla::cuda
