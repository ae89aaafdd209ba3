#pragma once
// Quality metrics of the evaluation: latent reconstruction error, E4M3 group-scale health,
// attention-distribution divergence, and their per-layer summaries.
#include <cstdint>
#include <vector>

#include "nvfp4mla/format.h"

namespace nvfp4mla::eval {

// Latent reconstruction error over a set of tokens.
//   mean_relative_error: mean over tokens of ||x^ - x|| / ||x|| (every token counts the same,
//     so small tokens that a format destroys are not hidden behind large ones);
//   snr_db: 10 log10(sum ||x||^2 / sum ||x^ - x||^2) over all tokens (+inf when error-free).
// All-zero tokens have no relative error and are skipped by the mean.
class LatentError {
 public:
  void add_token(const float* original, const float* reconstructed, int n);
  void merge(const LatentError& other);
  double mean_relative_error() const;
  double snr_db() const;
  int64_t tokens() const { return tokens_; }

 private:
  double signal_ = 0.0, error_ = 0.0, sum_relative_ = 0.0;
  int64_t tokens_ = 0, relative_count_ = 0;
};

// Health of the E4M3 group scales of NVFP4 records.
struct GroupScaleCounts {
  int64_t groups = 0;
  int64_t subnormal = 0;  // scale byte in the E4M3 subnormal range (2^-9 .. 7 * 2^-9)
  int64_t zero = 0;       // scale byte 0: the whole group reads back as zero
  int64_t saturated = 0;  // scale at the E4M3 maximum while the group's values exceed 6 * 448:
                          // values clipped (static scales on tokens beyond the calibrated range)
  void merge(const GroupScaleCounts& o) {
    groups += o.groups;
    subnormal += o.subnormal;
    zero += o.zero;
    saturated += o.saturated;
  }
};

// Classify the 32 group scales of one NVFP4 record. `kv_c` is the writer's input latent (fp32)
// and `outer_scale` the outer scale the writer divided by (1 in implicit mode).
void count_group_scales(const uint8_t* record, const float* kv_c, float outer_scale, GroupScaleCounts& counts);

// ln(sum_j exp(s_j)) over n scores in fp64 (-inf entries contribute nothing; -inf when all are).
// The evaluation normalizes every attention distribution with it, so the probabilities of an
// implementation are consistent with its own scores whatever computed its lse.
double log_sum_exp(const float* scores, int64_t n);

// KL(P_ref || P) in nats for attention distributions given as scores and log-sum-exp
// (p_j = exp(s_j - lse)), over n entries.
double attention_kl_divergence(const float* ref_scores, float ref_lse, const float* scores, float lse, int64_t n);

// ||a - b|| / ||b|| (0 when both are zero).
double relative_l2_error(const float* a, const float* b, int64_t n);

// Mean over layers and the worst layer (largest value, or smallest when `lower_is_worse`).
// Infinite values (an error-free SNR) take part as +inf; NaN entries are skipped.
struct Summary {
  double mean = 0.0;
  double worst = 0.0;
  int worst_layer = -1;
};
Summary summarize(const std::vector<double>& per_layer, bool lower_is_worse = false);

// Tokens a cache of `cache_bytes` holds when every token stores one record of
// `record_bytes` in each of `num_layers` layers: floor(cache_bytes / (record_bytes * layers)).
int64_t tokens_per_cache(double cache_bytes, int record_bytes, int num_layers);

}  // namespace nvfp4mla::eval
