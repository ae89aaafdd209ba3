// GPU fused selection (cuda/fused_select.h):
//   - against the GPU's own unfused chain (cuda::indexer_logits into a [rows, context] buffer,
//     then cuda::topk) bit for bit, on random data, long contexts and H = 64;
//   - against the CPU reference (fused_select_reference) bit for bit on small-integer data,
//     where every logit is exact, for several chunkings, next_n > 1 and slot ids;
//   - the ragged (prefill) form the same two ways;
//   - bad metadata counted on the device (every row then selects nothing), and a CUDA-graph
//     replay giving the same result.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "gpu/gpu_support.h"
#include "nvfp4mla/cuda/fused_select.h"
#include "nvfp4mla/cuda/indexer.h"
#include "nvfp4mla/cuda/topk.h"
#include "nvfp4mla/fused_select.h"
#include "support/fused_select_problems.h"

using namespace nvfp4mla;
using nvfp4mla::testing::DeviceBuffer;
using nvfp4mla::testing::fused_args;
using nvfp4mla::testing::fused_slot_map;
using nvfp4mla::testing::PagedProblem;
using nvfp4mla::testing::Selection;
using nvfp4mla::testing::selection_problem;
using nvfp4mla::testing::Values;

namespace {

int sm_count() {
  int dev = 0, sms = 0;
  cudaGetDevice(&dev);
  cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev);
  return sms;
}

// The problem's inputs on the device.
struct DeviceProblem {
  DeviceBuffer<uint8_t> cache, q;
  DeviceBuffer<float> w;
  DeviceBuffer<int32_t> table, context_lens;
  explicit DeviceProblem(const PagedProblem& p)
      : cache(p.cache), q(p.q), w(p.w), table(p.table), context_lens(p.context_lens) {}
  FusedSelectArgs args(PagedProblem& p, int k, bool slot_ids) const {
    FusedSelectArgs a = fused_args(p, k, slot_ids);
    a.keys.cache = cache.get();
    a.keys.q = q.get();
    a.keys.weights = w.get();
    a.keys.block_table = table.get();
    a.keys.context_lens = context_lens.get();
    return a;
  }
};

struct Outputs {
  DeviceBuffer<int32_t> indices, length;
  DeviceBuffer<float> values;
  DeviceBuffer<unsigned long long> errors{1};
  Outputs(int64_t rows, int k) : indices(rows * k), length(rows), values(rows * k) {
    indices.fill_bytes(0x7F);
    length.fill_bytes(0x7F);
    values.fill_bytes(0xFF);
  }
  TopkOutputs outputs() const { return {indices.get(), length.get(), values.get()}; }
  Selection download() const {
    Selection s;
    s.indices = indices.download();
    s.topk_length = length.download();
    s.values = values.download();
    return s;
  }
};

Selection gpu_fused(PagedProblem& p, const DeviceProblem& d, int k, bool slot_ids, int64_t chunk,
                    unsigned long long* invalid = nullptr) {
  const FusedSelectArgs a = d.args(p, k, slot_ids);
  const FusedSelectPlan plan = plan_fused_select(a, chunk, sm_count());
  DeviceBuffer<uint8_t> ws(plan.workspace_bytes);
  ws.fill_bytes(0xFF);
  Outputs o(p.requests * p.next_n, k);
  cuda::fused_select(a, plan, ws.get(), plan.workspace_bytes, o.outputs(), o.errors.get(), nullptr);
  if (cudaDeviceSynchronize() != cudaSuccess) throw std::runtime_error(cudaGetErrorString(cudaGetLastError()));
  const unsigned long long e = o.errors.download()[0];
  if (invalid) *invalid = e;
  else EXPECT_EQ(e, 0u);
  return o.download();
}

