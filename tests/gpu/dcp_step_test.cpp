// The DCP decode step on the GPU (cuda::dcp_decode_step) through the in-process communicator:
// DCP 2/4/8 with interleaves 1 and 64 equals the single GPU (the top-k bit for bit, the
// attention within the decode tolerances of output_compare.h) for every record format, MTP
// verifier rows, ranks without tokens of a request, a 1M-token context; union mode equals the
// CPU reference's selection; CUDA-graph replay and a stream per rank equal the eager
// single-stream step bit for bit; device-side errors are counted; over NCCL with a world of 1
// the step equals the single GPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <vector>

#include "gpu/dcp_support.h"
#include "gpu/gpu_support.h"
#include "nvfp4mla/codec.h"
#include "nvfp4mla/cuda/dcp.h"
#include "nvfp4mla/cuda/dcp_step.h"
#include "nvfp4mla/cuda/fused_select.h"
#include "nvfp4mla/cuda/sparse_decode.h"
#include "nvfp4mla/dcp.h"
#include "nvfp4mla/error.h"
#include "support/attention_oracle.h"
#include "nvfp4mla/testing/dcp_step_problem.h"
#include "support/output_compare.h"
#include "support/record_specs.h"
#include "support/expect_error.h"

using namespace nvfp4mla;
using nvfp4mla::testing::DeviceBuffer;
namespace nt = nvfp4mla::testing;

namespace {

// A device copy, or an empty buffer for an empty vector (no zero-byte copies).
template <class T>
DeviceBuffer<T> device_copy(const std::vector<T>& host) {
  return host.empty() ? DeviceBuffer<T>() : DeviceBuffer<T>(host);
}

// What every rank returned.
struct StepOutputs {
  std::vector<std::vector<uint16_t>> out;
  std::vector<std::vector<float>> lse, values;
  std::vector<std::vector<int32_t>> indices, length;
  std::vector<unsigned long long> errors;
};

// Device copies of a problem for the local ranks of `comm`, poisoned outputs, and the step.
class GpuStep {
 public:
  GpuStep(const nt::DcpStepProblem& p, DcpSelection selection, cuda::DcpCommunicator& comm)
      : comm_(comm),
        args_(p.step_args(selection)),
        q_(p.q),
        table_(p.table),
        index_q_(device_copy(p.index_q)),
        index_w_(device_copy(p.index_w)),
        context_lens_(p.shape.context_lens) {
    plan_ = plan_dcp_step(args_, cuda::current_sm_count());
    const int local = comm.local_ranks();
    const size_t rh = size_t(p.rows) * p.shape.heads, rk = size_t(p.rows) * p.shape.k;
    for (int i = 0; i < local; ++i) {
      const int r = comm.local_rank(i);
      logits_.emplace_back(p.rank_logits[r]);
      lengths_.emplace_back(p.rank_lengths[r]);
      caches_.emplace_back(p.rank_caches[r]);
      if (p.shape.indexer) index_.emplace_back(p.rank_index[r]);
      out_.emplace_back(rh * kLatentDim);
      lse_.emplace_back(rh);
      values_.emplace_back(rk);
      indices_.emplace_back(rk);
      length_.emplace_back(size_t(p.rows));
      errors_.emplace_back(1);
      workspace_.emplace_back(plan_.workspace_bytes);
      workspace_ptr_.push_back(workspace_.back().get());
    }
    for (int i = 0; i < local; ++i) {
      DcpRankStep s;
      s.logits = logits_[i].get();
      s.lengths = lengths_[i].get();
      s.q = q_.get();
      s.cache = caches_[i].get();
      s.block_table = table_.get();
      s.out = out_[i].get();
      s.lse = lse_[i].get();
      s.indices = indices_[i].get();
      s.topk_length = length_[i].get();
      s.values = values_[i].get();
      s.errors = errors_[i].get();
      if (p.shape.indexer) {
        s.logits = nullptr;
        s.lengths = nullptr;
        s.index_cache = index_[i].get();
        s.index_q = index_q_.get();
        s.index_w = index_w_.get();
        s.context_lens = context_lens_.get();
      }
      steps_.push_back(s);
    }
    poison();
  }
  void poison() {
    for (size_t i = 0; i < out_.size(); ++i) {
      out_[i].fill_bytes(0xFF);
      lse_[i].fill_bytes(0xFF);
      values_[i].fill_bytes(0xAB);
      indices_[i].fill_bytes(0xAB);
      length_[i].fill_bytes(0xAB);
      errors_[i].fill_bytes(0xAB);
      workspace_[i].fill_bytes(0xFF);
    }
    CUDA_CHECK_THROW(cudaDeviceSynchronize());
  }
  void run(const cudaStream_t* streams) { run_with(comm_, streams); }
  void run_with(cuda::DcpCommunicator& comm, const cudaStream_t* streams) {
    cuda::dcp_decode_step(comm, args_, plan_, steps_.data(), workspace_ptr_.data(), plan_.workspace_bytes, streams);
  }
  StepOutputs outputs() const {
    CUDA_CHECK_THROW(cudaDeviceSynchronize());
    StepOutputs o;
    for (size_t i = 0; i < out_.size(); ++i) {
      o.out.push_back(out_[i].download());
      o.lse.push_back(lse_[i].download());
      o.values.push_back(values_[i].download());
      o.indices.push_back(indices_[i].download());
      o.length.push_back(length_[i].download());
      o.errors.push_back(errors_[i].download()[0]);
    }
    return o;
  }
  std::vector<DeviceBuffer<int32_t>>& lengths() { return lengths_; }
  DeviceBuffer<int32_t>& context_lens() { return context_lens_; }
  const DcpStepPlan& plan() const { return plan_; }

