// DCP on the GPU: the merge kernel against the fp64 CPU reference on random and adversarial
// partials (empty ranks holding NaN, all-empty rows, LSE spreads that underflow the weights,
// NaN/+inf LSEs), every input/output type and LSE base, boundary shapes, NaN-poisoned outputs,
// bad arguments, CUDA-graph replay; the per-rank GPU top-k merged equals the single-GPU top-k.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "gpu/gpu_support.h"
#include "nvfp4mla/codec.h"
#include "nvfp4mla/cuda/dcp.h"
#include "nvfp4mla/cuda/sparse_decode.h"
#include "nvfp4mla/dcp.h"
#include "nvfp4mla/error.h"
#include "support/dcp_data.h"
#include "support/topk_data.h"
#include "support/expect_error.h"

using namespace nvfp4mla;
using nvfp4mla::testing::DeviceBuffer;
namespace nt = nvfp4mla::testing;

namespace {

constexpr int kPoisonByte = 0xFF;  // NaN in fp32 and bf16

// A device copy, or an empty buffer for an empty vector (no zero-byte copies).
template <class T>
DeviceBuffer<T> device_copy(const std::vector<T>& host) {
  return host.empty() ? DeviceBuffer<T>() : DeviceBuffer<T>(host);
}

// Device copies of a merge problem's partials and poisoned outputs.
struct GpuMerge {
  DeviceBuffer<float> part_f32, lse_in, out_f32, lse;
  DeviceBuffer<uint16_t> part_bf16, out_bf16;
  DcpMergeArgs args;
  DcpMergeOutputs outs;

  GpuMerge(const nt::MergeProblem& p, DcpPartialType out_type, bool with_lse = true)
      : lse_in(device_copy(p.lse)), lse(std::max<int64_t>(p.row_heads(), 1)) {
    args = p.args();
    if (p.type == DcpPartialType::f32) {
      part_f32 = device_copy(p.out_f32);
      args.partial_out = part_f32.get();
    } else {
      part_bf16 = device_copy(p.out_bf16);
      args.partial_out = part_bf16.get();
    }
    args.partial_lse = lse_in.get();
    const size_t n = std::max<size_t>(size_t(p.row_heads()) * kDcpLatentDim, 1);
    outs.out_type = out_type;
    if (out_type == DcpPartialType::f32) {
      out_f32 = DeviceBuffer<float>(n);
      out_f32.fill_bytes(kPoisonByte);
      outs.out = out_f32.get();
    } else {
      out_bf16 = DeviceBuffer<uint16_t>(n);
      out_bf16.fill_bytes(kPoisonByte);
      outs.out = out_bf16.get();
    }
    lse.fill_bytes(kPoisonByte);
    outs.lse = with_lse ? lse.get() : nullptr;
  }
  std::vector<float> out_floats() const {
    if (outs.out_type == DcpPartialType::f32) return out_f32.download();
    const auto b = out_bf16.download();
    std::vector<float> f(b.size());
    for (size_t i = 0; i < b.size(); ++i) f[i] = codec::bf16_decode(b[i]);
    return f;
  }
};

// The CPU reference's out (as floats) and lse.
void reference(const nt::MergeProblem& p, DcpPartialType out_type, std::vector<float>& out, std::vector<float>& lse) {
  const size_t n = size_t(p.row_heads()) * kDcpLatentDim;
  std::vector<float> f(n);
  std::vector<uint16_t> b(n);
  lse.assign(p.row_heads(), 0.0f);
  DcpMergeOutputs o{out_type == DcpPartialType::f32 ? static_cast<void*>(f.data()) : b.data(), out_type, lse.data()};
  dcp_merge_reference(p.args(), o);
  out = f;
  if (out_type == DcpPartialType::bf16)
    for (size_t i = 0; i < n; ++i) out[i] = codec::bf16_decode(b[i]);
}

void check_against_reference(const nt::MergeProblem& p, DcpPartialType out_type) {
  GpuMerge g(p, out_type);
  cuda::dcp_merge(g.args, g.outs, nullptr);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  std::vector<float> ref_out, ref_lse;
  reference(p, out_type, ref_out, ref_lse);
  std::string first;
  EXPECT_EQ(nt::merge_mismatches(p, g.out_floats(), g.lse.download(), ref_out, ref_lse, out_type == DcpPartialType::bf16, first),
            0)
      << first;
}

constexpr DcpPartialType kTypes[] = {DcpPartialType::f32, DcpPartialType::bf16};

}  // namespace

