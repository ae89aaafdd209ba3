// GPU sparse attention scores against the CPU reference, and the evaluation on CUDA against the
// evaluation on the CPU.
//
// Kernel tolerance. Both sides score the same BF16 operands (the reference with
// bf16_operands, which rounds the dequantized K exactly as dequant_unit does), so the products
// q_d * k_d are the same numbers and exact in fp32 (8-bit x 8-bit significands). The kernel
// sums the 576 products in fp32: 18 sequential additions per lane, then 5 butterfly levels, so
// every product passes through at most 23 roundings of relative size u = 2^-24, and
// |sum_fp32 - sum| <= 23 u sum_d |q_d k_d| (first order). The products by sm_scale (kernel) and
// the fp64 -> fp32 conversion (reference) add one rounding each: u |s| apiece. Bound used:
//   |got - want| <= sm_scale * 24 u * sum_d |q_d k_d| + 2 u |want|   (plus a 1e-30 floor).
// Masked entries must be exactly -inf on both sides, every other entry finite (the output is
// NaN-poisoned first, unused cache slots and the guard record past the end are NaN, and every
// row holds the boundary indices capacity - 1, capacity, -1, INT32_MIN and INT32_MAX).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <string>
#include <vector>

#include "gpu/gpu_support.h"
#include "nvfp4mla/codec.h"
#include "nvfp4mla/cuda/sparse_scores.h"
#include "nvfp4mla/error.h"
#include "nvfp4mla/eval/backend.h"
#include "nvfp4mla/eval/evaluation.h"
#include "nvfp4mla/record.h"
#include "support/attention_problem.h"
#include "support/eval_small.h"
#include "support/record_specs.h"

using namespace nvfp4mla;
using nvfp4mla::testing::AttentionProblem;
using nvfp4mla::testing::DeviceBuffer;
using nvfp4mla::testing::make_problem;
using nvfp4mla::testing::ProblemOptions;

namespace {

const auto& kAllSpecs = nvfp4mla::testing::kAllRecordSpecs;
constexpr double kU = 1.0 / 16777216.0;  // 2^-24

std::vector<float> run_gpu(const AttentionProblem& p) {
  DeviceBuffer<uint16_t> q(p.q);
  DeviceBuffer<uint8_t> cache(p.cache);
  DeviceBuffer<int32_t> idx(p.indices);
  DeviceBuffer<int32_t> len(p.topk_length);
  DeviceBuffer<float> scores(static_cast<size_t>(p.rows) * p.heads * p.topk);
  scores.fill_bytes(0xFF);  // NaN: every element must be written
  SparseMlaArgs a = p.host_args();
  a.q = q.get();
  a.cache = cache.get();
  a.indices = idx.get();
  a.topk_length = p.topk_length.empty() ? nullptr : len.get();
  cuda::sparse_scores(p.spec, a, scores.get(), nullptr);
  if (cudaDeviceSynchronize() != cudaSuccess) throw std::runtime_error("scores kernel failed");
  return scores.download();
}

// sum_d |q_d k_d| on the BF16 operands, per (row, head, position); 0 where masked.
std::vector<double> abs_dot(const AttentionProblem& p) {
  const SparseMlaArgs a = p.host_args();
  std::vector<double> out(static_cast<size_t>(p.rows) * p.heads * p.topk, 0.0);
  std::vector<float> k(kQkDim);
  for (int r = 0; r < p.rows; ++r)
    for (int j = 0; j < p.topk; ++j) {
      if (!sparse_entry_valid(a, r, j)) continue;
      const int64_t slot = p.indices[static_cast<size_t>(r) * p.topk + j];
      record::decode(p.spec, &p.cache[slot * p.spec.record_bytes()], p.layer_scale, k.data(), k.data() + kLatentDim);
      for (float& v : k) v = codec::bf16_decode(codec::bf16_encode_rn(v));
      for (int h = 0; h < p.heads; ++h) {
        const uint16_t* qh = &p.q[(static_cast<size_t>(r) * p.heads + h) * kQkDim];
        double s = 0.0;
        for (int d = 0; d < kQkDim; ++d) s += std::fabs(static_cast<double>(codec::bf16_decode(qh[d])) * k[d]);
        out[(static_cast<size_t>(r) * p.heads + h) * p.topk + j] = s;
      }
    }
  return out;
}

// Number of entries outside the bound (the first few are reported).
int64_t compare(const AttentionProblem& p, const std::vector<float>& got) {
  std::vector<float> want(got.size());
  sparse_mla_scores_reference(p.spec, p.host_args(), want.data(), {.bf16_operands = true});
  const std::vector<double> mag = abs_dot(p);
  int64_t bad = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    bool ok;
    if (std::isinf(want[i])) {
      ok = std::isinf(got[i]) && got[i] < 0;
    } else {
      const double tol = p.sm_scale * 24.0 * kU * mag[i] + 2.0 * kU * std::fabs(want[i]) + 1e-30;
      ok = std::isfinite(got[i]) && std::fabs(static_cast<double>(got[i]) - want[i]) <= tol;
    }
    if (!ok && bad++ < 5) {
      const size_t rh = i / p.topk;
      ADD_FAILURE() << "row " << rh / p.heads << " head " << rh % p.heads << " pos " << i % p.topk << ": got " << got[i]
                    << " want " << want[i];
    }
  }
  return bad;
}

}  // namespace

