// The NCCL backend of the DCP communicator (cuda/dcp_comm.h). NCCL is loaded at run time
// (dlopen), so the library neither links nor requires it; nccl.h gives only the types and the
// function signatures. Without nccl.h at build time (NVFP4MLA_WITH_NCCL unset) every entry point
// throws.
#include <chrono>
#include <cstdio>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "device/cuda_check.h"
#include "nvfp4mla/cuda/dcp_comm.h"
#include "nvfp4mla/error.h"

#if NVFP4MLA_WITH_NCCL
#include <dlfcn.h>
#include <nccl.h>

#include <algorithm>
#include <initializer_list>
#include <map>
#include <type_traits>

static_assert(sizeof(nvfp4mla::cuda::NcclUniqueId) == sizeof(ncclUniqueId), "NcclUniqueId must hold an ncclUniqueId");
#endif

namespace nvfp4mla::cuda {

#if NVFP4MLA_WITH_NCCL
namespace {

// The NCCL functions the backend calls, from one loaded library.
struct NcclApi {
  decltype(&ncclGetErrorString) get_error_string = nullptr;
  decltype(&ncclGetUniqueId) get_unique_id = nullptr;
  decltype(&ncclCommInitRank) comm_init_rank = nullptr;
  decltype(&ncclCommDestroy) comm_destroy = nullptr;
  decltype(&ncclCommCount) comm_count = nullptr;
  decltype(&ncclCommUserRank) comm_user_rank = nullptr;
  decltype(&ncclAllGather) all_gather = nullptr;
  // Nonblocking communicators (NCCL 2.14 and later); null when the loaded library lacks them.
  decltype(&ncclCommInitRankConfig) comm_init_rank_config = nullptr;
  decltype(&ncclCommGetAsyncError) comm_get_async_error = nullptr;
  decltype(&ncclCommAbort) comm_abort = nullptr;
  decltype(&ncclCommFinalize) comm_finalize = nullptr;
  decltype(&ncclGetLastError) get_last_error = nullptr;
  bool nonblocking() const { return comm_init_rank_config && comm_get_async_error && comm_abort && comm_finalize; }
};

// Loads `path` (or the default names) once per path and keeps it loaded for the process: NCCL
// communicators may outlive any one object that uses them. Throws Error saying what is missing.
const NcclApi& nccl_api(const std::string& path) {
  static std::mutex mutex;
  static std::map<std::string, NcclApi> loaded;
  std::lock_guard<std::mutex> lock(mutex);
  if (auto it = loaded.find(path); it != loaded.end()) return it->second;
  void* handle = nullptr;
  std::string tried;
  // A vector, not a braced list in a conditional: the list's strings would not outlive the
  // expression (dangling names: garbage in the error, a crash on the H200).
  const std::vector<std::string> names = path.empty() ? std::vector<std::string>{"libnccl.so.2", "libnccl.so"}
                                                      : std::vector<std::string>{path};
  for (const std::string& name : names) {
    handle = dlopen(name.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (handle) break;
    const char* e = dlerror();
    tried += (tried.empty() ? "" : "; ") + name + ": " + (e ? e : "not found");
  }
  if (!handle)
    throw Error("NCCL: cannot load the library (" + tried +
                "); pass its path (e.g. the nvidia-nccl wheel's nvidia/nccl/lib/libnccl.so.2)");
  NcclApi api;
  auto bind = [&](auto& fn, const char* symbol) {
    fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(dlsym(handle, symbol));
    if (!fn) throw Error(std::string("NCCL: the loaded library has no ") + symbol);
  };
  bind(api.get_error_string, "ncclGetErrorString");
  bind(api.get_unique_id, "ncclGetUniqueId");
  bind(api.comm_init_rank, "ncclCommInitRank");
  bind(api.comm_destroy, "ncclCommDestroy");
  bind(api.comm_count, "ncclCommCount");
  bind(api.comm_user_rank, "ncclCommUserRank");
  bind(api.all_gather, "ncclAllGather");
  auto bind_optional = [&](auto& fn, const char* symbol) {
    fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(dlsym(handle, symbol));
  };
  bind_optional(api.comm_init_rank_config, "ncclCommInitRankConfig");
  bind_optional(api.comm_get_async_error, "ncclCommGetAsyncError");
  bind_optional(api.comm_abort, "ncclCommAbort");
  bind_optional(api.comm_finalize, "ncclCommFinalize");
  bind_optional(api.get_last_error, "ncclGetLastError");
  return loaded.emplace(path, api).first->second;
}

std::string nccl_message(const NcclApi& api, ncclResult_t r, ncclComm_t comm = nullptr) {
  std::string m = api.get_error_string(r);
  if (api.get_last_error && r != ncclSuccess && r != ncclInProgress) {
    const char* last = api.get_last_error(comm);
    if (last && *last) m += std::string(" (") + last + ")";
  }
  return m;
}

void nccl_check(const NcclApi& api, ncclResult_t r, const char* what) {
  if (r != ncclSuccess) throw Error(std::string("NCCL: ") + what + ": " + nccl_message(api, r));
}

// Polls until done(state) says so (state: the communicator's, ncclSuccess or ncclInProgress).
// Past `timeout_seconds` (> 0; 0: no limit), or on an NCCL error (a failed peer among them),
// aborts the communicator when it is ours (ncclCommAbort, which also stops its kernels; a borrowed
// one is left to its owner) and throws Error saying which.
template <class Done>
void poll_or_abort(const NcclApi& api, ncclComm_t comm, double timeout_seconds, bool ours, const std::string& what,
                   Done done) {
  using Clock = std::chrono::steady_clock;
  const auto deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(timeout_seconds));
  auto pause = std::chrono::microseconds(20);
  for (;;) {
    ncclResult_t state = ncclSuccess;
    const ncclResult_t r = api.comm_get_async_error(comm, &state);
    if (r != ncclSuccess) state = r;
    if (state != ncclSuccess && state != ncclInProgress) {
      const std::string m = nccl_message(api, state, comm);
      if (!ours) throw Error("NCCL: " + what + ": " + m);
      api.comm_abort(comm);
      throw Error("NCCL: " + what + ": " + m + "; the communicator was aborted");
    }
    if (done(state)) return;
    if (timeout_seconds > 0 && Clock::now() >= deadline) {
      if (ours) api.comm_abort(comm);
      char seconds[32];
      std::snprintf(seconds, sizeof seconds, "%g", timeout_seconds);
      throw Error("NCCL: " + what + " did not complete within " + seconds + " s (a rank that never joined, died or hangs)" +
                  (ours ? "; the communicator was aborted" : ""));
    }
    std::this_thread::sleep_for(pause);
    pause = std::min<std::chrono::microseconds>(pause * 2, std::chrono::milliseconds(2));
  }
}

// Waits until a nonblocking communicator's pending operation (`what`) has completed.
void await_nonblocking(const NcclApi& api, ncclComm_t comm, double timeout_seconds, const std::string& what,
                       bool ours = true) {
  poll_or_abort(api, comm, timeout_seconds, ours, what, [](ncclResult_t state) { return state == ncclSuccess; });
}

// One rank of an NCCL communicator, driven by this process.
// A nonblocking one (`timeout_seconds` > 0, a communicator it owns) bounds each collective's
// enqueue by the timeout and finalizes before it destroys.
class NcclDcpCommunicator final : public DcpCommunicator {
 public:
  NcclDcpCommunicator(const NcclApi& api, ncclComm_t comm, bool owned, double timeout_seconds = 0)
      : api_(api), comm_(comm), owned_(owned), timeout_(timeout_seconds) {
    nccl_check(api_, api_.comm_count(comm_, &world_), "ncclCommCount");
    nccl_check(api_, api_.comm_user_rank(comm_, &rank_), "ncclCommUserRank");
  }
  ~NcclDcpCommunicator() override {
    if (!owned_ || !comm_) return;
    if (timeout_ > 0) {
      // Finalize flushes what the rank issued, which may wait on the other ranks: bounded by the
      // timeout, then aborted (a peer may be gone). An abort frees the communicator.
      const ncclResult_t r = api_.comm_finalize(comm_);
      if (r != ncclSuccess && r != ncclInProgress) {
        api_.comm_abort(comm_);
        return;
      }
      try {
        await_nonblocking(api_, comm_, timeout_, "ncclCommFinalize");
      } catch (const Error&) {
        return;
      }
    }
    api_.comm_destroy(comm_);
  }
  int world_size() const override { return world_; }
  int local_ranks() const override { return 1; }
  int local_rank(int) const override { return rank_; }
  void all_gather(const void* const* send, void* const* recv, size_t bytes, const cudaStream_t* streams) override {
    if (bytes == 0) return;
    if (!send || !recv || !streams || !send[0] || !recv[0])
      throw Error("NCCL all_gather: send, recv and streams are required");
    if (!comm_) throw Error("NCCL all_gather: the communicator was aborted after an earlier error");
    const ncclResult_t r = api_.all_gather(send[0], recv[0], bytes, ncclUint8, comm_, streams[0]);
    // In progress: a nonblocking communicator, ours (bounded by the timeout) or borrowed (the
    // engine made it nonblocking; waited for as a blocking call would be, and never aborted here).
    if (r == ncclInProgress && api_.comm_get_async_error) {
      try {
        await_nonblocking(api_, comm_, owned_ ? timeout_ : 0, "ncclAllGather", owned_);
      } catch (const Error&) {
        if (owned_) comm_ = nullptr;  // aborted
        throw;
      }
      return;
    }
    nccl_check(api_, r, "ncclAllGather");
  }
  ncclComm_t comm() const { return comm_; }
  // Waits for `stream`, bounded by the timeout (nonblocking communicators) or not (cudaStreamSynchronize).
  void synchronize(cudaStream_t stream, const std::string& what) {
    if (timeout_ <= 0) {
      check(cudaStreamSynchronize(stream), what.c_str());
      return;
    }
    if (!comm_) throw Error("NCCL: " + what + ": the communicator was aborted after an earlier error");
    cudaError_t status = cudaSuccess;
    try {
      poll_or_abort(api_, comm_, timeout_, true, what, [&](ncclResult_t) {
        status = cudaStreamQuery(stream);
        return status != cudaErrorNotReady;
      });
    } catch (const Error&) {
      comm_ = nullptr;  // aborted
      throw;
    }
    check(status, what.c_str());
  }

