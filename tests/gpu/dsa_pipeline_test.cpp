// The DSA decode step on the GPU (cuda/dsa_pipeline.h) against its CPU reference
// (dsa_decode_reference), on problems of support/dsa_problem.h (small-integer index data, so
// every indexer logit is exact and the selection must be identical; NaN-poisoned unused cache
// slots; padded -1 slots with NaN inputs; contexts 0, 1, k-1, k, k+1 and longer):
//   - both caches after the step equal the CPU writers' bytes;
//   - indices (cache slots), topk_length and the selected logits equal the reference bit for bit;
//   - out and lse within the decode kernels' bounds (support/output_compare.h, the reference on
//     the kernel's operands for the selected records);
//   - device-side errors counted (not thrown), a CUDA-graph replay gives the same result, and
//     host-visible errors throw before anything runs;
//   - the eval's pipeline section on the GPU agrees with its CPU run.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "gpu/gpu_support.h"
#include "nvfp4mla/codec.h"
#include "nvfp4mla/cuda/dsa_pipeline.h"
#include "nvfp4mla/cuda/sparse_decode.h"
#include "nvfp4mla/dsa_pipeline.h"
#include "nvfp4mla/error.h"
#include "nvfp4mla/eval/evaluation.h"
#include "support/attention_oracle.h"
#include "nvfp4mla/testing/dsa_problem.h"
#include "support/eval_small.h"
#include "support/expect_error.h"
#include "support/output_compare.h"
#include "support/record_specs.h"

using namespace nvfp4mla;
using nvfp4mla::testing::DeviceBuffer;
using nvfp4mla::testing::dsa_problem;
using nvfp4mla::testing::DsaProblem;
using nvfp4mla::testing::DsaProblemShape;

namespace {

// The problem's inputs and the step's outputs on the device.
struct DeviceStep {
  DeviceBuffer<uint16_t> kv_c, k_pe, index_k, q;
  DeviceBuffer<int64_t> slots;
  DeviceBuffer<uint8_t> latent, index, index_q;
  DeviceBuffer<float> index_w;
  DeviceBuffer<int32_t> table, context_lens;
  DeviceBuffer<uint16_t> out;
  DeviceBuffer<float> lse, logits;
  DeviceBuffer<int32_t> indices, length;
  DeviceBuffer<DsaDecodeErrors> errors{1};
  explicit DeviceStep(const DsaProblem& p)
      : kv_c(p.kv_c), k_pe(p.k_pe), index_k(p.index_k), q(p.q), slots(p.slots), latent(p.latent), index(p.index),
        index_q(p.index_q), index_w(p.index_w), table(p.table), context_lens(p.shape.context_lens),
        out(p.rows() * p.shape.heads * kLatentDim), lse(p.rows() * p.shape.heads), logits(p.rows() * p.shape.k),
        indices(p.rows() * p.shape.k), length(p.rows()) {
    poison_outputs();
  }
  void poison_outputs() {
    out.fill_bytes(0xFF);
    lse.fill_bytes(0xFF);
    logits.fill_bytes(0x7F);
    indices.fill_bytes(0x7F);
    length.fill_bytes(0x7F);
  }
  DsaDecodeArgs args(const DsaProblem& p) const {
    DsaDecodeArgs a = p.args(latent.get(), index.get());
    a.tokens = {kv_c.get(), k_pe.get(), index_k.get(), slots.get(), static_cast<int64_t>(p.slots.size())};
    a.block_table = table.get();
    a.context_lens = context_lens.get();
    a.q = q.get();
    a.index_q = index_q.get();
    a.index_w = index_w.get();
    return a;
  }
  DsaDecodeOutputs outputs() const { return {out.get(), lse.get(), indices.get(), length.get(), logits.get()}; }
};

int sm_count() { return cuda::current_sm_count(); }

DsaDecodePlan run(const DsaProblem& p, DeviceStep& d, int64_t chunk = 0, int forced_splits = 0) {
  const DsaDecodeArgs a = d.args(p);
  const DsaDecodePlan plan = plan_dsa_decode(a, sm_count(), chunk, forced_splits);
  DeviceBuffer<uint8_t> ws(plan.workspace_bytes);
  ws.fill_bytes(0xFF);
  cuda::dsa_decode(a, plan, ws.get(), ws.size(), d.outputs(), d.errors.get(), nullptr);
  if (cudaDeviceSynchronize() != cudaSuccess) throw std::runtime_error("dsa_decode failed on the device");
  return plan;
}

struct HostStep {
  std::vector<uint8_t> latent, index;
  std::vector<float> out, lse, logits;
  std::vector<int32_t> indices, length;
};

HostStep reference(const DsaProblem& p, int64_t chunk, const ReferenceOptions& options) {
  HostStep h{p.latent, p.index, std::vector<float>(p.rows() * p.shape.heads * kLatentDim),
             std::vector<float>(p.rows() * p.shape.heads), std::vector<float>(p.rows() * p.shape.k),
             std::vector<int32_t>(p.rows() * p.shape.k), std::vector<int32_t>(p.rows())};
  dsa_decode_reference(p.args(h.latent.data(), h.index.data()), chunk,
                       {h.out.data(), h.lse.data(), h.indices.data(), h.length.data(), h.logits.data()}, options);
  return h;
}

// Everything the step produced against the reference (attention on the kernel's operands).
void expect_equal_to_reference(const DsaProblem& p, const DeviceStep& d, const DsaDecodePlan& plan, int64_t chunk) {
  const bool bf16_k = cuda::decode_rounds_k_to_bf16(p.shape.spec, plan.decode);
  const HostStep h = reference(p, chunk, {.bf16_operands = bf16_k});
  EXPECT_TRUE(d.latent.download() == h.latent) << "latent cache";
  EXPECT_TRUE(d.index.download() == h.index) << "index key cache";
  EXPECT_EQ(d.indices.download(), h.indices);
  EXPECT_EQ(d.length.download(), h.length);
  const auto logits = d.logits.download();
  EXPECT_EQ(0, std::memcmp(logits.data(), h.logits.data(), logits.size() * 4)) << "selected logits";
  const auto e = d.errors.download()[0];
  EXPECT_EQ(e.latent_slots + e.index_slots + e.selection, 0u);

  DsaProblem host = p;
  std::vector<uint8_t> latent = h.latent, index = h.index;
  const DsaDecodeArgs a = host.args(latent.data(), index.data());
  const SparseMlaArgs sa = dsa_attention_args(a, h.indices.data(), h.length.data());
  const auto bounds = nvfp4mla::testing::oracle::attention(a.spec, sa, nvfp4mla::testing::plan_bound_options(plan.decode, bf16_k));
  const auto out_bits = d.out.download();
  std::vector<float> got(out_bits.size());
  for (size_t i = 0; i < got.size(); ++i) got[i] = codec::bf16_decode(out_bits[i]);
  const double row_cos = cuda::decode_weights_are_bf16(a.spec, plan.decode) ? 5e-5 : 5e-6;
  const auto c = nvfp4mla::testing::compare_attention(got, h.out, d.lse.download(), h.lse, bounds, a.heads,
                                                      {.cos_limit = 5e-6, .row_cos_limit = row_cos});
  EXPECT_EQ(c.failures, 0);
}

}  // namespace

