#pragma once
// The DSA half of the embedded synthetic workload: index keys, index queries and weights for one
// layer of the synthetic model (workload.h), built so that the lightning indexer behaves as in a
// deployed model (docs/QUALITY.md, "The DSA workload"):
//
//   - content: a token's index key carries, in dims 0..103, the first 104 channels of the
//     unit-variance content z its latent is made from, so the indexer's logits correlate with the
//     attention logits (both see the same content);
//   - recency: dims 104..127 are 12 (cos, sin) pairs of the token's position at angular
//     frequencies w_j = (pi / 2) / (1024 * 2^j); a query at context length L uses the pair whose
//     quarter turn first covers L (1024 .. 2M tokens), so a token of age a adds
//     recency * cos(w_j a): most of the 2048-entry budget goes to recent tokens, the rest is a
//     tail over the whole context (the oldest token gets cos(w_j L), between 0 and 0.71);
//   - needles: query row i looks for its needle along a unit direction u_i of the content space;
//     every index head's query is u_i + index_noise * g_h (g_h a random unit direction per head)
//     + the recency pair, with weight 1/heads. Ordinary tokens project onto u_i as N(0, 1); the
//     row's needle carries index_margin * u_i on top of its own content, so index_margin is how
//     many standard deviations of the bulk the needle stands above it before recency: a deep
//     (old) needle must beat the recency lift of the newest tokens with it;
//   - attention: the needle's latent is an ordinary token of the layer (typical magnitude), and
//     every head of row i is matched to it (logit lift needle_logit 8..12 nats over the bulk,
//     spread over the heads), with a small random RoPE part.
// Index queries are quantized to E4M3 with index_key.h's recipe per (row, head), the scale folded
// into the weight. Everything is drawn from seeded streams per token and per row: the same
// options give the same bytes on every run and thread count.
#include <cstdint>
#include <vector>

#include "nvfp4mla/eval/workload.h"
#include "nvfp4mla/index_key.h"

namespace nvfp4mla::eval {

inline constexpr int kDsaContentDims = 104;       // index key dims carrying the content
inline constexpr int kDsaRecencyPairs = 12;       // (cos, sin) pairs in dims 104..127
inline constexpr int64_t kDsaRecencyBase = 1024;  // pair j reaches a quarter turn at 1024 * 2^j

struct DsaWorkloadOptions {
  int layer = -1;              // the synthetic model's layer whose latents these are; -1: the middle one
  int heads = 8;               // attention heads per query row
  int index_heads = 64;        // indexer heads (DeepSeek-V3.2 / GLM-5.x: 64)
  double needle_logit = 12.0;  // attention logit lift of the needle, the largest over the heads
  double index_margin = 6.0;   // the needle's projection on its row's direction, in bulk standard deviations
  double index_noise = 1.0;    // weight of each index head's own random direction
  double recency = 2.0;        // recency lift of the newest token (bulk standard deviations)
};

// A block of tokens at positions first .. first + count - 1.
struct DsaTokens {
  TokenBlock latents;            // kv_c, k_pe (BF16)
  std::vector<uint16_t> index_k; // [count, 128] BF16
};

// One query row's inputs.
struct DsaQueryRow {
  std::vector<uint16_t> q;        // [heads, 576] BF16
  std::vector<float> index_q;     // [index_heads, 128] fp32, before quantization
  std::vector<float> index_w;     // [index_heads]
  std::vector<uint8_t> index_q_e4m3;  // [index_heads, 128] E4M3 (the kernels' input)
  std::vector<float> index_w_scaled;  // [index_heads]: index_w times the query's E4M3 scale
};

class DsaWorkload {
 public:
  DsaWorkload(const SyntheticWorkload& model, const DsaWorkloadOptions& options);
  const DsaWorkloadOptions& options() const { return options_; }
  int layer() const { return layer_; }

  // Ordinary tokens (no needle) at positions [first, first + count), on up to `threads` threads.
  DsaTokens tokens(int64_t first, int64_t count, int threads = 1) const;
  // Row `row`'s needle at `position` (one token).
  DsaTokens needle(int row, int64_t position) const;
  // Row `row`'s queries at context length `context` (the query is the token after the context),
  // matched to `needle` (what needle(row, position) returned).
  DsaQueryRow query(int row, const DsaTokens& needle, int64_t context) const;

  // fp32 indexer logits of BF16 index keys (no key quantization) for a row's fp32 queries:
  // logits[t] = sum_h w_h max(q_h . k_t, 0), t < count. The reference selection the FP8 keys are
  // compared with.
  static void exact_index_logits(const DsaQueryRow& row, int index_heads, const uint16_t* index_k, int64_t count,
                                 float* logits);

 private:
  void content_direction(int row, double* u) const;
  const SyntheticWorkload& model_;
  DsaWorkloadOptions options_;
  int layer_;
};

// Fills a row's index_q_e4m3 and index_w_scaled from its fp32 index_q and index_w: each head's
// query through index_key.h's recipe, its scale folded into the weight.
void quantize_index_queries(DsaQueryRow& row, int index_heads);

// The recency pair a query at context length `context` uses.
int dsa_recency_pair(int64_t context);

}  // namespace nvfp4mla::eval
