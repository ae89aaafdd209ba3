#pragma once
// Deterministic random BF16 tokens (kv_c [N, 512], k_pe [N, 64]) for tests.
#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "nvfp4mla/codec.h"
#include "nvfp4mla/format.h"
#include "nvfp4mla/record.h"

namespace nvfp4mla::testing {

struct Bf16Tokens {
  std::vector<Bf16Bits> kv_c, k_pe;
  int64_t count = 0;
};

// Token magnitudes spread over several decades, as real latents are; token 0 is all zeros and
// token 1 has magnitude ~1e-4 (its unit-scale group scales fall into E4M3 subnormals or zero).
inline Bf16Tokens random_bf16_tokens(int64_t count, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  Bf16Tokens t{std::vector<Bf16Bits>(count * kLatentDim), std::vector<Bf16Bits>(count * kRopeDim), count};
  for (int64_t i = 0; i < count; ++i) {
    const float mag = i == 0 ? 0.0f : i == 1 ? 1e-4f : std::pow(10.0f, -3.0f + 4.0f * float(i) / float(count));
    for (int j = 0; j < kLatentDim; ++j) t.kv_c[i * kLatentDim + j] = {codec::bf16_encode_rn(normal(rng) * mag)};
    for (int j = 0; j < kRopeDim; ++j) t.k_pe[i * kRopeDim + j] = {codec::bf16_encode_rn(normal(rng) * mag)};
  }
  return t;
}

}  // namespace nvfp4mla::testing