Selection gpu_unfused(PagedProblem& p, const DeviceProblem& d, int k, bool slot_ids) {
  const int rows = static_cast<int>(p.requests * p.next_n);
  IndexerPagedArgs a = d.args(p, k, slot_ids).keys;
  DeviceBuffer<float> logits(size_t(rows) * p.stride);
  DeviceBuffer<unsigned long long> invalid(1);
  a.logits = logits.get();
  a.logits_stride = p.stride;
  cuda::indexer_logits(a, invalid.get(), nullptr);
  TopkArgs t;
  t.values = logits.get();
  t.rows = rows;
  t.columns = p.stride;
  t.stride = p.stride;
  t.k = k;
  if (slot_ids) {
    t.slots = fused_slot_map(p);
    t.slots.block_table = d.table.get();
  }
  const TopkPlan plan = plan_topk(rows, p.stride, sm_count());
  DeviceBuffer<uint8_t> ws(topk_workspace_bytes(plan, rows));
  Outputs o(rows, k);
  cuda::topk(t, plan, ws.get(), ws.size(), o.outputs(), o.errors.get(), nullptr);
  if (cudaDeviceSynchronize() != cudaSuccess) throw std::runtime_error(cudaGetErrorString(cudaGetLastError()));
  EXPECT_EQ(invalid.download()[0], 0u);
  return o.download();
}

Selection cpu_fused(PagedProblem& p, int k, bool slot_ids, int64_t chunk) {
  Selection s(p.requests * p.next_n, k);
  fused_select_reference(fused_args(p, k, slot_ids), chunk, s.outputs());
  return s;
}

TEST(FusedSelectGpu, SmallIntegersEqualTheCpuReference) {
  NVFP4MLA_REQUIRE_GPU();
  for (int next_n : {1, 3}) {
    PagedProblem p = selection_problem(32, next_n, 64, {0, 1, 63, 64, 65, 1000, 4999}, 5000, 11 + next_n, Values::small_integers);
    const DeviceProblem d(p);
    for (bool slots : {false, true})
      for (int64_t chunk : {int64_t(0), int64_t(64), int64_t(640), int64_t(1984)}) {
        SCOPED_TRACE("next_n " + std::to_string(next_n) + " chunk " + std::to_string(chunk) + " slots " + std::to_string(slots));
        EXPECT_EQ(gpu_fused(p, d, 64, slots, chunk), cpu_fused(p, 64, slots, chunk));
      }
  }
}

TEST(FusedSelectGpu, RandomEqualsGpuLogitsThenTopk) {
  NVFP4MLA_REQUIRE_GPU();
  struct Case {
    int heads, next_n, k;
    std::vector<int32_t> lengths;
    int64_t max_context, chunk;
  };
  const std::vector<Case> cases = {
      {64, 1, 2048, {1 << 18}, 1 << 18, 0},
      {64, 2, 2048, {2047, 2049, 300000, 131072}, 300000, 0},
      {32, 4, 2048, {118750 * 4, 5000}, 118750 * 4, 118784},
      {64, 1, 17, {100000, 3}, 100000, 4096},
  };
  for (const Case& c : cases) {
    PagedProblem p = selection_problem(c.heads, c.next_n, 64, c.lengths, c.max_context, 5, Values::random);
    const DeviceProblem d(p);
    for (bool slots : {false, true}) {
      SCOPED_TRACE("context " + std::to_string(c.max_context) + " chunk " + std::to_string(c.chunk) + " slots " +
                   std::to_string(slots));
      EXPECT_EQ(gpu_fused(p, d, c.k, slots, c.chunk), gpu_unfused(p, d, c.k, slots));
    }
  }
}

