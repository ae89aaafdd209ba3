// The DSA decode step's CPU side (dsa_pipeline.h): the reference equals its parts run one by one
// with materialized logits (writers, indexer_logits_reference, topk_reference with the slot
// transform, sparse_mla_reference), the planner's workspace, and bad input rejected with the
// argument named and nothing written.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "nvfp4mla/config.h"
#include "nvfp4mla/dsa_pipeline.h"
#include "nvfp4mla/error.h"
#include "nvfp4mla/index_cache.h"
#include "nvfp4mla/indexer.h"
#include "nvfp4mla/paged_cache.h"
#include "nvfp4mla/topk.h"
#include "nvfp4mla/testing/dsa_problem.h"
#include "support/record_specs.h"

using namespace nvfp4mla;
using nvfp4mla::testing::dsa_problem;
using nvfp4mla::testing::DsaProblem;
using nvfp4mla::testing::DsaProblemShape;

namespace {

struct HostOutputs {
  std::vector<float> out, lse, logits;
  std::vector<int32_t> indices, length;
  HostOutputs(int64_t rows, int heads, int k)
      : out(rows * heads * kLatentDim, 7.0f), lse(rows * heads, 7.0f), logits(rows * k, 7.0f), indices(rows * k, 77),
        length(rows, 77) {}
  DsaDecodeReferenceOutputs outputs() { return {out.data(), lse.data(), indices.data(), length.data(), logits.data()}; }
  bool operator==(const HostOutputs&) const = default;
};

// The same step, part by part, with the whole [rows, max_context] logits materialized.
HostOutputs run_parts(const DsaProblem& p, std::vector<uint8_t>& latent, std::vector<uint8_t>& index) {
  const DsaDecodeArgs a = p.args(latent.data(), index.data());
  write_paged_cache(dsa_format_config(a.spec, a.layer_scale),
                    TokenBatch<Bf16Bits>{reinterpret_cast<const Bf16Bits*>(a.tokens.kv_c),
                                         reinterpret_cast<const Bf16Bits*>(a.tokens.k_pe), a.tokens.num_tokens},
                    p.slots, PagedCacheView{latent.data(), p.num_pages, a.caches.page_size, a.spec.record_bytes()});
  write_index_cache(reinterpret_cast<const Bf16Bits*>(a.tokens.index_k), a.tokens.num_tokens, p.slots,
                    IndexCacheView{index.data(), p.num_pages, a.caches.page_size});
  const int64_t rows = p.rows();
  const int64_t stride = std::max<int64_t>(p.max_context, 1);
  std::vector<float> logits(rows * stride);
  IndexerPagedArgs ia = dsa_select_args(a).keys;
  ia.logits = logits.data();
  ia.logits_stride = stride;
  indexer_logits_reference(ia);
  HostOutputs h(rows, a.heads, a.k);
  TopkArgs t;
  t.values = logits.data();
  t.rows = static_cast<int>(rows);
  t.columns = stride;
  t.stride = stride;
  t.k = a.k;
  t.slots = {a.block_table, a.requests, a.block_table_stride, a.block_table_stride, static_cast<int>(a.caches.page_size),
             a.next_n, a.caches.capacity()};
  topk_reference(t, {h.indices.data(), h.length.data(), h.logits.data()});
  sparse_mla_reference(a.spec, dsa_attention_args(a, h.indices.data(), h.length.data()), h.out.data(), h.lse.data());
  return h;
}

DsaProblemShape small_shape(const RecordSpec& spec, uint64_t seed) {
  DsaProblemShape s;
  s.spec = spec;
  s.context_lens = {0, 1, 63, 64, 65, 300};
  s.next_n = 2;
  s.heads = 8;
  s.index_heads = 8;
  s.k = 64;
  s.page_size = 16;
  s.seed = seed;
  return s;
}

}  // namespace

TEST(DsaPipeline, ReferenceEqualsItsPartsForEveryFormatAndChunking) {
  uint64_t seed = 1;
  for (const auto& spec : nvfp4mla::testing::kAllRecordSpecs) {
    const DsaProblem p = dsa_problem(small_shape(spec, seed++));
    std::vector<uint8_t> latent_parts = p.latent, index_parts = p.index;
    const HostOutputs want = run_parts(p, latent_parts, index_parts);
    // Chunks of one page, a few pages, and the planner's (one chunk).
    for (int64_t chunk : {int64_t(16), int64_t(48), int64_t(0)}) {
      SCOPED_TRACE(nvfp4mla::testing::spec_name(spec) + " chunk " + std::to_string(chunk));
      std::vector<uint8_t> latent = p.latent, index = p.index;
      HostOutputs got(p.rows(), p.shape.heads, p.shape.k);
      dsa_decode_reference(p.args(latent.data(), index.data()), chunk, got.outputs());
      EXPECT_TRUE(latent == latent_parts);
      EXPECT_TRUE(index == index_parts);
      EXPECT_EQ(got.indices, want.indices);
      EXPECT_EQ(got.length, want.length);
      EXPECT_TRUE(got == want);
    }
  }
}

