#include "nvfp4mla/eval/metrics.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "nvfp4mla/codec.h"
#include "nvfp4mla/record.h"

namespace nvfp4mla::eval {

void LatentError::add_token(const float* original, const float* reconstructed, int n) {
  double sig = 0.0, err = 0.0;
  for (int i = 0; i < n; ++i) {
    const double x = original[i], d = static_cast<double>(reconstructed[i]) - x;
    sig += x * x;
    err += d * d;
  }
  signal_ += sig;
  error_ += err;
  ++tokens_;
  if (sig > 0.0) {
    sum_relative_ += std::sqrt(err / sig);
    ++relative_count_;
  }
}

void LatentError::merge(const LatentError& o) {
  signal_ += o.signal_;
  error_ += o.error_;
  sum_relative_ += o.sum_relative_;
  tokens_ += o.tokens_;
  relative_count_ += o.relative_count_;
}

double LatentError::mean_relative_error() const {
  return relative_count_ ? sum_relative_ / static_cast<double>(relative_count_) : 0.0;
}

double LatentError::snr_db() const {
  if (error_ == 0.0) return std::numeric_limits<double>::infinity();
  if (signal_ == 0.0) return -std::numeric_limits<double>::infinity();
  return 10.0 * std::log10(signal_ / error_);
}

void count_group_scales(const uint8_t* record, const float* kv_c, float outer_scale, GroupScaleCounts& counts) {
  namespace L = layout::nvfp4;
  for (int g = 0; g < L::kNumGroups; ++g) {
    const uint8_t b = record[L::kGroupScaleOffset + g];
    ++counts.groups;
    if ((b & 0x7F) == 0) {
      ++counts.zero;
    } else if ((b & 0x78) == 0) {
      ++counts.subnormal;  // exponent field 0, mantissa non-zero
    } else if (b == codec::kE4M3MaxByte) {
      float amax = 0.0f;
      for (int i = 0; i < L::kGroupSize; ++i)
        amax = std::max(amax, std::fabs(record::nvfp4_prescale(kv_c[g * L::kGroupSize + i], outer_scale)));
      if (amax > codec::kE2M1Max * codec::kE4M3Max) ++counts.saturated;
    }
  }
}

double log_sum_exp(const float* scores, int64_t n) {
  double m = -std::numeric_limits<double>::infinity();
  for (int64_t j = 0; j < n; ++j) m = std::max(m, static_cast<double>(scores[j]));
  if (std::isinf(m)) return m;
  double sum = 0.0;
  for (int64_t j = 0; j < n; ++j) sum += std::exp(scores[j] - m);
  return m + std::log(sum);
}

double attention_kl_divergence(const float* ref_scores, float ref_lse, const float* scores, float lse, int64_t n) {
  double kl = 0.0;
  for (int64_t j = 0; j < n; ++j) {
    const double lp_ref = static_cast<double>(ref_scores[j]) - ref_lse;
    const double p_ref = std::exp(lp_ref);
    if (p_ref == 0.0) continue;
    kl += p_ref * (lp_ref - (static_cast<double>(scores[j]) - lse));
  }
  // Rounding can leave a tiny negative value for identical distributions.
  return kl < 0.0 ? 0.0 : kl;
}

double relative_l2_error(const float* a, const float* b, int64_t n) {
  double num = 0.0, den = 0.0;
  for (int64_t i = 0; i < n; ++i) {
    const double d = static_cast<double>(a[i]) - b[i];
    num += d * d;
    den += static_cast<double>(b[i]) * b[i];
  }
  if (den == 0.0) return num == 0.0 ? 0.0 : std::numeric_limits<double>::infinity();
  return std::sqrt(num / den);
}

Summary summarize(const std::vector<double>& v, bool lower_is_worse) {
  Summary s;
  double sum = 0.0;
  int64_t n = 0;
  for (size_t i = 0; i < v.size(); ++i) {
    if (std::isnan(v[i])) continue;
    sum += v[i];
    ++n;
    const bool worse = s.worst_layer < 0 || (lower_is_worse ? v[i] < s.worst : v[i] > s.worst);
    if (worse) {
      s.worst = v[i];
      s.worst_layer = static_cast<int>(i);
    }
  }
  s.mean = n ? sum / static_cast<double>(n) : std::numeric_limits<double>::quiet_NaN();
  if (!n) s.worst = std::numeric_limits<double>::quiet_NaN();
  return s;
}

int64_t tokens_per_cache(double cache_bytes, int record_bytes, int num_layers) {
  return static_cast<int64_t>(std::floor(cache_bytes / (static_cast<double>(record_bytes) * num_layers)));
}

}  // namespace nvfp4mla::eval
