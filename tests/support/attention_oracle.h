#pragma once
// An attention oracle written from the specifications alone: the record readers of
// docs/FORMAT.md (sections 2, 3 and 5) and the semantics of include/nvfp4mla/sparse_mla.h, in
// plain fp64. It shares no code with the library's reference (sparse_mla_cpu.cpp), its codecs
// (codec.h) or its record readers (record.h), so a bug there cannot hide in both.
//
// Besides out, LSE and scores it can return error bounds for GPU kernels whose softmax weights
// enter the output product as BF16 values (derived below, before namespace detail; used by
// output_compare.h).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <numeric>
#include <vector>

#include "nvfp4mla/format.h"
#include "nvfp4mla/sparse_mla.h"
#include "lib/threads/parallel_for.h"

namespace nvfp4mla::testing::oracle {

// ---- Number formats (FORMAT.md section 2) ----

// E2M1 nibble: bit 3 sign, magnitudes by code 0..7.
inline double e2m1_value(unsigned code) {
  static constexpr double kMagnitude[8] = {0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0};
  return (code & 8u) ? -kMagnitude[code & 7u] : kMagnitude[code & 7u];
}

// E4M3 byte: bit 7 sign, exponent bits 6..3 (bias 7), mantissa bits 2..0; exponent 0 is
// subnormal (m * 2^-9); 0x7F and 0xFF are NaN.
inline double e4m3_value(unsigned byte) {
  const int e = static_cast<int>((byte >> 3) & 15u), m = static_cast<int>(byte & 7u);
  if (e == 15 && m == 7) return std::numeric_limits<double>::quiet_NaN();
  const double magnitude = e == 0 ? std::ldexp(m, -9) : std::ldexp(8 + m, e - 10);  // (1 + m/8) 2^(e-7)
  return (byte & 0x80u) ? -magnitude : magnitude;
}

inline float float_of_bits(uint32_t bits) {
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

// Little-endian fields of a record.
inline float bf16_at(const uint8_t* p) { return float_of_bits((uint32_t(p[0]) | uint32_t(p[1]) << 8) << 16); }
inline float fp32_at(const uint8_t* p) {
  return float_of_bits(uint32_t(p[0]) | uint32_t(p[1]) << 8 | uint32_t(p[2]) << 16 | uint32_t(p[3]) << 24);
}

// A query value (BF16 bits).
inline double bf16_bits_value(uint16_t bits) { return float_of_bits(uint32_t(bits) << 16); }

// Round an fp32 value to the nearest BF16 (ties to even), as the GPU kernels do with their K operands.
inline float round_to_bf16(float x) {
  if (std::isnan(x)) return x;
  uint32_t b;
  std::memcpy(&b, &x, 4);
  b += 0x7FFFu + ((b >> 16) & 1u);
  return float_of_bits(b & 0xFFFF0000u);
}

// ---- Record reader (FORMAT.md sections 3 and 5): the 576 fp32 values of K, V = K[0, 512) ----

inline void read_k_row(const RecordSpec& spec, const uint8_t* r, float layer_scale, float* k) {
  constexpr int kLatent = 512, kRope = 64;
  switch (spec.dtype) {
    case CacheDtype::bf16:  // 512 + 64 BF16 values, back to back
      for (int j = 0; j < kLatent + kRope; ++j) k[j] = bf16_at(r + 2 * j);
      return;
    case CacheDtype::fp8_ds_mla:  // E4M3 at j, fp32 tile scale at 512 + 4 (j / 128), BF16 RoPE at 528
      for (int j = 0; j < kLatent; ++j) k[j] = static_cast<float>(e4m3_value(r[j])) * fp32_at(r + 512 + 4 * (j / 128));
      for (int i = 0; i < kRope; ++i) k[kLatent + i] = bf16_at(r + 528 + 2 * i);
      return;
    case CacheDtype::nvfp4_ds_mla: {
      // Outer scale: 1 (implicit), the layer's (static) or the fp32 at 292 (dynamic).
      const float s = spec.scale_mode == ScaleMode::implicit  ? 1.0f
                      : spec.scale_mode == ScaleMode::dynamic ? fp32_at(r + 292)
                                                              : layer_scale;
      for (int j = 0; j < kLatent; ++j) {
        const unsigned code = (r[j / 2] >> (4 * (j % 2))) & 15u;  // even j: bits 3..0, odd j: bits 7..4
        const float d = static_cast<float>(e4m3_value(r[256 + j / 16]));
        k[j] = static_cast<float>(e2m1_value(code) * d) * s;  // e2m1 * d is exact; one fp32 rounding
      }
      const bool fp8_rope = spec.rope == RopeEncoding::fp8;  // 368 bytes: E4M3 times the fp32 at 288
      for (int i = 0; i < kRope; ++i)
        k[kLatent + i] = fp8_rope ? static_cast<float>(e4m3_value(r[304 + i])) * fp32_at(r + 288) : bf16_at(r + 304 + 2 * i);
      return;
    }
  }
}

// ---- Attention (sparse_mla.h) ----

struct Options {
  bool bf16_operands = false;  // K (and V) rounded to BF16 first (ReferenceOptions::bf16_operands)
  bool bounds = false;         // fill Result::element_bound and norm_bound
  // Entries per KV split of the kernel being bounded (0: one split); see the bounds below.
  int split_entries = 0;
  // The splits' normalized partials are rounded to BF16 before the merge (DecodePlan::partial_bytes 2).
  bool bf16_partials = false;
};

struct Result {
  std::vector<double> out;     // [rows, heads, 512]
  std::vector<double> lse;     // [rows, heads], in args.lse_base; -inf for a row without valid entries
  std::vector<double> scores;  // [rows, heads, topk]: sm_scale q.K, -inf where masked
  std::vector<double> element_bound;  // [rows, heads, 512] (Options::bounds)
  std::vector<double> norm_bound;     // [rows, heads]      (Options::bounds)
};

// Whether position `pos` of `row` is attended (sparse_mla.h): inside topk_length and
// 0 <= index < capacity.
inline bool attended(const SparseMlaArgs& a, int row, int pos) {
  if (a.topk_length && pos >= a.topk_length[row]) return false;
  const int64_t idx = a.indices[static_cast<int64_t>(row) * a.topk + pos];
  return idx >= 0 && idx < a.capacity;
}

// Error bounds for a GPU output computed with BF16 softmax weights (Options::bounds). With
// P_j the exact probabilities, v_j the values and out the exact output of a (row, head), a
// kernel that rounds each weight to BF16 (relative error eps_j, |eps_j| <= 2^-9) computes, to
// first order,
//   out + sum_j P_j eps_j (v_j - c_j)
// where c_j = 0 when it normalizes by the fp32 sum of the unrounded weights (the 16-head NVFP4
// kernels) and c_j = the mean of entry j's KV split when it normalizes each split by the sum of
// its rounded weights (the other kernels; splits are merged in fp32). Both give, per element d,
//   |error_d| <= 2^-9 sum_j P_j (|v_jd| + |c_jd|) <= 2^-8 A_d,   A_d = sum_j P_j |v_jd|,
// since sum_j P_j |c_jd| <= A_d, whatever the splits. The BF16 output adds at most 2^-9 |out_d|.
// The kernels' scores carry fp32 rounding: an error delta_j (in nats) of score j moves P_j by
// P_j (delta_j - sum_k P_k delta_k), so the output by at most sum_j P_j delta_j |v_jd| +
// Delta |out_d| (Delta = sum_j P_j delta_j). delta_j is taken as
// 64 u (sm_scale sum_d |q_d k_jd| + |s_j| + 64) + 2^-20 with u = 2^-24: at most 40 fp32
// roundings of the dot product's terms in the MMA accumulation, the scale multiply, the
// difference to the running maximum (|s_j - max| < 64 wherever P_j matters) and ex2.approx
// (2^-22). Element bound, 1.25x the first-order worst case 2^-8 A_d + 2^-9 |out_d| or more
// (fp32 accumulation of the products and the merge add ~2^-16 A_d at most):
//   2^-8 (1.25 A_d + |out_d|) + sum_j P_j delta_j |v_jd| + Delta |out_d| + 1e-30.
// Norm of the error vector: the first-order term is a sum of independent rounding errors (RMS
// about 2^-9 / sqrt(3)), so its norm stays below 4 x 2^-9 sqrt(S), S = sum_j m_j P_j^2
// |v_j - c_j|^2 taken for both choices of c_j (the larger), where m_j counts the entries whose
// score equals s_j exactly (duplicates and identical records round identically: Cauchy-Schwarz
// over such a group). With up to 16 entries carrying the weight, 4 sqrt(S) is not below the
// worst case sum_j P_j |v_j - c_j|; with more the rounding errors average out. Norm bound:
//   4 x 2^-9 sqrt(S) + sum_j P_j delta_j |v_j| + Delta |out| + 2^-8 |out| + 1e-30,
// which bounds | |got| - |out| | and hence the relative error of |out| (about 1.3-1.5% of |out| for
// a softmax over many comparable entries of order-1 values: a 2% scale error exceeds it).
// BF16 partials (Options::bf16_partials) round each split's normalized output c_s (relative error
// at most 2^-9 per element) before the merge weights W_s (the splits' shares of P): that adds
// 2^-9 B_d to the element bound, B_d = sum_s W_s |c_sd| = sum_s |sum_{j in s} P_j v_jd|, and
// 2^-9 |B| to the norm bound.

namespace detail {

constexpr double kU = 1.0 / 16777216.0;  // 2^-24

// Work buffers of one row's work item.
struct Scratch {
  std::vector<float> k;                    // [n, 576] K rows of the row's attended entries
  std::vector<int> pos;                    // their positions
  std::vector<double> s, w, abs_dot, delta, mult, v_norm;
  std::vector<int> order;
  std::vector<double> split_mean, split_sq;  // [splits, 512]: sum P v, sum m P^2 v
  std::vector<double> split_p, split_p2;     // [splits]: sum P, sum m P^2
};

inline void attend_head(const SparseMlaArgs& a, const Options& opt, int row, int h, Scratch& t, Result& res) {
  constexpr int kLatent = 512, kDim = 576;
  const size_t n = t.pos.size();
  const size_t rh = static_cast<size_t>(row) * a.heads + h;
  double* out = &res.out[rh * kLatent];
  double* scores = &res.scores[rh * a.topk];
  std::fill(scores, scores + a.topk, -std::numeric_limits<double>::infinity());
  std::fill(out, out + kLatent, 0.0);
  if (n == 0) {
    res.lse[rh] = -std::numeric_limits<double>::infinity();
    if (opt.bounds) {
      std::fill(&res.element_bound[rh * kLatent], &res.element_bound[rh * kLatent] + kLatent, 0.0);
      res.norm_bound[rh] = 0.0;
    }
    return;
  }
  double q[kDim];
  for (int d = 0; d < kDim; ++d) q[d] = bf16_bits_value(a.q[rh * kDim + d]);
  t.s.resize(n);
  t.abs_dot.resize(n);
  double m = -std::numeric_limits<double>::infinity();
  for (size_t j = 0; j < n; ++j) {
    const float* k = &t.k[j * kDim];
    // Four partial sums each: one fp64 chain of 576 dependent adds dominated the suites' CPU time.
    double dots[4] = {}, abs_dots[4] = {};
    for (int d = 0; d < kDim; d += 4)
      for (int i = 0; i < 4; ++i) {
        const double prod = q[d + i] * k[d + i];
        dots[i] += prod;
        abs_dots[i] += std::fabs(prod);
      }
    const double dot = (dots[0] + dots[1]) + (dots[2] + dots[3]);
    const double abs_dot = (abs_dots[0] + abs_dots[1]) + (abs_dots[2] + abs_dots[3]);
    t.s[j] = static_cast<double>(a.sm_scale) * dot;
    t.abs_dot[j] = std::fabs(static_cast<double>(a.sm_scale)) * abs_dot;
    scores[t.pos[j]] = t.s[j];
    m = std::max(m, t.s[j]);
  }
  t.w.resize(n);
  double sum = 0.0;
  for (size_t j = 0; j < n; ++j) sum += (t.w[j] = std::exp(t.s[j] - m));
  for (size_t j = 0; j < n; ++j) {
    t.w[j] /= sum;  // P_j
    const float* v = &t.k[j * kDim];
    for (int d = 0; d < kLatent; ++d) out[d] += t.w[j] * v[d];
  }
  const double ln = m + std::log(sum);
  res.lse[rh] = a.lse_base == LseBase::base2 ? ln / std::log(2.0) : ln;
  if (!opt.bounds) return;

  // Score errors and the multiplicity of each score.
  t.delta.resize(n);
  for (size_t j = 0; j < n; ++j) t.delta[j] = 64.0 * kU * (t.abs_dot[j] + std::fabs(t.s[j]) + 64.0) + 0x1p-20;
  t.order.resize(n);
  std::iota(t.order.begin(), t.order.end(), 0);
  std::sort(t.order.begin(), t.order.end(), [&](int x, int y) { return t.s[x] < t.s[y]; });
  t.mult.resize(n);
  for (size_t b = 0; b < n;) {
    size_t e = b + 1;
    while (e < n && t.s[t.order[e]] == t.s[t.order[b]]) ++e;
    for (size_t i = b; i < e; ++i) t.mult[t.order[i]] = static_cast<double>(e - b);
    b = e;
  }
  const int splits = opt.split_entries > 0 ? (a.topk + opt.split_entries - 1) / opt.split_entries : 1;
  t.split_mean.assign(static_cast<size_t>(splits) * kLatent, 0.0);
  t.split_sq.assign(static_cast<size_t>(splits) * kLatent, 0.0);
  t.split_p.assign(splits, 0.0);
  t.split_p2.assign(splits, 0.0);
  double* bound = &res.element_bound[rh * kLatent];
  std::fill(bound, bound + kLatent, 0.0);
  double a_sum[kLatent] = {};
  double big_delta = 0.0, delta_norm = 0.0, s_plain = 0.0;
  for (size_t j = 0; j < n; ++j) {
    const double p = t.w[j], mp2 = t.mult[j] * p * p;
    const int sp = opt.split_entries > 0 ? t.pos[j] / opt.split_entries : 0;
    const float* v = &t.k[j * kDim];
    double* mean = &t.split_mean[static_cast<size_t>(sp) * kLatent];
    double* sq = &t.split_sq[static_cast<size_t>(sp) * kLatent];
    for (int d = 0; d < kLatent; ++d) {
      a_sum[d] += p * std::fabs(v[d]);
      bound[d] += p * t.delta[j] * std::fabs(v[d]);
      mean[d] += p * v[d];
      sq[d] += mp2 * v[d];
    }
    t.split_p[sp] += p;
    t.split_p2[sp] += mp2;
    big_delta += p * t.delta[j];
    delta_norm += p * t.delta[j] * t.v_norm[j];
    s_plain += mp2 * t.v_norm[j] * t.v_norm[j];
  }
  // S with c_j = the split mean: sum m P^2 |v|^2 - 2 sum_i c_i . (sum m P^2 v) + sum_i |c_i|^2 sum m P^2.
  double s_split = s_plain;
  for (int sp = 0; sp < splits; ++sp) {
    if (t.split_p[sp] <= 0.0) continue;
    const double* mean = &t.split_mean[static_cast<size_t>(sp) * kLatent];
    const double* sq = &t.split_sq[static_cast<size_t>(sp) * kLatent];
    double cross = 0.0, c2 = 0.0;
    for (int d = 0; d < kLatent; ++d) {
      const double c = mean[d] / t.split_p[sp];
      cross += c * sq[d];
      c2 += c * c;
    }
    s_split += -2.0 * cross + c2 * t.split_p2[sp];
  }
  // BF16 partials: B_d = sum_s W_s |c_sd| = sum_s |sum_{j in s} P_j v_jd| (the split sums above).
  double partial_norm = 0.0;
  if (opt.bf16_partials) {
    for (int d = 0; d < kLatent; ++d) {
      double b = 0.0;
      for (int sp = 0; sp < splits; ++sp) b += std::fabs(t.split_mean[static_cast<size_t>(sp) * kLatent + d]);
      bound[d] += 0x1p-9 * b;
      partial_norm += b * b;
    }
    partial_norm = 0x1p-9 * std::sqrt(partial_norm);
  }
  double out_norm = 0.0;
  for (int d = 0; d < kLatent; ++d) {
    bound[d] += 0x1p-8 * (1.25 * a_sum[d] + std::fabs(out[d])) + big_delta * std::fabs(out[d]) + 1e-30;
    out_norm += out[d] * out[d];
  }
  out_norm = std::sqrt(out_norm);
  res.norm_bound[rh] = 4.0 * 0x1p-9 * std::sqrt(std::max({s_plain, s_split, 0.0})) + delta_norm +
                       big_delta * out_norm + 0x1p-8 * out_norm + 1e-30 + partial_norm;
}

// Reads the K rows of `row`'s attended entries into t.
inline void load_row(const RecordSpec& spec, const SparseMlaArgs& a, const Options& opt, int row, Scratch& t) {
  constexpr int kLatent = 512, kDim = 576;
  t.pos.clear();
  for (int p = 0; p < a.topk; ++p)
    if (attended(a, row, p)) t.pos.push_back(p);
  const size_t n = t.pos.size();
  t.k.resize(n * kDim);
  t.v_norm.resize(n);
  for (size_t j = 0; j < n; ++j) {
    const int64_t slot = a.indices[static_cast<int64_t>(row) * a.topk + t.pos[j]];
    float* k = &t.k[j * kDim];
    read_k_row(spec, a.cache + slot * spec.record_bytes(), a.layer_scale, k);
    if (opt.bf16_operands)
      for (int d = 0; d < kDim; ++d) k[d] = round_to_bf16(k[d]);
    double norm = 0.0;
    for (int d = 0; d < kLatent; ++d) norm += static_cast<double>(k[d]) * k[d];
    t.v_norm[j] = std::sqrt(norm);
  }
}

}  // namespace detail

// Out, LSE and scores of every (row, head) of `a` (host pointers), spread over threads.
inline Result attention(const RecordSpec& spec, const SparseMlaArgs& a, const Options& opt = {}) {
  constexpr int kLatent = 512;
  Result res;
  const size_t pairs = static_cast<size_t>(a.rows) * a.heads;
  res.out.assign(pairs * kLatent, 0.0);
  res.lse.assign(pairs, 0.0);
  res.scores.assign(pairs * a.topk, 0.0);
  if (opt.bounds) {
    res.element_bound.assign(pairs * kLatent, 0.0);
    res.norm_bound.assign(pairs, 0.0);
  }
  const int threads = nvfp4mla::detail::hardware_threads();
  const nvfp4mla::detail::RowHeadBlocks b = nvfp4mla::detail::row_head_blocks(a.rows, a.heads, threads);
  nvfp4mla::detail::parallel_for(b.items(), threads, [&](int64_t i) {
    const nvfp4mla::detail::RowHeadItem w = b.item(i);
    if (w.h0 >= w.h1) return;
    detail::Scratch t;
    detail::load_row(spec, a, opt, w.row, t);
    for (int h = w.h0; h < w.h1; ++h) detail::attend_head(a, opt, w.row, h, t, res);
  });
  return res;
}

}  // namespace nvfp4mla::testing::oracle