TEST(DsaPipelineGpu, EqualsCpuReferenceForEveryFormat) {
  NVFP4MLA_REQUIRE_GPU();
  uint64_t seed = 11;
  int i = 0;
  for (const auto& spec : nvfp4mla::testing::kAllRecordSpecs) {
    DsaProblemShape s;
    s.spec = spec;
    s.context_lens = {0, 1, 2047, 2048, 2049, 5000};
    s.next_n = 2;
    s.heads = (i++ % 2) ? 64 : 16;
    s.index_heads = 64;
    s.k = 2048;
    s.seed = seed++;
    SCOPED_TRACE(nvfp4mla::testing::spec_name(spec) + " heads " + std::to_string(s.heads));
    const DsaProblem p = dsa_problem(s);
    DeviceStep d(p);
    const DsaDecodePlan plan = run(p, d);
    expect_equal_to_reference(p, d, plan, 0);
  }
}

TEST(DsaPipelineGpu, LongContextInChunksEqualsCpuReference) {
  NVFP4MLA_REQUIRE_GPU();
  DsaProblemShape s;
  s.spec = kSpecNvfp4Fp8Rope;
  s.spec.scale_mode = ScaleMode::dynamic;
  s.context_lens = {120000, 70001};
  s.next_n = 4;  // an MTP verifier batch
  s.heads = 16;
  s.index_heads = 16;
  s.seed = 5;
  const DsaProblem p = dsa_problem(s);
  for (int64_t chunk : {int64_t(16384), int64_t(0)}) {
    SCOPED_TRACE("chunk " + std::to_string(chunk));
    DeviceStep d(p);
    const DsaDecodePlan plan = run(p, d, chunk);
    expect_equal_to_reference(p, d, plan, chunk);
  }
}

