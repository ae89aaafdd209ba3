// Verifier routing, verifier rows, scratch and capacity planning.
#include <gtest/gtest.h>

#include <cstdlib>
#include <vector>

#include "nvfp4mla/decode_plan.h"
#include "nvfp4mla/error.h"
#include "nvfp4mla/serving/planner.h"
#include "nvfp4mla/serving/route.h"

using namespace nvfp4mla;
using namespace nvfp4mla::serving;

TEST(Route, ModeParsing) {
  for (const char* s : {"0", "false", "OFF", " no ", "False"}) EXPECT_EQ(parse_spec_decode_mode(s), SpecDecodeMode::off) << s;
  for (const char* s : {"auto", "AUTO", " Auto\t"}) EXPECT_EQ(parse_spec_decode_mode(s), SpecDecodeMode::automatic) << s;
  for (const char* s : {"1", "true", "On", "YES"}) EXPECT_EQ(parse_spec_decode_mode(s), SpecDecodeMode::on) << s;
  for (const char* s : {"", "2", "enable", "decode", "auto1"}) {
    try {
      (void)parse_spec_decode_mode(s);
      ADD_FAILURE() << "accepted '" << s << "'";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("0, false, off or no"), std::string::npos) << e.what();
    }
  }
  setenv(kSpecDecodeModeEnv, "On", 1);
  EXPECT_EQ(spec_decode_mode_from_env(), SpecDecodeMode::on);
  setenv(kSpecDecodeModeEnv, "maybe", 1);
  EXPECT_THROW((void)spec_decode_mode_from_env(), Error);
  unsetenv(kSpecDecodeModeEnv);
  EXPECT_EQ(spec_decode_mode_from_env(), std::nullopt);
}

namespace {
// A pure MTP-3 verifier batch of 16 requests that fits the decode budget.
VerifierBatchShape mtp3_batch() {
  VerifierBatchShape b;
  b.num_speculative_tokens = 3;
  b.max_query_len = 4;
  b.decode_rows = 64;
  b.decode_row_budget = 64;
  return b;
}
}  // namespace

TEST(Route, CompatibilityTable) {
  // The seed's table: mode 0 -> extend for all; auto -> decode for fp8_ds_mla, extend for
  // nvfp4_ds_mla; 1 -> decode for all. nvfp4mla's GPU qualification suite has since qualified
  // nvfp4_ds_mla and bf16 (docs/ROUTING.md), so auto sends them to decode too.
  const VerifierBatchShape b = mtp3_batch();
  struct Case { SpecDecodeMode mode; CacheDtype dtype; Route want; };
  const Case cases[] = {
      {SpecDecodeMode::off, CacheDtype::fp8_ds_mla, Route::extend},
      {SpecDecodeMode::off, CacheDtype::nvfp4_ds_mla, Route::extend},
      {SpecDecodeMode::off, CacheDtype::bf16, Route::extend},
      {SpecDecodeMode::automatic, CacheDtype::fp8_ds_mla, Route::decode},
      {SpecDecodeMode::automatic, CacheDtype::nvfp4_ds_mla, Route::decode},
      {SpecDecodeMode::automatic, CacheDtype::bf16, Route::decode},
      {SpecDecodeMode::on, CacheDtype::fp8_ds_mla, Route::decode},
      {SpecDecodeMode::on, CacheDtype::nvfp4_ds_mla, Route::decode},
      {SpecDecodeMode::on, CacheDtype::bf16, Route::decode},
  };
  for (const auto& c : cases) {
    const auto d = decide_route(c.mode, c.dtype, b);
    EXPECT_EQ(d.route, c.want) << to_string(c.mode) << " " << to_string(c.dtype) << ": " << d.reason;
    EXPECT_FALSE(d.reason.empty());
  }
  for (CacheDtype d : {CacheDtype::fp8_ds_mla, CacheDtype::nvfp4_ds_mla, CacheDtype::bf16}) EXPECT_TRUE(decode_qualified(d));
}