 private:
  cuda::DcpCommunicator& comm_;
  DcpStepArgs args_;
  DcpStepPlan plan_;
  DeviceBuffer<uint16_t> q_;
  DeviceBuffer<int32_t> table_;
  DeviceBuffer<uint8_t> index_q_;
  DeviceBuffer<float> index_w_;
  DeviceBuffer<int32_t> context_lens_;
  std::vector<DeviceBuffer<uint8_t>> index_;
  std::vector<DeviceBuffer<float>> logits_, lse_, values_;
  std::vector<DeviceBuffer<int32_t>> lengths_, indices_, length_;
  std::vector<DeviceBuffer<uint8_t>> caches_, workspace_;
  std::vector<DeviceBuffer<uint16_t>> out_;
  std::vector<DeviceBuffer<unsigned long long>> errors_;
  std::vector<void*> workspace_ptr_;
  std::vector<DcpRankStep> steps_;
};

StepOutputs run_in_process(const nt::DcpStepProblem& p, DcpSelection selection, bool per_rank_streams = false) {
  cuda::InProcessDcpCommunicator comm(p.shape.place.ranks);
  nt::Streams streams(p.shape.place.ranks, per_rank_streams);
  GpuStep step(p, selection, comm);
  step.run(streams.get());
  streams.synchronize();
  return step.outputs();
}

std::vector<float> widen(const std::vector<uint16_t>& b) {
  std::vector<float> f(b.size());
  for (size_t i = 0; i < b.size(); ++i) f[i] = codec::bf16_decode(b[i]);
  return f;
}

// The selected global positions of the single-GPU answer mapped to single-cache slots.
std::vector<int32_t> single_slots(const nt::DcpStepProblem& p) {
  const TopkSlotMap m = p.single_slots(p.table.data());
  std::vector<int32_t> slots(p.want_indices.size());
  for (size_t i = 0; i < slots.size(); ++i)
    slots[i] = p.want_indices[i] < 0 ? -1 : static_cast<int32_t>(topk_slot(m, int64_t(i) / p.shape.k, p.want_indices[i]));
  return slots;
}

// Checks every rank's outputs against the single GPU: selection bit for bit, no device errors;
// the attention against the fp64 reference on the kernels' operands within the decode bounds
// (output_compare.h): the single-GPU kernel within one bound; the DCP step within 2.5: the
// ranks' kernel errors, weighted by the merge, stay within 2^-8 (2.25 sum P|v|), and the BF16
// rounding of each rank's partial adds at most 2^-9 sum P|v|; DCP against the single GPU's own
// output within the sum of both (3.5).
void expect_equals_single_gpu(const nt::DcpStepProblem& p, const StepOutputs& got) {
  const int n = static_cast<int>(got.out.size());
  for (int r = 0; r < n; ++r) {
    SCOPED_TRACE(::testing::Message() << "rank " << r);
    ASSERT_EQ(got.indices[r], p.want_indices);
    ASSERT_EQ(got.length[r], p.want_length);
    ASSERT_EQ(0, std::memcmp(got.values[r].data(), p.want_values.data(), p.want_values.size() * 4));
    EXPECT_EQ(got.errors[r], 0u);
    if (r > 0) {  // every rank merges the same gathered partials
      EXPECT_EQ(got.out[r], got.out[0]);
      EXPECT_EQ(0, std::memcmp(got.lse[r].data(), got.lse[0].data(), got.lse[0].size() * 4));
    }
  }
  // Single GPU: sparse decode over the whole selection in the single cache.
  const std::vector<int32_t> slots = single_slots(p);
  DeviceBuffer<uint16_t> q(p.q), out(size_t(p.rows) * p.shape.heads * kLatentDim);
  DeviceBuffer<uint8_t> cache(p.single_cache);
  DeviceBuffer<int32_t> idx(slots), len(p.want_length);
  DeviceBuffer<float> lse(size_t(p.rows) * p.shape.heads);
  const DecodePlan plan = plan_sparse_decode(p.shape.spec, p.rows, p.shape.heads, p.shape.k, cuda::current_sm_count());
  DeviceBuffer<uint8_t> ws(std::max<size_t>(decode_workspace_layout(plan, p.rows, p.shape.heads).total_bytes, 1));
  cuda::sparse_decode(p.shape.spec, p.single_attention_args(q.get(), cache.get(), idx.get(), len.get()), plan, ws.get(),
                      ws.size(), out.get(), lse.get(), nullptr);
  CUDA_CHECK_THROW(cudaDeviceSynchronize());
  const std::vector<float> single_out = widen(out.download()), single_lse = lse.download();

  const SparseMlaArgs host = p.single_attention_args(p.q.data(), p.single_cache.data(), slots.data(), p.want_length.data());
  const bool bf16_k = cuda::decode_rounds_k_to_bf16(p.shape.spec, plan);
  std::vector<float> ref_out(single_out.size()), ref_lse(single_lse.size());
  sparse_mla_reference(p.shape.spec, host, ref_out.data(), ref_lse.data(), {.bf16_operands = bf16_k});
  auto bounds = nt::oracle::attention(p.shape.spec, host, nt::plan_bound_options(plan, bf16_k));
  const double row_cos = cuda::decode_weights_are_bf16(p.shape.spec, plan) ? 5e-5 : 5e-6;
  {
    SCOPED_TRACE("single GPU vs reference");
    EXPECT_EQ(nt::compare_attention(single_out, ref_out, single_lse, ref_lse, bounds, p.shape.heads,
                                    {.cos_limit = 5e-6, .row_cos_limit = row_cos})
                  .failures,
              0);
  }
  for (auto& b : bounds.element_bound) b *= 2.5;
  for (auto& b : bounds.norm_bound) b *= 2.5;
  const std::vector<float> dcp_out = widen(got.out[0]);
  {
    SCOPED_TRACE("DCP vs reference");
    EXPECT_EQ(nt::compare_attention(dcp_out, ref_out, got.lse[0], ref_lse, bounds, p.shape.heads,
                                    {.cos_limit = 1e-5, .row_cos_limit = 2 * row_cos})
                  .failures,
              0);
  }
  for (auto& b : bounds.element_bound) b *= 3.5 / 2.5;  // the single GPU's one bound plus DCP's 2.5
  for (auto& b : bounds.norm_bound) b *= 3.5 / 2.5;
  {
    SCOPED_TRACE("DCP vs single GPU");
    EXPECT_EQ(nt::compare_attention(dcp_out, single_out, got.lse[0], single_lse, bounds, p.shape.heads,
                                    {.cos_limit = 2e-5, .row_cos_limit = 4 * row_cos})
                  .failures,
              0);
  }
}

}  // namespace

