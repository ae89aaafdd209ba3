// The in-process DCP communicator (cuda/dcp_comm.h): N ranks on one GPU, an all-gather as one
// copy kernel (per receiving stream); and the collectives built on any communicator's all-gather.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <string>

#include "device/cuda_check.h"
#include "nvfp4mla/cuda/dcp_comm.h"
#include "nvfp4mla/error.h"

namespace nvfp4mla::cuda {
namespace {

constexpr int kMaxInProcessRanks = 64;
constexpr int kCopyThreads = 256;

// Every rank's send and receive buffer, as a kernel parameter (1 KB).
struct GatherPointers {
  const void* send[kMaxInProcessRanks];
  void* recv[kMaxInProcessRanks];
};

// Block (x, y): receiver first + y / ranks gets sender y % ranks's `count` words V at its offset
// sender x count; an in-place sender's block is already there.
template <class V>
__global__ void __launch_bounds__(kCopyThreads) gather_copy_kernel(GatherPointers p, int first, int ranks, int64_t count) {
  const int receiver = first + static_cast<int>(blockIdx.y) / ranks, sender = static_cast<int>(blockIdx.y) % ranks;
  const V* src = static_cast<const V*>(p.send[sender]);
  V* dst = static_cast<V*>(p.recv[receiver]) + int64_t(sender) * count;
  if (static_cast<const void*>(dst) == static_cast<const void*>(src)) return;
  for (int64_t i = int64_t(blockIdx.x) * kCopyThreads + threadIdx.x; i < count; i += int64_t(gridDim.x) * kCopyThreads)
    dst[i] = src[i];
}

// Copies into receivers first..first+receivers-1 from every sender, in one launch on `stream`,
// with the widest word every pointer and the size allow.
void launch_gather_copy(const GatherPointers& p, int first, int receivers, int ranks, size_t bytes, cudaStream_t stream) {
  bool align16 = bytes % 16 == 0, align4 = bytes % 4 == 0;
  for (int r = 0; r < ranks; ++r) {
    const auto a = reinterpret_cast<uintptr_t>(p.send[r]), b = reinterpret_cast<uintptr_t>(p.recv[r]);
    align16 = align16 && a % 16 == 0 && b % 16 == 0;
    align4 = align4 && a % 4 == 0 && b % 4 == 0;
  }
  const size_t word = align16 ? 16 : align4 ? 4 : 1;
  const auto count = static_cast<int64_t>(bytes / word);
  const unsigned pairs = static_cast<unsigned>(receivers * ranks);  // <= 64 x 64
  const int64_t wanted = (count + kCopyThreads - 1) / kCopyThreads, cap = std::max<int64_t>(1, 8192 / pairs);
  const dim3 grid(static_cast<unsigned>(std::min(wanted, cap)), pairs);
  if (word == 16)
    gather_copy_kernel<uint4><<<grid, kCopyThreads, 0, stream>>>(p, first, ranks, count);
  else if (word == 4)
    gather_copy_kernel<uint32_t><<<grid, kCopyThreads, 0, stream>>>(p, first, ranks, count);
  else
    gather_copy_kernel<uint8_t><<<grid, kCopyThreads, 0, stream>>>(p, first, ranks, count);
  check_launch("in-process all_gather: copy kernel");
}

void require_arrays(const DcpCommunicator& comm, const void* const* a, const void* const* b, const cudaStream_t* s,
                    const char* what) {
  if (!a || !b || !s) throw Error(std::string(what) + ": the per-rank arrays (buffers and streams) are required");
  for (int i = 0; i < comm.local_ranks(); ++i)
    if (!a[i] || !b[i]) throw Error(std::string(what) + ": a buffer of local rank " + std::to_string(i) + " is null");
}

}  // namespace

InProcessDcpCommunicator::InProcessDcpCommunicator(int ranks) : ranks_(ranks) {
  if (ranks < 1 || ranks > kMaxInProcessRanks)
    throw Error("in-process DCP communicator: ranks must be 1.." + std::to_string(kMaxInProcessRanks) + ", got " +
                std::to_string(ranks));
  ready_.assign(ranks, nullptr);
  done_.assign(ranks, nullptr);
  try {
    for (int r = 0; r < ranks; ++r) {
      check(cudaEventCreateWithFlags(&ready_[r], cudaEventDisableTiming), "in-process DCP communicator: event");
      check(cudaEventCreateWithFlags(&done_[r], cudaEventDisableTiming), "in-process DCP communicator: event");
    }
  } catch (...) {
    destroy_events();
    throw;
  }
}

InProcessDcpCommunicator::~InProcessDcpCommunicator() { destroy_events(); }

void InProcessDcpCommunicator::destroy_events() {
  for (cudaEvent_t e : ready_)
    if (e) cudaEventDestroy(e);
  for (cudaEvent_t e : done_)
    if (e) cudaEventDestroy(e);
  ready_.clear();
  done_.clear();
}

void InProcessDcpCommunicator::all_gather(const void* const* send, void* const* recv, size_t bytes,
                                          const cudaStream_t* streams) {
  if (bytes == 0) return;
  require_arrays(*this, send, const_cast<const void* const*>(recv), streams, "in-process all_gather");
  bool one_stream = true;
  for (int r = 1; r < ranks_; ++r) one_stream = one_stream && streams[r] == streams[0];
  // Barrier in: rank r's copies read every rank's send buffer, written on that rank's stream.
  if (!one_stream) {
    for (int s = 0; s < ranks_; ++s) check(cudaEventRecord(ready_[s], streams[s]), "in-process all_gather: event record");
    for (int r = 0; r < ranks_; ++r)
      for (int s = 0; s < ranks_; ++s)
        if (streams[s] != streams[r])
          check(cudaStreamWaitEvent(streams[r], ready_[s], 0), "in-process all_gather: stream wait");
  }
  // One copy kernel for all receivers on a shared stream, else one per receiver on its stream.
  GatherPointers p{};
  for (int r = 0; r < ranks_; ++r) {
    p.send[r] = send[r];
    p.recv[r] = recv[r];
  }
  if (one_stream) {
    launch_gather_copy(p, 0, ranks_, ranks_, bytes, streams[0]);
  } else {
    for (int r = 0; r < ranks_; ++r) launch_gather_copy(p, r, 1, ranks_, bytes, streams[r]);
  }
  // Barrier out: no rank overwrites its send buffer while another rank's stream still copies it.
  if (!one_stream) {
    for (int r = 0; r < ranks_; ++r) check(cudaEventRecord(done_[r], streams[r]), "in-process all_gather: event record");
    for (int s = 0; s < ranks_; ++s)
      for (int r = 0; r < ranks_; ++r)
        if (streams[s] != streams[r])
          check(cudaStreamWaitEvent(streams[s], done_[r], 0), "in-process all_gather: stream wait");
  }
}

void dcp_all_gather_heads(DcpCommunicator& comm, const void* const* send, void* const* staging, void* const* recv,
                          int64_t rows, int heads_per_rank, size_t head_bytes, const cudaStream_t* streams) {
  if (rows < 0 || heads_per_rank < 1 || head_bytes == 0)
    throw Error("dcp_all_gather_heads: rows must be >= 0, heads_per_rank and head_bytes positive");
  if (rows == 0) return;
  require_arrays(comm, send, const_cast<const void* const*>(staging), streams, "dcp_all_gather_heads");
  require_arrays(comm, send, const_cast<const void* const*>(recv), streams, "dcp_all_gather_heads");
  const size_t block = size_t(heads_per_rank) * head_bytes;  // one row's heads of one rank
  const int world = comm.world_size();
  comm.all_gather(send, staging, size_t(rows) * block, streams);
  for (int i = 0; i < comm.local_ranks(); ++i)
    for (int s = 0; s < world; ++s)
      check(cudaMemcpy2DAsync(static_cast<char*>(recv[i]) + size_t(s) * block, size_t(world) * block,
                              static_cast<const char*>(staging[i]) + size_t(s) * rows * block, block, block, size_t(rows),
                              cudaMemcpyDeviceToDevice, streams[i]),
            "dcp_all_gather_heads: copy");
}

}  // namespace nvfp4mla::cuda