// A prefill chunk: the last 64 tokens of each request are the step's new tokens and its 64 causal
// query rows (next_n), attended on the extend route (one split per row).
TEST(DsaPipelineGpu, PrefillChunkOnTheExtendRouteEqualsCpuReference) {
  NVFP4MLA_REQUIRE_GPU();
  uint64_t seed = 40;
  for (const auto& spec : {kSpecNvfp4Fp8Rope, kSpecFp8}) {
    DsaProblemShape s;
    s.spec = spec;
    s.context_lens = {64, 3001};
    s.next_n = 64;
    s.heads = 16;
    s.k = 512;
    s.seed = seed++;
    SCOPED_TRACE(nvfp4mla::testing::spec_name(spec));
    const DsaProblem p = dsa_problem(s);
    DeviceStep d(p);
    const DsaDecodePlan plan = run(p, d, 0, /*forced_splits=*/1);
    EXPECT_EQ(plan.decode.splits, 1);
    expect_equal_to_reference(p, d, plan, 0);
  }
}

TEST(DsaPipelineGpu, DeviceErrorsAreCountedAndRowsSelectNothing) {
  NVFP4MLA_REQUIRE_GPU();
  DsaProblemShape s;
  s.spec = kSpecFp8;
  s.context_lens = {300, 5000};
  s.k = 256;
  DsaProblem p = dsa_problem(s);
  p.slots[0] = p.num_pages * p.shape.page_size;  // past the capacity
  p.shape.context_lens[1] = static_cast<int32_t>(p.max_context + 1);
  DeviceStep d(p);
  run(p, d);
  const auto e = d.errors.download()[0];
  EXPECT_EQ(e.latent_slots, 1u);
  EXPECT_EQ(e.index_slots, 1u);
  EXPECT_GE(e.selection, 1u);
  for (int32_t l : d.length.download()) EXPECT_EQ(l, 0);
  for (float l : d.lse.download()) EXPECT_EQ(l, -INFINITY);
  for (uint16_t o : d.out.download()) EXPECT_EQ(codec::bf16_decode(o), 0.0f);
  // The index key writer writes nothing when any slot is bad.
  EXPECT_TRUE(d.index.download() == p.index);
}

TEST(DsaPipelineGpu, GraphReplayGivesTheSameStep) {
  NVFP4MLA_REQUIRE_GPU();
  DsaProblemShape s;
  s.spec = kSpecNvfp4Bf16Rope;
  s.context_lens = {4000, 17, 9000};
  s.next_n = 1;
  s.heads = 64;
  const DsaProblem p = dsa_problem(s);
  DeviceStep d(p);
  run(p, d);
  const auto indices = d.indices.download();
  const auto out = d.out.download();
  const auto lse = d.lse.download();

  DeviceStep g(p);
  const DsaDecodeArgs a = g.args(p);
  const DsaDecodePlan plan = plan_dsa_decode(a, sm_count());
  DeviceBuffer<uint8_t> ws(plan.workspace_bytes);
  cudaStream_t stream;
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  CUDA_OK(cudaStreamCreate(&stream));
  CUDA_OK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal));
  cuda::dsa_decode(a, plan, ws.get(), ws.size(), g.outputs(), g.errors.get(), stream);
  CUDA_OK(cudaStreamEndCapture(stream, &graph));
  CUDA_OK(cudaGraphInstantiate(&exec, graph, 0));
  for (int i = 0; i < 2; ++i) CUDA_OK(cudaGraphLaunch(exec, stream));
  CUDA_OK(cudaStreamSynchronize(stream));
  EXPECT_EQ(g.indices.download(), indices);
  EXPECT_EQ(g.out.download(), out);
  EXPECT_EQ(0, std::memcmp(g.lse.download().data(), lse.data(), lse.size() * 4));
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaStreamDestroy(stream);
}