TEST(GpuDcpMerge, EqualsReferenceOnRandomAndAdversarialPartials) {
  NVFP4MLA_REQUIRE_GPU();
  uint64_t seed = 1;
  for (auto kind : {nt::MergeData::random, nt::MergeData::wide, nt::MergeData::mostly_empty})
    for (int ranks : {1, 2, 4, 8})
      for (DcpPartialType in : kTypes)
        for (DcpPartialType out : kTypes)
          for (LseBase base : {LseBase::natural, LseBase::base2}) {
            SCOPED_TRACE(::testing::Message() << "kind " << int(kind) << " ranks " << ranks << " in " << int(in) << " out "
                                              << int(out) << " base2 " << (base == LseBase::base2));
            check_against_reference(nt::make_merge_problem(ranks, 5, 16, in, base, kind, seed++), out);
          }
}

// Shapes where rows x heads is not a multiple of the warps per block, one (row, head), many.
TEST(GpuDcpMerge, BoundaryShapes) {
  NVFP4MLA_REQUIRE_GPU();
  const int shapes[][2] = {{1, 1}, {1, 3}, {3, 5}, {7, 128}, {129, 16}, {2048, 1}};
  for (const auto& s : shapes) {
    SCOPED_TRACE(::testing::Message() << "rows " << s[0] << " heads " << s[1]);
    check_against_reference(nt::make_merge_problem(4, s[0], s[1], DcpPartialType::bf16, LseBase::natural,
                                                   nt::MergeData::random, 40 + s[0]),
                            DcpPartialType::bf16);
  }
  // No rows: nothing launched, nothing written.
  auto p = nt::make_merge_problem(2, 0, 8, DcpPartialType::f32, LseBase::natural, nt::MergeData::random, 9);
  GpuMerge g(p, DcpPartialType::f32);
  cuda::dcp_merge(g.args, g.outs, nullptr);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  for (float v : g.out_f32.download()) EXPECT_TRUE(std::isnan(v));
}

// NaN and +inf LSEs give NaN rows; an all-empty (row, head) gives 0 and -inf; lse may be null.
TEST(GpuDcpMerge, PoisonedLsesAndAllEmptyRows) {
  NVFP4MLA_REQUIRE_GPU();
  auto p = nt::make_merge_problem(3, 4, 2, DcpPartialType::f32, LseBase::base2, nt::MergeData::random, 5);
  const float inf = std::numeric_limits<float>::infinity();
  const int64_t rh = p.row_heads();
  p.lse[0 * rh + 1] = std::numeric_limits<float>::quiet_NaN();
  p.lse[2 * rh + 2] = inf;
  for (int r = 0; r < 3; ++r) {
    p.lse[r * rh + 3] = -inf;
    for (int d = 0; d < kDcpLatentDim; ++d) p.out_f32[(r * rh + 3) * kDcpLatentDim + d] = std::numeric_limits<float>::quiet_NaN();
  }
  check_against_reference(p, DcpPartialType::f32);
  GpuMerge g(p, DcpPartialType::bf16, false);
  cuda::dcp_merge(g.args, g.outs, nullptr);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  const auto out = g.out_floats();
  for (int d = 0; d < kDcpLatentDim; ++d) {
    EXPECT_TRUE(std::isnan(out[1 * kDcpLatentDim + d]));
    EXPECT_TRUE(std::isnan(out[2 * kDcpLatentDim + d]));
    EXPECT_EQ(out[3 * kDcpLatentDim + d], 0.0f);
    EXPECT_FALSE(std::signbit(out[3 * kDcpLatentDim + d]));
  }
  for (float v : g.lse.download()) EXPECT_TRUE(std::isnan(v));  // lse null: never written
}