TEST(GpuDcpStep, EqualsSingleGpuOverRanksInterleavesAndMtpRows) {
  NVFP4MLA_REQUIRE_GPU();
  for (int n : {2, 4, 8})
    for (int il : {1, 64})
      for (int next_n : {1, 2}) {
        SCOPED_TRACE(::testing::Message() << "N=" << n << " interleave=" << il << " next_n=" << next_n);
        nt::DcpStepShape s;
        s.spec = {CacheDtype::nvfp4_ds_mla, RopeEncoding::bf16, ScaleMode::implicit};
        s.place = {n, il};
        s.next_n = next_n;
        s.context_lens = {5000 + 7 * n, 3000, 40, 0};  // 40 tokens: ranks without tokens at interleave 64
        s.heads = 64;
        s.k = 256;
        s.seed = uint64_t(n) * 1000 + il * 10 + next_n;
        const nt::DcpStepProblem p = nt::make_dcp_step_problem(s);
        expect_equals_single_gpu(p, run_in_process(p, DcpSelection::exact));
      }
}

TEST(GpuDcpStep, EqualsSingleGpuForEveryRecordFormat) {
  NVFP4MLA_REQUIRE_GPU();
  for (const RecordSpec& spec : nt::kAllRecordSpecs)
    for (int heads : {16, 128}) {
      SCOPED_TRACE(::testing::Message() << nt::spec_name(spec) << " heads " << heads);
      nt::DcpStepShape s;
      s.spec = spec;
      s.place = {4, 64};
      s.next_n = 2;
      s.context_lens = {4000, 100};
      s.heads = heads;
      s.k = 512;
      s.selected_only = true;  // unselected records NaN: never read
      s.seed = 77 + heads;
      const nt::DcpStepProblem p = nt::make_dcp_step_problem(s);
      expect_equals_single_gpu(p, run_in_process(p, DcpSelection::exact));
    }
}

