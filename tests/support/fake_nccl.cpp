// A stand-in libnccl for the CPU tests of the NCCL backend's timeouts (tests/unit/dcp_nccl_test.cpp):
// the entry points nvfp4mla loads, with communicators whose joins, collectives and flushes stay in
// progress for as many polls as the test says (or for ever), or end in an error. It moves no data
// and needs no GPU. The test steers it through nvfp4mla_fake_nccl(), which it finds with dlsym in
// the same loaded library.
#include <nccl.h>

#include <cstring>

#include "support/fake_nccl.h"

struct ncclComm {
  int world = 0, rank = 0;
  bool nonblocking = false;
  int pending = 0;                       // polls until the current operation ends; -1: never
  ncclResult_t outcome = ncclSuccess;    // what it ends in
};

extern "C" {

static FakeNccl g_fake;

__attribute__((visibility("default"))) FakeNccl* nvfp4mla_fake_nccl() { return &g_fake; }

__attribute__((visibility("default"))) const char* ncclGetErrorString(ncclResult_t r) {
  switch (r) {
    case ncclSuccess: return "fake: no error";
    case ncclRemoteError: return "fake: a remote rank failed";
    case ncclInProgress: return "fake: in progress";
    default: return "fake: error";
  }
}

__attribute__((visibility("default"))) const char* ncclGetLastError(ncclComm_t) { return "fake: last error"; }

__attribute__((visibility("default"))) ncclResult_t ncclGetUniqueId(ncclUniqueId* id) {
  std::memset(id->internal, 7, sizeof(id->internal));
  return ncclSuccess;
}

static ncclComm* make_comm(int world, int rank, bool nonblocking) {
  auto* c = new ncclComm;
  c->world = world;
  c->rank = rank;
  c->nonblocking = nonblocking;
  c->pending = g_fake.join_polls;
  c->outcome = g_fake.join_outcome;
  return c;
}

__attribute__((visibility("default"))) ncclResult_t ncclCommInitRank(ncclComm_t* comm, int world, ncclUniqueId, int rank) {
  ++g_fake.blocking_inits;
  *comm = make_comm(world, rank, false);
  (*comm)->pending = 0;
  return g_fake.join_outcome;
}

__attribute__((visibility("default"))) ncclResult_t ncclCommInitRankConfig(ncclComm_t* comm, int world, ncclUniqueId,
                                                                          int rank, ncclConfig_t* config) {
  const bool nonblocking = config && config->blocking == 0;
  ++(nonblocking ? g_fake.nonblocking_inits : g_fake.blocking_inits);
  *comm = make_comm(world, rank, nonblocking);
  if (!nonblocking) return g_fake.join_outcome;
  return (*comm)->pending == 0 ? (*comm)->outcome : ncclInProgress;
}

__attribute__((visibility("default"))) ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t* state) {
  if (g_fake.async_error != ncclSuccess) {
    *state = g_fake.async_error;
  } else if (comm->pending == 0) {
    *state = comm->outcome;
  } else {
    if (comm->pending > 0) --comm->pending;
    *state = ncclInProgress;
  }
  return ncclSuccess;
}

__attribute__((visibility("default"))) ncclResult_t ncclCommCount(const ncclComm_t comm, int* count) {
  *count = comm->world;
  return ncclSuccess;
}

__attribute__((visibility("default"))) ncclResult_t ncclCommUserRank(const ncclComm_t comm, int* rank) {
  *rank = comm->rank;
  return ncclSuccess;
}

__attribute__((visibility("default"))) ncclResult_t ncclAllGather(const void*, void*, size_t, ncclDataType_t, ncclComm_t comm,
                                                                  cudaStream_t) {
  ++g_fake.collectives;
  comm->pending = g_fake.collective_polls;
  comm->outcome = ncclSuccess;
  return comm->nonblocking && comm->pending != 0 ? ncclInProgress : ncclSuccess;
}

__attribute__((visibility("default"))) ncclResult_t ncclCommFinalize(ncclComm_t comm) {
  ++g_fake.finalizes;
  comm->pending = g_fake.finalize_polls;
  comm->outcome = ncclSuccess;
  return comm->nonblocking && comm->pending != 0 ? ncclInProgress : ncclSuccess;
}

__attribute__((visibility("default"))) ncclResult_t ncclCommAbort(ncclComm_t comm) {
  ++g_fake.aborts;
  delete comm;
  return ncclSuccess;
}

__attribute__((visibility("default"))) ncclResult_t ncclCommDestroy(ncclComm_t comm) {
  ++g_fake.destroys;
  delete comm;
  return ncclSuccess;
}

}  // extern "C"