// A prefill chunk is a step whose next_n query rows are each request's last next_n tokens.
TEST(DsaPipeline, PrefillChunkEqualsItsParts) {
  DsaProblemShape shape = small_shape(kSpecNvfp4Fp8Rope, 21);
  shape.next_n = 16;
  shape.context_lens = {16, 40, 300};
  const DsaProblem p = dsa_problem(shape);
  std::vector<uint8_t> latent_parts = p.latent, index_parts = p.index;
  const HostOutputs want = run_parts(p, latent_parts, index_parts);
  std::vector<uint8_t> latent = p.latent, index = p.index;
  HostOutputs got(p.rows(), p.shape.heads, p.shape.k);
  dsa_decode_reference(p.args(latent.data(), index.data()), 32, got.outputs());
  EXPECT_TRUE(got == want);
  // Row i of request b attends min(k, context - 16 + i + 1) positions: all of them, at most k.
  for (int i = 0; i < 16; ++i) EXPECT_EQ(got.length[static_cast<size_t>(16 + i)], std::min(64, 40 - 16 + i + 1));
}

TEST(DsaPipeline, StepWritesOnlyTheNewTokensAndTheyAreAttended) {
  const DsaProblem p = dsa_problem(small_shape(kSpecFp8, 9));
  std::vector<uint8_t> latent = p.latent, index = p.index;
  HostOutputs got(p.rows(), p.shape.heads, p.shape.k);
  dsa_decode_reference(p.args(latent.data(), index.data()), 0, got.outputs());
  const int rb = kSpecFp8.record_bytes();
  int64_t changed = 0;
  for (int64_t s = 0; s < p.num_pages * p.shape.page_size; ++s) {
    const bool is_new = std::find(p.slots.begin(), p.slots.end(), s) != p.slots.end();
    const bool differs = !std::equal(&latent[s * rb], &latent[(s + 1) * rb], &p.latent[s * rb]);
    EXPECT_EQ(differs, is_new) << "slot " << s;
    changed += differs;
  }
  EXPECT_EQ(changed, static_cast<int64_t>(p.slots.size()) - 2);  // the two padded slots write nothing
  // Row b * next_n + i attends causal length min(k, context - next_n + i + 1) (every logit here is
  // finite, the new tokens' included, so the selection is full). A request's last row with a
  // context of at most k selects every position, and its last entries are the step's new tokens,
  // at the slots the step wrote.
  const int k = p.shape.k;
  size_t new_begin = 0;  // the request's new tokens in p.slots
  for (size_t b = 0; b < p.shape.context_lens.size(); ++b) {
    const int64_t context = p.shape.context_lens[b];
    for (int i = 0; i < p.shape.next_n; ++i) {
      const int64_t r = int64_t(b) * p.shape.next_n + i;
      const int64_t len = std::max<int64_t>(0, context - p.shape.next_n + i + 1);
      EXPECT_EQ(got.length[r], std::min<int64_t>(len, k)) << "row " << r;
      if (len == 0) EXPECT_EQ(got.lse[r * p.shape.heads], -std::numeric_limits<float>::infinity());
    }
    const size_t new_count = static_cast<size_t>(std::min<int64_t>(context, p.shape.next_n));
    if (context > 0 && context <= k) {
      const int64_t last = (int64_t(b) + 1) * p.shape.next_n - 1;
      const std::vector<int32_t> tail(got.indices.begin() + last * k + (context - int64_t(new_count)), got.indices.begin() + last * k + context);
      const std::vector<int32_t> written(p.slots.begin() + new_begin, p.slots.begin() + new_begin + new_count);
      EXPECT_EQ(tail, written) << "request " << b;
    }
    new_begin += new_count;
  }
}

// The selection reads only the index cache and the indexer's inputs: the same step over caches
// of different record formats selects the same entries.
TEST(DsaPipeline, SelectionDoesNotDependOnTheRecordFormat) {
  HostOutputs first(0, 0, 0);
  bool have_first = false;
  for (const RecordSpec& spec : kAllRecordSpecs) {
    const DsaProblem p = dsa_problem(small_shape(spec, 17));  // the same seed: the same index data
    std::vector<uint8_t> latent = p.latent, index = p.index;
    HostOutputs got(p.rows(), p.shape.heads, p.shape.k);
    dsa_decode_reference(p.args(latent.data(), index.data()), 0, got.outputs());
    if (!have_first) {
      first = got;
      have_first = true;
      continue;
    }
    EXPECT_EQ(got.indices, first.indices) << to_string(spec);
    EXPECT_EQ(got.length, first.length) << to_string(spec);
  }
}