// With the indexer: each rank's fused selection over its own index key cache. The single GPU's
// fused selection over the whole cache gives the reference selection (small-integer keys: exact
// logits) and the DCP step equals it.
TEST(GpuDcpStep, IndexerStepEqualsSingleGpuFusedSelection) {
  NVFP4MLA_REQUIRE_GPU();
  for (int n : {2, 4, 8})
    for (int il : {1, 64})
      for (int next_n : {1, 3}) {
        SCOPED_TRACE(::testing::Message() << "N=" << n << " interleave=" << il << " next_n=" << next_n);
        nt::DcpStepShape s;
        s.spec = {CacheDtype::nvfp4_ds_mla, RopeEncoding::fp8, ScaleMode::dynamic};
        s.place = {n, il};
        s.next_n = next_n;
        s.context_lens = {6000 + 5 * n, 40, 0};
        s.heads = 64;
        s.k = 512;
        s.indexer = true;
        s.index_heads = 64;
        s.seed = uint64_t(n) * 100 + il + next_n;
        const nt::DcpStepProblem p = nt::make_dcp_step_problem(s);
        // The single GPU's selection.
        DeviceBuffer<uint8_t> iq(p.index_q), index(p.single_index);
        DeviceBuffer<float> iw(p.index_w);
        DeviceBuffer<int32_t> table(p.table), ctx(s.context_lens), idx(p.want_indices.size()), len(size_t(p.rows));
        DeviceBuffer<float> val(p.want_values.size());
        DeviceBuffer<unsigned long long> invalid(1);
        FusedSelectArgs f;
        f.keys = p.single_index_args(iq.get(), iw.get(), index.get(), table.get(), ctx.get());
        f.max_context = p.max_context;
        f.k = s.k;
        const FusedSelectPlan plan = plan_fused_select(f, 0, cuda::current_sm_count());
        DeviceBuffer<uint8_t> ws(plan.workspace_bytes);
        cuda::fused_select(f, plan, ws.get(), plan.workspace_bytes, {idx.get(), len.get(), val.get()}, invalid.get(), nullptr);
        CUDA_OK(cudaDeviceSynchronize());
        ASSERT_EQ(idx.download(), p.want_indices);
        ASSERT_EQ(len.download(), p.want_length);
        ASSERT_EQ(invalid.download()[0], 0u);
        expect_equals_single_gpu(p, run_in_process(p, DcpSelection::exact));
      }
}