TEST(Route, DecodeNeedsAPureVerifierBatchWithinLimits) {
  const VerifierBatchShape b = mtp3_batch();
  ASSERT_EQ(decide_route(SpecDecodeMode::on, CacheDtype::nvfp4_ds_mla, b).route, Route::decode);
  auto prefill = b;
  prefill.any_prefill = true;
  EXPECT_EQ(decide_route(SpecDecodeMode::on, CacheDtype::nvfp4_ds_mla, prefill).route, Route::extend);
  auto too_long = b;
  too_long.num_speculative_tokens = 9;
  too_long.max_query_len = 10;
  const auto long_route = decide_route(SpecDecodeMode::on, CacheDtype::fp8_ds_mla, too_long);
  EXPECT_EQ(long_route.route, Route::extend);
  EXPECT_NE(long_route.reason.find("10 query tokens (limit 8)"), std::string::npos) << long_route.reason;
  // Within the kernel's limit but longer than 1 + k: not a verifier batch.
  auto not_verifier = b;
  not_verifier.max_query_len = 1 + b.num_speculative_tokens + 1;
  ASSERT_LE(not_verifier.max_query_len, not_verifier.max_q_per_request);
  const auto nv = decide_route(SpecDecodeMode::on, CacheDtype::nvfp4_ds_mla, not_verifier);
  EXPECT_EQ(nv.route, Route::extend);
  EXPECT_NE(nv.reason.find("exceeds 1 + speculative tokens"), std::string::npos) << nv.reason;
  auto over_budget = b;
  over_budget.decode_rows = 65;
  const auto d = decide_route(SpecDecodeMode::automatic, CacheDtype::fp8_ds_mla, over_budget);
  EXPECT_EQ(d.route, Route::extend);
  EXPECT_NE(d.reason.find("budget"), std::string::npos);
}

TEST(Route, VerifierRows) {
  const std::vector<int64_t> ctx = {0, 100, 5000};
  const auto v = build_verifier_rows(ctx, 4, 2048, 16);
  ASSERT_EQ(v.causal_len.size(), 16u);
  const int64_t want_len[] = {1, 2, 3, 4, 101, 102, 103, 104, 5001, 5002, 5003, 5004};
  for (int i = 0; i < 12; ++i) EXPECT_EQ(v.causal_len[i], want_len[i]) << i;
  EXPECT_EQ(v.topk_length[0], 1);
  EXPECT_EQ(v.topk_length[4], 101);
  EXPECT_EQ(v.topk_length[8], 2048);  // truncated to topk
  for (int i = 12; i < 16; ++i) EXPECT_EQ(v.topk_length[i], 0);  // padding rows attend nothing
  EXPECT_THROW(build_verifier_rows(ctx, 4, 2048, 8), Error);  // padding smaller than the rows
  EXPECT_THROW(build_verifier_rows(std::vector<int64_t>{-1}, 1, 2048), Error);
}

TEST(Scratch, SeedWorkedExampleExactly) {
  // 64 heads, 32 splits, max_num_seqs 16, MTP 3, BF16 partials: decode rows 64 when verifier
  // batches may take the decode route, 16 when they stay on extend (the seed: NVFP4 under auto).
  ScratchRequest r;
  r.spec = kSpecNvfp4Fp8Rope;
  r.num_heads = 64;
  r.topk = 2048;
  r.max_num_seqs = 16;
  r.max_num_batched_tokens = 8192;
  r.num_speculative_tokens = 3;
  r.partials = PartialPrecision::bf16;
  r.splits = 32;
  r.mode = SpecDecodeMode::on;
  const auto with_verifier = plan_scratch(r);
  r.mode = SpecDecodeMode::off;
  const auto without = plan_scratch(r);
  EXPECT_EQ(with_verifier.decode_rows, 64);
  EXPECT_EQ(without.decode_rows, 16);
  const double mib = 1024.0 * 1024.0;
  EXPECT_EQ((with_verifier.tmp_output_bytes - without.tmp_output_bytes) / mib, 96.0);
  EXPECT_EQ((with_verifier.tmp_lse_bytes - without.tmp_lse_bytes) / mib, 0.375);
  EXPECT_EQ((with_verifier.output_bytes - without.output_bytes) / mib, 3.0);
  const size_t three = (with_verifier.tmp_output_bytes + with_verifier.tmp_lse_bytes + with_verifier.output_bytes) -
                       (without.tmp_output_bytes + without.tmp_lse_bytes + without.output_bytes);
  EXPECT_EQ(three / mib, 99.375);
  EXPECT_EQ(with_verifier.final_lse_bytes - without.final_lse_bytes, size_t(48) * 64 * 4);
  EXPECT_EQ(with_verifier.total_bytes, with_verifier.tmp_output_bytes + with_verifier.tmp_lse_bytes +
                                           with_verifier.output_bytes + with_verifier.final_lse_bytes);
}