TEST(GpuSparseScores, EveryFormatAndHeadCountMatchesReference) {
  NVFP4MLA_REQUIRE_GPU();
  uint64_t seed = 300;
  for (const auto& spec : kAllSpecs) {
    for (int heads : {1, 8, 16, 32, 64, 128}) {
      SCOPED_TRACE(nvfp4mla::testing::spec_name(spec) + " heads " + std::to_string(heads));
      const auto p = make_problem(spec, /*rows=*/5, heads, /*topk=*/320, seed++);
      EXPECT_EQ(compare(p, run_gpu(p)), 0);
    }
  }
}

TEST(GpuSparseScores, TopkLengthInvalidIndicesAndRaggedTopk) {
  NVFP4MLA_REQUIRE_GPU();
  ProblemOptions opt;
  opt.lengths = true;
  uint64_t seed = 400;
  for (const auto& spec : kAllSpecs) {
    for (int topk : {1, 31, 33, 100, 1000}) {
      SCOPED_TRACE(nvfp4mla::testing::spec_name(spec) + " topk " + std::to_string(topk));
      const auto p = make_problem(spec, 6, 16, topk, seed++, opt);
      EXPECT_EQ(compare(p, run_gpu(p)), 0);
    }
  }
}

TEST(GpuSparseScores, WideMagnitudesAndOutliers) {
  NVFP4MLA_REQUIRE_GPU();
  const ProblemOptions opt = ProblemOptions::wide_magnitudes();
  uint64_t seed = 500;
  for (const auto& spec : kAllSpecs) {
    SCOPED_TRACE(nvfp4mla::testing::spec_name(spec));
    const auto p = make_problem(spec, 3, 32, 2048, seed++, opt);
    EXPECT_EQ(compare(p, run_gpu(p)), 0);
  }
}

TEST(GpuSparseScores, RejectsInvalidArguments) {
  NVFP4MLA_REQUIRE_GPU();
  const auto p = make_problem(kAllSpecs[4], 2, 8, 64, 7);
  DeviceBuffer<uint16_t> q(p.q);
  DeviceBuffer<uint8_t> cache(p.cache);
  DeviceBuffer<int32_t> idx(p.indices);
  DeviceBuffer<float> scores(static_cast<size_t>(p.rows) * p.heads * p.topk);
  SparseMlaArgs a = p.host_args();
  a.q = q.get();
  a.cache = cache.get();
  a.indices = idx.get();
  EXPECT_THROW(cuda::sparse_scores(p.spec, a, nullptr, nullptr), Error);  // no output
  SparseMlaArgs misaligned = a;
  misaligned.q = q.get() + 1;
  EXPECT_THROW(cuda::sparse_scores(p.spec, misaligned, scores.get(), nullptr), Error);
  SparseMlaArgs no_topk = a;
  no_topk.topk = 0;
  EXPECT_THROW(cuda::sparse_scores(p.spec, no_topk, scores.get(), nullptr), Error);
  const RecordSpec dynamic_bf16_rope{CacheDtype::nvfp4_ds_mla, RopeEncoding::bf16, ScaleMode::dynamic};
  EXPECT_THROW(cuda::sparse_scores(dynamic_bf16_rope, a, scores.get(), nullptr), Error);
  SparseMlaArgs empty = a;
  empty.rows = 0;
  EXPECT_NO_THROW(cuda::sparse_scores(p.spec, empty, scores.get(), nullptr));
}