// One request of 2^20 tokens over 8 ranks at the production k.
TEST(GpuDcpStep, OneMillionTokenContext) {
  NVFP4MLA_REQUIRE_GPU();
  for (int il : {1, 64}) {
    SCOPED_TRACE(::testing::Message() << "interleave " << il);
    nt::DcpStepShape s;
    s.spec = {CacheDtype::nvfp4_ds_mla, RopeEncoding::fp8, ScaleMode::implicit};
    s.place = {8, il};
    s.context_lens = {1 << 20};
    s.heads = 64;
    s.k = 2048;
    s.selected_only = true;
    s.seed = 1000000 + il;
    const nt::DcpStepProblem p = nt::make_dcp_step_problem(s);
    expect_equals_single_gpu(p, run_in_process(p, DcpSelection::exact));
  }
}

// Union mode: each rank's selection (indices, lengths, values) equals the CPU reference's bit for
// bit; every rank's attention agrees with the CPU reference of the step (fp64) within a cosine
// difference of 1e-4 per (row, head).
TEST(GpuDcpStep, UnionModeEqualsCpuReference) {
  NVFP4MLA_REQUIRE_GPU();
  nt::DcpStepShape s;
  s.spec = {CacheDtype::bf16, RopeEncoding::bf16, ScaleMode::implicit};
  s.place = {4, 1};
  s.next_n = 2;
  s.context_lens = {3000, 50};
  s.heads = 16;
  s.k = 128;
  const nt::DcpStepProblem p = nt::make_dcp_step_problem(s);
  const StepOutputs got = run_in_process(p, DcpSelection::union_local);
  const int n = s.place.ranks;
  const size_t rh = size_t(p.rows) * s.heads, rk = size_t(p.rows) * s.k;
  std::vector<std::vector<float>> out(n, std::vector<float>(rh * kLatentDim)), lse(n, std::vector<float>(rh)),
      values(n, std::vector<float>(rk));
  std::vector<std::vector<int32_t>> idx(n, std::vector<int32_t>(rk)), len(n, std::vector<int32_t>(p.rows));
  std::vector<DcpRankStepReference> steps(n);
  for (int r = 0; r < n; ++r)
    steps[r] = {p.rank_logits[r].data(), p.rank_lengths[r].data(), p.q.data(), p.rank_caches[r].data(), p.table.data(),
                out[r].data(), lse[r].data(), idx[r].data(), len[r].data(), values[r].data(), nullptr};
  dcp_decode_step_reference(p.step_args(DcpSelection::union_local), steps.data());
  for (int r = 0; r < n; ++r) {
    EXPECT_EQ(got.indices[r], idx[r]) << "rank " << r;
    EXPECT_EQ(got.length[r], len[r]) << "rank " << r;
    EXPECT_EQ(0, std::memcmp(got.values[r].data(), values[r].data(), rk * sizeof(float))) << "rank " << r;
    EXPECT_EQ(got.errors[r], 0u);
  }
  for (int r = 0; r < n; ++r) {
    const std::vector<float> g = widen(got.out[r]);
    for (size_t i = 0; i < rh; ++i) {
      double dot = 0, a = 0, b = 0;
      for (int d = 0; d < kLatentDim; ++d) {
        dot += double(g[i * kLatentDim + d]) * out[r][i * kLatentDim + d];
        a += double(g[i * kLatentDim + d]) * g[i * kLatentDim + d];
        b += double(out[r][i * kLatentDim + d]) * out[r][i * kLatentDim + d];
      }
      if (b == 0) {
        EXPECT_EQ(a, 0) << "rank " << r << " row-head " << i;
        continue;
      }
      EXPECT_LE(1 - dot / std::sqrt(a * b), 1e-4) << "rank " << r << " row-head " << i;
      EXPECT_NEAR(got.lse[r][i], lse[r][i], 1e-3 * (1 + std::fabs(lse[r][i]))) << "rank " << r << " row-head " << i;
    }
  }
}

