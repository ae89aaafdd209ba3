// CPU reference for sparse MLA attention: dequantize through the format module, accumulate
// in fp64. Rows and blocks of heads are independent and are spread over the hardware threads.
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "nvfp4mla/codec.h"
#include "nvfp4mla/error.h"
#include "nvfp4mla/record.h"
#include "nvfp4mla/sparse_mla.h"
#include "threads/parallel_for.h"

namespace nvfp4mla {

void validate_sparse_mla_args(const RecordSpec& spec, const SparseMlaArgs& a) {
  if (a.rows < 0 || a.heads <= 0) throw Error("sparse MLA: rows must be >= 0 and heads > 0");
  if (a.topk <= 0) throw Error("sparse MLA: topk must be positive");
  if (a.capacity < 0) throw Error("sparse MLA: negative cache capacity");
  if (a.rows > 0 && (!a.q || !a.indices)) throw Error("sparse MLA: q and indices are required");
  if (a.capacity > 0 && !a.cache) throw Error("sparse MLA: cache pointer is null");
  if (!std::isfinite(a.sm_scale)) throw Error("sparse MLA: sm_scale must be finite");
  if (spec.scale_mode == ScaleMode::static_calibrated && !(std::isfinite(a.layer_scale) && a.layer_scale > 0.0f))
    throw Error("sparse MLA: static scale mode needs a finite positive layer scale");
}

namespace {

// K row (576 values) of one slot: the dequantized record, rounded to BF16 on request.
void decode_k_row(const RecordSpec& spec, const SparseMlaArgs& a, int64_t slot, const ReferenceOptions& opt, float* k) {
  record::decode(spec, a.cache + slot * spec.record_bytes(), a.layer_scale, k, k + kLatentDim);
  if (opt.bf16_operands)
    for (int d = 0; d < kQkDim; ++d) k[d] = codec::bf16_decode(codec::bf16_encode_rn(k[d]));
}

// Heads [h0, h1) of `row`: its valid entries dequantized once, then each head over them.
void attend_heads(const RecordSpec& spec, const SparseMlaArgs& a, const ReferenceOptions& opt, int row, int h0, int h1,
                  float* out, float* lse) {
  std::vector<int> valid;
  for (int p = 0; p < a.topk; ++p)
    if (sparse_entry_valid(a, row, p)) valid.push_back(p);
  const size_t n = valid.size();
  std::vector<float> k_buf(n * kQkDim);
  for (size_t j = 0; j < n; ++j)
    decode_k_row(spec, a, a.indices[static_cast<int64_t>(row) * a.topk + valid[j]], opt, &k_buf[j * kQkDim]);
  std::vector<double> scores(n), acc(kLatentDim);
  for (int h = h0; h < h1; ++h) {
    const uint16_t* q = a.q + (static_cast<int64_t>(row) * a.heads + h) * kQkDim;
    float* o = out + (static_cast<int64_t>(row) * a.heads + h) * kLatentDim;
    float& l = lse[static_cast<int64_t>(row) * a.heads + h];
    if (n == 0) {
      std::fill(o, o + kLatentDim, 0.0f);
      l = -std::numeric_limits<float>::infinity();
      continue;
    }
    double qf[kQkDim];
    for (int d = 0; d < kQkDim; ++d) qf[d] = codec::bf16_decode(q[d]);
    double m = -std::numeric_limits<double>::infinity();
    for (size_t j = 0; j < n; ++j) {
      const float* k = &k_buf[j * kQkDim];
      // Four partial sums: a single chain of 576 dependent fp64 adds was most of the time.
      double dots[4] = {};
      for (int d = 0; d < kQkDim; d += 4)
        for (int i = 0; i < 4; ++i) dots[i] += qf[d + i] * k[d + i];
      const double dot = (dots[0] + dots[1]) + (dots[2] + dots[3]);
      scores[j] = static_cast<double>(a.sm_scale) * dot;
      m = std::max(m, scores[j]);
    }
    double sum = 0;
    std::fill(acc.begin(), acc.end(), 0.0);
    for (size_t j = 0; j < n; ++j) {
      const double p = std::exp(scores[j] - m);
      sum += p;
      const float* v = &k_buf[j * kQkDim];
      for (int d = 0; d < kLatentDim; ++d) acc[d] += p * v[d];
    }
    for (int d = 0; d < kLatentDim; ++d) o[d] = static_cast<float>(acc[d] / sum);
    const double ln = m + std::log(sum);
    l = static_cast<float>(a.lse_base == LseBase::base2 ? ln / std::log(2.0) : ln);
  }
}

}  // namespace

void sparse_mla_reference(const RecordSpec& spec, const SparseMlaArgs& a, float* out, float* lse,
                          const ReferenceOptions& opt) {
  validate_sparse_mla_args(spec, a);
  const int threads = detail::hardware_threads();
  const detail::RowHeadBlocks b = detail::row_head_blocks(a.rows, a.heads, threads);
  detail::parallel_for(b.items(), threads, [&](int64_t i) {
    const detail::RowHeadItem w = b.item(i);
    if (w.h0 < w.h1) attend_heads(spec, a, opt, w.row, w.h0, w.h1, out, lse);
  });
}

// Each referenced record is decoded once per call (rows often share records), then fp64 dot
// products in four partial sums (the result does not depend on the order to ~1e-15).
void sparse_mla_scores_reference(const RecordSpec& spec, const SparseMlaArgs& a, float* scores,
                                 const ReferenceOptions& opt) {
  validate_sparse_mla_args(spec, a);
  std::vector<int32_t> k_row_of_slot(static_cast<size_t>(a.capacity), -1);
  std::vector<float> k;
  int32_t decoded = 0;
  for (int r = 0; r < a.rows; ++r)
    for (int p = 0; p < a.topk; ++p) {
      if (!sparse_entry_valid(a, r, p)) continue;
      const int64_t slot = a.indices[static_cast<int64_t>(r) * a.topk + p];
      if (k_row_of_slot[static_cast<size_t>(slot)] >= 0) continue;
      k_row_of_slot[static_cast<size_t>(slot)] = decoded++;
      k.resize(static_cast<size_t>(decoded) * kQkDim);
      decode_k_row(spec, a, slot, opt, &k[static_cast<size_t>(decoded - 1) * kQkDim]);
    }
  double q[kQkDim];
  for (int r = 0; r < a.rows; ++r) {
    for (int h = 0; h < a.heads; ++h) {
      const uint16_t* qb = a.q + (static_cast<int64_t>(r) * a.heads + h) * kQkDim;
      for (int d = 0; d < kQkDim; ++d) q[d] = codec::bf16_decode(qb[d]);
      float* s = scores + (static_cast<int64_t>(r) * a.heads + h) * a.topk;
      for (int p = 0; p < a.topk; ++p) {
        if (!sparse_entry_valid(a, r, p)) {
          s[p] = -std::numeric_limits<float>::infinity();
          continue;
        }
        const int64_t slot = a.indices[static_cast<int64_t>(r) * a.topk + p];
        const float* kp = &k[static_cast<size_t>(k_row_of_slot[static_cast<size_t>(slot)]) * kQkDim];
        double part[4] = {0.0, 0.0, 0.0, 0.0};
        for (int d = 0; d < kQkDim; d += 4)
          for (int j = 0; j < 4; ++j) part[j] += q[d + j] * kp[d + j];
        const double dot = (part[0] + part[1]) + (part[2] + part[3]);
        s[p] = static_cast<float>(static_cast<double>(a.sm_scale) * dot);
      }
    }
  }
}

}  // namespace nvfp4mla