// Ragged form: GPU fused vs GPU logits + top-k (random) and vs the CPU reference (small integers).
TEST(FusedSelectGpu, RaggedEqualsUnfusedAndCpu) {
  NVFP4MLA_REQUIRE_GPU();
  for (Values v : {Values::random, Values::small_integers}) {
    // The CPU reference (small integers) is kept to a second or so per chunking.
    const bool exact = v == Values::small_integers;
    nvfp4mla::testing::RaggedProblem p =
        nvfp4mla::testing::ragged_problem(64, exact ? 12 : 40, exact ? 20000 : 200000, exact ? 15000 : 150000, 31, v);
    const FusedSelectRaggedArgs host = nvfp4mla::testing::fused_ragged_args(p, 2048);
    DeviceBuffer<uint8_t> values(p.key_values), q(p.q);
    DeviceBuffer<float> scales(p.key_scales), w(p.w), logits(size_t(p.rows) * p.stride);
    DeviceBuffer<int32_t> starts(p.starts), ends(p.ends);
    FusedSelectRaggedArgs a = host;
    a.keys.q = q.get();
    a.keys.weights = w.get();
    a.keys.key_values = values.get();
    a.keys.key_scales = scales.get();
    a.keys.row_starts = starts.get();
    a.keys.row_ends = ends.get();
    // Unfused on the GPU.
    IndexerRaggedArgs l = a.keys;
    l.logits = logits.get();
    l.logits_stride = p.stride;
    DeviceBuffer<unsigned long long> invalid(1);
    cuda::indexer_logits(l, invalid.get(), nullptr);
    TopkArgs t;
    t.values = logits.get();
    t.rows = static_cast<int>(p.rows);
    t.columns = p.stride;
    t.stride = p.stride;
    t.k = 2048;
    const TopkPlan tplan = plan_topk(t.rows, t.columns, sm_count());
    DeviceBuffer<uint8_t> tws(topk_workspace_bytes(tplan, t.rows));
    Outputs unfused(p.rows, 2048);
    cuda::topk(t, tplan, tws.get(), tws.size(), unfused.outputs(), unfused.errors.get(), nullptr);
    for (int64_t chunk : {int64_t(0), int64_t(4096), int64_t(50001)}) {
      const FusedSelectPlan plan = plan_fused_select(a, chunk, sm_count());
      DeviceBuffer<uint8_t> ws(plan.workspace_bytes);
      ws.fill_bytes(0xFF);
      Outputs fused(p.rows, 2048);
      cuda::fused_select(a, plan, ws.get(), plan.workspace_bytes, fused.outputs(), fused.errors.get(), nullptr);
      CUDA_OK(cudaDeviceSynchronize());
      EXPECT_EQ(fused.errors.download()[0], 0u);
      const Selection got = fused.download();
      EXPECT_EQ(got, unfused.download()) << "chunk " << chunk;
      if (v == Values::small_integers) {
        Selection cpu(p.rows, 2048);
        fused_select_reference(host, chunk, cpu.outputs());
        EXPECT_EQ(got, cpu) << "chunk " << chunk;
      }
    }
    EXPECT_EQ(invalid.download()[0], 0u);
  }
}

TEST(FusedSelectGpu, BadMetadataSelectsNothing) {
  NVFP4MLA_REQUIRE_GPU();
  PagedProblem p = selection_problem(8, 2, 64, {500, 700}, 700, 3, Values::small_integers);
  p.context_lens[1] = 701;  // past max_context
  const DeviceProblem d(p);
  unsigned long long invalid = 0;
  const Selection s = gpu_fused(p, d, 16, false, 128, &invalid);
  EXPECT_GT(invalid, 0u);
  for (int32_t len : s.topk_length) EXPECT_EQ(len, 0);
  for (int32_t i : s.indices) EXPECT_EQ(i, -1);
}

TEST(FusedSelectGpu, GraphReplayGivesTheSameSelection) {
  NVFP4MLA_REQUIRE_GPU();
  PagedProblem p = selection_problem(64, 2, 64, {20000, 9000}, 20000, 9, Values::random);
  const DeviceProblem d(p);
  const Selection direct = gpu_fused(p, d, 256, true, 4096);
  const FusedSelectArgs a = d.args(p, 256, true);
  const FusedSelectPlan plan = plan_fused_select(a, 4096, sm_count());
  DeviceBuffer<uint8_t> ws(plan.workspace_bytes);
  Outputs o(p.requests * p.next_n, 256);
  cudaStream_t stream;
  CUDA_OK(cudaStreamCreate(&stream));
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  CUDA_OK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal));
  cuda::fused_select(a, plan, ws.get(), plan.workspace_bytes, o.outputs(), o.errors.get(), stream);
  CUDA_OK(cudaStreamEndCapture(stream, &graph));
  CUDA_OK(cudaGraphInstantiate(&exec, graph, 0));
  for (int i = 0; i < 2; ++i) CUDA_OK(cudaGraphLaunch(exec, stream));
  CUDA_OK(cudaStreamSynchronize(stream));
  EXPECT_EQ(o.download(), direct);
  EXPECT_EQ(o.errors.download()[0], 0u);
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaStreamDestroy(stream);
}

}  // namespace