TEST(Scratch, RowsHeadsAndKernelSplits) {
  ScratchRequest r;
  r.spec = kSpecNvfp4Fp8Rope;
  r.num_heads = 16;
  r.dcp_world_size = 3;  // 48 gathered heads
  r.max_num_seqs = 8;
  r.max_num_batched_tokens = 20;  // caps 8 x 4
  r.num_speculative_tokens = 3;
  r.mode = SpecDecodeMode::on;
  const auto p = plan_scratch(r);
  EXPECT_EQ(p.decode_rows, 20);
  EXPECT_EQ(p.heads, 48);
  EXPECT_EQ(p.partial_bytes, 4);  // fp32: room for any decode plan's partials
  EXPECT_LE(p.splits, 2048 / 64);
  // The regions cover every row count the kernel may see up to decode_rows.
  for (int rows = 1; rows <= p.decode_rows; ++rows) {
    const auto d = plan_sparse_decode(r.spec, rows, p.heads, r.topk, scratch_arch(r));
    EXPECT_LE(decode_workspace_layout(d, rows, p.heads).partial_out_bytes, p.tmp_output_bytes) << rows;
  }
  r.max_num_batched_tokens = 4;  // never below max_num_seqs
  EXPECT_EQ(plan_scratch(r).decode_rows, 8);
  r.num_heads = 0;
  EXPECT_THROW(plan_scratch(r), Error);
}

// The scratch is planned for the GPU given (or, with compute capability 0, the one the decode
// planner plans for): on a B200-like device (10.0, 148 SMs) the NVFP4 16-head plans split more
// than on the H200, and the scratch covers them.
TEST(Scratch, CoversTheDecodePlansOfTheGivenArchitecture) {
  for (const int cc : {90, 100, 80, 120})
    for (const RecordSpec& spec : kAllRecordSpecs) {
      ScratchRequest r;
      r.spec = spec;
      r.num_heads = 16;
      r.max_num_seqs = 64;
      r.max_num_batched_tokens = 64;
      r.sm_count = cc == 90 ? 132 : 148;
      r.compute_capability = cc;
      const ArchSpec arch = arch_spec(cc / 10, cc % 10, r.sm_count);
      if (!supported_decode_kernels(arch, spec, r.num_heads).size()) {
        EXPECT_THROW(plan_scratch(r), Error) << to_string(spec) << " cc " << cc;
        continue;
      }
      const auto p = plan_scratch(r);
      for (int rows = 1; rows <= p.decode_rows; ++rows) {
        DecodePlan d;
        try {
          d = plan_sparse_decode(r.spec, rows, p.heads, r.topk, arch);
        } catch (const Error&) {
          continue;  // no kernel for this format here
        }
        EXPECT_LE(decode_workspace_layout(d, rows, p.heads).partial_out_bytes, p.tmp_output_bytes)
            << to_string(spec) << " cc " << cc << " rows " << rows;
      }
    }
  ScratchRequest bad;
  bad.spec = kSpecNvfp4Fp8Rope;
  bad.num_heads = 16;
  bad.max_num_seqs = 4;
  bad.max_num_batched_tokens = 4;
  bad.compute_capability = -1;
  EXPECT_THROW(plan_scratch(bad), Error);
}

TEST(Capacity, TokensAndLargestRequest) {
  CapacityRequest r;
  r.spec = kSpecNvfp4Fp8Rope;
  r.layers = 78;
  r.memory_gib = 100;
  const auto p = plan_capacity(r);
  EXPECT_EQ(p.bytes_per_token, 78 * (368 + 132));
  EXPECT_EQ(p.tokens % 64, 0);
  EXPECT_LE(p.tokens * p.bytes_per_token, int64_t(100) << 30);
  EXPECT_GT((p.tokens + 64) * p.bytes_per_token, int64_t(100) << 30);
  EXPECT_EQ(p.max_single_request_tokens, p.tokens);
  r.spec = kSpecFp8;
  EXPECT_LT(plan_capacity(r).tokens, p.tokens);
  r.reserved_gib = 200;
  EXPECT_THROW(plan_capacity(r), Error);
}
