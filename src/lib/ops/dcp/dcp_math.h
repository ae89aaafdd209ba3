#pragma once
// The placement arithmetic of dcp.h, shared by the host functions and the kernels. Arguments
// are assumed valid (the public functions check them).
#include <cstdint>

#include "nvfp4mla/hd.h"
#include "nvfp4mla/topk.h"

namespace nvfp4mla::dcp_math {

NVFP4MLA_HD int rank_of(int64_t global, int ranks, int interleave) {
  return static_cast<int>((global / interleave) % ranks);
}

NVFP4MLA_HD int64_t local_of(int64_t global, int ranks, int interleave) {
  return global / (int64_t(interleave) * ranks) * interleave + global % interleave;
}

NVFP4MLA_HD int64_t global_of(int64_t local, int ranks, int interleave, int rank) {
  return local / interleave * (int64_t(interleave) * ranks) + int64_t(rank) * interleave + local % interleave;
}

// How many of the positions 0..context_length-1 (>= 0) live on `rank`.
NVFP4MLA_HD int64_t local_length(int64_t context_length, int ranks, int interleave, int rank) {
  const int64_t stride = int64_t(interleave) * ranks;
  const int64_t rest = context_length % stride - int64_t(rank) * interleave;
  return context_length / stride * interleave + (rest < 0 ? 0 : rest > interleave ? interleave : rest);
}

// The local slot on `rank` of a global (virtual-page) slot, or -1 when another rank owns it.
NVFP4MLA_HD int64_t local_slot(int64_t global_slot, int ranks, int interleave, int page_size, int rank) {
  if (global_slot < 0) return -1;
  const int64_t virtual_page = int64_t(page_size) * ranks;
  const int64_t page = global_slot / virtual_page, offset = global_slot % virtual_page;
  if (rank_of(offset, ranks, interleave) != rank) return -1;
  return page * page_size + local_of(offset, ranks, interleave);
}

// The attention index on `rank` of global position `pos` of row `row`: -1 for padding and for
// other ranks' positions, -2 for a position of this rank without a valid slot.
NVFP4MLA_HD int64_t local_index(int32_t pos, int64_t row, int ranks, int interleave, int rank, const TopkSlotMap& m) {
  if (pos < 0 || rank_of(pos, ranks, interleave) != rank) return -1;
  const int64_t slot = topk_slot(m, row, local_of(pos, ranks, interleave));
  return slot < 0 ? -2 : slot;
}

}  // namespace nvfp4mla::dcp_math
