// The attention backend and the attention stage: CPU scores consistent with the reference's
// log-sum-exp, CUDA never emulated, bf16 exact, unit scale far off at shallow layers.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

#include "nvfp4mla/codec.h"
#include "nvfp4mla/error.h"
#include "nvfp4mla/eval/backend.h"
#include "nvfp4mla/eval/random.h"
#include "nvfp4mla/record.h"
#include "support/eval_small.h"

using namespace nvfp4mla;
using namespace nvfp4mla::eval;
using nvfp4mla::testing::mode_of;
using nvfp4mla::testing::small_eval_report;

TEST(EvalBackend, DeviceChoice) {
  EXPECT_EQ(parse_device("cpu"), Device::cpu);
  EXPECT_EQ(parse_device("cuda"), Device::cuda);
  EXPECT_EQ(parse_device("auto"), Device::automatic);
  EXPECT_THROW(parse_device("gpu"), Error);
  EXPECT_EQ(resolve_device(Device::cpu).device, Device::cpu);
  std::string why;
  if (!cuda_attention_available(&why)) {
    EXPECT_FALSE(why.empty());
    EXPECT_THROW(resolve_device(Device::cuda), Error);  // never a silent fallback
    const ResolvedDevice a = resolve_device(Device::automatic);
    EXPECT_EQ(a.device, Device::cpu);
    EXPECT_NE(a.note.find("auto"), std::string::npos);
  }
}

TEST(EvalBackend, CpuScoresMatchTheReference) {
  constexpr int kTokens = 40, kHeads = 3, kTopk = 16;
  Rng rng(stream_key(9, 9));
  std::vector<float> kv(kTokens * kLatentDim), pe(kTokens * kRopeDim);
  for (auto& v : kv) v = static_cast<float>(0.3 * rng.normal());
  for (auto& v : pe) v = static_cast<float>(rng.normal());
  std::vector<uint16_t> q(2 * kHeads * kQkDim);
  for (auto& v : q) v = codec::bf16_encode_rn(static_cast<float>(0.5 * rng.normal()));
  std::vector<int32_t> idx(2 * kTopk);
  for (int i = 0; i < 2 * kTopk; ++i) idx[i] = static_cast<int32_t>(rng.below(kTokens));
  idx[5] = -1;  // masked
  for (RecordSpec spec : {kSpecBf16, kSpecFp8, kSpecNvfp4Bf16Rope, kSpecNvfp4Fp8Rope}) {
    std::vector<uint8_t> cache(static_cast<size_t>(kTokens) * spec.record_bytes());
    for (int t = 0; t < kTokens; ++t)
      record::encode(spec, &kv[t * kLatentDim], &pe[t * kRopeDim], 1.0f, &cache[static_cast<size_t>(t) * spec.record_bytes()]);
    SparseMlaArgs a;
    a.q = q.data();
    a.rows = 2;
    a.heads = kHeads;
    a.cache = cache.data();
    a.capacity = kTokens;
    a.indices = idx.data();
    a.topk = kTopk;
    a.sm_scale = 0.0625f;
    std::vector<float> out(2 * kHeads * kLatentDim), lse(2 * kHeads), scores(2 * kHeads * kTopk);
    sparse_attention(Device::cpu, spec, a, AttentionOutputs{out.data(), lse.data(), scores.data()});
    std::vector<float> ref_out(out.size()), ref_lse(lse.size());
    sparse_mla_reference(spec, a, ref_out.data(), ref_lse.data());
    EXPECT_EQ(out, ref_out);
    EXPECT_EQ(lse, ref_lse);
    for (int rh = 0; rh < 2 * kHeads; ++rh) {
      double sum = 0.0;
      for (int j = 0; j < kTopk; ++j) sum += std::exp(static_cast<double>(scores[rh * kTopk + j]) - lse[rh]);
      EXPECT_NEAR(sum, 1.0, 1e-5);  // softmax of the scores sums to one under the reference's lse
    }
    EXPECT_TRUE(std::isinf(scores[5]) && scores[5] < 0);  // row 0 (every head) masks position 5
    EXPECT_TRUE(std::isinf(scores[kTopk + 5]) && scores[kTopk + 5] < 0);
  }
}

TEST(EvalAttention, ReferenceIsExactAndUnitScaleFailsShallowLayers) {
  const EvalReport& r = small_eval_report();
  const ModeResult& bf16 = mode_of(r, "bf16_1152");
  for (int l = 0; l < r.num_layers; ++l) {
    EXPECT_EQ(bf16.attention_relative_error[l], 0.0);
    EXPECT_EQ(bf16.attention_kld[l], 0.0);
  }
  const ModeResult& implicit = mode_of(r, "nvfp4_368_implicit");
  const ModeResult& dynamic = mode_of(r, "nvfp4_368_dynamic");
  const ModeResult& fixed = mode_of(r, "nvfp4_368_static");
  // Layer 0 (max |kv_c| ~0.02): the unit scale destroys the latent, calibrated scales do not.
  EXPECT_GT(implicit.attention_kld[0], 0.1);
  EXPECT_GT(implicit.attention_kld[0], 10.0 * dynamic.attention_kld[0]);
  EXPECT_GT(implicit.attention_kld[0], 10.0 * fixed.attention_kld[0]);
  EXPECT_GT(implicit.attention_relative_error[0], 0.3);
  for (const auto& m : r.modes)
    for (int l = 0; l < r.num_layers; ++l) {
      EXPECT_GE(m.attention_kld[l], 0.0);
      if (!m.mode.is_nvfp4() || m.mode.scale_mode != ScaleMode::implicit) EXPECT_LT(m.attention_relative_error[l], 0.5);
    }
  EXPECT_LT(mode_of(r, "fp8_ds_mla_656").attention_kld_summary.worst, dynamic.attention_kld_summary.worst);
}
