// Exact top-k kernels (cuda/topk.h): radix select over order-preserving keys, then an ordered
// compaction. The CPU reference is topk_cpu.cpp (a full stable sort per row).
#include <cuda_runtime.h>

#include <cstdint>
#include <cub/block/block_load.cuh>
#include <cub/block/block_scan.cuh>
#include <string>

#include "device/cuda_check.h"
#include "nvfp4mla/cuda/topk.h"
#include "nvfp4mla/error.h"
#include "ops/topk/topk_radix.h"

namespace nvfp4mla::cuda {
namespace {

using namespace topk_radix;

constexpr int kThreads = 512;
constexpr int kItems = 8;              // entries per thread per compaction tile
constexpr int kTile = kThreads * kItems;
constexpr int kUnroll = 8;             // independent loads per thread in the histogram passes
constexpr uint32_t kNoBin = 0xFFFFFFFFu;
static_assert(kBins % kThreads == 0 && 2 * kThreads == (1 << digit_bits(2)), "bin loops assume 512 threads");
static_assert(kTile < (1 << 16), "a tile's counts are packed in 16-bit halves");

using BlockScanU32 = cub::BlockScan<uint32_t, kThreads>;
using BlockScanU64 = cub::BlockScan<unsigned long long, kThreads>;
using BlockLoadF32 = cub::BlockLoad<float, kThreads, kItems, cub::BLOCK_LOAD_WARP_TRANSPOSE>;

struct SharedStorage {
  uint32_t hist[kBins];
  union {
    typename BlockScanU32::TempStorage scan;
    typename BlockScanU64::TempStorage scan64;
    typename BlockLoadF32::TempStorage load;
  } temp;
  uint32_t digit, k_rem, above;
  bool last;
};

// A row's length. A length outside 0..columns is an error (the caller counts it once) and reads
// as 0, so the row selects nothing.
__device__ __forceinline__ int64_t row_length(const TopkArgs& a, int row, bool* bad) {
  if (!a.lengths) return a.columns;
  const int32_t len = a.lengths[row];
  const bool ok = len >= 0 && len <= a.columns;
  if (bad) *bad = !ok;
  return ok ? len : 0;
}

// Adds one to shared histogram bin `bin` for each lane whose bin is not kNoBin. All 32 lanes of
// the warp call it together; when they share a bin (all-equal rows), one atomic adds 32.
__device__ __forceinline__ void count_bin(uint32_t* hist, uint32_t bin) {
  const uint32_t first = __shfl_sync(0xFFFFFFFFu, bin, 0);
  if (__all_sync(0xFFFFFFFFu, bin == first)) {
    if ((threadIdx.x & 31) == 0 && first != kNoBin) atomicAdd(&hist[first], 32u);
  } else if (bin != kNoBin) {
    atomicAdd(&hist[bin], 1u);
  }
}

// Histogram of pass PASS's digit over the entries [begin, end) of a row whose keys start with
// `prefix` (the digits the earlier passes chose). Pass 2 also counts, per thread, the entries
// whose key is above the prefix. The loop bounds are uniform over the block, so every warp
// reaches count_bin whole.
template <int PASS>
__device__ void histogram_range(const float* __restrict__ v, int64_t begin, int64_t end, uint32_t prefix,
                                uint32_t* hist, uint32_t& above) {
  constexpr int kShift = digit_shift(PASS);
  constexpr uint32_t kMask = (1u << digit_bits(PASS)) - 1;
  for (int64_t base = begin; base < end; base += int64_t(kThreads) * kUnroll) {
    uint32_t bits[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int64_t c = base + u * kThreads + threadIdx.x;
      bits[u] = c < end ? __float_as_uint(v[c]) : 0u;
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int64_t c = base + u * kThreads + threadIdx.x;
      const uint32_t key = order_key(bits[u]);
      uint32_t bin = kNoBin;
      if (c < end) {
        if constexpr (PASS == 0) {
          bin = key >> kShift;
        } else {
          const uint32_t high = key >> (kShift + digit_bits(PASS));
          if (high == prefix)
            bin = (key >> kShift) & kMask;
          else if (PASS == 2 && high > prefix)
            ++above;
        }
      }
      count_bin(hist, bin);
    }
  }
}

// The digit of the k_rem-th largest key among the counted ones (`bins` counts read through
// get(bin)): the largest d with count[d] + count[d + 1] + ... >= k_rem. Leaves it in s.digit and
// k_rem minus the count above it in s.k_rem. Needs k_rem >= 1 and a total count >= k_rem.
template <class Get>
__device__ void find_digit(SharedStorage& s, int bins, uint32_t k_rem, Get get) {
  constexpr int kPer = kBins / kThreads;
  uint32_t h[kPer], sum = 0;
#pragma unroll
  for (int j = 0; j < kPer; ++j) {
    const int i = threadIdx.x * kPer + j;  // i = 0 is the top bin
    h[j] = i < bins ? get(bins - 1 - i) : 0u;
    sum += h[j];
  }
  uint32_t run;
  BlockScanU32(s.temp.scan).ExclusiveSum(sum, run);
#pragma unroll
  for (int j = 0; j < kPer; ++j) {
    if (run < k_rem && run + h[j] >= k_rem) {
      s.digit = bins - 1 - (threadIdx.x * kPer + j);
      s.k_rem = k_rem - run;
    }
    run += h[j];
  }
  __syncthreads();
}

// Writes one selected entry: its position (or slot) and value at output place `place`.
__device__ __forceinline__ void write_selected(const TopkArgs& a, const TopkOutputs& o, int row, uint32_t place,
                                               int64_t col, float value, unsigned long long* error_count) {
  const int64_t pos = a.positions ? a.positions[row * a.stride + col] : col + a.position_offset;
  int64_t id = pos;
  if (a.slots.block_table) {
    id = topk_slot(a.slots, row, pos);
    if (id < 0 && error_count) atomicAdd(error_count, 1ull);
  }
  const int64_t at = int64_t(row) * a.k + place;
  o.indices[at] = static_cast<int32_t>(id);
  if (o.values) o.values[at] = value;
}

// The selected entries of [begin, end) of a row, in column order: keys above the threshold T,
// and keys equal to T (T != 0) while fewer than `need` of those came before. gt_before and
// eq_before count the row's entries above and equal to T before `begin`. An entry's output
// place is the number of selected entries before it: (above T before it) + min(equal to T
// before it, need), or just the first when T = 0 (key 0 is never selected, so the entries equal
// to it, which eq_before counts in a split row, take no places).
__device__ void compact_range(SharedStorage& s, const TopkArgs& a, const TopkOutputs& o, int row, int64_t begin,
                              int64_t end, uint32_t T, uint32_t need, uint32_t gt_before, uint32_t eq_before,
                              unsigned long long* error_count) {
  const float* v = a.values + row * a.stride;
  for (int64_t tile = begin; tile < end; tile += kTile) {
    const int valid = static_cast<int>(end - tile < kTile ? end - tile : kTile);
    float x[kItems];
    BlockLoadF32(s.temp.load).Load(v + tile, x, valid, 0.0f);
    uint32_t key[kItems], gt = 0, eq = 0;
#pragma unroll
    for (int j = 0; j < kItems; ++j) {
      key[j] = threadIdx.x * kItems + j < valid ? order_key(__float_as_uint(x[j])) : 0u;
      gt += key[j] > T;
      eq += T != 0 && key[j] == T;
    }
    __syncthreads();  // the load's temporary storage becomes the scan's
    uint32_t excl, total;
    BlockScanU32(s.temp.scan).ExclusiveSum(gt | (eq << 16), excl, total);
    uint32_t g = gt_before + (excl & 0xFFFFu), e = eq_before + (excl >> 16);
    const uint32_t ties = T != 0 ? need : 0u;
#pragma unroll
    for (int j = 0; j < kItems; ++j) {
      const int64_t col = tile + threadIdx.x * kItems + j;
      if (key[j] > T) {
        write_selected(a, o, row, g + min(e, ties), col, x[j], error_count);
        ++g;
      } else if (T != 0 && key[j] == T) {
        if (e < need) write_selected(a, o, row, g + e, col, x[j], error_count);
        ++e;
      }
    }
    gt_before += total & 0xFFFFu;
    eq_before += total >> 16;
    __syncthreads();  // before the next tile's load reuses the storage
  }
}

// -1 (and -inf values) after the row's `count` selected entries, and topk_length.
__device__ void write_padding(const TopkArgs& a, const TopkOutputs& o, int row, uint32_t count) {
  for (int64_t i = count + threadIdx.x; i < a.k; i += kThreads) {
    o.indices[int64_t(row) * a.k + i] = -1;
    if (o.values) o.values[int64_t(row) * a.k + i] = -__int_as_float(0x7F800000);
  }
  if (threadIdx.x == 0) o.topk_length[row] = static_cast<int32_t>(count);
}

__device__ __forceinline__ uint32_t selected_count(uint32_t k_eff, uint32_t T, uint32_t need) {
  // T == 0: fewer than k_eff selectable entries, all taken (need counts the missing ones).
  return T != 0 ? k_eff : k_eff - need;
}

// One radix pass over a whole row by one CTA.
template <int PASS>
__device__ void row_pass(SharedStorage& s, const float* v, int64_t len, uint32_t& prefix, uint32_t& k_rem) {
  for (int b = threadIdx.x; b < kBins; b += kThreads) s.hist[b] = 0;
  __syncthreads();
  uint32_t above = 0;
  histogram_range<PASS>(v, 0, len, prefix, s.hist, above);
  __syncthreads();
  find_digit(s, 1 << digit_bits(PASS), k_rem, [&](int b) { return s.hist[b]; });
  prefix = (prefix << digit_bits(PASS)) | s.digit;
  k_rem = s.k_rem;
  __syncthreads();
}

__global__ void __launch_bounds__(kThreads) topk_row_per_cta(TopkArgs a, TopkOutputs o, unsigned long long* error_count) {
  __shared__ SharedStorage s;
  const int row = blockIdx.x;
  bool bad = false;
  const int64_t len = row_length(a, row, &bad);
  if (bad && threadIdx.x == 0 && error_count) atomicAdd(error_count, 1ull);
  const uint32_t k_eff = static_cast<uint32_t>(len < a.k ? len : a.k);
  const float* v = a.values + int64_t(row) * a.stride;
  uint32_t T = 0, need = 0;
  if (k_eff > 0) {
    need = k_eff;
    row_pass<0>(s, v, len, T, need);
    row_pass<1>(s, v, len, T, need);
    row_pass<2>(s, v, len, T, need);
  }
  compact_range(s, a, o, row, 0, len, T, need, 0, 0, error_count);
  write_padding(a, o, row, k_eff > 0 ? selected_count(k_eff, T, need) : 0);
}

// A row's part of a split_rows workspace (topk_radix.h).
struct SplitView {
  uint32_t* hist;     // [kPasses][kBins]
  RowState* state;
  uint32_t* suffix;   // [segments][kSegmentSuffixWords]
  uint32_t* offsets;  // [segments][kSegmentOffsetWords]
};
__device__ __forceinline__ SplitView split_view(void* ws, int rows, int segments, int row) {
  const SplitLayout l = split_layout(rows, segments);
  uint8_t* base = static_cast<uint8_t*>(ws);
  uint32_t* words = reinterpret_cast<uint32_t*>(base) + size_t(row) * kRowWords;
  return {words, reinterpret_cast<RowState*>(words + kPasses * kBins),
          reinterpret_cast<uint32_t*>(base + l.suffix_offset) + size_t(row) * segments * kSegmentSuffixWords,
          reinterpret_cast<uint32_t*>(base + l.offsets_offset) + size_t(row) * segments * kSegmentOffsetWords};
}

// The segment's last-pass counts as suffix sums: out[d] = above + hist[d] + ... + hist[1023],
// out[1024] = above.
__device__ void write_suffix(SharedStorage& s, uint32_t* out) {
  const int hi = 1023 - 2 * threadIdx.x;
  const uint32_t h1 = s.hist[hi], h0 = s.hist[hi - 1];
  uint32_t excl;
  BlockScanU32(s.temp.scan).ExclusiveSum(h1 + h0, excl);
  const uint32_t above = s.above;
  out[hi] = above + excl + h1;
  out[hi - 1] = above + excl + h1 + h0;
  if (threadIdx.x == 0) out[1024] = above;
}

// Pass PASS of a split row: each CTA adds its segment's histogram to the row's; the last CTA
// of the row to finish finds the digit. After pass 2 it also sets the threshold and turns the
// segments' counts into their offsets.
template <int PASS>
__global__ void __launch_bounds__(kThreads) topk_split_pass(TopkArgs a, int segments, int64_t segment_len, void* ws) {
  __shared__ SharedStorage s;
  const int row = static_cast<int>(blockIdx.x / segments), seg = static_cast<int>(blockIdx.x % segments);
  const int64_t len = row_length(a, row, nullptr);
  const int64_t begin = int64_t(seg) * segment_len;
  if (begin >= len) return;
  const int64_t end = begin + segment_len < len ? begin + segment_len : len;
  const uint32_t nseg = static_cast<uint32_t>((len + segment_len - 1) / segment_len);
  const SplitView w = split_view(ws, a.rows, segments, row);
  const uint32_t prefix = PASS == 0 ? 0u : w.state->prefix;
  constexpr int kDigitBins = 1 << digit_bits(PASS);

  for (int b = threadIdx.x; b < kBins; b += kThreads) s.hist[b] = 0;
  if (threadIdx.x == 0) s.above = 0;
  __syncthreads();
  uint32_t above = 0;
  histogram_range<PASS>(a.values + int64_t(row) * a.stride, begin, end, prefix, s.hist, above);
  if (PASS == 2 && above) atomicAdd(&s.above, above);
  __syncthreads();
  for (int b = threadIdx.x; b < kDigitBins; b += kThreads)
    if (s.hist[b]) atomicAdd(&w.hist[PASS * kBins + b], s.hist[b]);
  if (PASS == 2) write_suffix(s, w.suffix + size_t(seg) * kSegmentSuffixWords);
  __threadfence();
  __syncthreads();
  if (threadIdx.x == 0) s.last = atomicAdd(&w.state->arrived[PASS], 1u) == nseg - 1;
  __syncthreads();
  if (!s.last) return;
  __threadfence();

  const uint32_t k_eff = static_cast<uint32_t>(len < a.k ? len : a.k);
  const uint32_t k_rem = PASS == 0 ? k_eff : w.state->k_rem;
  const uint32_t* row_hist = w.hist + PASS * kBins;
  find_digit(s, kDigitBins, k_rem, [&](int b) { return __ldcg(row_hist + b); });
  const uint32_t digit = s.digit, rem = s.k_rem;
  if (threadIdx.x == 0) {
    w.state->prefix = (prefix << digit_bits(PASS)) | digit;
    w.state->k_rem = rem;
  }
  if (PASS != 2) return;

  const uint32_t T = (prefix << digit_bits(PASS)) | digit;
  if (threadIdx.x == 0) {
    w.state->threshold = T;
    w.state->need = rem;
    w.state->count = selected_count(k_eff, T, rem);
  }
  // Segment s: entries above T = suffix[digit + 1], equal to T = suffix[digit] - suffix[digit + 1];
  // exclusive sums over the segments, packed (above << 32 | equal; each total < 2^31).
  unsigned long long carry = 0;
  for (uint32_t first = 0; first < nseg; first += kThreads) {
    const uint32_t sg = first + threadIdx.x;
    unsigned long long packed = 0;
    if (sg < nseg) {
      const uint32_t* sf = w.suffix + size_t(sg) * kSegmentSuffixWords;
      const uint32_t ge = __ldcg(sf + digit), gt = __ldcg(sf + digit + 1);
      packed = (static_cast<unsigned long long>(gt) << 32) | (ge - gt);
    }
    unsigned long long excl, total;
    BlockScanU64(s.temp.scan64).ExclusiveSum(packed, excl, total);
    excl += carry;
    if (sg < nseg) {
      w.offsets[size_t(sg) * kSegmentOffsetWords] = static_cast<uint32_t>(excl >> 32);
      w.offsets[size_t(sg) * kSegmentOffsetWords + 1] = static_cast<uint32_t>(excl);
    }
    carry += total;
    __syncthreads();
  }
}

// The compaction of a split row: each CTA writes its segment's selected entries at the offsets
// pass 2 computed; the row's first CTA writes the padding and topk_length.
__global__ void __launch_bounds__(kThreads) topk_split_write(TopkArgs a, TopkOutputs o, int segments, int64_t segment_len,
                                                             void* ws, unsigned long long* error_count) {
  __shared__ SharedStorage s;
  const int row = static_cast<int>(blockIdx.x / segments), seg = static_cast<int>(blockIdx.x % segments);
  bool bad = false;
  const int64_t len = row_length(a, row, &bad);
  const SplitView w = split_view(ws, a.rows, segments, row);
  const RowState st = *w.state;
  if (seg == 0) {
    if (bad && threadIdx.x == 0 && error_count) atomicAdd(error_count, 1ull);
    write_padding(a, o, row, st.count);
  }
  const int64_t begin = int64_t(seg) * segment_len;
  if (begin >= len) return;
  const int64_t end = begin + segment_len < len ? begin + segment_len : len;
  compact_range(s, a, o, row, begin, end, st.threshold, st.need, w.offsets[size_t(seg) * kSegmentOffsetWords],
                w.offsets[size_t(seg) * kSegmentOffsetWords + 1], error_count);
}

}  // namespace

void topk(const TopkArgs& a, const TopkPlan& plan, void* workspace, size_t workspace_bytes, const TopkOutputs& out,
          unsigned long long* error_count, cudaStream_t stream) {
  validate_topk_args(a, out);
  if (reinterpret_cast<uintptr_t>(error_count) % alignof(unsigned long long) != 0)
    throw Error("top-k: error_count is not aligned to 8 bytes");
  if (plan.kernel == TopkKernel::split_rows) {
    if (plan.segments < 1 || plan.segment_len < 1 || int64_t(plan.segments) * plan.segment_len < a.columns)
      throw Error("top-k: the plan's " + std::to_string(plan.segments) + " segments of " + std::to_string(plan.segment_len) +
                  " entries do not cover the " + std::to_string(a.columns) + " columns (plan it for these arguments)");
    if (int64_t(a.rows) * plan.segments > INT32_MAX) throw Error("top-k: rows x segments exceeds the grid");
    const size_t need = topk_workspace_bytes(plan, a.rows);
    if (workspace_bytes < need)
      throw Error("top-k: workspace of " + std::to_string(workspace_bytes) + " bytes; the plan needs " + std::to_string(need));
    if (need && (!workspace || reinterpret_cast<uintptr_t>(workspace) % 16 != 0))
      throw Error("top-k: workspace is null or not 16-byte aligned");
  }
  if (a.rows == 0) return;
  if (plan.kernel == TopkKernel::row_per_cta) {
    topk_row_per_cta<<<a.rows, kThreads, 0, stream>>>(a, out, error_count);
    check_launch("top-k kernel");
    return;
  }
  const unsigned grid = static_cast<unsigned>(a.rows * plan.segments);
  check(cudaMemsetAsync(workspace, 0, split_layout(a.rows, plan.segments).zeroed_bytes, stream), "top-k workspace reset");
  topk_split_pass<0><<<grid, kThreads, 0, stream>>>(a, plan.segments, plan.segment_len, workspace);
  check_launch("top-k pass 0");
  topk_split_pass<1><<<grid, kThreads, 0, stream>>>(a, plan.segments, plan.segment_len, workspace);
  check_launch("top-k pass 1");
  topk_split_pass<2><<<grid, kThreads, 0, stream>>>(a, plan.segments, plan.segment_len, workspace);
  check_launch("top-k pass 2");
  topk_split_write<<<grid, kThreads, 0, stream>>>(a, out, plan.segments, plan.segment_len, workspace, error_count);
  check_launch("top-k compaction");
}

}  // namespace nvfp4mla::cuda
