#pragma once
// Collectives for decode context parallelism (CUDA builds only; docs/DCP.md, "Communicator").
//
// A communicator connects `world_size` ranks. One process drives `local_ranks` of them (all of
// them in the in-process backend, one per communicator with NCCL), and every collective call
// covers all of its local ranks at once: the arrays it takes hold one entry per local rank, in
// local order, and entry i belongs to rank local_rank(i). So one thread can drive any number of
// ranks without deadlock, and the same calling code runs on both backends.
//
// All-gather: every rank sends `bytes` bytes; every rank's `recv` ([world_size * bytes]) gets
// rank r's bytes at offset r * bytes. In place is allowed (send == recv + rank * bytes), as NCCL
// allows it; any other overlap is not. The work goes on the caller's streams (one per local
// rank, may be the same stream); nothing is allocated and nothing synchronizes with the host,
// so the calls can be captured in a CUDA graph.
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace nvfp4mla::cuda {

class DcpCommunicator {
 public:
  virtual ~DcpCommunicator() = default;
  virtual int world_size() const = 0;
  virtual int local_ranks() const = 0;
  virtual int local_rank(int i) const = 0;  // the rank of local entry i
  // send[i], recv[i], streams[i] for each local rank i (device pointers). bytes 0 does nothing.
  virtual void all_gather(const void* const* send, void* const* recv, size_t bytes, const cudaStream_t* streams) = 0;
};

// N ranks on the current GPU, each with its own buffers: an all-gather is one copy kernel over
// all (receiver, sender) pairs when the ranks share a stream, else one per receiving rank on its
// stream (16-byte words when every pointer and the size allow, else 4-byte or single bytes). When the local ranks' streams
// differ, the call orders them with events as a barrier (every rank's prior work before any
// copy, every copy before any rank's later work), so a rank may reuse its buffers right after.
class InProcessDcpCommunicator final : public DcpCommunicator {
 public:
  explicit InProcessDcpCommunicator(int ranks);  // 1..64; throws Error naming `ranks`
  ~InProcessDcpCommunicator() override;
  InProcessDcpCommunicator(const InProcessDcpCommunicator&) = delete;
  InProcessDcpCommunicator& operator=(const InProcessDcpCommunicator&) = delete;
  int world_size() const override { return ranks_; }
  int local_ranks() const override { return ranks_; }
  int local_rank(int i) const override { return i; }
  void all_gather(const void* const* send, void* const* recv, size_t bytes, const cudaStream_t* streams) override;

 private:
  void destroy_events();
  int ranks_;
  std::vector<cudaEvent_t> ready_;  // [ranks]: each rank's stream before the copies
  std::vector<cudaEvent_t> done_;   // [ranks]: each rank's stream after them
};

// ---- NCCL ----
// The NCCL backend loads NCCL (libnccl.so.2) at run time, so the library neither links nor
// requires it: `library_path` names the file to load, or empty for the loader's search
// ("libnccl.so.2", then "libnccl.so"). It exists when the library was built with nccl.h
// (CMake option NVFP4MLA_NCCL, on by default when nccl.h is found); otherwise every function
// here throws Error saying so.

// True when NCCL support was built and the library loads; otherwise false and *why (when given)
// says why.
bool nccl_available(const std::string& library_path = {}, std::string* why = nullptr);

// The bytes of an ncclUniqueId (NCCL_UNIQUE_ID_BYTES), created by rank 0 and sent to the others.
struct NcclUniqueId {
  char bytes[128] = {};
};
NcclUniqueId nccl_unique_id(const std::string& library_path = {});

// One rank of `world_size` on the current device; the communicator owns and destroys it. Throws
// Error with NCCL's message when the library is missing or init fails.
// `timeout_seconds` 0: NCCL's blocking join (ncclCommInitRank), which waits as long as the other
// ranks take, forever for a rank that never comes. > 0: a nonblocking communicator
// (ncclCommInitRankConfig with blocking = 0; NCCL 2.14 or later, else Error): the join, each
// all_gather's enqueue and the final flush (ncclCommFinalize) each get that long; past it, or on an
// NCCL error, the communicator is aborted (ncclCommAbort) and the call throws Error saying so. The
// collective's kernels are bounded by waiting for them with dcp_stream_synchronize.
std::unique_ptr<DcpCommunicator> make_nccl_communicator(const NcclUniqueId& id, int world_size, int rank,
                                                        const std::string& library_path = {},
                                                        double timeout_seconds = 0);
// An existing ncclComm_t (passed as void*), borrowed: the caller keeps it alive and destroys it. A
// nonblocking one (the engine's) works too: all_gather waits, without a limit, until NCCL has
// enqueued the collective, and reports an NCCL error without aborting the communicator.
std::unique_ptr<DcpCommunicator> make_nccl_communicator(void* nccl_comm, const std::string& library_path = {});
// The ncclComm_t of a communicator from make_nccl_communicator (null for other backends).
void* nccl_comm_of(const DcpCommunicator& comm);
// Waits until `stream` has run everything issued to it, collectives included. For a communicator
// from make_nccl_communicator with a timeout it polls the stream and the communicator: past the
// timeout with the stream still busy (a peer that died or hangs after the join leaves the
// collective's kernels waiting), or on an NCCL error, it aborts the communicator, which stops its
// kernels, and throws Error naming `what`; the communicator then refuses further collectives. The
// abort returns once the device is idle (ncclCommAbort frees device memory), so work on the device
// that is not NCCL's and never ends still holds it.
// Otherwise cudaStreamSynchronize (Error naming `what` on a CUDA error).
void dcp_stream_synchronize(DcpCommunicator& comm, cudaStream_t stream, const std::string& what);

// ---- collectives built on all_gather ----

// Query heads sharded by tensor parallelism: rank r holds heads r*H..(r+1)*H-1 of every row
// (send[i]: [rows, H, head_bytes]); recv[i] gets all of them, [rows, world_size * H, head_bytes].
// staging[i] ([world_size, rows, H, head_bytes]) receives the all-gather, then strided copies
// put the heads in order. head_bytes e.g. 576 * 2 for BF16 q.
void dcp_all_gather_heads(DcpCommunicator& comm, const void* const* send, void* const* staging, void* const* recv,
                          int64_t rows, int heads_per_rank, size_t head_bytes, const cudaStream_t* streams);

}  // namespace nvfp4mla::cuda
