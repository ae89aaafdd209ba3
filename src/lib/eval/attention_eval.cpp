// Attention stage: queries correlated with a few context tokens attend over a top-k selection
// of the layer's context in every format; outputs and attention distributions are compared
// with the bf16 reference.
#include <algorithm>
#include <cmath>
#include <map>

#include "nvfp4mla/codec.h"
#include "nvfp4mla/error.h"
#include "nvfp4mla/eval/random.h"
#include "stages.h"

namespace nvfp4mla::eval::detail {

LayerQueries queries_from_bf16(std::vector<uint16_t> q, int rows, int heads) {
  LayerQueries out;
  out.rows = rows;
  out.heads = heads;
  out.q = std::move(q);
  out.indexer.assign(static_cast<size_t>(rows) * kQkDim, 0.0);
  for (int r = 0; r < rows; ++r)
    for (int h = 0; h < heads; ++h)
      for (int d = 0; d < kQkDim; ++d)
        out.indexer[static_cast<size_t>(r) * kQkDim + d] += codec::bf16_decode(out.q[(static_cast<size_t>(r) * heads + h) * kQkDim + d]);
  return out;
}

LayerQueries synthesize_queries(const LayerModel& model, int layer, const TokenBlock& ctx, const AttentionOptions& o) {
  Rng rng(stream_key(model.seed, static_cast<uint64_t>(Sample::queries), static_cast<uint64_t>(layer)));
  const std::vector<float>& c = *model.channel_scale;
  const int64_t n = ctx.count;
  const int64_t query_position = n;  // the queries are the tokens right after the context
  // RoPE part: a random direction whose logit against a random key has the requested spread.
  const double rope_base_scale = o.rope_logit_std / (kSmScale * model.rope_scale * std::sqrt(double(kRopeDim)));
  std::vector<uint16_t> q(static_cast<size_t>(o.rows) * o.heads * kQkDim);
  for (int r = 0; r < o.rows; ++r) {
    std::vector<int64_t> relevant;
    while (static_cast<int>(relevant.size()) < std::min<int64_t>(o.relevant_per_row, n)) {
      const int64_t t = static_cast<int64_t>(rng.below(static_cast<uint64_t>(n)));
      if (std::find(relevant.begin(), relevant.end(), t) == relevant.end()) relevant.push_back(t);
    }
    for (int h = 0; h < o.heads; ++h) {
      double qd[kQkDim] = {};
      for (int k = 0; k < o.relevant_per_head && !relevant.empty(); ++k) {
        const int64_t t = relevant[rng.below(relevant.size())];
        // Matched direction scaled so this token's logit is g * peak_logit, g in [0.6, 1].
        add_matched_query(ctx.kv_c_row(t), c, rng.uniform(0.6, 1.0) * o.peak_logit / kSmScale, qd);
      }
      double base[kRopeDim];
      for (double& v : base) v = rope_base_scale * rng.normal();
      model.rope(base, query_position, qd + kLatentDim);
      uint16_t* qb = q.data() + (static_cast<size_t>(r) * o.heads + h) * kQkDim;
      for (int d = 0; d < kQkDim; ++d) qb[d] = codec::bf16_encode_rn(static_cast<float>(qd[d]));
    }
  }
  return queries_from_bf16(std::move(q), o.rows, o.heads);
}

LayerAttention evaluate_layer_attention(int layer, const TokenBlock& ctx, const LayerQueries& queries, int topk_wanted,
                                        const std::vector<FormatConfig>& configs, Device device) {
  if (configs.empty() || configs[0].cache_dtype() != CacheDtype::bf16)
    throw Error("internal: the attention stage needs the bf16 reference as its first mode");
  const int topk = static_cast<int>(std::min<int64_t>(topk_wanted, ctx.count));
  const int rows = queries.rows, heads = queries.heads;

  // The indexer selects each row's top-k from exact logits, the same for every format (in a
  // deployment it reads its own key cache, not the KV records under test).
  std::vector<std::vector<int64_t>> selected(static_cast<size_t>(rows));
  std::vector<float> logits;
  std::vector<int64_t> union_positions;
  for (int r = 0; r < rows; ++r) {
    exact_logits(ctx, &queries.indexer[static_cast<size_t>(r) * kQkDim], logits);
    selected[static_cast<size_t>(r)] = top_k_positions(logits, topk);
    union_positions.insert(union_positions.end(), selected[static_cast<size_t>(r)].begin(),
                           selected[static_cast<size_t>(r)].end());
  }
  std::sort(union_positions.begin(), union_positions.end());
  union_positions.erase(std::unique(union_positions.begin(), union_positions.end()), union_positions.end());
  std::map<int64_t, int32_t> slot_of;
  for (size_t i = 0; i < union_positions.size(); ++i) slot_of[union_positions[i]] = static_cast<int32_t>(i);
  std::vector<int32_t> indices(static_cast<size_t>(rows) * topk);
  for (int r = 0; r < rows; ++r)
    for (int j = 0; j < topk; ++j)
      indices[static_cast<size_t>(r) * topk + j] = slot_of.at(selected[static_cast<size_t>(r)][static_cast<size_t>(j)]);

  const size_t pairs = static_cast<size_t>(rows) * heads;
  std::vector<float> ref_out, ref_scores;
  LayerAttention result;
  for (size_t m = 0; m < configs.size(); ++m) {
    const FormatConfig& cfg = configs[m];
    const float layer_scale = cfg.layer_scale_for(layer);
    const std::vector<uint8_t> cache = encode_tokens(cfg, layer_scale, ctx, union_positions);
    SparseMlaArgs args;
    args.q = queries.q.data();
    args.rows = rows;
    args.heads = heads;
    args.cache = cache.data();
    args.capacity = static_cast<int64_t>(union_positions.size());
    args.indices = indices.data();
    args.topk = topk;
    args.sm_scale = kSmScale;
    args.layer_scale = layer_scale;
    std::vector<float> out(pairs * kLatentDim), scores(pairs * topk);
    sparse_attention(device, cfg.spec(), args, AttentionOutputs{out.data(), nullptr, scores.data()});
    if (m == 0) {
      ref_out = out;
      ref_scores = scores;
    }
    double err = 0.0, kld = 0.0;
    for (size_t p = 0; p < pairs; ++p) {
      // Distributions normalized from their own scores (log_sum_exp), on every device alike.
      const float* ref = &ref_scores[p * topk];
      const float* s = &scores[p * topk];
      err += relative_l2_error(&out[p * kLatentDim], &ref_out[p * kLatentDim], kLatentDim);
      kld += attention_kl_divergence(ref, static_cast<float>(log_sum_exp(ref, topk)), s,
                                     static_cast<float>(log_sum_exp(s, topk)), topk);
    }
    result.relative_error.push_back(err / static_cast<double>(pairs));
    result.kld.push_back(kld / static_cast<double>(pairs));
  }
  return result;
}

}  // namespace nvfp4mla::eval::detail