// Captured once in a CUDA graph (a stream per rank, forked from the capturing stream) and
// replayed into poisoned outputs: equal to the eager single-stream step bit for bit.
TEST(GpuDcpStep, GraphReplayAndStreamPerRankEqualEager) {
  NVFP4MLA_REQUIRE_GPU();
  nt::DcpStepShape s;
  s.spec = {CacheDtype::nvfp4_ds_mla, RopeEncoding::fp8, ScaleMode::dynamic};  // the 368-byte dynamic record
  s.place = {4, 16};
  s.next_n = 2;
  s.context_lens = {6000, 900};
  s.heads = 64;
  s.k = 512;
  const nt::DcpStepProblem p = nt::make_dcp_step_problem(s);
  const StepOutputs eager = run_in_process(p, DcpSelection::exact);
  const StepOutputs streamed = run_in_process(p, DcpSelection::exact, true);
  cuda::InProcessDcpCommunicator comm(4);
  nt::Streams streams(4, true);
  GpuStep step(p, DcpSelection::exact, comm);
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  CUDA_OK(cudaStreamBeginCapture(streams[0], cudaStreamCaptureModeGlobal));
  streams.fork();
  step.run(streams.get());
  streams.join();
  CUDA_OK(cudaStreamEndCapture(streams[0], &graph));
  CUDA_OK(cudaGraphInstantiate(&exec, graph, 0));
  step.poison();
  CUDA_OK(cudaGraphLaunch(exec, streams[0]));
  CUDA_OK(cudaStreamSynchronize(streams[0]));
  const StepOutputs replayed = step.outputs();
  for (const StepOutputs* o : {&streamed, &replayed})
    for (int r = 0; r < 4; ++r) {
      EXPECT_EQ(o->out[r], eager.out[r]) << "rank " << r;
      EXPECT_EQ(0, std::memcmp(o->lse[r].data(), eager.lse[r].data(), eager.lse[r].size() * 4)) << "rank " << r;
      EXPECT_EQ(o->indices[r], eager.indices[r]) << "rank " << r;
    }
  expect_equals_single_gpu(p, replayed);
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
}