TEST(GpuDcpMerge, BadArgumentsThrowBeforeLaunch) {
  NVFP4MLA_REQUIRE_GPU();
  auto p = nt::make_merge_problem(2, 2, 2, DcpPartialType::f32, LseBase::natural, nt::MergeData::random, 2);
  GpuMerge g(p, DcpPartialType::f32);
  DcpMergeArgs a = g.args;
  a.partial_out = reinterpret_cast<const char*>(a.partial_out) + 4;
  EXPECT_THROW(cuda::dcp_merge(a, g.outs, nullptr), Error);
  a = g.args;
  a.ranks = 0;
  EXPECT_THROW(cuda::dcp_merge(a, g.outs, nullptr), Error);
  DcpMergeOutputs o = g.outs;
  o.out = nullptr;
  EXPECT_THROW(cuda::dcp_merge(g.args, o, nullptr), Error);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  for (float v : g.out_f32.download()) EXPECT_TRUE(std::isnan(v));
}

TEST(GpuDcpMerge, CudaGraphReplayEqualsEager) {
  NVFP4MLA_REQUIRE_GPU();
  auto p = nt::make_merge_problem(4, 32, 16, DcpPartialType::bf16, LseBase::natural, nt::MergeData::random, 11);
  GpuMerge eager(p, DcpPartialType::bf16), graphed(p, DcpPartialType::bf16);
  cuda::dcp_merge(eager.args, eager.outs, nullptr);
  CUDA_OK(cudaDeviceSynchronize());
  cudaStream_t stream;
  CUDA_OK(cudaStreamCreate(&stream));
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  CUDA_OK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal));
  cuda::dcp_merge(graphed.args, graphed.outs, stream);
  CUDA_OK(cudaStreamEndCapture(stream, &graph));
  CUDA_OK(cudaGraphInstantiate(&exec, graph, 0));
  CUDA_OK(cudaGraphLaunch(exec, stream));
  CUDA_OK(cudaStreamSynchronize(stream));
  CUDA_OK(cudaDeviceSynchronize());
  EXPECT_EQ(graphed.out_bf16.download(), eager.out_bf16.download());
  const auto a = graphed.lse.download(), b = eager.lse.download();
  EXPECT_EQ(0, std::memcmp(a.data(), b.data(), a.size() * 4));
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaStreamDestroy(stream);
}

// ---- selection ----

namespace {

// cuda::dcp_merge_topk of the candidates into poisoned outputs; the error count in *errors.
nt::TopkResult gpu_merge_topk(const nt::DcpCandidates& cand, int k, const TopkPlan& plan, unsigned long long* errors) {
  DeviceBuffer<int32_t> idx(cand.indices), len(cand.topk_length);
  DeviceBuffer<float> val(cand.values);
  DcpTopkMergeArgs a = cand.args(k);
  a.indices = idx.get();
  a.values = val.get();
  a.topk_length = len.get();
  const size_t bytes = dcp_merge_topk_workspace(a, plan).total_bytes;
  DeviceBuffer<uint8_t> ws(bytes);
  ws.fill_bytes(0xFF);
  DeviceBuffer<int32_t> out_idx(size_t(cand.rows) * k), out_len(cand.rows);
  DeviceBuffer<float> out_val(size_t(cand.rows) * k);
  DeviceBuffer<unsigned long long> err(1);
  out_idx.fill_bytes(0xAB);
  out_len.fill_bytes(0xAB);
  out_val.fill_bytes(0xAB);
  err.fill_bytes(0);
  cuda::dcp_merge_topk(a, plan, ws.get(), bytes, {out_idx.get(), out_len.get(), out_val.get()}, err.get(), nullptr);
  if (cudaDeviceSynchronize() != cudaSuccess) throw Error("dcp_merge_topk failed on the device");
  nt::TopkResult r(cand.rows, k);
  r.indices = out_idx.download();
  r.length = out_len.download();
  r.values = out_val.download();
  *errors = err.download()[0];
  return r;
}

}  // namespace

