#include "nvfp4mla/eval/dsa_workload.h"

#include <algorithm>
#include <cmath>
#include <numbers>

#include "nvfp4mla/codec.h"
#include "nvfp4mla/error.h"
#include "nvfp4mla/eval/random.h"
#include "parallel.h"
#include "stages.h"

namespace nvfp4mla::eval {
namespace {

constexpr int64_t kTokensPerTask = 4096;

double recency_frequency(int pair) { return (std::numbers::pi / 2) / (double(kDsaRecencyBase) * std::ldexp(1.0, pair)); }

// One token from its stream: content z (512), magnitude, RoPE base; the index key from z and the
// position.
void draw_token(const detail::LayerModel& model, Rng& rng, int64_t position, double extra_content, const double* direction,
                uint16_t* kv_c, uint16_t* k_pe, float* magnitude, uint16_t* index_k, double token_sigma) {
  double z[kLatentDim], rope[kRopeDim];
  for (double& v : z) v = rng.normal();
  const double mag = magnitude ? std::exp(token_sigma * rng.normal()) : 1.0;
  for (double& v : rope) v = rng.normal();
  if (direction)
    for (int d = 0; d < kDsaContentDims; ++d) z[d] += extra_content * direction[d];
  model.make_token(z, mag, rope, position, kv_c, k_pe);
  if (magnitude) *magnitude = static_cast<float>(mag);
  for (int d = 0; d < kDsaContentDims; ++d) index_k[d] = bf16_bits_finite(static_cast<float>(z[d]));
  for (int j = 0; j < kDsaRecencyPairs; ++j) {
    const double angle = recency_frequency(j) * static_cast<double>(position);
    index_k[kDsaContentDims + 2 * j] = bf16_bits_finite(static_cast<float>(std::cos(angle)));
    index_k[kDsaContentDims + 2 * j + 1] = bf16_bits_finite(static_cast<float>(std::sin(angle)));
  }
}

void unit_normal(Rng& rng, double* v, int n) {
  double norm = 0.0;
  for (int i = 0; i < n; ++i) {
    v[i] = rng.normal();
    norm += v[i] * v[i];
  }
  norm = std::sqrt(norm);
  for (int i = 0; i < n; ++i) v[i] /= norm;
}

}  // namespace

int dsa_recency_pair(int64_t context) {
  int j = 0;
  while (j < kDsaRecencyPairs - 1 && kDsaRecencyBase * (int64_t(1) << j) < context) ++j;
  return j;
}

DsaWorkload::DsaWorkload(const SyntheticWorkload& model, const DsaWorkloadOptions& o)
    : model_(model), options_(o), layer_(o.layer < 0 ? model.num_layers() / 2 : o.layer) {
  if (layer_ >= model.num_layers()) throw Error("DSA workload: layer " + std::to_string(layer_) + " is not a layer of the model");
  if (o.heads < 1) throw Error("DSA workload: heads must be at least 1");
  if (o.index_heads < 1 || o.index_heads > 64) throw Error("DSA workload: index heads must be in 1..64");
  for (double v : {o.needle_logit, o.index_margin, o.index_noise, o.recency})
    if (!std::isfinite(v) || v < 0) throw Error("DSA workload: needle logit, index margin, noise and recency must be finite and >= 0");
}

DsaTokens DsaWorkload::tokens(int64_t first, int64_t count, int threads) const {
  DsaTokens b;
  b.latents.count = count;
  b.latents.kv_c.resize(static_cast<size_t>(count) * kLatentDim);
  b.latents.k_pe.resize(static_cast<size_t>(count) * kRopeDim);
  b.latents.magnitude.resize(static_cast<size_t>(count));
  b.index_k.resize(static_cast<size_t>(count) * index_key::kDim);
  const detail::LayerModel model = detail::synthetic_layer_model(model_, layer_);
  const double sigma = model_.shape().token_sigma;
  detail::parallel_for((count + kTokensPerTask - 1) / kTokensPerTask, threads, [&](int64_t task) {
    for (int64_t i = task * kTokensPerTask; i < std::min(count, (task + 1) * kTokensPerTask); ++i) {
      const int64_t position = first + i;
      Rng rng(stream_key(model_.seed(), static_cast<uint64_t>(Sample::dsa_tokens), static_cast<uint64_t>(layer_),
                         static_cast<uint64_t>(position)));
      draw_token(model, rng, position, 0.0, nullptr, &b.latents.kv_c[size_t(i) * kLatentDim], &b.latents.k_pe[size_t(i) * kRopeDim],
                 &b.latents.magnitude[size_t(i)], &b.index_k[size_t(i) * index_key::kDim], sigma);
    }
  });
  return b;
}

void DsaWorkload::content_direction(int row, double* u) const {
  Rng rng(stream_key(model_.seed(), static_cast<uint64_t>(Sample::dsa_query), static_cast<uint64_t>(layer_),
                     static_cast<uint64_t>(row) << 8));
  unit_normal(rng, u, kDsaContentDims);
}

DsaTokens DsaWorkload::needle(int row, int64_t position) const {
  DsaTokens b;
  b.latents.count = 1;
  b.latents.kv_c.resize(kLatentDim);
  b.latents.k_pe.resize(kRopeDim);
  b.latents.magnitude = {1.0f};
  b.index_k.resize(index_key::kDim);
  double u[kDsaContentDims];
  content_direction(row, u);
  Rng rng(stream_key(model_.seed(), static_cast<uint64_t>(Sample::dsa_needle), static_cast<uint64_t>(layer_),
                     static_cast<uint64_t>(row)));
  draw_token(detail::synthetic_layer_model(model_, layer_), rng, position, options_.index_margin, u, b.latents.kv_c.data(),
             b.latents.k_pe.data(), nullptr, b.index_k.data(), 0.0);
  return b;
}

DsaQueryRow DsaWorkload::query(int row, const DsaTokens& needle, int64_t context) const {
  const DsaWorkloadOptions& o = options_;
  DsaQueryRow r;
  r.q.resize(static_cast<size_t>(o.heads) * kQkDim);
  const detail::LayerModel model = detail::synthetic_layer_model(model_, layer_);
  // RoPE part of the query: a random direction whose logits spread by about 0.1 nats.
  const double rope_q = 0.1 / (detail::kSmScale * model.rope_scale * std::sqrt(double(kRopeDim)));
  for (int h = 0; h < o.heads; ++h) {
    Rng rng(stream_key(model_.seed(), static_cast<uint64_t>(Sample::dsa_query), static_cast<uint64_t>(layer_),
                       (static_cast<uint64_t>(row) << 8) + 128 + static_cast<uint64_t>(h)));
    double qd[kQkDim] = {};
    const double lift = h == 0 ? o.needle_logit : o.needle_logit * rng.uniform(2.0 / 3.0, 1.0);
    detail::add_matched_query(needle.latents.kv_c.data(), *model.channel_scale, lift / detail::kSmScale, qd);
    double base[kRopeDim];
    for (double& v : base) v = rope_q * rng.normal();
    model.rope(base, context, qd + kLatentDim);
    for (int d = 0; d < kQkDim; ++d) r.q[static_cast<size_t>(h) * kQkDim + d] = codec::bf16_encode_rn(static_cast<float>(qd[d]));
  }
  double u[kDsaContentDims];
  content_direction(row, u);
  const int pair = dsa_recency_pair(context);
  const double angle = recency_frequency(pair) * static_cast<double>(context);
  r.index_q.assign(static_cast<size_t>(o.index_heads) * index_key::kDim, 0.0f);
  r.index_w.assign(static_cast<size_t>(o.index_heads), static_cast<float>(1.0 / o.index_heads));
  for (int h = 0; h < o.index_heads; ++h) {
    Rng rng(stream_key(model_.seed(), static_cast<uint64_t>(Sample::dsa_query), static_cast<uint64_t>(layer_),
                       (static_cast<uint64_t>(row) << 8) + 1 + static_cast<uint64_t>(h)));
    double g[kDsaContentDims];
    unit_normal(rng, g, kDsaContentDims);
    float* q = &r.index_q[static_cast<size_t>(h) * index_key::kDim];
    for (int d = 0; d < kDsaContentDims; ++d) q[d] = static_cast<float>(u[d] + o.index_noise * g[d]);
    q[kDsaContentDims + 2 * pair] = static_cast<float>(o.recency * std::cos(angle));
    q[kDsaContentDims + 2 * pair + 1] = static_cast<float>(o.recency * std::sin(angle));
  }
  quantize_index_queries(r, o.index_heads);
  return r;
}

void quantize_index_queries(DsaQueryRow& r, int index_heads) {
  r.index_q_e4m3.resize(static_cast<size_t>(index_heads) * index_key::kDim);
  r.index_w_scaled.resize(static_cast<size_t>(index_heads));
  for (int h = 0; h < index_heads; ++h) {
    const size_t at = static_cast<size_t>(h) * index_key::kDim;
    r.index_w_scaled[static_cast<size_t>(h)] = r.index_w[static_cast<size_t>(h)] * index_key::encode(&r.index_q[at], &r.index_q_e4m3[at]);
  }
}

void DsaWorkload::exact_index_logits(const DsaQueryRow& row, int index_heads, const uint16_t* index_k, int64_t count,
                                     float* logits) {
  constexpr int D = index_key::kDim;
  for (int64_t t = 0; t < count; ++t) {
    float k[D];
    for (int d = 0; d < D; ++d) k[d] = codec::bf16_decode(index_k[t * D + d]);
    float sum = 0.0f;
    for (int h = 0; h < index_heads; ++h) {
      const float* q = &row.index_q[static_cast<size_t>(h) * D];
      float acc[8] = {};  // eight partial sums: the loop vectorizes without reassociation
      for (int d = 0; d < D; d += 8)
        for (int j = 0; j < 8; ++j) acc[j] += q[d + j] * k[d + j];
      const float dot = ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
      sum += row.index_w[static_cast<size_t>(h)] * std::max(dot, 0.0f);
    }
    logits[t] = sum;
  }
}

}  // namespace nvfp4mla::eval
