#pragma once
// The quality effect of DCP's union mode (dcp.h, DcpSelection::union_local) on the evaluation's
// needle workload (dsa_workload.h): each query row looks for its needle at a depth of a context
// of `context` tokens; its exact indexer logits (fp32, BF16 keys) give the exact global top-k E;
// in union mode each of N ranks takes the top k_rank of its own tokens (placement dcp.h) and the
// row attends their union U. Measured per (N, interleave, k_rank), over the rows:
//   recall      |U n E| / |E|: how much of the exact selection the union keeps;
//   union size  |U| / k: the attended tokens relative to the exact k;
//   needles     rows whose needle is in U;
//   attention   sparse_mla_reference (fp64, BF16 records) over U against over E, per (row,
//               head): relative L2 difference ||o_U - o_E|| / ||o_E|| and cosine difference.
// k_rank = k keeps every exact entry (each rank's share of E is within its own top k), at up to
// N k attended tokens; k_rank = k / N attends at most k tokens, as the exact mode does.
#include <cstdint>
#include <vector>

namespace nvfp4mla::eval {

struct DcpUnionOptions {
  int64_t context = 65536;
  int rows = 4;   // query rows, needles at depths (i + 0.5) / rows
  int k = 2048;
  std::vector<int> ranks{2, 4, 8};
  std::vector<int> interleaves{1, 64};
  uint64_t seed = 1;
  int threads = 0;  // 0: all cores
};

struct DcpUnionCell {
  int ranks = 0, interleave = 0, k_rank = 0;
  double recall = 0;          // mean over rows
  double min_recall = 0;
  double union_size = 0;      // mean |U| / k
  int needles = 0, rows = 0;  // rows whose needle U holds, of rows
  double mean_rel_l2 = 0, max_rel_l2 = 0;      // over (row, head)
  double mean_cos_diff = 0, max_cos_diff = 0;  // over (row, head)
};

// Cells for every (ranks, interleave) and k_rank in {k, k / ranks}. Throws Error for bad options.
std::vector<DcpUnionCell> evaluate_dcp_union(const DcpUnionOptions& options);

}  // namespace nvfp4mla::eval