// The ranks' candidates (top-k of each rank's entries by the placement) merged on the GPU equal
// topk_reference of the whole rows bit for bit, for both top-k plan kinds.
TEST(GpuDcpSelection, MergedRankTopkEqualsWholeRowTopk) {
  NVFP4MLA_REQUIRE_GPU();
  for (int n : {2, 4, 8})
    for (int il : {1, 16, 64})
      for (int k : {1, 64, 512}) {
        const nt::TopkProblem prob = nt::dcp_selection_rows(uint64_t(1000) * n + il + k);
        const nt::TopkResult want = nt::reference(prob.args(k));
        const nt::DcpCandidates cand(prob, {n, il}, k);
        const int64_t cols = int64_t(n) * k;
        for (const TopkPlan& plan : {plan_topk(prob.rows, cols, cuda::current_sm_count()), split_topk_plan(cols, 3)}) {
          unsigned long long errors = 0;
          const nt::TopkResult got = gpu_merge_topk(cand, k, plan, &errors);
          EXPECT_TRUE(got == want) << "N=" << n << " interleave=" << il << " k=" << k << " plan " << to_string(plan.kernel);
          EXPECT_EQ(errors, 0u);
        }
      }
}

// Long rows at the production k: 2 x 200,000 entries over 8 ranks, k = 2048.
TEST(GpuDcpSelection, LongRowsAtK2048) {
  NVFP4MLA_REQUIRE_GPU();
  nt::TopkProblem prob(2, 200000);
  nt::fill_random(prob.row(0), prob.columns, 5);
  nt::fill_random(prob.row(1), prob.columns, 6, 40);  // many ties
  const nt::TopkResult want = nt::reference(prob.args(2048));
  const nt::DcpCandidates cand(prob, {8, 1}, 2048);
  unsigned long long errors = 0;
  EXPECT_TRUE(gpu_merge_topk(cand, 2048, plan_topk(2, 8 * 2048, cuda::current_sm_count()), &errors) == want);
  EXPECT_EQ(errors, 0u);
}

// A topk_length outside 0..k_rank is counted and that rank contributes nothing to the row.
TEST(GpuDcpSelection, BadCandidateLengthsAreCounted) {
  NVFP4MLA_REQUIRE_GPU();
  nt::TopkProblem prob(3, 500);
  for (int r = 0; r < 3; ++r) nt::fill_random(prob.row(r), 500, 30 + r);
  nt::DcpCandidates cand(prob, {4, 16}, 32);
  cand.topk_length[1 * 3 + 2] = 33;  // rank 1, row 2
  cand.topk_length[3 * 3 + 0] = -1;  // rank 3, row 0
  unsigned long long errors = 0;
  const nt::TopkResult got = gpu_merge_topk(cand, 32, plan_topk(3, 4 * 32, cuda::current_sm_count()), &errors);
  EXPECT_EQ(errors, 2u);
  nt::DcpCandidates dropped = cand;
  dropped.topk_length[1 * 3 + 2] = 0;
  dropped.topk_length[3 * 3 + 0] = 0;
  nt::TopkResult want(3, 32);
  dcp_merge_topk_reference(dropped.args(32), want.outputs());
  EXPECT_TRUE(got == want);
  // Host-visible errors throw before anything runs: k past k_rank, by its own check (the null
  // workspace and outputs here would be rejected after it).
  DcpTopkMergeArgs a = cand.args(33);
  nt::expect_error_containing([&] { cuda::dcp_merge_topk(a, plan_topk(3, 128, cuda::current_sm_count()), nullptr, 0, {}, nullptr, nullptr); },
                              "k must be in 1..k_rank");
}

// ---- mappings ----