TEST(DsaPipelineGpu, HostErrorsThrowBeforeLaunch) {
  NVFP4MLA_REQUIRE_GPU();
  DsaProblemShape s;
  s.spec = kSpecBf16;
  s.context_lens = {1000};
  s.k = 128;
  const DsaProblem p = dsa_problem(s);
  DeviceStep d(p);
  const DsaDecodeArgs a = d.args(p);
  const DsaDecodePlan plan = plan_dsa_decode(a, sm_count());
  DeviceBuffer<uint8_t> ws(plan.workspace_bytes + 256);
  EXPECT_THROW(cuda::dsa_decode(a, plan, ws.get(), plan.workspace_bytes - 1, d.outputs(), d.errors.get(), nullptr), Error);
  EXPECT_THROW(cuda::dsa_decode(a, plan, ws.get(), ws.size(), d.outputs(), nullptr, nullptr), Error);
  DsaDecodeArgs bigger = a;
  bigger.heads = 128;
  EXPECT_THROW(cuda::dsa_decode(bigger, plan, ws.get(), ws.size(), d.outputs(), d.errors.get(), nullptr), Error);
  DsaDecodeArgs bad = a;
  bad.k = 0;
  EXPECT_THROW(cuda::dsa_decode(bad, plan, ws.get(), ws.size(), d.outputs(), d.errors.get(), nullptr), Error);
  // The GPU parts' own rules, refused before either cache is written: misaligned index keys (the
  // index cache writer's rule), a page size the paged indexer cannot take.
  const std::vector<uint8_t> latent_before = d.latent.download();
  DsaDecodeArgs keys = a;
  keys.tokens.index_k += 1;
  nvfp4mla::testing::expect_error_containing(
      [&] { cuda::dsa_decode(keys, plan, ws.get(), ws.size(), d.outputs(), d.errors.get(), nullptr); }, "index_k must be 16-byte aligned");
  CUDA_OK(cudaDeviceSynchronize());
  EXPECT_EQ(d.length.download()[0], 0x7F7F7F7F);  // nothing ran
  EXPECT_EQ(d.latent.download(), latent_before);
  // Pages of 2 tokens: valid on the CPU, refused on the GPU before anything is written.
  DsaProblemShape s2 = s;
  s2.page_size = 2;
  s2.context_lens = {40};
  s2.k = 16;
  const DsaProblem p2 = dsa_problem(s2);
  DeviceStep d2(p2);
  const DsaDecodeArgs a2 = d2.args(p2);
  const DsaDecodePlan plan2 = plan_dsa_decode(a2, sm_count());
  DeviceBuffer<uint8_t> ws2(plan2.workspace_bytes + 256);
  const std::vector<uint8_t> latent2_before = d2.latent.download();
  nvfp4mla::testing::expect_error_containing(
      [&] { cuda::dsa_decode(a2, plan2, ws2.get(), ws2.size(), d2.outputs(), d2.errors.get(), nullptr); }, "multiple of 4");
  CUDA_OK(cudaDeviceSynchronize());
  EXPECT_EQ(d2.latent.download(), latent2_before);
}

// The eval's pipeline section on the GPU (cuda::dsa_decode) against the CPU (the reference): the
// same needle grids, masses within the kernels' rounding, selections sharing almost every entry,
// and the GPU selection equal to the exact top-k of the GPU's own logits.
TEST(GpuEvaluation, PipelineSectionAgreesWithCpu) {
  NVFP4MLA_REQUIRE_GPU();
  eval::EvalOptions o = nvfp4mla::testing::small_eval_options();
  o.latent = o.attention.enabled = o.sweep.enabled = o.needle.enabled = false;
  o.device = eval::Device::cpu;
  const eval::EvalReport cpu = eval::run_evaluation(o);
  o.device = eval::Device::cuda;
  const eval::EvalReport gpu = eval::run_evaluation(o);
  EXPECT_EQ(gpu.pipeline_note.rfind("cuda:", 0), 0u) << gpu.pipeline_note;
  ASSERT_EQ(cpu.modes.size(), gpu.modes.size());
  for (size_t m = 0; m < cpu.modes.size(); ++m) {
    SCOPED_TRACE(cpu.modes[m].mode.key);
    for (auto grid : {&eval::ModeResult::pipeline, &eval::ModeResult::verifier}) {
      const eval::PipelineGrid &c = cpu.modes[m].*grid, &g = gpu.modes[m].*grid;
      ASSERT_EQ(c.cells.size(), g.cells.size());
      EXPECT_EQ(c.route, g.route);
      for (size_t i = 0; i < c.cells.size(); ++i) {
        EXPECT_EQ(g.cells[i].selected, c.cells[i].selected) << "cell " << i;
        EXPECT_EQ(g.cells[i].top, c.cells[i].top) << "cell " << i;
        EXPECT_NEAR(g.cells[i].mass_ratio, c.cells[i].mass_ratio, 1e-3 + 0.01 * c.cells[i].mass_ratio) << "cell " << i;
      }
    }
  }
  ASSERT_EQ(cpu.selection.size(), gpu.selection.size());
  for (size_t i = 0; i < cpu.selection.size(); ++i) {
    const eval::SelectionStats &c = cpu.selection[i], &g = gpu.selection[i];
    for (int q = 0; q < 4; ++q) EXPECT_NEAR(g.share[q], c.share[q], 0.01);
    EXPECT_NEAR(g.exact_overlap, c.exact_overlap, 0.01);
    EXPECT_LT(c.same_logits_overlap, 0.0);  // not measured on the CPU
    EXPECT_DOUBLE_EQ(g.same_logits_overlap, 1.0);  // the GPU selector is exact on its own logits
    EXPECT_EQ(g.same_logits_newest_shift, 0.0);
  }
}