 private:
  const NcclApi& api_;
  ncclComm_t comm_;
  bool owned_;
  double timeout_;
  int world_ = 0, rank_ = 0;
};

}  // namespace

bool nccl_available(const std::string& library_path, std::string* why) {
  try {
    nccl_api(library_path);
    return true;
  } catch (const Error& e) {
    if (why) *why = e.what();
    return false;
  }
}

NcclUniqueId nccl_unique_id(const std::string& library_path) {
  const NcclApi& api = nccl_api(library_path);
  ncclUniqueId id;
  nccl_check(api, api.get_unique_id(&id), "ncclGetUniqueId");
  NcclUniqueId out;
  std::memcpy(out.bytes, id.internal, sizeof(out.bytes));
  return out;
}

std::unique_ptr<DcpCommunicator> make_nccl_communicator(const NcclUniqueId& id, int world_size, int rank,
                                                        const std::string& library_path, double timeout_seconds) {
  if (world_size < 1) throw Error("NCCL communicator: world_size must be >= 1");
  if (rank < 0 || rank >= world_size) throw Error("NCCL communicator: rank must be in 0..world_size-1");
  if (!(timeout_seconds >= 0)) throw Error("NCCL communicator: timeout_seconds must be >= 0 (0: no timeout)");
  const NcclApi& api = nccl_api(library_path);
  ncclUniqueId nid;
  std::memcpy(nid.internal, id.bytes, sizeof(id.bytes));
  ncclComm_t comm = nullptr;
  if (timeout_seconds > 0) {
    if (!api.nonblocking())
      throw Error("NCCL: the loaded library has no nonblocking communicators (ncclCommInitRankConfig, "
                  "ncclCommGetAsyncError, ncclCommAbort, ncclCommFinalize: NCCL 2.14 or later), which a join "
                  "timeout needs; load a newer NCCL or pass no timeout");
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    const ncclResult_t r = api.comm_init_rank_config(&comm, world_size, nid, rank, &config);
    if (r != ncclSuccess && r != ncclInProgress) {
      const std::string m = nccl_message(api, r, comm);
      if (comm) api.comm_abort(comm);
      throw Error("NCCL: ncclCommInitRankConfig: " + m);
    }
    await_nonblocking(api, comm, timeout_seconds,
                      "the join of rank " + std::to_string(rank) + " of " + std::to_string(world_size));
  } else {
    nccl_check(api, api.comm_init_rank(&comm, world_size, nid, rank), "ncclCommInitRank");
  }
  try {
    return std::make_unique<NcclDcpCommunicator>(api, comm, true, timeout_seconds);
  } catch (...) {
    if (timeout_seconds > 0)
      api.comm_abort(comm);
    else
      api.comm_destroy(comm);
    throw;
  }
}

std::unique_ptr<DcpCommunicator> make_nccl_communicator(void* nccl_comm, const std::string& library_path) {
  if (!nccl_comm) throw Error("NCCL communicator: nccl_comm is null");
  return std::make_unique<NcclDcpCommunicator>(nccl_api(library_path), static_cast<ncclComm_t>(nccl_comm), false);
}

void* nccl_comm_of(const DcpCommunicator& comm) {
  const auto* n = dynamic_cast<const NcclDcpCommunicator*>(&comm);
  return n ? static_cast<void*>(n->comm()) : nullptr;
}

void dcp_stream_synchronize(DcpCommunicator& comm, cudaStream_t stream, const std::string& what) {
  if (auto* n = dynamic_cast<NcclDcpCommunicator*>(&comm)) return n->synchronize(stream, what);
  check(cudaStreamSynchronize(stream), what.c_str());
}

#else  // built without nccl.h

namespace {
[[noreturn]] void no_nccl() {
  throw Error("NCCL: this build of nvfp4mla has no NCCL support (nccl.h was not found, or NVFP4MLA_NCCL=OFF)");
}
}  // namespace

bool nccl_available(const std::string&, std::string* why) {
  if (why) *why = "this build of nvfp4mla has no NCCL support (nccl.h was not found, or NVFP4MLA_NCCL=OFF)";
  return false;
}
NcclUniqueId nccl_unique_id(const std::string&) { no_nccl(); }
std::unique_ptr<DcpCommunicator> make_nccl_communicator(const NcclUniqueId&, int, int, const std::string&, double) {
  no_nccl();
}
std::unique_ptr<DcpCommunicator> make_nccl_communicator(void*, const std::string&) { no_nccl(); }
void* nccl_comm_of(const DcpCommunicator&) { return nullptr; }
void dcp_stream_synchronize(DcpCommunicator&, cudaStream_t stream, const std::string& what) {
  check(cudaStreamSynchronize(stream), what.c_str());
}

#endif

}  // namespace nvfp4mla::cuda
