#pragma once
// GPU benchmarks of the decode kernel and the cache writer, with the device ceilings (copy
// bandwidth, BF16 matrix rate through cuBLAS) measured in the same run. Timing: CUDA events
// around each launch, warm-up first, L2 flushed before every timed iteration, medians.
//
// The flush streams through a 512 MB buffer. By default it reads it, which leaves the 60 MB L2
// full of clean lines of that buffer; writing it instead (cudaMemset, as nvbench and triton's
// do_bench do) leaves it full of dirty lines, whose write-back to DRAM then runs during the timed
// kernel: on the H200 the plain gather of 128 x 2048 records took 44.6-45.2 us after a write
// flush and 36.5-38.2 us after a read flush (docs/PERF.md, "Machine and method"). Both are offered;
// results say which one was used.
#include <filesystem>
#include <functional>
#include <string>
#include <vector>

#include "nvfp4mla/decode_plan.h"
#include "nvfp4mla/format.h"

namespace nvfp4mla::bench {

struct Ceilings {
  double copy_gbps = 0;     // device-to-device copy, bytes read + written per second / 1e9
  double bf16_tflops = 0;   // cuBLAS BF16 GEMM 8192^3
  double max_clock_mhz = 0; // the device's top SM clock
  std::string device;
};

struct DecodeCase {
  int rows = 0, heads = 0, topk = 0;
  RecordSpec spec;
  int forced_splits = 0;    // 0 = planner
  int64_t capacity = int64_t(1) << 20;  // cache slots the random indices point into (rounded up to 65536s)
  DecodeKernel kernel = DecodeKernel::automatic;  // the planner's choice, or one the device supports
  bool staged = false;  // extend: the staged extend (staging + attention over bf16 records, timed together)
  bool walk_only = false;  // staged extend: every row walked, no split tail (cuda::ExtendStagedPlan), for A/B timing
};

struct DecodeResult {
  DecodeCase c;
  int splits = 0, head_group = 0;
  DecodeKernel kernel = DecodeKernel::automatic;  // the kernel that ran
  double median_us = 0, min_us = 0;
  double tflops = 0;        // 2 * heads * rows * topk * (576 + 512) / time
  double gbps = 0;          // (records read once per (row, entry) + q + out) / time
  double frac_copy = 0, frac_mma = 0;
  double staging_us = 0;    // staged extend: the staging alone (median), part of median_us
  int tail_rows = 0, tail_splits = 0;  // staged extend: rows run first as a split launch, and its splits
  // A ceiling measured on the same cache and indices: a plain kernel that only reads every
  // (row, entry) record once (several 16-byte loads in flight per thread, all SMs full).
  // frac_gather = gather_us / median_us.
  double gather_us = 0, frac_gather = 0;
  bool finite = true;       // every output element finite
  double clock_mhz = 0;     // median SM clock probed right after each timed launch
};

struct WriteCase {
  int64_t tokens = 0;
  RecordSpec spec;
};

struct WriteResult {
  WriteCase c;
  double median_us = 0;
  double gbps = 0;          // (BF16 input + slot mapping + records written) / time
  double frac_copy = 0;
  double clock_mhz = 0;     // as in DecodeResult
};

// Exact top-k (cuda/topk.h) on random logits rows generated on the device, with an in-run
// anchor: CUB's segmented radix sort (pairs: values, positions; descending) of the same rows.
// matches_sort: the top-k equals the first k positions of that (stable) sort, sorted.
struct TopkCase {
  int rows = 0;
  int64_t columns = 0;
  int k = 2048;
  int segments = 0;         // 0: the planner's plan; 1: row_per_cta; more: split_rows with that many
  bool resident = false;    // segments > 1: resident_rows instead of split_rows
};

struct TopkResult {
  TopkCase c;
  std::string kernel;       // the plan: to_string(TopkKernel)
  int segments = 1;
  double median_us = 0, min_us = 0;
  double gbps = 0;          // logits bytes / time
  double sort_us = 0;       // CUB segmented radix sort of the same rows
  bool matches_sort = false;
  double clock_mhz = 0;     // as in DecodeResult
};

enum class L2Flush { read, write };
const char* to_string(L2Flush f);

struct Options {
  // After the ceilings and before any case is timed, the device is kept busy for warmup_seconds
  // (measure_ceilings does it): the cuBLAS GEMM of the ceilings leaves the H200 under its software
  // power cap, with the SM clock at 1545-1905 MHz for about half a second, and a decode case timed
  // in that window read 69-74 us where it reads 58-60 us at 1980 MHz (docs/PERF.md,
  // "Machine and method"). Every result reports the SM clock it was measured at (clock_mhz). `warmup`
  // launches then precede each case's timed ones.
  double warmup_seconds = 5.0;
  int warmup = 3;
  int iters = 20;
  L2Flush l2_flush = L2Flush::read;
  std::function<void(const std::string&)> progress;  // optional progress callback
};

// All of these throw Error when the library was built without CUDA or no device is present.
Ceilings measure_ceilings(const Options& opt);
std::vector<DecodeResult> run_decode(const std::vector<DecodeCase>& cases, const Ceilings& ceil, const Options& opt);
std::vector<WriteResult> run_write(const std::vector<WriteCase>& cases, const Ceilings& ceil, const Options& opt);
std::vector<TopkResult> run_topk(const std::vector<TopkCase>& cases, const Options& opt);

// Indexer logits (cuda/indexer.h) on random E4M3 data. prefill: `rows` causal query rows over
// `keys` contiguous keys (row i scores keys 0 .. keys - rows + i, DeepGEMM's benchmark shape);
// decode: `rows` requests x next_n rows over a paged cache of `keys` tokens per request (pages
// scattered over the cache). Logits stride: `keys`.
struct IndexerCase {
  enum class Form { prefill, decode };
  Form form = Form::prefill;
  int64_t rows = 0, keys = 0;
  int heads = 64, next_n = 2;
  int64_t page_size = 64;
  int mma = 0;  // cuda::IndexerMma: 0 automatic, 1 wgmma, 2 mma.sync, 3 wgmma_ws
  // Decode only: also time fused selection (cuda/fused_select.h, k = fused_k, chunk from the
  // planner) of the same rows, against the logits alone.
  bool fused = false;
  int fused_k = 2048;
};

struct IndexerResult {
  IndexerCase c;
  double median_us = 0, min_us = 0;
  double tflops = 0;      // 2 * heads * 128 * (sum of row lengths) / time
  double key_tbps = 0;    // index key bytes (132 per key, each read once per request or row block) / time / 1e12
  double frac_copy = 0;   // key bytes per second / the copy ceiling's read bytes per second
  bool finite = true;     // no NaN among the logits
  double clock_mhz = 0;
  double fused_median_us = 0;  // fused logits + top-k (c.fused)
  int64_t fused_chunk = 0, fused_workspace_bytes = 0;
};

std::vector<IndexerResult> run_indexer(const std::vector<IndexerCase>& cases, const Ceilings& ceil, const Options& opt);

// PNG figures (cairo) of the JSON files written by `nvfp4mla bench decode|extend|write --json`,
// into `dir` (created if missing):
//   decode_time.png       median microseconds per shape (rows x heads, file order), one series
//                         per format and scale mode (decode and extend results)
//   writer_bandwidth.png  the writer's % of the measured copy bandwidth per format, with the
//                         50% bar of issue 3
// A figure is written when some file has its results. Returns the paths written. Throws Error
// naming the file (and the missing field) for unreadable or unknown JSON, when the library
// lacks cairo, or when a figure cannot be written. Every file is read before anything is written.
std::vector<std::filesystem::path> write_plots(const std::vector<std::filesystem::path>& json_files,
                                               const std::filesystem::path& dir);

// Decode context parallelism (cuda/dcp.h, cuda/dcp_comm.h) for `rows` x `heads` over `ranks`
// ranks, k = 2048: the merge kernel (cuda::dcp_merge, BF16 partials and output, as the step
// runs it on each rank), the in-process all-gather of the (out, lse) partials and of the top-k
// candidates (N ranks on this one GPU: N (N - 1) block copies in one kernel, so it times the device's copy
// rate, not a link between GPUs), and the global top-k merge (cuda::dcp_merge_topk). Bytes: what
// each rank receives from the others in one layer's step.
struct DcpCase {
  int rows = 64, heads = 128, ranks = 2;
  int k = 2048;
};
struct DcpResult {
  DcpCase c;
  double merge_us = 0;              // cuda::dcp_merge of one rank
  double gather_partials_us = 0;    // all-gather of the partials, all N ranks
  double gather_candidates_us = 0;  // all-gather of the candidates, all N ranks
  double merge_topk_us = 0;         // cuda::dcp_merge_topk of one rank
  int64_t partial_bytes = 0;        // per rank and layer: (N - 1) rows heads (512 x 2 + 4)
  int64_t candidate_bytes = 0;      // per rank and layer: (N - 1) rows (k x 8 + 4)
  double clock_mhz = 0;
};
std::vector<DcpResult> run_dcp(const std::vector<DcpCase>& cases, const Options& opt);

}  // namespace nvfp4mla::bench
