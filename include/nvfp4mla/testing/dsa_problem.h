#pragma once
// DSA decode step problems (host memory) for the CPU and GPU pipeline suites: requests whose
// pages are spread over shuffled caches with spare pages, their history already written (CPU
// writers), the step writing each request's last min(next_n, context) tokens plus padded (-1)
// slots. Unused cache bytes are 0xFF (NaN records and NaN index keys: reading one poisons a
// result). Index keys, index queries and weights are small integers (every indexer logit exact
// in fp32, many ties); latents and queries are random.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <random>
#include <vector>

#include "nvfp4mla/codec.h"
#include "nvfp4mla/config.h"
#include "nvfp4mla/dsa_pipeline.h"
#include "nvfp4mla/index_cache.h"
#include "nvfp4mla/paged_cache.h"
#include "nvfp4mla/testing/index_data.h"
#include "nvfp4mla/testing/random_tokens.h"

namespace nvfp4mla::testing {

struct DsaProblemShape {
  RecordSpec spec;
  std::vector<int32_t> context_lens;
  int next_n = 1;
  int heads = 16;
  int index_heads = 64;
  int k = 2048;
  int64_t page_size = 64;
  uint64_t seed = 1;
};

struct DsaProblem {
  DsaProblemShape shape;
  float layer_scale = 1.0f;
  int64_t num_pages = 0, table_stride = 0, max_context = 0;
  std::vector<int32_t> table;
  std::vector<uint16_t> kv_c, k_pe, index_k;  // the step's new tokens
  std::vector<int64_t> slots;
  std::vector<uint8_t> latent, index;  // the caches before the step
  std::vector<uint16_t> q;
  std::vector<uint8_t> index_q;
  std::vector<float> index_w;

