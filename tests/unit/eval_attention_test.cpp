// The attention backend and the attention stage: CPU attention equal to an independent oracle,
// CUDA never emulated, bf16 exact, unit scale far off at shallow layers.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

#include "nvfp4mla/error.h"
#include "nvfp4mla/eval/backend.h"
#include "support/attention_oracle.h"
#include "support/attention_problem.h"
#include "support/eval_small.h"
#include "support/record_specs.h"

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

// The evaluation's CPU attention (out, natural LSE and scores) against the independent fp64
// oracle (support/attention_oracle.h), in every record format and scale mode: the scores'
// softmax under the LSE sums to one, and masked positions (every boundary index) are -inf.
TEST(EvalBackend, CpuAttentionMatchesTheOracle) {
  nvfp4mla::testing::ProblemOptions opt;
  opt.lengths = true;
  uint64_t seed = 90;
  for (const RecordSpec& spec : nvfp4mla::testing::kAllRecordSpecs) {
    SCOPED_TRACE(nvfp4mla::testing::spec_name(spec));
    const auto p = nvfp4mla::testing::make_problem(spec, 5, 3, 40, seed++, opt);
    SparseMlaArgs a = p.host_args();
    a.lse_base = LseBase::base2;  // the evaluation's LSE is natural whatever the arguments ask for
    const size_t pairs = static_cast<size_t>(p.rows) * p.heads;
    std::vector<float> out(pairs * kLatentDim), lse(pairs), scores(pairs * p.topk);
    sparse_attention(Device::cpu, spec, a, AttentionOutputs{out.data(), lse.data(), scores.data()});
    a.lse_base = LseBase::natural;
    const auto o = nvfp4mla::testing::oracle::attention(spec, a);
    for (size_t i = 0; i < out.size(); ++i)
      ASSERT_NEAR(out[i], o.out[i], 1e-6 * (1.0 + std::fabs(o.out[i]))) << "row/head " << i / kLatentDim << " dim " << i % kLatentDim;
    for (size_t rh = 0; rh < pairs; ++rh) {
      if (std::isinf(o.lse[rh])) {
        EXPECT_EQ(lse[rh], -INFINITY) << rh;
      } else {
        EXPECT_NEAR(lse[rh], o.lse[rh], 1e-6 * (1.0 + std::fabs(o.lse[rh]))) << rh;
        double sum = 0.0;
        for (int j = 0; j < p.topk; ++j) sum += std::exp(static_cast<double>(scores[rh * p.topk + j]) - lse[rh]);
        EXPECT_NEAR(sum, 1.0, 1e-5) << rh;
      }
      for (int j = 0; j < p.topk; ++j) {
        const size_t i = rh * p.topk + j;
        if (std::isinf(o.scores[i])) EXPECT_EQ(scores[i], -INFINITY) << "row/head " << rh << " position " << j;
        else EXPECT_NEAR(scores[i], o.scores[i], 1e-6 * (1.0 + std::fabs(o.scores[i]))) << "row/head " << rh << " position " << j;
      }
    }
  }
}

// The bf16-1152 records are the baseline every format is compared with: their own row is zero by
// construction (that they hold the BF16 tokens exactly is
// RecordProperties.Bf16RecordRoundTripsBf16InputsExactly's check); here it pins that the baseline
// is the bf16 mode.
TEST(EvalAttention, Bf16IsTheBaselineAndUnitScaleFailsShallowLayers) {
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