// The evaluation on CUDA agrees with the evaluation on the CPU. What differs: the GPU uses BF16
// K rows (exact except for scaled NVFP4 latents and FP8 RoPE: one rounding, 2^-9 relative),
// fp32 score sums (bound above) and the decode's BF16 output with BF16 probabilities (its own
// suite accepts a cosine difference of 5e-6, i.e. relative L2 <= 3.2e-3, and the BF16 output
// rounding adds <= 2^-9 relative to each of the two outputs compared). Hence, per layer:
//   attention relative error: |gpu - cpu| <= 0.01 + 5% of cpu (bf16 reference itself: 0 on both);
//   KL divergence: |gpu - cpu| <= 2e-5 + 5% of cpu (logit perturbations of ~1e-3 nats change a
//   KLD by ~Var/2 ~ 1e-6; the rest is headroom);
// needles: the same top-scoring decision wherever the CPU margin exceeds 0.05 nats, and mass
// ratios within 1% (+1e-3).
TEST(GpuEvaluation, CudaAgreesWithCpu) {
  NVFP4MLA_REQUIRE_GPU();
  std::string why;
  ASSERT_TRUE(eval::cuda_attention_available(&why)) << why;
  eval::EvalOptions o = nvfp4mla::testing::small_eval_options();
  o.latent = false;
  o.sweep.enabled = false;
  o.attention.heads = 16;
  o.device = eval::Device::cpu;
  const eval::EvalReport cpu = eval::run_evaluation(o);
  o.device = eval::Device::cuda;
  const eval::EvalReport gpu = eval::run_evaluation(o);
  EXPECT_EQ(gpu.device.rfind("cuda (requested", 0), 0u) << gpu.device;
  ASSERT_EQ(cpu.modes.size(), gpu.modes.size());
  for (size_t m = 0; m < cpu.modes.size(); ++m) {
    const eval::ModeResult &c = cpu.modes[m], &g = gpu.modes[m];
    SCOPED_TRACE(c.mode.key);
    for (size_t l = 0; l < c.attention_kld.size(); ++l) {
      SCOPED_TRACE("layer " + std::to_string(l));
      EXPECT_NEAR(g.attention_relative_error[l], c.attention_relative_error[l], 0.01 + 0.05 * c.attention_relative_error[l]);
      EXPECT_NEAR(g.attention_kld[l], c.attention_kld[l], 2e-5 + 0.05 * c.attention_kld[l]);
      if (m == 0) {
        EXPECT_EQ(g.attention_relative_error[l], 0.0);
        EXPECT_EQ(g.attention_kld[l], 0.0);
      }
    }
    ASSERT_EQ(c.needle.size(), g.needle.size());
    for (size_t n = 0; n < c.needle.size(); ++n)
      for (size_t i = 0; i < c.needle[n].cells.size(); ++i) {
        const eval::NeedleCell &cc = c.needle[n].cells[i], &gc = g.needle[n].cells[i];
        SCOPED_TRACE("needle layer " + std::to_string(c.needle[n].layer) + " cell " + std::to_string(i));
        if (std::fabs(cc.margin) > 0.05) EXPECT_EQ(gc.kept, cc.kept) << "cpu margin " << cc.margin << " gpu " << gc.margin;
        EXPECT_NEAR(gc.mass_ratio, cc.mass_ratio, 1e-3 + 0.01 * cc.mass_ratio);
      }
  }
}