// Writer slots and attention indices on the device equal the CPU functions element for element.
TEST(GpuDcpMapping, SlotsAndIndicesEqualCpu) {
  NVFP4MLA_REQUIRE_GPU();
  std::mt19937_64 rng(12);
  for (int n : {1, 2, 4, 8})
    for (int il : {1, 16, 64}) {
      const DcpPlacement place{n, il};
      const int page = 64;
      const int64_t context = 100000 + 17 * n, vpage = int64_t(page) * n, vpages = (context + vpage - 1) / vpage;
      std::vector<int32_t> table(vpages);
      for (auto& t : table) t = static_cast<int32_t>(rng() % 100000);
      std::vector<int64_t> global(context);
      for (int64_t i = 0; i < context; ++i) global[i] = i % 97 == 0 ? -1 : table[i / vpage] * vpage + i % vpage;
      const int rows = 4, k = 2048;
      std::vector<int32_t> positions(rows * k);
      for (auto& p : positions) p = rng() % 11 == 0 ? -1 : static_cast<int32_t>(rng() % context);
      positions[5] = static_cast<int32_t>(context + 5 * vpage);  // past the table: no valid slot on its rank
      TopkSlotMap slots;
      slots.requests = 2;
      slots.pages = vpages;
      slots.table_stride = vpages;
      slots.page_size = page;
      slots.rows_per_request = 2;
      slots.capacity = int64_t(100000) * page;
      std::vector<int32_t> tables(2 * vpages);
      std::copy(table.begin(), table.end(), tables.begin());
      std::copy(table.rbegin(), table.rend(), tables.begin() + vpages);
      DeviceBuffer<int64_t> d_global(global), d_local(context);
      DeviceBuffer<int32_t> d_pos(positions), d_idx(positions.size()), d_tables(tables);
      DeviceBuffer<unsigned long long> d_err(1);
      unsigned long long total_errors = 0, expected_errors = 0;
      for (int r = 0; r < n; ++r) {
        SCOPED_TRACE(::testing::Message() << "N=" << n << " interleave=" << il << " rank " << r);
        std::vector<int64_t> want(context);
        dcp_local_slot_mapping(place, page, r, global.data(), context, want.data());
        d_local.fill_bytes(0xAB);
        cuda::dcp_local_slot_mapping(place, page, r, d_global.get(), context, d_local.get(), nullptr);
        ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
        EXPECT_EQ(d_local.download(), want);

        // The CPU reference throws for the slotless position; compare on the others and count it.
        std::vector<int32_t> clean = positions, want_idx(positions.size());
        const bool mine = dcp_locate(place, positions[5]).rank == r;
        expected_errors += mine;
        clean[5] = -1;
        slots.block_table = tables.data();
        dcp_local_indices_reference(place, r, clean.data(), rows, k, slots, want_idx.data());
        slots.block_table = d_tables.get();
        d_idx.fill_bytes(0xAB);
        d_err.fill_bytes(0);
        cuda::dcp_local_indices(place, r, d_pos.get(), rows, k, slots, d_idx.get(), d_err.get(), nullptr);
        ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
        EXPECT_EQ(d_idx.download(), want_idx);
        total_errors += d_err.download()[0];
        // In place.
        DeviceBuffer<int32_t> inplace(positions);
        cuda::dcp_local_indices(place, r, inplace.get(), rows, k, slots, inplace.get(), nullptr, nullptr);
        ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
        EXPECT_EQ(inplace.download(), want_idx);
      }
      EXPECT_EQ(total_errors, expected_errors);
      EXPECT_EQ(expected_errors, 1u);
    }
}

TEST(GpuDcpMapping, BadArgumentsThrowBeforeLaunch) {
  NVFP4MLA_REQUIRE_GPU();
  DeviceBuffer<int64_t> g(4), l(4);
  EXPECT_THROW(cuda::dcp_local_slot_mapping({2, 16}, 8, 0, g.get(), 4, l.get(), nullptr), Error);
  EXPECT_THROW(cuda::dcp_local_slot_mapping({2, 3}, 64, 0, g.get(), 4, l.get(), nullptr), Error);
  EXPECT_THROW(cuda::dcp_local_slot_mapping({2, 16}, 64, 2, g.get(), 4, l.get(), nullptr), Error);
  TopkSlotMap m;  // no block table
  DeviceBuffer<int32_t> pos(4), idx(4);
  EXPECT_THROW(cuda::dcp_local_indices({2, 1}, 0, pos.get(), 1, 4, m, idx.get(), nullptr, nullptr), Error);
}
