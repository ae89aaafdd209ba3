// Exact top-k kernels (cuda/topk.h): radix select over order-preserving keys, then an ordered
// compaction. The CPU reference is topk_cpu.cpp (a full stable sort per row).
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cub/block/block_load.cuh>
#include <cub/block/block_radix_sort.cuh>
#include <cub/block/block_scan.cuh>
#include <mutex>
#include <string>
#include <type_traits>

#include "device/cuda_check.h"
#include "device/per_device.h"
#include "nvfp4mla/cuda/topk.h"
#include "nvfp4mla/error.h"
#include "ops/topk/topk_radix.h"

namespace nvfp4mla::cuda {
namespace {

using namespace topk_radix;

constexpr int kThreads = 512;
constexpr int kItems = 8;              // entries per thread per compaction tile
constexpr int kTile = kThreads * kItems;
constexpr int kUnroll = 4;             // independent 16-byte loads per thread per round of a walk
constexpr int kVec = 4;                // entries per load
constexpr int kRound = kThreads * kUnroll * kVec;  // entries a block visits per round
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
  uint32_t digit, k_rem, bin_count, above;
  bool last;
  uint32_t cursor[2];  // the filter's next free places within the segment's; resident: the counts before it
};

// The kernels after a split row's first pass are launched as programmatic dependents of the one
// before (sm_90 on): their CTAs are scheduled while it drains and wait here, before touching
// memory, for it to complete and its writes to be visible. Elsewhere a no-op.
__device__ __forceinline__ void wait_for_previous_kernel() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

// A row's length. A length outside 0..columns is an error (the caller counts it once) and reads
// as 0, so the row selects nothing.
__device__ __forceinline__ int64_t row_length(const TopkArgs& a, int row, bool* bad) {
  if (!a.lengths) return a.columns;
  const int32_t len = a.lengths[row];
  const bool ok = len >= 0 && len <= a.columns;
  if (bad) *bad = !ok;
  return ok ? len : 0;
}

// Whether a row's entries can be read 16 bytes at a time (walks start at multiples of 4).
__device__ __forceinline__ bool rows_are_vector_aligned(const TopkArgs& a) {
  return reinterpret_cast<uintptr_t>(a.values) % 16 == 0 && a.stride % kVec == 0;
}

// One round of a block's walk over the entries [begin, end) of a row: thread t gets the entries
// base + (u * kThreads + t) * kVec + j (u < kUnroll, j < kVec), all its loads issued before any
// is used. In a full round (every entry before `end`, 16-byte loads) avail is not read; in the
// last round avail[u] of them (0..kVec) are before `end` and the others read as 0.
struct Round {
  uint32_t bits[kUnroll][kVec];
  int avail[kUnroll];
};
__device__ __forceinline__ void load_full_round(const float* __restrict__ v, int64_t base, Round& r) {
#pragma unroll
  for (int u = 0; u < kUnroll; ++u) {
    const float4 x = __ldg(reinterpret_cast<const float4*>(v + base + (u * kThreads + threadIdx.x) * kVec));
    r.bits[u][0] = __float_as_uint(x.x);
    r.bits[u][1] = __float_as_uint(x.y);
    r.bits[u][2] = __float_as_uint(x.z);
    r.bits[u][3] = __float_as_uint(x.w);
  }
}
__device__ __forceinline__ void load_partial_round(const float* __restrict__ v, int64_t base, int64_t end, Round& r) {
#pragma unroll
  for (int u = 0; u < kUnroll; ++u) {
    const int64_t c = base + (int64_t(u) * kThreads + threadIdx.x) * kVec;
    const int64_t left = end - c;
    r.avail[u] = left <= 0 ? 0 : left >= kVec ? kVec : static_cast<int>(left);
#pragma unroll
    for (int j = 0; j < kVec; ++j) r.bits[u][j] = j < r.avail[u] ? __float_as_uint(v[c + j]) : 0u;
  }
}
__device__ __forceinline__ int64_t round_column(int64_t base, int u, int j) {
  return base + (int64_t(u) * kThreads + threadIdx.x) * kVec + j;
}
// Walks [begin, end) in rounds, calling body(round, base, full) with full a std::true_type or
// std::false_type, so the full rounds compile without bounds checks. Rounds are block-uniform.
template <class Body>
__device__ __forceinline__ void walk(const float* __restrict__ v, int64_t begin, int64_t end, bool vec, Body body) {
  for (int64_t base = begin; base < end; base += kRound) {
    Round r;
    if (vec && base + kRound <= end) {
      load_full_round(v, base, r);
      body(r, base, std::true_type{});
    } else {
      load_partial_round(v, base, end, r);
      body(r, base, std::false_type{});
    }
  }
}
// Whether entry (u, j) of a round is before the walk's end.
template <class Full>
__device__ __forceinline__ bool entry_valid(const Round& r, Full, int u, int j) {
  return Full::value || j < r.avail[u];
}

// Counts one key in pass PASS's histogram: its digit, when its higher digits equal `prefix`
// (the digits the earlier passes chose; pass 0: always). Passes 1 and 2 count keys above the
// prefix in `above`.
template <int PASS>
__device__ __forceinline__ void count_digit(uint32_t key, uint32_t prefix, uint32_t* hist, uint32_t& above) {
  constexpr int kShift = digit_shift(PASS);
  constexpr uint32_t kMask = (1u << digit_bits(PASS)) - 1;
  if constexpr (PASS == 0) {
    atomicAdd(&hist[key >> kShift], 1u);
  } else {
    const uint32_t high = key >> (kShift + digit_bits(PASS));
    if (high == prefix)
      atomicAdd(&hist[(key >> kShift) & kMask], 1u);
    else if (high > prefix)
      ++above;
  }
}

// Histogram of pass PASS's digit over the entries [begin, end) of a row whose keys start with
// `prefix` (count_digit).
template <int PASS>
__device__ void histogram_range(const float* __restrict__ v, int64_t begin, int64_t end, bool vec, uint32_t prefix,
                                uint32_t* hist, uint32_t& above) {
  walk(v, begin, end, vec, [&](const Round& r, int64_t, auto full) {
#pragma unroll
    for (int u = 0; u < kUnroll; ++u)
#pragma unroll
      for (int j = 0; j < kVec; ++j)
        if (entry_valid(r, full, u, j)) count_digit<PASS>(order_key(r.bits[u][j]), prefix, hist, above);
  });
}

// The digit of the k_rem-th largest key among the counted ones (`bins` counts read through
// get(bin)): the largest d with count[d] + count[d + 1] + ... >= k_rem. Leaves it in s.digit,
// its count in s.bin_count and k_rem minus the count above it in s.k_rem. Needs k_rem >= 1 and a
// total count >= k_rem.
template <class Shared, class Get>
__device__ void find_digit(Shared& s, int bins, uint32_t k_rem, Get get) {
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
      s.bin_count = h[j];
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

// One entry of a compaction in column order (compact_range): written at its place when
// selected, with value_of() its value (read only then). g and e count the selected entries above
// T and the entries equal to T before it (T != 0), and move past it; ties = T != 0 ? need : 0.
// (key by reference: with a copy ptxas schedules compact_range's loop differently.)
template <class ValueOf>
__device__ __forceinline__ void place_if_selected(const TopkArgs& a, const TopkOutputs& o, int row, int64_t col,
                                                  const uint32_t& key, uint32_t T, uint32_t need, uint32_t ties,
                                                  uint32_t& g, uint32_t& e, ValueOf value_of,
                                                  unsigned long long* error_count) {
  if (key > T) {
    write_selected(a, o, row, g + min(e, ties), col, value_of(), error_count);
    ++g;
  } else if (T != 0 && key == T) {
    if (e < need) write_selected(a, o, row, g + e, col, value_of(), error_count);
    ++e;
  }
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
      place_if_selected(a, o, row, col, key[j], T, need, ties, g, e, [&] { return x[j]; }, error_count);
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
__device__ void row_pass(SharedStorage& s, const float* v, int64_t len, bool vec, uint32_t& prefix, uint32_t& k_rem) {
  for (int b = threadIdx.x; b < kBins; b += kThreads) s.hist[b] = 0;
  __syncthreads();
  uint32_t above = 0;
  histogram_range<PASS>(v, 0, len, vec, prefix, s.hist, above);
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
    const bool vec = rows_are_vector_aligned(a);
    row_pass<0>(s, v, len, vec, T, need);
    row_pass<1>(s, v, len, vec, T, need);
    row_pass<2>(s, v, len, vec, T, need);
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
  uint2* candidates;  // [candidates] (column, key)
  uint32_t* sure;     // [kTopkMaxK] columns
};
__device__ __forceinline__ SplitView split_view(void* ws, int rows, int segments, int64_t candidates, int row) {
  const SplitLayout l = split_layout(rows, segments, candidates);
  uint8_t* base = static_cast<uint8_t*>(ws);
  uint32_t* words = reinterpret_cast<uint32_t*>(base) + size_t(row) * kRowWords;
  return {words, reinterpret_cast<RowState*>(words + kPasses * kBins),
          reinterpret_cast<uint32_t*>(base + l.suffix_offset) + size_t(row) * segments * kSegmentSuffixWords,
          reinterpret_cast<uint32_t*>(base + l.offsets_offset) + size_t(row) * segments * kSegmentOffsetWords,
          reinterpret_cast<uint2*>(base + l.candidate_offset) + size_t(row) * candidates,
          reinterpret_cast<uint32_t*>(base + l.sure_offset) + size_t(row) * kTopkMaxK};
}

// A segment's counts of one pass as suffix sums over its kDigitBins digits: out[d] = above +
// hist[d] + ... + hist[kDigitBins - 1], out[kDigitBins] = above (above: the entries whose key is
// above the pass's prefix). For digit D, out[D + 1] entries of the segment are above D and
// out[D] - out[D + 1] have it.
template <int kDigitBins>
__device__ void write_suffix(SharedStorage& s, uint32_t* out) {
  constexpr int kPer = kDigitBins / kThreads;
  static_assert(kPer * kThreads == kDigitBins, "whole bins per thread");
  uint32_t h[kPer], sum = 0;
#pragma unroll
  for (int j = 0; j < kPer; ++j) {
    h[j] = s.hist[kDigitBins - 1 - (threadIdx.x * kPer + j)];
    sum += h[j];
  }
  uint32_t run;
  BlockScanU32(s.temp.scan).ExclusiveSum(sum, run);
  run += s.above;
#pragma unroll
  for (int j = 0; j < kPer; ++j) {
    run += h[j];
    out[kDigitBins - 1 - (threadIdx.x * kPer + j)] = run;
  }
  if (threadIdx.x == 0) out[kDigitBins] = s.above;
}

// Pass PASS of a split row whose stage is still open: each CTA adds its segment's histogram to
// the row's and keeps its own as suffix sums; the last CTA of the row to finish finds the digit.
// When the entries sharing the chosen prefix fit the candidate buffer (passes 0 and 1), it hands
// the row to the filter; after pass 2 it sets the threshold. Either way it then turns the
// segments' counts into their offsets: entries above the digit and with it, in the segments
// before each (the filter's places for sure entries and candidates, or the compaction's).
template <int PASS>
__global__ void __launch_bounds__(kThreads)
    topk_split_pass(TopkArgs a, int segments, int64_t segment_len, int64_t candidates, void* ws) {
  __shared__ SharedStorage s;
  wait_for_previous_kernel();
  const int row = static_cast<int>(blockIdx.x / segments), seg = static_cast<int>(blockIdx.x % segments);
  const int64_t len = row_length(a, row, nullptr);
  const int64_t begin = int64_t(seg) * segment_len;
  if (begin >= len) return;
  const int64_t end = begin + segment_len < len ? begin + segment_len : len;
  const uint32_t nseg = static_cast<uint32_t>((len + segment_len - 1) / segment_len);
  const SplitView w = split_view(ws, a.rows, segments, candidates, row);
  if (PASS > 0 && w.state->stage != 0) return;
  const uint32_t prefix = PASS == 0 ? 0u : w.state->prefix;
  constexpr int kDigitBins = 1 << digit_bits(PASS);

  for (int b = threadIdx.x; b < kBins; b += kThreads) s.hist[b] = 0;
  if (threadIdx.x == 0) s.above = 0;
  __syncthreads();
  uint32_t above = 0;
  histogram_range<PASS>(a.values + int64_t(row) * a.stride, begin, end, rows_are_vector_aligned(a), prefix, s.hist, above);
  if (above) atomicAdd(&s.above, above);
  __syncthreads();
  for (int b = threadIdx.x; b < kDigitBins; b += kThreads)
    if (s.hist[b]) atomicAdd(&w.hist[PASS * kBins + b], s.hist[b]);
  // Passes 0 and 1 keep the counts only for a plan that can filter (they give the filter's offsets).
  if (PASS == 2 || candidates > 0) write_suffix<kDigitBins>(s, w.suffix + size_t(seg) * kSegmentSuffixWords);
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
  const bool filter = PASS < 2 && s.bin_count <= candidates;
  const uint32_t T = (prefix << digit_bits(PASS)) | digit;
  if (threadIdx.x == 0) {
    w.state->prefix = T;
    w.state->k_rem = rem;
    if (filter) w.state->stage = PASS == 0 ? kStageFilter11 : kStageFilter22;
    if (PASS == 2) {
      w.state->stage = kStageThreshold;
      w.state->threshold = T;
      w.state->need = rem;
      w.state->count = selected_count(k_eff, T, rem);
    }
  }
  if (PASS < 2 && !filter) return;
  // Segment s: entries above the digit = suffix[digit + 1], with it = suffix[digit] - suffix[digit + 1];
  // exclusive sums over the segments, packed (above << 32 | with; each total < 2^31).
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
  if (filter && threadIdx.x == 0) {
    w.state->sure = static_cast<uint32_t>(carry >> 32);
    w.state->candidates = static_cast<uint32_t>(carry);
  }
}

// The filter of a split row at stage kStageFilter11 / kStageFilter22 (BITS = 11 / 22 key bits
// known): entries whose top BITS key bits are above the row's prefix are sure to be selected,
// those equal to it are candidates. The segment's places in the row's buffers start at the
// offsets the deciding pass computed; each warp takes its places within them with a
// shared-memory atomic per round. The order within the buffers does not matter: the finisher
// sorts.
template <int BITS>
__device__ void filter_range(SharedStorage& s, const float* __restrict__ v, int64_t begin, int64_t end, bool vec,
                             uint32_t prefix, const SplitView& w, int seg, int64_t candidates) {
  constexpr int kShift = 32 - BITS;
  if (threadIdx.x == 0) s.cursor[0] = s.cursor[1] = 0;
  __syncthreads();
  const uint32_t sure_before = w.offsets[size_t(seg) * kSegmentOffsetWords];
  const uint32_t cand_before = w.offsets[size_t(seg) * kSegmentOffsetWords + 1];
  const int lane = threadIdx.x & 31;
  walk(v, begin, end, vec, [&](const Round& r, int64_t base, auto full) {
    uint32_t key[kUnroll][kVec];
    uint32_t counts = 0;  // sure | candidates << 16 (at most kUnroll * kVec each)
#pragma unroll
    for (int u = 0; u < kUnroll; ++u)
#pragma unroll
      for (int j = 0; j < kVec; ++j) {
        key[u][j] = order_key(r.bits[u][j]);
        const uint32_t high = key[u][j] >> kShift;
        if (entry_valid(r, full, u, j)) counts += high > prefix ? 1u : high == prefix ? 0x10000u : 0u;
      }
    if (!__any_sync(0xFFFFFFFFu, counts != 0)) return;
    uint32_t incl = counts;
#pragma unroll
    for (int d = 1; d < 32; d *= 2) {
      const uint32_t up = __shfl_up_sync(0xFFFFFFFFu, incl, d);
      if (lane >= d) incl += up;
    }
    uint32_t warp_sure = 0, warp_cand = 0;
    if (lane == 31) {
      warp_sure = (incl & 0xFFFFu) ? atomicAdd(&s.cursor[0], incl & 0xFFFFu) : 0u;
      warp_cand = (incl >> 16) ? atomicAdd(&s.cursor[1], incl >> 16) : 0u;
    }
    warp_sure = __shfl_sync(0xFFFFFFFFu, warp_sure, 31);
    warp_cand = __shfl_sync(0xFFFFFFFFu, warp_cand, 31);
    if (counts == 0) return;
    const uint32_t before = incl - counts;
    uint32_t at_sure = sure_before + warp_sure + (before & 0xFFFFu);
    uint32_t at_cand = cand_before + warp_cand + (before >> 16);
#pragma unroll
    for (int u = 0; u < kUnroll; ++u)
#pragma unroll
      for (int j = 0; j < kVec; ++j) {
        if (!entry_valid(r, full, u, j)) continue;
        const uint32_t high = key[u][j] >> kShift;
        const uint32_t c = static_cast<uint32_t>(round_column(base, u, j));
        if (high > prefix) {
          if (at_sure < kTopkMaxK) w.sure[at_sure] = c;
          ++at_sure;
        } else if (high == prefix) {
          if (at_cand < candidates) w.candidates[at_cand] = make_uint2(c, key[u][j]);
          ++at_cand;
        }
      }
  });
}

// The last kernel over the segments of a split row: the filter (stages kStageFilter11/22) or
// the compaction in column order at the offsets pass 2 computed (kStageThreshold). The row's
// first CTA writes the padding and topk_length of rows the finisher does not take.
__global__ void __launch_bounds__(kThreads) topk_split_write(TopkArgs a, TopkOutputs o, int segments, int64_t segment_len,
                                                             int64_t candidates, void* ws, unsigned long long* error_count) {
  __shared__ SharedStorage s;
  wait_for_previous_kernel();
  const int row = static_cast<int>(blockIdx.x / segments), seg = static_cast<int>(blockIdx.x % segments);
  bool bad = false;
  const int64_t len = row_length(a, row, &bad);
  const SplitView w = split_view(ws, a.rows, segments, candidates, row);
  const RowState st = *w.state;
  const bool filtered = st.stage == kStageFilter11 || st.stage == kStageFilter22;
  if (seg == 0) {
    if (bad && threadIdx.x == 0 && error_count) atomicAdd(error_count, 1ull);
    if (!filtered) write_padding(a, o, row, st.count);
  }
  const int64_t begin = int64_t(seg) * segment_len;
  if (begin >= len) return;
  const int64_t end = begin + segment_len < len ? begin + segment_len : len;
  const float* v = a.values + int64_t(row) * a.stride;
  const bool vec = rows_are_vector_aligned(a);
  if (st.stage == kStageFilter11)
    filter_range<11>(s, v, begin, end, vec, st.prefix, w, seg, candidates);
  else if (st.stage == kStageFilter22)
    filter_range<22>(s, v, begin, end, vec, st.prefix, w, seg, candidates);
  else
    compact_range(s, a, o, row, begin, end, st.threshold, st.need, w.offsets[size_t(seg) * kSegmentOffsetWords],
                  w.offsets[size_t(seg) * kSegmentOffsetWords + 1], error_count);
}

// The finisher sorts kSortItems columns per thread: 4 for k <= 2048 (half the sort's work), 8 up
// to kTopkMaxK.
template <int kSortItems>
struct FinishStorage {
  using BlockSortU32 = cub::BlockRadixSort<uint32_t, kThreads, kSortItems>;
  uint32_t hist[kBins];
  union {
    typename BlockScanU32::TempStorage scan;
    typename BlockSortU32::TempStorage sort;
  } temp;
  uint32_t list[kTopkMaxK];
  uint32_t digit, k_rem, bin_count, count;
};

// One radix pass of the finisher over n keys given by key_of(i) (false: not counted): the
// digit of pass PASS among the keys whose higher digits equal `prefix`. Extends prefix, lowers
// k_rem, returns how many keys share the extended prefix.
template <int PASS, class Storage, class KeyOf>
__device__ uint32_t finish_pass(Storage& s, uint32_t n, uint32_t& prefix, uint32_t& k_rem, KeyOf key_of) {
  for (int b = threadIdx.x; b < kBins; b += kThreads) s.hist[b] = 0;
  __syncthreads();
  constexpr int kBatch = 8;  // key_of may load from global memory: all of a batch's loads first
  for (uint32_t first = 0; first < n; first += kThreads * kBatch) {
    uint32_t key[kBatch];
    bool counted[kBatch];
#pragma unroll
    for (int u = 0; u < kBatch; ++u) {
      const uint32_t i = first + u * kThreads + threadIdx.x;
      key[u] = 0;
      counted[u] = i < n && key_of(i, key[u]);
    }
#pragma unroll
    for (int u = 0; u < kBatch; ++u) {
      uint32_t above = 0;  // unused: the finisher counts only the keys with the prefix
      if (counted[u]) count_digit<PASS>(key[u], prefix, s.hist, above);
    }
  }
  __syncthreads();
  find_digit(s, 1 << digit_bits(PASS), k_rem, [&](int b) { return s.hist[b]; });
  prefix = (prefix << digit_bits(PASS)) | s.digit;
  k_rem = s.k_rem;
  const uint32_t shared_prefix = s.bin_count;
  __syncthreads();
  return shared_prefix;
}

// The rest of a filtered row, one CTA: the candidates' keys are copied to shared memory
// (dynamic, `candidates` words), where the remaining radix passes give the threshold T and how
// many entries equal to it to take (need); if fewer than all of those, three more passes over
// their columns find the need smallest. The sure entries, the candidates above T and the chosen
// ones equal to it are sorted by column and written.
template <int kSortItems>
__global__ void __launch_bounds__(kThreads) topk_split_finish(TopkArgs a, TopkOutputs o, int segments, int64_t candidates,
                                                              void* ws, unsigned long long* error_count) {
  extern __shared__ uint32_t keys[];
  __shared__ FinishStorage<kSortItems> s;
  wait_for_previous_kernel();
  const int row = blockIdx.x;
  const int64_t len = row_length(a, row, nullptr);
  const SplitView w = split_view(ws, a.rows, segments, candidates, row);
  const RowState st = *w.state;
  if (len == 0 || (st.stage != kStageFilter11 && st.stage != kStageFilter22)) return;
  const uint32_t n_cand = min(st.candidates, static_cast<uint32_t>(candidates));
  const uint32_t n_sure = min(st.sure, static_cast<uint32_t>(kTopkMaxK));
  const uint2* cand = w.candidates;
  constexpr int kCopyUnroll = 8;
  for (uint32_t first = 0; first < n_cand; first += kThreads * kCopyUnroll) {
    uint32_t t[kCopyUnroll];
#pragma unroll
    for (int u = 0; u < kCopyUnroll; ++u) {
      const uint32_t i = first + u * kThreads + threadIdx.x;
      t[u] = i < n_cand ? __ldcg(&cand[i].y) : 0u;
    }
#pragma unroll
    for (int u = 0; u < kCopyUnroll; ++u) {
      const uint32_t i = first + u * kThreads + threadIdx.x;
      if (i < n_cand) keys[i] = t[u];
    }
  }
  __syncthreads();
  auto cand_key = [&](uint32_t i, uint32_t& key) {
    key = keys[i];
    return true;
  };
  uint32_t T = st.prefix, need = st.k_rem;
  if (st.stage == kStageFilter11) finish_pass<1>(s, n_cand, T, need, cand_key);
  const uint32_t equal = finish_pass<2>(s, n_cand, T, need, cand_key);

  uint32_t last_col = 0xFFFFFFFFu;  // entries equal to T are taken up to this column
  if (T != 0 && need < equal) {
    // The need-th largest of ~column among the candidates equal to T is the need-th smallest column.
    auto tied = [&](uint32_t i, uint32_t& key) {
      if (keys[i] != T) return false;
      key = ~__ldcg(&cand[i].x);
      return true;
    };
    uint32_t p = 0, rem = need;
    finish_pass<0>(s, n_cand, p, rem, tied);
    finish_pass<1>(s, n_cand, p, rem, tied);
    finish_pass<2>(s, n_cand, p, rem, tied);
    last_col = ~p;
  }

  if (threadIdx.x == 0) s.count = 0;
  __syncthreads();
  // Loads in batches of kBatch per thread, all issued before any is used.
  constexpr int kBatch = 8;
  for (uint32_t first = 0; first < n_sure; first += kThreads * kBatch) {
    uint32_t col[kBatch];
#pragma unroll
    for (int u = 0; u < kBatch; ++u) {
      const uint32_t i = first + u * kThreads + threadIdx.x;
      col[u] = i < n_sure ? __ldcg(&w.sure[i]) : 0u;
    }
#pragma unroll
    for (int u = 0; u < kBatch; ++u)
      if (first + u * kThreads + threadIdx.x < n_sure) s.list[atomicAdd(&s.count, 1u)] = col[u];
  }
  for (uint32_t first = 0; first < n_cand; first += kThreads * kBatch) {
    uint32_t col[kBatch], key[kBatch];
#pragma unroll
    for (int u = 0; u < kBatch; ++u) {
      const uint32_t i = first + u * kThreads + threadIdx.x;
      key[u] = i < n_cand ? keys[i] : 0u;
      col[u] = key[u] > T || (key[u] == T && T != 0) ? __ldcg(&cand[i].x) : 0u;
    }
#pragma unroll
    for (int u = 0; u < kBatch; ++u)
      if (key[u] > T || (key[u] == T && T != 0 && col[u] <= last_col)) {
        const uint32_t at = atomicAdd(&s.count, 1u);
        if (at < kTopkMaxK) s.list[at] = col[u];
      }
  }
  __syncthreads();
  const uint32_t count = min(s.count, static_cast<uint32_t>(kThreads * kSortItems));  // <= k_eff by construction
  uint32_t cols[kSortItems];
#pragma unroll
  for (int j = 0; j < kSortItems; ++j) {
    const uint32_t i = threadIdx.x * kSortItems + j;
    cols[j] = i < count ? s.list[i] : 0xFFFFFFFFu;
  }
  // Columns are below `columns` <= 2^31 - 1; the padding's low end_bit bits are all ones, above them.
  const int end_bit = 32 - __clz(static_cast<int>(a.columns));
  typename FinishStorage<kSortItems>::BlockSortU32(s.temp.sort).Sort(cols, 0, end_bit);
  const float* v = a.values + int64_t(row) * a.stride;
  float x[kSortItems];
#pragma unroll
  for (int j = 0; j < kSortItems; ++j) x[j] = threadIdx.x * kSortItems + j < count ? v[cols[j]] : 0.0f;
#pragma unroll
  for (int j = 0; j < kSortItems; ++j) {
    const uint32_t place = threadIdx.x * kSortItems + j;
    if (place < count) write_selected(a, o, row, place, cols[j], x[j], error_count);
  }
  write_padding(a, o, row, count);
}

// ---- resident_rows ---------------------------------------------------------------------------
// Every CTA of the grid is resident at once (the cooperative launch guarantees it or fails), so a
// row's CTAs can wait for each other: each reads its segment (at most kRound entries) once into
// registers as keys, and the three radix passes and the compaction run on those: after each
// pass's histogram the row's CTAs wait for each other (an arrival counter) and each then reads the
// row's histogram and finds the digit itself.
static_assert(kRound == kTopkResidentMaxSegment, "a resident CTA holds one round of a walk");

__device__ __forceinline__ uint32_t load_acquire(const uint32_t* flag) {
  uint32_t v;
  asm volatile("ld.acquire.gpu.global.u32 %0, [%1];\n" : "=r"(v) : "l"(flag) : "memory");
  return v;
}

// Entry (u, j) of this thread is entry (u * kThreads + t) * kVec + j of its segment, as in a round.
__device__ __forceinline__ int resident_entry(int u, int j) { return (u * kThreads + threadIdx.x) * kVec + j; }

// The keys of the segment's n entries from v (entries past n read as key 0 and are never counted).
__device__ __forceinline__ void load_resident(const float* __restrict__ v, int n, bool vec, uint32_t (&key)[kUnroll][kVec]) {
  uint32_t bits[kUnroll][kVec];
#pragma unroll
  for (int u = 0; u < kUnroll; ++u) {
    const int c = resident_entry(u, 0);
    if (vec && c + kVec <= n) {
      const float4 x = __ldg(reinterpret_cast<const float4*>(v + c));
      bits[u][0] = __float_as_uint(x.x);
      bits[u][1] = __float_as_uint(x.y);
      bits[u][2] = __float_as_uint(x.z);
      bits[u][3] = __float_as_uint(x.w);
    } else {
#pragma unroll
      for (int j = 0; j < kVec; ++j) bits[u][j] = c + j < n ? __float_as_uint(v[c + j]) : 0u;
    }
  }
#pragma unroll
  for (int u = 0; u < kUnroll; ++u)
#pragma unroll
    for (int j = 0; j < kVec; ++j) key[u][j] = order_key(bits[u][j]);
}

// Pass PASS of a resident row: the segment's histogram (into s.hist, entries above the prefix into
// s.above) is added to the row's; once every segment of the row has arrived, each CTA reads the
// row's histogram and finds the digit itself (the same for all: no CTA waits for another's
// decision). Extends prefix and lowers k_rem; after pass 2 also gives the segment's entries above
// and equal to the threshold in the segments before it (gt_before, eq_before).
template <int PASS>
__device__ void resident_pass(SharedStorage& s, const SplitView& w, const uint32_t (&key)[kUnroll][kVec], int n, int seg,
                              uint32_t nseg, uint32_t& prefix, uint32_t& k_rem, uint32_t* gt_before = nullptr,
                              uint32_t* eq_before = nullptr) {
  constexpr int kDigitBins = 1 << digit_bits(PASS);
  for (int b = threadIdx.x; b < kDigitBins; b += kThreads) s.hist[b] = 0;
  if (threadIdx.x == 0) s.above = 0;
  __syncthreads();
  uint32_t above = 0;
#pragma unroll
  for (int u = 0; u < kUnroll; ++u)
#pragma unroll
    for (int j = 0; j < kVec; ++j)
      if (resident_entry(u, j) < n) count_digit<PASS>(key[u][j], prefix, s.hist, above);
  if (above) atomicAdd(&s.above, above);
  __syncthreads();
  for (int b = threadIdx.x; b < kDigitBins; b += kThreads)
    if (s.hist[b]) atomicAdd(&w.hist[PASS * kBins + b], s.hist[b]);
  if constexpr (PASS == 2) write_suffix<kDigitBins>(s, w.suffix + size_t(seg) * kSegmentSuffixWords);
  __threadfence();
  __syncthreads();
  if (threadIdx.x == 0) {
    atomicAdd(&w.state->arrived[PASS], 1u);
    while (load_acquire(&w.state->arrived[PASS]) < nseg) __nanosleep(32);
  }
  __syncthreads();
  const uint32_t* row_hist = w.hist + PASS * kBins;
  find_digit(s, kDigitBins, k_rem, [&](int b) { return __ldcg(row_hist + b); });
  const uint32_t digit = s.digit;
  prefix = (prefix << digit_bits(PASS)) | digit;
  k_rem = s.k_rem;
  if constexpr (PASS == 2) {
    // The segments before this one: entries above the digit = suffix[digit + 1], with it =
    // suffix[digit] - suffix[digit + 1] (write_suffix), summed packed (above << 32 | with).
    unsigned long long packed = 0;
    for (uint32_t sg = threadIdx.x; sg < static_cast<uint32_t>(seg); sg += kThreads) {
      const uint32_t* sf = w.suffix + size_t(sg) * kSegmentSuffixWords;
      const uint32_t ge = __ldcg(sf + digit), gt = __ldcg(sf + digit + 1);
      packed += (static_cast<unsigned long long>(gt) << 32) | (ge - gt);
    }
    __syncthreads();  // find_digit's scan storage becomes this sum's
    unsigned long long excl, total;
    BlockScanU64(s.temp.scan64).ExclusiveSum(packed, excl, total);
    if (threadIdx.x == 0) s.cursor[0] = static_cast<uint32_t>(total >> 32), s.cursor[1] = static_cast<uint32_t>(total);
    __syncthreads();
    *gt_before = s.cursor[0];
    *eq_before = s.cursor[1];
  }
  __syncthreads();  // before the next pass reuses s
}

// The segment's selected entries in column order at the offsets pass 2 gave (compact_range
// over the keys in registers: the block's entries of round u come before those of round u + 1).
__device__ void resident_compact(SharedStorage& s, const TopkArgs& a, const TopkOutputs& o, int row, int64_t begin,
                                 const uint32_t (&key)[kUnroll][kVec], int n, uint32_t T, uint32_t need,
                                 uint32_t gt_before, uint32_t eq_before, unsigned long long* error_count) {
  const float* v = a.values + int64_t(row) * a.stride;
  const uint32_t ties = T != 0 ? need : 0u;
#pragma unroll
  for (int u = 0; u < kUnroll; ++u) {
    uint32_t gt = 0, eq = 0;
#pragma unroll
    for (int j = 0; j < kVec; ++j) {
      const bool valid = resident_entry(u, j) < n;
      gt += valid && key[u][j] > T;
      eq += valid && T != 0 && key[u][j] == T;
    }
    uint32_t excl, total;
    BlockScanU32(s.temp.scan).ExclusiveSum(gt | (eq << 16), excl, total);
    uint32_t g = gt_before + (excl & 0xFFFFu), e = eq_before + (excl >> 16);
#pragma unroll
    for (int j = 0; j < kVec; ++j) {
      if (resident_entry(u, j) >= n) continue;
      const int64_t col = begin + resident_entry(u, j);
      place_if_selected(a, o, row, col, key[u][j], T, need, ties, g, e, [&] { return o.values ? v[col] : 0.0f; },
                        error_count);
    }
    gt_before += total & 0xFFFFu;
    eq_before += total >> 16;
    __syncthreads();  // before the next round's scan reuses the storage
  }
}

__global__ void __launch_bounds__(kThreads, kTopkResidentCtasPerSm)
    topk_resident(TopkArgs a, TopkOutputs o, int segments, int64_t segment_len, void* ws, unsigned long long* error_count) {
  __shared__ SharedStorage s;
  const int row = static_cast<int>(blockIdx.x / segments), seg = static_cast<int>(blockIdx.x % segments);
  bool bad = false;
  const int64_t len = row_length(a, row, &bad);
  if (seg == 0 && bad && threadIdx.x == 0 && error_count) atomicAdd(error_count, 1ull);
  const uint32_t k_eff = static_cast<uint32_t>(len < a.k ? len : a.k);
  if (k_eff == 0) {
    if (seg == 0) write_padding(a, o, row, 0);
    return;
  }
  const int64_t begin = int64_t(seg) * segment_len;
  if (begin >= len) return;
  const int n = static_cast<int>(begin + segment_len < len ? segment_len : len - begin);
  const uint32_t nseg = static_cast<uint32_t>((len + segment_len - 1) / segment_len);
  const SplitView w = split_view(ws, a.rows, segments, 0, row);
  uint32_t key[kUnroll][kVec];
  load_resident(a.values + int64_t(row) * a.stride + begin, n, rows_are_vector_aligned(a), key);
  uint32_t prefix = 0, k_rem = k_eff, gt_before = 0, eq_before = 0;
  resident_pass<0>(s, w, key, n, seg, nseg, prefix, k_rem);
  resident_pass<1>(s, w, key, n, seg, nseg, prefix, k_rem);
  resident_pass<2>(s, w, key, n, seg, nseg, prefix, k_rem, &gt_before, &eq_before);
  const uint32_t T = prefix, need = k_rem;
  resident_compact(s, a, o, row, begin, key, n, T, need, gt_before, eq_before, error_count);
  if (seg == 0) write_padding(a, o, row, selected_count(k_eff, T, need));
}

// How many resident_rows CTAs fit on the current GPU at once (worked out once per device).
int64_t resident_capacity() {
  static PerDevice<int64_t> capacity;
  return capacity.get([] {
    int device = 0, sms = 0, per_sm = 0;
    check(cudaGetDevice(&device), "top-k: current device");
    check(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device), "top-k: SM count");
    check(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, topk_resident, kThreads, 0), "top-k: resident occupancy");
    return int64_t(sms) * per_sm;
  });
}

// Launches one kernel of a split row's chain, as a programmatic dependent of the kernel before
// it when `dependent` (see wait_for_previous_kernel).
template <class... Params, class... Args>
void launch_split_kernel(void (*kernel)(Params...), unsigned grid, size_t smem, cudaStream_t stream, bool dependent,
                         const char* what, Args... args) {
  cudaLaunchConfig_t config{};
  config.gridDim = dim3(grid);
  config.blockDim = dim3(kThreads);
  config.dynamicSmemBytes = smem;
  config.stream = stream;
  cudaLaunchAttribute attribute{};
  attribute.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attribute.val.programmaticStreamSerializationAllowed = 1;
  config.attrs = dependent ? &attribute : nullptr;
  config.numAttrs = dependent ? 1 : 0;
  check(cudaLaunchKernelEx(&config, kernel, static_cast<Params>(args)...), what);
}

// The finisher sorting kSortItems columns per thread and how many candidates' keys it can hold in
// dynamic shared memory beside its static storage (at most kTopkCandidates). Worked out and opted
// in once per device, as the decode kernels do, so later calls (graph captures included) make no
// attribute call.
struct Finisher {
  void (*kernel)(TopkArgs, TopkOutputs, int, int64_t, void*, unsigned long long*);
  int64_t capacity;
};
template <int kSortItems>
Finisher finisher() {
  static PerDevice<Finisher> per_device;
  return per_device.get([] {
    Finisher f{topk_split_finish<kSortItems>, 0};
    int device = 0, optin = 0;
    check(cudaGetDevice(&device), "top-k: current device");
    check(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device), "top-k: shared memory limit");
    cudaFuncAttributes attributes{};
    check(cudaFuncGetAttributes(&attributes, f.kernel), "top-k finisher attributes");
    const int64_t free_bytes = int64_t(optin) - int64_t(attributes.sharedSizeBytes);
    f.capacity = std::min<int64_t>(kTopkCandidates, free_bytes > 0 ? free_bytes / int64_t(sizeof(uint32_t)) : 0);
    if (f.capacity > 0)
      check(cudaFuncSetAttribute(f.kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                 static_cast<int>(f.capacity * sizeof(uint32_t))),
            "top-k finisher shared memory");
    return f;
  });
}