// The device computes the same local row lengths as the host; a negative context length and a
// local length past the columns are counted, not read.
TEST(GpuDcpStep, DeviceRowLengthsAndErrorCounts) {
  NVFP4MLA_REQUIRE_GPU();
  const std::vector<int32_t> ctx = {7, 0, 100000, 65, 64, 63};
  DeviceBuffer<int32_t> d_ctx(ctx), d_len(ctx.size() * 3);
  DeviceBuffer<unsigned long long> err(1);
  for (int n : {1, 2, 8})
    for (int il : {1, 64})
      for (int r = 0; r < n; ++r) {
        std::vector<int32_t> want(ctx.size() * 3);
        dcp_local_row_lengths({n, il}, r, ctx.data(), int64_t(ctx.size()), 3, want.data());
        err.fill_bytes(0);
        cuda::dcp_local_row_lengths({n, il}, r, d_ctx.get(), int64_t(ctx.size()), 3, d_len.get(), err.get(), nullptr);
        CUDA_OK(cudaDeviceSynchronize());
        EXPECT_EQ(d_len.download(), want) << "N=" << n << " il=" << il << " rank " << r;
        EXPECT_EQ(err.download()[0], 0u);
      }
  DeviceBuffer<int32_t> bad(std::vector<int32_t>{-5, 3});
  err.fill_bytes(0);
  cuda::dcp_local_row_lengths({2, 1}, 0, bad.get(), 2, 2, d_len.get(), err.get(), nullptr);
  CUDA_OK(cudaDeviceSynchronize());
  EXPECT_EQ(err.download()[0], 1u);
  EXPECT_EQ(d_len.download()[0], 0);

  // A rank's row length past the columns: that rank's top-k counts it and selects nothing there.
  nt::DcpStepShape s;
  s.place = {2, 1};
  s.context_lens = {500};
  s.heads = 16;
  s.k = 32;
  const nt::DcpStepProblem p = nt::make_dcp_step_problem(s);
  cuda::InProcessDcpCommunicator comm(2);
  nt::Streams streams(2, false);
  GpuStep step(p, DcpSelection::exact, comm);
  step.lengths()[1].upload(std::vector<int32_t>{static_cast<int32_t>(p.columns + 1)});
  step.run(streams.get());
  const StepOutputs o = step.outputs();
  EXPECT_EQ(o.errors[0], 0u);
  EXPECT_EQ(o.errors[1], 1u);
  for (int32_t pos : o.indices[0]) EXPECT_TRUE(pos < 0 || dcp_locate(s.place, pos).rank == 0) << pos;

  // With the indexer, a negative context length: counted on every rank, and no rank selects.
  s.indexer = true;
  const nt::DcpStepProblem q = nt::make_dcp_step_problem(s);
  GpuStep indexed(q, DcpSelection::exact, comm);
  indexed.context_lens().upload(std::vector<int32_t>{-3});
  indexed.run(streams.get());
  const StepOutputs e = indexed.outputs();
  for (int r = 0; r < 2; ++r) {
    EXPECT_GE(e.errors[r], 1u) << "rank " << r;
    EXPECT_EQ(e.length[r], std::vector<int32_t>{0}) << "rank " << r;
  }
}

TEST(GpuDcpStep, BadArgumentsThrowBeforeLaunch) {
  NVFP4MLA_REQUIRE_GPU();
  nt::DcpStepShape s;
  s.context_lens = {300};
  s.heads = 16;
  s.k = 16;
  const nt::DcpStepProblem p = nt::make_dcp_step_problem(s);
  cuda::InProcessDcpCommunicator comm(2), three(3);
  GpuStep step(p, DcpSelection::exact, comm);
  EXPECT_THROW(step.run_with(three, nt::Streams(3, false).get()), Error);  // world 3, placement 2
  DcpStepArgs a = p.step_args(DcpSelection::exact);
  a.k = 0;
  std::vector<void*> ws(2, nullptr);
  nt::Streams streams(2, false);
  // k's own check fires first (the null rank steps would be rejected after it).
  nt::expect_error_containing([&] { cuda::dcp_decode_step(comm, a, step.plan(), nullptr, ws.data(), 0, streams.get()); },
                              "k must be in 1..4096 (got 0)");
  const StepOutputs o = step.outputs();
  for (const auto& v : o.indices[0]) EXPECT_EQ(v, int32_t(0xABABABAB));  // nothing written
}

// ---- NCCL, world of 1 ----

TEST(GpuDcpStep, NcclWorldOfOneEqualsSingleGpu) {
  NVFP4MLA_REQUIRE_GPU();
  NVFP4MLA_REQUIRE_NCCL();
  const std::string lib = nt::test_nccl_library();
  auto comm = cuda::make_nccl_communicator(cuda::nccl_unique_id(lib), 1, 0, lib);
  nt::DcpStepShape s;
  s.spec = {CacheDtype::nvfp4_ds_mla, RopeEncoding::bf16, ScaleMode::implicit};
  s.place = {1, 1};
  s.next_n = 2;
  s.context_lens = {5000, 20};
  s.heads = 64;
  s.k = 512;
  const nt::DcpStepProblem p = nt::make_dcp_step_problem(s);
  nt::Streams streams(1, true);
  GpuStep step(p, DcpSelection::exact, *comm);
  step.run(streams.get());
  streams.synchronize();
  const StepOutputs nccl = step.outputs();
  expect_equals_single_gpu(p, nccl);
  const StepOutputs in_process = run_in_process(p, DcpSelection::exact);
  EXPECT_EQ(nccl.out[0], in_process.out[0]);
}
