#pragma once
// The control block of the stand-in libnccl (fake_nccl.cpp), shared by the fake and its tests:
// what the test sets before a call (polls: how many ncclCommGetAsyncError calls the operation stays
// in progress; -1: for ever) and what the fake counts. The test finds it with
// dlsym(handle, "nvfp4mla_fake_nccl").
#include <nccl.h>

struct FakeNccl {
  int join_polls;
  ncclResult_t join_outcome;  // what the join ends in
  int collective_polls;
  int finalize_polls;
  ncclResult_t async_error;  // when not ncclSuccess: what every communicator's state reads as
  int blocking_inits, nonblocking_inits, aborts, destroys, finalizes, collectives;
};