// Programmatic dependent launch needs compute capability 9.0.
bool device_has_dependent_launch() {
  int device = 0, major = 0;
  check(cudaGetDevice(&device), "top-k: current device");
  check(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device), "top-k: compute capability");
  return major >= 9;
}

}  // namespace

void topk(const TopkArgs& a, const TopkPlan& plan, void* workspace, size_t workspace_bytes, const TopkOutputs& out,
          unsigned long long* error_count, cudaStream_t stream) {
  validate_topk_args(a, out);
  if (reinterpret_cast<uintptr_t>(error_count) % alignof(unsigned long long) != 0)
    throw Error("top-k: error_count is not aligned to 8 bytes");
  if (plan.kernel == TopkKernel::resident_rows) {
    if (plan.candidates != 0) throw Error("top-k: a resident_rows plan keeps no candidates");
    if (plan.segment_len < 1 || plan.segment_len > kTopkResidentMaxSegment || plan.segment_len % kVec != 0)
      throw Error("top-k: the resident plan's segments of " + std::to_string(plan.segment_len) +
                  " entries are not a multiple of 4 in 4.." + std::to_string(kTopkResidentMaxSegment));
  }
  if (plan.kernel != TopkKernel::row_per_cta) {
    if (plan.candidates < 0 || plan.candidates > kTopkCandidates)
      throw Error("top-k: the plan's candidate count " + std::to_string(plan.candidates) + " is outside 0.." +
                  std::to_string(kTopkCandidates));
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
  const SplitLayout layout = split_layout(a.rows, plan.segments, plan.candidates);
  if (plan.kernel == TopkKernel::resident_rows) {
    if (int64_t(grid) > resident_capacity())
      throw Error("top-k: the resident plan's " + std::to_string(grid) + " CTAs do not fit on this GPU at once (" +
                  std::to_string(resident_capacity()) + "); plan it with this GPU's SM count");
    check(cudaMemsetAsync(workspace, 0, layout.zeroed_bytes, stream), "top-k workspace reset");
    cudaLaunchConfig_t config{};
    config.gridDim = dim3(grid);
    config.blockDim = dim3(kThreads);
    config.stream = stream;
    cudaLaunchAttribute attribute{};
    attribute.id = cudaLaunchAttributeCooperative;  // every CTA resident: the row's CTAs wait for each other
    attribute.val.cooperative = 1;
    config.attrs = &attribute;
    config.numAttrs = 1;
    check(cudaLaunchKernelEx(&config, topk_resident, a, out, plan.segments, plan.segment_len, workspace, error_count),
          "top-k resident kernel");
    return;
  }
  check(cudaMemsetAsync(workspace, 0, layout.zeroed_bytes, stream), "top-k workspace reset");
  const bool pdl = device_has_dependent_launch();
  // A plan's candidates that this GPU's finisher cannot hold in shared memory (smaller GPUs than
  // Hopper) take the three passes instead: the kernels then never filter (the workspace is larger
  // than that path needs, which is fine).
  const Finisher finish = a.k <= kTopkMaxK / 2 ? finisher<kTopkMaxK / 2 / kThreads>() : finisher<kTopkMaxK / kThreads>();
  const int64_t candidates = plan.candidates <= finish.capacity ? plan.candidates : 0;
  launch_split_kernel(topk_split_pass<0>, grid, 0, stream, false, "top-k pass 0", a, plan.segments, plan.segment_len,
                      candidates, workspace);
  launch_split_kernel(topk_split_pass<1>, grid, 0, stream, pdl, "top-k pass 1", a, plan.segments, plan.segment_len,
                      candidates, workspace);
  launch_split_kernel(topk_split_pass<2>, grid, 0, stream, pdl, "top-k pass 2", a, plan.segments, plan.segment_len,
                      candidates, workspace);
  launch_split_kernel(topk_split_write, grid, 0, stream, pdl, "top-k filter or compaction", a, out, plan.segments,
                      plan.segment_len, candidates, workspace, error_count);
  if (candidates > 0)
    launch_split_kernel(finish.kernel, static_cast<unsigned>(a.rows), static_cast<size_t>(candidates * sizeof(uint32_t)),
                        stream, pdl, "top-k finisher", a, out, plan.segments, candidates, workspace, error_count);
}

}  // namespace nvfp4mla::cuda