TEST(DsaPipeline, PlannerSharesOneWorkspaceBetweenSelectionAndDecode) {
  const DsaProblem p = dsa_problem(small_shape(kSpecNvfp4Fp8Rope, 3));
  std::vector<uint8_t> latent = p.latent, index = p.index;
  const DsaDecodeArgs a = p.args(latent.data(), index.data());
  for (int forced : {0, 1, 2}) {
    const DsaDecodePlan plan = plan_dsa_decode(a, 132, 32, forced);
    const FusedSelectPlan select = plan_fused_select(dsa_select_args(a), 32, 132);
    const DecodePlan decode = plan_sparse_decode(a.spec, static_cast<int>(a.rows()), a.heads, a.k, 132, forced);
    EXPECT_EQ(plan.select.workspace_bytes, select.workspace_bytes);
    EXPECT_EQ(plan.select.chunk, 32);
    EXPECT_EQ(plan.decode.splits, decode.splits);
    EXPECT_EQ(plan.workspace_bytes,
              std::max(select.workspace_bytes, decode_workspace_layout(decode, static_cast<int>(a.rows()), a.heads).total_bytes));
    if (forced == 1) EXPECT_EQ(plan.decode.splits, 1);  // the extend route
  }
  EXPECT_THROW(plan_dsa_decode(a, 132, 17), Error);  // chunk not a multiple of the page size
  EXPECT_THROW(plan_dsa_decode(a, 0), Error);
}

TEST(DsaPipeline, BadInputNamesTheArgumentAndWritesNothing) {
  const DsaProblem p = dsa_problem(small_shape(kSpecNvfp4Bf16Rope, 5));
  struct Case {
    const char* what;
    std::function<void(DsaDecodeArgs&, DsaProblem&)> spoil;
  };
  const std::vector<Case> cases = {
      {"tokens.slot_mapping[3]", [](DsaDecodeArgs&, DsaProblem& q) { q.slots[3] = q.num_pages * q.shape.page_size; }},
      {"context_lens", [](DsaDecodeArgs&, DsaProblem& q) { q.shape.context_lens[5] = static_cast<int32_t>(q.max_context + 1); }},
      {"block_table", [](DsaDecodeArgs&, DsaProblem& q) { q.table[5 * q.table_stride] = static_cast<int32_t>(q.num_pages); }},
      {"k must be", [](DsaDecodeArgs& a, DsaProblem&) { a.k = 0; }},
      {"k must be", [](DsaDecodeArgs& a, DsaProblem&) { a.k = kTopkMaxK + 1; }},
      {"heads", [](DsaDecodeArgs& a, DsaProblem&) { a.index_heads = 65; }},
      {"heads must be", [](DsaDecodeArgs& a, DsaProblem&) { a.heads = 0; }},
      {"next_n", [](DsaDecodeArgs& a, DsaProblem&) { a.next_n = 0; }},
      {"layer_scale", [](DsaDecodeArgs& a, DsaProblem&) { a.layer_scale = 0.0f; }},
      {"dynamic scale mode requires", [](DsaDecodeArgs& a, DsaProblem&) { a.spec.scale_mode = ScaleMode::dynamic; }},
      {"tokens.index_k", [](DsaDecodeArgs& a, DsaProblem&) { a.tokens.index_k = nullptr; }},
      {"sm_scale", [](DsaDecodeArgs& a, DsaProblem&) { a.sm_scale = std::numeric_limits<float>::quiet_NaN(); }},
      {"caches.latent", [](DsaDecodeArgs& a, DsaProblem&) { a.caches.latent = nullptr; }},
      {"page_size", [](DsaDecodeArgs& a, DsaProblem&) { a.caches.page_size = 0; }},
      {"requests is negative", [](DsaDecodeArgs& a, DsaProblem&) { a.requests = -1; }},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.what);
    DsaProblem q = p;
    std::vector<uint8_t> latent = q.latent, index = q.index;
    DsaDecodeArgs a = q.args(latent.data(), index.data());
    c.spoil(a, q);
    HostOutputs got(q.rows(), q.shape.heads, q.shape.k);
    const HostOutputs untouched = got;
    try {
      dsa_decode_reference(a, 0, got.outputs());
      ADD_FAILURE() << "no error";
    } catch (const Error& e) {
      const std::string msg = e.what();
      EXPECT_EQ(msg.rfind("dsa decode: ", 0), 0u) << msg;
      EXPECT_NE(msg.find(c.what), std::string::npos) << msg;
    }
    EXPECT_TRUE(latent == q.latent);
    EXPECT_TRUE(index == q.index);
    EXPECT_TRUE(got == untouched);
  }
  // Missing outputs.
  std::vector<uint8_t> latent = p.latent, index = p.index;
  HostOutputs got(p.rows(), p.shape.heads, p.shape.k);
  DsaDecodeReferenceOutputs out = got.outputs();
  out.lse = nullptr;
  EXPECT_THROW(dsa_decode_reference(p.args(latent.data(), index.data()), 0, out), Error);
}
