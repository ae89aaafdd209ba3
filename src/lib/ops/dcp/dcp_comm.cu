// The in-process DCP communicator (cuda/dcp_comm.h): N ranks on one GPU, collectives as device
// copies; and the collectives built on any communicator's all-gather.
#include <cuda_runtime.h>

#include <cstdint>
#include <string>

#include "device/cuda_check.h"
#include "nvfp4mla/cuda/dcp_comm.h"
#include "nvfp4mla/error.h"

namespace nvfp4mla::cuda {
namespace {

constexpr int kMaxInProcessRanks = 64;

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
  for (int r = 0; r < ranks_; ++r)
    for (int s = 0; s < ranks_; ++s) {
      char* dst = static_cast<char*>(recv[r]) + size_t(s) * bytes;
      if (dst == send[s]) continue;  // in place
      check(cudaMemcpyAsync(dst, send[s], bytes, cudaMemcpyDeviceToDevice, streams[r]), "in-process all_gather: copy");
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
