// The NCCL backend of the DCP communicator (cuda/dcp_comm.h). NCCL is loaded at run time
// (dlopen), so the library neither links nor requires it; nccl.h gives only the types and the
// function signatures. Without nccl.h at build time (NVFP4MLA_WITH_NCCL unset) every entry point
// throws.
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "nvfp4mla/cuda/dcp_comm.h"
#include "nvfp4mla/error.h"

#if NVFP4MLA_WITH_NCCL
#include <dlfcn.h>
#include <nccl.h>

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
  return loaded.emplace(path, api).first->second;
}

void nccl_check(const NcclApi& api, ncclResult_t r, const char* what) {
  if (r != ncclSuccess) throw Error(std::string("NCCL: ") + what + ": " + api.get_error_string(r));
}

// One rank of an NCCL communicator, driven by this process.
class NcclDcpCommunicator final : public DcpCommunicator {
 public:
  NcclDcpCommunicator(const NcclApi& api, ncclComm_t comm, bool owned) : api_(api), comm_(comm), owned_(owned) {
    nccl_check(api_, api_.comm_count(comm_, &world_), "ncclCommCount");
    nccl_check(api_, api_.comm_user_rank(comm_, &rank_), "ncclCommUserRank");
  }
  ~NcclDcpCommunicator() override {
    if (owned_) api_.comm_destroy(comm_);
  }
  int world_size() const override { return world_; }
  int local_ranks() const override { return 1; }
  int local_rank(int) const override { return rank_; }
  void all_gather(const void* const* send, void* const* recv, size_t bytes, const cudaStream_t* streams) override {
    if (bytes == 0) return;
    if (!send || !recv || !streams || !send[0] || !recv[0])
      throw Error("NCCL all_gather: send, recv and streams are required");
    nccl_check(api_, api_.all_gather(send[0], recv[0], bytes, ncclUint8, comm_, streams[0]), "ncclAllGather");
  }
  ncclComm_t comm() const { return comm_; }

 private:
  const NcclApi& api_;
  ncclComm_t comm_;
  bool owned_;
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
                                                        const std::string& library_path) {
  if (world_size < 1) throw Error("NCCL communicator: world_size must be >= 1");
  if (rank < 0 || rank >= world_size) throw Error("NCCL communicator: rank must be in 0..world_size-1");
  const NcclApi& api = nccl_api(library_path);
  ncclUniqueId nid;
  std::memcpy(nid.internal, id.bytes, sizeof(id.bytes));
  ncclComm_t comm = nullptr;
  nccl_check(api, api.comm_init_rank(&comm, world_size, nid, rank), "ncclCommInitRank");
  try {
    return std::make_unique<NcclDcpCommunicator>(api, comm, true);
  } catch (...) {
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
std::unique_ptr<DcpCommunicator> make_nccl_communicator(const NcclUniqueId&, int, int, const std::string&) { no_nccl(); }
std::unique_ptr<DcpCommunicator> make_nccl_communicator(void*, const std::string&) { no_nccl(); }
void* nccl_comm_of(const DcpCommunicator&) { return nullptr; }

#endif

}  // namespace nvfp4mla::cuda
