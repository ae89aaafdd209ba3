// The merge of partial attention (cuda/dcp.h); the CPU reference is dcp_cpu.cpp.
#include <cuda_runtime.h>

#include <cstdint>

#include "device/cuda_check.h"
#include "nvfp4mla/codec.h"
#include "nvfp4mla/cuda/dcp.h"

namespace nvfp4mla::cuda {
namespace {

constexpr int kWarps = 4;
constexpr int kGroups = kDcpLatentDim / (32 * 4);  // groups of 4 dims per lane

struct Quad {
  float v[4];
};

__device__ __forceinline__ Quad load_quad(const float* p) {
  const float4 f = *reinterpret_cast<const float4*>(p);
  return {{f.x, f.y, f.z, f.w}};
}
__device__ __forceinline__ Quad load_quad(const uint16_t* p) {
  const uint2 u = *reinterpret_cast<const uint2*>(p);
  return {{codec::bf16_decode(uint16_t(u.x)), codec::bf16_decode(uint16_t(u.x >> 16)), codec::bf16_decode(uint16_t(u.y)),
           codec::bf16_decode(uint16_t(u.y >> 16))}};
}
__device__ __forceinline__ void store_quad(float* p, const Quad& q) {
  *reinterpret_cast<float4*>(p) = make_float4(q.v[0], q.v[1], q.v[2], q.v[3]);
}
__device__ __forceinline__ void store_quad(uint16_t* p, const Quad& q) {
  uint2 u;
  u.x = uint32_t(codec::bf16_encode_rn(q.v[0])) | (uint32_t(codec::bf16_encode_rn(q.v[1])) << 16);
  u.y = uint32_t(codec::bf16_encode_rn(q.v[2])) | (uint32_t(codec::bf16_encode_rn(q.v[3])) << 16);
  *reinterpret_cast<uint2*>(p) = u;
}

template <class In, class Out>
__global__ void __launch_bounds__(32 * kWarps) dcp_merge_kernel(const In* __restrict__ partial,
                                                               const float* __restrict__ partial_lse, int ranks,
                                                               int64_t rh_count, bool base2, Out* __restrict__ out,
                                                               float* __restrict__ lse) {
  const int64_t rh = int64_t(blockIdx.x) * kWarps + threadIdx.x / 32;
  if (rh >= rh_count) return;
  const int lane = threadIdx.x % 32;
  float m = -INFINITY;
  bool bad = false;  // a NaN or +inf LSE makes the row NaN (dcp.h)
  for (int r = 0; r < ranks; ++r) {
    const float l = partial_lse[r * rh_count + rh];
    bad |= isnan(l) || l == INFINITY;
    m = fmaxf(m, l);
  }
  Quad acc[kGroups] = {};
  float sum = 0.0f;
  if (!bad && m != -INFINITY)
    for (int r = 0; r < ranks; ++r) {
      const float l = partial_lse[r * rh_count + rh];
      if (l == -INFINITY) continue;  // an empty rank: its output is never read
      const float w = base2 ? exp2f(l - m) : expf(l - m);
      sum += w;
      const In* src = partial + (r * rh_count + rh) * kDcpLatentDim + lane * 4;
#pragma unroll
      for (int g = 0; g < kGroups; ++g) {
        const Quad v = load_quad(src + g * 128);
#pragma unroll
        for (int i = 0; i < 4; ++i) acc[g].v[i] += w * v.v[i];
      }
    }
  const float fill = bad ? NAN : 0.0f;
  Out* dst = out + rh * kDcpLatentDim + lane * 4;
#pragma unroll
  for (int g = 0; g < kGroups; ++g) {
    Quad o;
#pragma unroll
    for (int i = 0; i < 4; ++i) o.v[i] = sum > 0.0f ? acc[g].v[i] / sum : fill;
    store_quad(dst + g * 128, o);
  }
  if (lse && lane == 0) lse[rh] = bad ? NAN : sum > 0.0f ? m + (base2 ? log2f(sum) : logf(sum)) : -INFINITY;
}

template <class In, class Out>
void launch(const DcpMergeArgs& a, const DcpMergeOutputs& out, int64_t rh_count, cudaStream_t stream) {
  const int64_t blocks = (rh_count + kWarps - 1) / kWarps;
  dcp_merge_kernel<In, Out><<<static_cast<unsigned>(blocks), 32 * kWarps, 0, stream>>>(
      static_cast<const In*>(a.partial_out), a.partial_lse, a.ranks, rh_count, a.lse_base == LseBase::base2,
      static_cast<Out*>(out.out), out.lse);
  check_launch("dcp merge kernel launch");
}

}  // namespace

void dcp_merge(const DcpMergeArgs& a, const DcpMergeOutputs& out, cudaStream_t stream) {
  validate_dcp_merge_args(a, out);
  const int64_t rh_count = int64_t(a.rows) * a.heads;
  if (rh_count == 0) return;
  if ((rh_count + kWarps - 1) / kWarps > INT32_MAX) throw Error("dcp merge: rows x heads is too large for one launch");
  const bool in_f32 = a.partial_type == DcpPartialType::f32, out_f32 = out.out_type == DcpPartialType::f32;
  if (in_f32 && out_f32) launch<float, float>(a, out, rh_count, stream);
  if (in_f32 && !out_f32) launch<float, uint16_t>(a, out, rh_count, stream);
  if (!in_f32 && out_f32) launch<uint16_t, float>(a, out, rh_count, stream);
  if (!in_f32 && !out_f32) launch<uint16_t, uint16_t>(a, out, rh_count, stream);
}

}  // namespace nvfp4mla::cuda
