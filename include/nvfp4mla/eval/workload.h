#pragma once
// The embedded synthetic workload: a deterministic model of the KV state a GLM-5.2-like
// network writes into its MLA cache, shaped after what the seed pull requests measured.
//
//   - 78 layers whose latent magnitudes (max |kv_c|) grow geometrically from ~0.02 in the
//     shallowest layer to ~5.2 in the deepest (the ~240x span that pushed unit-scale NVFP4
//     group scales into E4M3 subnormals);
//   - per layer, channel scales that are log-normal with a few heavy-tailed outlier channels;
//   - per token, a log-normal magnitude factor (a spread of token magnitudes);
//   - RoPE keys: a random 64-dim vector rotated by its position (base 10000, NeoX pairing).
// A token's latent is value_scale(layer) * magnitude * channel_scale[c] * z_c with z ~ N(0,1),
// rounded to BF16 (the writer's input type). Every (layer, sample, index) triple draws from its
// own random stream, so samples are independent and reproducible in any order.
#include <cstddef>
#include <cstdint>
#include <vector>

#include "nvfp4mla/format.h"

namespace nvfp4mla::eval {

struct WorkloadShape {
  int num_layers = 78;
  double shallow_max_abs = 0.02;  // nominal max |kv_c| of layer 0
  double deep_max_abs = 5.2;      // nominal max |kv_c| of the last layer
  double token_sigma = 0.35;      // log-normal spread of the per-token magnitude
  double channel_sigma = 0.35;    // log-normal spread of ordinary channel scales
  int outlier_channels = 8;       // heavy-tailed channels per layer
  double outlier_min = 4.0;       // their scale, log-uniform in [min, max]
  double outlier_max = 16.0;
  double rope_base = 10000.0;
};

// Independent samples of the same workload.
enum class Sample : uint64_t {
  evaluation = 1,   // the tokens every metric is measured on (and the attention context)
  calibration = 2,  // the separate sample static calibration is computed from (out of sample)
  sweep = 3,
  sweep_calibration = 4,
  needle = 5,
  queries = 6,
  needle_context = 7,  // draws of a dump's tokens for needle contexts longer than it
  dsa_tokens = 8,      // the DSA workload (dsa_workload.h): ordinary tokens, per position
  dsa_needle = 9,      // its needles, per query row
  dsa_query = 10,      // its query rows
};

// BF16 bits of a finite fp32 value, round to nearest even (branch-free; equals
// codec::bf16_encode_rn for every finite input). The generator rounds every value with it.
uint16_t bf16_bits_finite(float x);

// Tokens as a cache writer receives them: BF16 latent and post-RoPE key.
struct TokenBlock {
  int64_t count = 0;
  std::vector<uint16_t> kv_c;      // [count, 512] BF16 bits
  std::vector<uint16_t> k_pe;      // [count, 64] BF16 bits
  std::vector<float> magnitude;    // per-token magnitude factor
  const uint16_t* kv_c_row(int64_t t) const { return kv_c.data() + t * kLatentDim; }
  const uint16_t* k_pe_row(int64_t t) const { return k_pe.data() + t * kRopeDim; }
  float max_abs_kv_c() const;      // max |kv_c| over the block
};

class SyntheticWorkload {
 public:
  explicit SyntheticWorkload(uint64_t seed, const WorkloadShape& shape = {});

  uint64_t seed() const { return seed_; }
  const WorkloadShape& shape() const { return shape_; }
  int num_layers() const { return shape_.num_layers; }

  // The layer's nominal max |kv_c| (geometric from shallow_max_abs to deep_max_abs).
  double nominal_max_abs(int layer) const;
  // a_l: the factor that turns unit content into this layer's latent values.
  double value_scale(int layer) const { return layers_.at(static_cast<size_t>(layer)).value_scale; }
  const std::vector<float>& channel_scale(int layer) const { return layers_.at(static_cast<size_t>(layer)).channel_scale; }
  double rope_scale(int layer) const { return layers_.at(static_cast<size_t>(layer)).rope_scale; }

  // `count` tokens of `layer` at positions first_position, first_position + 1, ... drawn from
  // the stream (layer, sample, index). `value_scale` overrides a_l when positive (the
  // magnitude sweep scales the same tokens to many magnitudes).
  TokenBlock tokens(int layer, Sample sample, uint64_t index, int64_t first_position, int64_t count,
                    double value_scale = 0.0) const;

  // Rotate a 64-dim vector to `position` (RoPE, NeoX pairing: dims i and i + 32).
  void apply_rope(const double* in, int64_t position, double* out) const;

 private:
  struct Layer {
    double value_scale = 1.0;
    double rope_scale = 1.0;
    std::vector<float> channel_scale;  // 512
  };
  uint64_t seed_;
  WorkloadShape shape_;
  std::vector<Layer> layers_;
  std::vector<double> rope_inv_freq_;  // 32
};

}  // namespace nvfp4mla::eval
