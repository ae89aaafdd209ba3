// The register slices of the 64-entry warp-specialized decode kernels (kv_tile.cuh: RecordSlice)
// against dequant_unit_words, bit for bit: for every cache slot of random records (written ones,
// and unwritten NaN-filled ones) and every part, each latent unit and the eight RoPE values must
// be the same BF16 bits; a masked slice must dequantize to +0.
#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "gpu/gpu_support.h"
#include "ops/sparse_mla/format_dispatch.cuh"
#include "support/attention_problem.h"
#include "support/record_specs.h"

namespace nvfp4mla::cuda {
namespace {

__device__ bool same_words(uint4 a, uint4 b) { return a.x == b.x && a.y == b.y && a.z == b.z && a.w == b.w; }

// One thread per (slot, part); counts the slices whose words differ from dequant_unit_words.
template <class F>
__global__ void slice_vs_unit_kernel(const uint8_t* cache, int64_t slots, float layer_scale, unsigned* mismatches) {
  using S = RecordSlice<F>;
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= slots * S::kParts) return;
  const int part = static_cast<int>(i % S::kParts);
  const uint8_t* rec = cache + (i / S::kParts) * F::kRecordBytes;
  unsigned bad = 0;
  for (int pass = 0; pass < 2; ++pass) {
    const bool valid = pass == 0;
    S x;
    load_record_slice(rec, part, valid, x);
    const float latent_scale = slice_latent_scale(x, layer_scale);
    const uint4 zero = make_uint4(0, 0, 0, 0);
    for (int j = 0; j < S::kGroups; ++j) {
      const Words16 got = slice_group_words(x, j, latent_scale);
      const Words16 want = valid ? dequant_unit_words<F>(rec, S::kGroups * part + j, layer_scale) : Words16{zero, zero};
      bad += !same_words(got.lo, want.lo) || !same_words(got.hi, want.hi);
    }
    // RoPE unit kLatentUnits + part / 2 holds 16 values; this part's eight are its lo or hi half.
    const Words16 rope = dequant_unit_words<F>(rec, kLatentUnits + S::kRopeValues * part / 16, layer_scale);
    const uint4 want = !valid ? zero : part % 2 == 0 ? rope.lo : rope.hi;
    bad += !same_words(slice_rope_words(x), want);
  }
  if (bad) atomicAdd(mismatches, bad);
}

}  // namespace
}  // namespace nvfp4mla::cuda

namespace {

using nvfp4mla::RecordSpec;
using nvfp4mla::testing::DeviceBuffer;

TEST(GpuRecordSlice, EqualsDequantUnitWordsBitForBit) {
  NVFP4MLA_REQUIRE_GPU();
  int formats = 0;
  for (const RecordSpec& spec : nvfp4mla::testing::kAllRecordSpecs) {
    if (spec.dtype == nvfp4mla::CacheDtype::bf16) continue;  // bf16 records are K rows: no slice
    for (const bool degenerate : {false, true}) {
      SCOPED_TRACE(nvfp4mla::testing::spec_name(spec) + (degenerate ? " degenerate scales" : ""));
      nvfp4mla::testing::ProblemOptions opt;
      opt.degenerate = degenerate;
      const auto p = nvfp4mla::testing::make_problem(spec, 2, 16, 256, 41 + formats, opt);
      DeviceBuffer<uint8_t> cache(p.cache);
      DeviceBuffer<unsigned> mismatches(std::vector<unsigned>{0});
      nvfp4mla::cuda::with_record_format(spec, "record slice test", [&](auto format) {
        using F = decltype(format);
        if constexpr (!F::kRawIsKRow) {
          const int64_t threads = p.capacity * nvfp4mla::cuda::RecordSlice<F>::kParts;
          nvfp4mla::cuda::slice_vs_unit_kernel<F>
              <<<static_cast<unsigned>((threads + 255) / 256), 256>>>(cache.get(), p.capacity, p.layer_scale, mismatches.get());
        }
      });
      CUDA_OK(cudaDeviceSynchronize());
      EXPECT_EQ(mismatches.download()[0], 0u);
      ++formats;
    }
  }
  EXPECT_EQ(formats, 12);  // fp8 and five NVFP4 formats, twice each
}

}  // namespace