  int64_t rows() const { return static_cast<int64_t>(shape.context_lens.size()) * shape.next_n; }
  // Arguments over host buffers (`latent`, `index`: the caller's copies of the caches).
  DsaDecodeArgs args(uint8_t* latent_cache, uint8_t* index_cache) const {
    DsaDecodeArgs a;
    a.spec = shape.spec;
    a.layer_scale = layer_scale;
    a.tokens = {kv_c.data(), k_pe.data(), index_k.data(), slots.data(), static_cast<int64_t>(slots.size())};
    a.caches = {latent_cache, index_cache, num_pages, shape.page_size};
    a.requests = static_cast<int64_t>(shape.context_lens.size());
    a.next_n = shape.next_n;
    a.block_table = table.data();
    a.block_table_stride = table_stride;
    a.context_lens = shape.context_lens.data();
    a.max_context = max_context;
    a.q = q.data();
    a.heads = shape.heads;
    a.index_q = index_q.data();
    a.index_w = index_w.data();
    a.index_heads = shape.index_heads;
    a.k = shape.k;
    a.sm_scale = 1.0f / 24.0f;
    return a;
  }
};

// BF16 small integers in -2..2 (exact through the index key recipe: power-of-two scales).
inline std::vector<uint16_t> small_integer_bf16(size_t n, uint64_t seed) {
  const std::vector<uint8_t> e4m3 = small_integer_e4m3(n, seed);
  std::vector<uint16_t> out(n);
  for (size_t i = 0; i < n; ++i) out[i] = codec::bf16_encode_rn(codec::e4m3_decode(e4m3[i]));
  return out;
}

inline DsaProblem dsa_problem(const DsaProblemShape& shape) {
  DsaProblem p;
  p.shape = shape;
  p.layer_scale = shape.spec.scale_mode == ScaleMode::static_calibrated ? 0.125f : 1.0f;
  const int64_t ps = shape.page_size;
  const int64_t requests = static_cast<int64_t>(shape.context_lens.size());
  int64_t total_pages = 0, max_pages = 0, tokens = 0;
  for (int32_t c : shape.context_lens) {
    total_pages += (c + ps - 1) / ps;
    max_pages = std::max<int64_t>(max_pages, (c + ps - 1) / ps);
    p.max_context = std::max<int64_t>(p.max_context, c);
    tokens += c;
  }
  p.table_stride = max_pages + 1;
  p.num_pages = total_pages + 3;
  std::vector<int32_t> pages(p.num_pages);
  std::iota(pages.begin(), pages.end(), 0);
  std::mt19937_64 rng(shape.seed);
  std::shuffle(pages.begin(), pages.end(), rng);
  p.table.assign(requests * p.table_stride, -1);
  std::vector<int64_t> all_slots;
  std::vector<bool> is_new;
  int64_t next_page = 0;
  for (int64_t b = 0; b < requests; ++b) {
    const int64_t c = shape.context_lens[b];
    for (int64_t j = 0; j < (c + ps - 1) / ps; ++j) p.table[b * p.table_stride + j] = pages[next_page++];
    for (int64_t pos = 0; pos < c; ++pos) {
      all_slots.push_back(int64_t(p.table[b * p.table_stride + pos / ps]) * ps + pos % ps);
      is_new.push_back(pos >= c - shape.next_n);
    }
  }
  const TokenSet latents = random_tokens(tokens, shape.seed + 1, -1.0, 0.5);
  const std::vector<uint16_t> keys = small_integer_bf16(static_cast<size_t>(tokens) * 128, shape.seed + 2);
  p.latent.assign(static_cast<size_t>(p.num_pages * ps) * shape.spec.record_bytes(), 0xFF);
  p.index.assign(static_cast<size_t>(p.num_pages * ps) * index_key::kRecordBytes, 0xFF);
  // History through the CPU writers; new tokens into the step's batch.
  std::vector<int64_t> history_slots;
  std::vector<uint16_t> h_kv, h_pe, h_key;
  for (int64_t t = 0; t < tokens; ++t) {
    auto& kv = is_new[t] ? p.kv_c : h_kv;
    auto& pe = is_new[t] ? p.k_pe : h_pe;
    auto& key = is_new[t] ? p.index_k : h_key;
    (is_new[t] ? p.slots : history_slots).push_back(all_slots[t]);
    kv.insert(kv.end(), &latents.kv_c[t * kLatentDim], &latents.kv_c[(t + 1) * kLatentDim]);
    pe.insert(pe.end(), &latents.k_pe[t * kRopeDim], &latents.k_pe[(t + 1) * kRopeDim]);
    key.insert(key.end(), &keys[t * 128], &keys[(t + 1) * 128]);
  }
  // Padded entries of a CUDA-graph batch: slot -1, poisoned inputs.
  for (int i = 0; i < 2; ++i) {
    p.slots.push_back(-1);
    p.kv_c.insert(p.kv_c.end(), kLatentDim, 0x7FC0);
    p.k_pe.insert(p.k_pe.end(), kRopeDim, 0x7FC0);
    p.index_k.insert(p.index_k.end(), 128, 0x7FC0);
  }
  const auto config = dsa_format_config(shape.spec, p.layer_scale);
  const auto n = static_cast<int64_t>(history_slots.size());
  write_paged_cache(config,
                    TokenBatch<Bf16Bits>{reinterpret_cast<const Bf16Bits*>(h_kv.data()),
                                         reinterpret_cast<const Bf16Bits*>(h_pe.data()), n},
                    history_slots, PagedCacheView{p.latent.data(), p.num_pages, ps, shape.spec.record_bytes()});
  write_index_cache(reinterpret_cast<const Bf16Bits*>(h_key.data()), n, history_slots,
                    IndexCacheView{p.index.data(), p.num_pages, ps});
  const int64_t rows = p.rows();
  std::normal_distribution<float> normal(0.0f, 1.0f);
  p.q.resize(static_cast<size_t>(rows) * shape.heads * kQkDim);
  for (auto& x : p.q) x = codec::bf16_encode_rn(normal(rng));
  p.index_q = small_integer_e4m3(static_cast<size_t>(rows) * shape.index_heads * 128, shape.seed + 3);
  p.index_w = small_integer_weights(static_cast<size_t>(rows) * shape.index_heads, shape.seed + 4);
  return p;
}

}  // namespace nvfp4mla::testing
