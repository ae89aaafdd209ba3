#include "nvfp4mla/eval/workload.h"

#include <algorithm>
#include <cmath>
#include <string>

#include "nvfp4mla/codec.h"
#include "nvfp4mla/error.h"
#include "nvfp4mla/eval/random.h"

namespace nvfp4mla::eval {

namespace {

// Stream labels for the workload's own parameters (kept apart from the Sample streams).
constexpr uint64_t kLayerParameters = 100;

// Typical max over a few thousand tokens of magnitude * |z| in one channel: value_scale is
// nominal / (largest channel scale * this), so a sample's max |kv_c| lands near the nominal
// magnitude (the report prints the measured values).
constexpr double kTypicalPeak = 6.5;

}  // namespace

uint16_t bf16_bits_finite(float x) {
  const uint32_t u = codec::float_bits(x);
  return static_cast<uint16_t>((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
}

float TokenBlock::max_abs_kv_c() const {
  float m = 0.0f;
  for (uint16_t b : kv_c) m = std::max(m, std::fabs(codec::bf16_decode(b)));
  return m;
}

SyntheticWorkload::SyntheticWorkload(uint64_t seed, const WorkloadShape& shape) : seed_(seed), shape_(shape) {
  if (shape.num_layers < 1 || shape.num_layers > 4096) throw Error("workload: num_layers must be in [1, 4096]");
  if (!(shape.shallow_max_abs > 0.0) || !(shape.deep_max_abs > 0.0) || !std::isfinite(shape.deep_max_abs))
    throw Error("workload: layer magnitudes must be finite and positive");
  if (shape.outlier_channels < 0 || shape.outlier_channels > kLatentDim)
    throw Error("workload: outlier_channels must be in [0, 512]");
  rope_inv_freq_.resize(kRopeDim / 2);
  for (int i = 0; i < kRopeDim / 2; ++i)
    rope_inv_freq_[static_cast<size_t>(i)] = std::pow(shape.rope_base, -2.0 * i / kRopeDim);

  layers_.resize(static_cast<size_t>(shape.num_layers));
  for (int l = 0; l < shape.num_layers; ++l) {
    Rng rng(stream_key(seed, kLayerParameters, static_cast<uint64_t>(l)));
    Layer& L = layers_[static_cast<size_t>(l)];
    L.channel_scale.resize(kLatentDim);
    for (auto& c : L.channel_scale) c = static_cast<float>(std::exp(shape.channel_sigma * rng.normal()));
    // Outlier channels: distinct random channels with a log-uniform scale.
    for (int k = 0; k < shape.outlier_channels; ++k) {
      int c;
      do c = static_cast<int>(rng.below(kLatentDim));
      while (L.channel_scale[static_cast<size_t>(c)] >= shape.outlier_min);
      L.channel_scale[static_cast<size_t>(c)] =
          static_cast<float>(shape.outlier_min * std::pow(shape.outlier_max / shape.outlier_min, rng.uniform()));
    }
    const float c_max = *std::max_element(L.channel_scale.begin(), L.channel_scale.end());
    L.value_scale = nominal_max_abs(l) / (static_cast<double>(c_max) * kTypicalPeak);
    L.rope_scale = std::exp(0.3 * rng.normal());
  }
}

double SyntheticWorkload::nominal_max_abs(int layer) const {
  if (shape_.num_layers == 1) return shape_.shallow_max_abs;
  const double t = static_cast<double>(layer) / (shape_.num_layers - 1);
  return shape_.shallow_max_abs * std::pow(shape_.deep_max_abs / shape_.shallow_max_abs, t);
}

void SyntheticWorkload::apply_rope(const double* in, int64_t position, double* out) const {
  constexpr int half = kRopeDim / 2;
  for (int i = 0; i < half; ++i) {
    const double a = static_cast<double>(position) * rope_inv_freq_[static_cast<size_t>(i)];
    const double c = std::cos(a), s = std::sin(a);
    out[i] = in[i] * c - in[i + half] * s;
    out[i + half] = in[i] * s + in[i + half] * c;
  }
}

TokenBlock SyntheticWorkload::tokens(int layer, Sample sample, uint64_t index, int64_t first_position, int64_t count,
                                     double value_scale) const {
  if (layer < 0 || layer >= num_layers())
    throw Error("workload: layer " + std::to_string(layer) + " is outside [0, " + std::to_string(num_layers()) + ")");
  if (count < 0) throw Error("workload: negative token count");
  const Layer& L = layers_[static_cast<size_t>(layer)];
  const double a = value_scale > 0.0 ? value_scale : L.value_scale;
  Rng rng(stream_key(seed_, static_cast<uint64_t>(sample), static_cast<uint64_t>(layer), index));
  TokenBlock b;
  b.count = count;
  b.kv_c.resize(static_cast<size_t>(count) * kLatentDim);
  b.k_pe.resize(static_cast<size_t>(count) * kRopeDim);
  b.magnitude.resize(static_cast<size_t>(count));
  double base[kRopeDim], rotated[kRopeDim];
  for (int64_t t = 0; t < count; ++t) {
    const double mag = std::exp(shape_.token_sigma * rng.normal());
    b.magnitude[static_cast<size_t>(t)] = static_cast<float>(mag);
    uint16_t* kv = b.kv_c.data() + t * kLatentDim;
    for (int c = 0; c < kLatentDim; ++c)
      kv[c] = bf16_bits_finite(static_cast<float>(a * mag * L.channel_scale[static_cast<size_t>(c)] * rng.normal()));
    for (double& v : base) v = rng.normal();
    apply_rope(base, first_position + t, rotated);
    uint16_t* pe = b.k_pe.data() + t * kRopeDim;
    for (int i = 0; i < kRopeDim; ++i) pe[i] = bf16_bits_finite(static_cast<float>(L.rope_scale * rotated[i]));
  }
  return b;
}

}  // namespace nvfp4mla::eval
