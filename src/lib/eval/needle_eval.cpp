// Needle retention: a needle token whose key aligns with the query is planted at several depths
// of contexts of several lengths, among distractors drawn from the same layer (synthetic or a
// dump's, see NeedleSource) plus "hard" distractors that share part of the needle's content.
// The indexer (exact logits, the same for every format) selects the top-k; each format then
// scores the selection from its records.
#include <algorithm>
#include <cmath>
#include <limits>

#include "nvfp4mla/codec.h"
#include "nvfp4mla/error.h"
#include "nvfp4mla/eval/random.h"
#include "nvfp4mla/record.h"
#include "stages.h"

namespace nvfp4mla::eval::detail {

namespace {

// Context positions ordered by logit, highest first (ties: lower position first); the first
// `count` only.
std::vector<int64_t> ranking(const std::vector<float>& logits, int64_t count) {
  std::vector<int64_t> idx(logits.size());
  for (size_t i = 0; i < idx.size(); ++i) idx[i] = static_cast<int64_t>(i);
  count = std::min<int64_t>(count, static_cast<int64_t>(idx.size()));
  std::partial_sort(idx.begin(), idx.begin() + count, idx.end(), [&](int64_t a, int64_t b) {
    const float va = logits[static_cast<size_t>(a)], vb = logits[static_cast<size_t>(b)];
    return va != vb ? va > vb : a < b;
  });
  idx.resize(static_cast<size_t>(count));
  return idx;
}

double exact_logit(const uint16_t* kv, const uint16_t* pe, const double* q) {
  double dot = 0.0;
  for (int d = 0; d < kLatentDim; ++d) dot += q[d] * codec::bf16_decode(kv[d]);
  for (int d = 0; d < kRopeDim; ++d) dot += q[kLatentDim + d] * codec::bf16_decode(pe[d]);
  return kSmScale * dot;
}

}  // namespace

std::vector<NeedleGrid> run_needle_layer(const NeedleSource& src, int layer, const NeedleOptions& o, int topk,
                                         const std::vector<FormatConfig>& configs, Device device,
                                         const std::function<void()>& cell_done) {
  const size_t modes = configs.size();
  const size_t depths = o.depths.size();
  std::vector<NeedleGrid> grids(modes);
  for (auto& g : grids) {
    g.layer = layer;
    g.cells.resize(o.lengths.size() * depths);
  }
  const LayerModel& model = src.model;
  const std::vector<float>& c = *model.channel_scale;
  for (size_t li = 0; li < o.lengths.size(); ++li) {
    const int64_t length = o.lengths[li];
    Rng rng(stream_key(model.seed, static_cast<uint64_t>(Sample::needle), static_cast<uint64_t>(layer),
                       static_cast<uint64_t>(length)));
    TokenBlock ctx = src.context(length);

    // The needle: typical magnitude (1), its own content and RoPE base.
    double z_needle[kLatentDim], needle_rope[kRopeDim];
    for (double& v : z_needle) v = rng.normal();
    for (double& v : needle_rope) v = rng.normal();
    double needle_norm2 = 0.0;
    for (double v : z_needle) needle_norm2 += v * v;
    uint16_t needle_kv[kLatentDim], needle_pe[kRopeDim];  // its latent does not depend on the position
    model.make_token(z_needle, 1.0, needle_rope, 0, needle_kv, needle_pe);

    // The query matches the needle's content; its RoPE part is a small random term.
    double q[kQkDim] = {};
    add_matched_query(needle_kv, c, o.needle_logit / kSmScale, q);
    double q_rope[kRopeDim];
    const double rope_base_scale = o.rope_logit_std / (kSmScale * model.rope_scale * std::sqrt(double(kRopeDim)));
    for (double& v : q_rope) v = rope_base_scale * rng.normal();
    model.rope(q_rope, length, q + kLatentDim);
    for (double& v : q) v = codec::bf16_decode(codec::bf16_encode_rn(static_cast<float>(v)));  // BF16 query

    // Hard distractors: larger tokens sharing a fraction of the needle's content, so their logit
    // is a chosen fraction of the needle's.
    const int64_t hard = std::min<int64_t>(length, std::max<int64_t>(4, length / 1024));
    for (int64_t h = 0; h < hard; ++h) {
      const int64_t pos = static_cast<int64_t>(rng.below(static_cast<uint64_t>(length)));
      const double fraction = rng.uniform(o.distractor_min, o.distractor_max);
      const double magnitude = std::exp(rng.uniform(std::log(1.2), std::log(2.5)));
      const double share = std::min(1.0, fraction / magnitude);
      // z = share * z_needle + sqrt(1 - share^2) * (a random direction orthogonal to z_needle, of
      // the same length): the logit is then fraction * needle_logit up to BF16 rounding.
      double z[kLatentDim], base[kRopeDim], other[kLatentDim];
      double dot = 0.0, other2 = 0.0;
      for (int d = 0; d < kLatentDim; ++d) {
        other[d] = rng.normal();
        dot += other[d] * z_needle[d];
      }
      for (int d = 0; d < kLatentDim; ++d) {
        other[d] -= dot / needle_norm2 * z_needle[d];
        other2 += other[d] * other[d];
      }
      const double rescale = std::sqrt(needle_norm2 / other2);
      for (int d = 0; d < kLatentDim; ++d) z[d] = share * z_needle[d] + std::sqrt(1.0 - share * share) * rescale * other[d];
      for (double& v : base) v = rng.normal();
      model.make_token(z, magnitude, base, pos, ctx.kv_c.data() + pos * kLatentDim, ctx.k_pe.data() + pos * kRopeDim);
    }

    std::vector<float> logits;
    exact_logits(ctx, q, logits);
    const int k = static_cast<int>(std::min<int64_t>(topk, length));
    // The best k distractors cover every depth: planting the needle removes one position.
    const std::vector<int64_t> ranked = ranking(logits, k);
    // Per depth: the needle at its position, and the top-k selection with it planted. Cache
    // slots: one needle record per depth first, then the ranked distractors.
    struct Planted {
      size_t depth;
      int64_t position;
      uint16_t kv[kLatentDim], pe[kRopeDim];
      int needle_index = -1;        // its place in the selection; -1: the indexer dropped it
      std::vector<int32_t> indices;  // k slots
    };
    const int32_t first_distractor = static_cast<int32_t>(depths);
    std::vector<Planted> planted(depths);
    for (size_t di = 0; di < depths; ++di) {
      Planted& pl = planted[di];
      pl.depth = di;
      pl.position = std::llround(o.depths[di] * static_cast<double>(length - 1));
      model.make_token(z_needle, 1.0, needle_rope, pl.position, pl.kv, pl.pe);
      const double needle_logit = exact_logit(pl.kv, pl.pe, q);
      // Top-k of the context with the needle at `position`: merge it into the ranking.
      for (size_t r = 0; r < ranked.size() && static_cast<int>(pl.indices.size()) < k; ++r) {
        if (ranked[r] == pl.position) continue;
        const double lr = logits[static_cast<size_t>(ranked[r])];
        if (pl.needle_index < 0 && (needle_logit > lr || (needle_logit == lr && pl.position < ranked[r]))) {
          pl.needle_index = static_cast<int>(pl.indices.size());
          pl.indices.push_back(static_cast<int32_t>(di));
          if (static_cast<int>(pl.indices.size()) == k) break;
        }
        pl.indices.push_back(first_distractor + static_cast<int32_t>(r));
      }
      if (pl.needle_index < 0 && static_cast<int>(pl.indices.size()) < k) {
        pl.needle_index = static_cast<int>(pl.indices.size());
        pl.indices.push_back(static_cast<int32_t>(di));
      }
      if (pl.needle_index < 0) {
        // The indexer itself dropped the needle: lost in every format alike.
        for (auto& g : grids)
          g.cells[li * depths + di] = NeedleCell{false, 0.0, 0.0, -std::numeric_limits<double>::infinity()};
      }
    }
    std::vector<const Planted*> rows;
    for (const Planted& pl : planted)
      if (pl.needle_index >= 0) rows.push_back(&pl);
    std::vector<uint16_t> q_rows(rows.size() * kQkDim);
    std::vector<int32_t> indices(rows.size() * static_cast<size_t>(k));
    for (size_t r = 0; r < rows.size(); ++r) {
      for (int d = 0; d < kQkDim; ++d) q_rows[r * kQkDim + d] = codec::bf16_encode_rn(static_cast<float>(q[d]));
      std::copy(rows[r]->indices.begin(), rows[r]->indices.end(), indices.begin() + static_cast<long>(r * k));
    }

    std::vector<double> reference_mass(rows.size(), 0.0);
    for (size_t m = 0; m < modes && !rows.empty(); ++m) {
      const FormatConfig& cfg = configs[m];
      const float layer_scale = cfg.layer_scale_for(layer);
      const size_t rb = static_cast<size_t>(cfg.record_bytes());
      std::vector<uint8_t> cache(depths * rb);
      for (const Planted& pl : planted) {
        Bf16Bits kv[kLatentDim], pe[kRopeDim];
        for (int d = 0; d < kLatentDim; ++d) kv[d] = Bf16Bits{pl.kv[d]};
        for (int d = 0; d < kRopeDim; ++d) pe[d] = Bf16Bits{pl.pe[d]};
        record::encode(cfg.spec(), kv, pe, layer_scale, cache.data() + pl.depth * rb);
      }
      const std::vector<uint8_t> distractors = encode_tokens(cfg, layer_scale, ctx, ranked);
      cache.insert(cache.end(), distractors.begin(), distractors.end());

      SparseMlaArgs args;
      args.q = q_rows.data();
      args.rows = static_cast<int>(rows.size());
      args.heads = 1;
      args.cache = cache.data();
      args.capacity = static_cast<int64_t>(depths + ranked.size());
      args.indices = indices.data();
      args.topk = k;
      args.sm_scale = kSmScale;
      args.layer_scale = layer_scale;
      std::vector<float> scores(rows.size() * static_cast<size_t>(k));
      sparse_attention(device, cfg.spec(), args, AttentionOutputs{nullptr, nullptr, scores.data()});

      for (size_t r = 0; r < rows.size(); ++r) {
        const float* s = &scores[r * static_cast<size_t>(k)];
        const int ni = rows[r]->needle_index;
        double best_other = -std::numeric_limits<double>::infinity();
        for (int j = 0; j < k; ++j)
          if (j != ni) best_other = std::max(best_other, static_cast<double>(s[j]));
        NeedleCell& cell = grids[m].cells[li * depths + rows[r]->depth];
        cell.margin = s[ni] - best_other;
        cell.kept = cell.margin > 0.0;
        cell.mass = std::exp(s[ni] - log_sum_exp(s, k));
        if (m == 0) reference_mass[r] = cell.mass;
        cell.mass_ratio = reference_mass[r] > 0.0 ? cell.mass / reference_mass[r] : 0.0;
      }
    }
    if (cell_done)
      for (size_t di = 0; di < depths; ++di) cell_done();
  }
  return grids;
}

}  // namespace nvfp4mla::eval::detail
