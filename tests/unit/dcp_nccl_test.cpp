// The NCCL backend's timeouts (cuda/dcp_comm.h, make_nccl_communicator with timeout_seconds), on
// a stand-in libnccl (support/fake_nccl.cpp) whose joins, collectives and flushes stay in progress
// as long as each test says: a join that never completes is aborted at the timeout with an error
// that says so, a late one succeeds, an NCCL error aborts at once, a collective stuck in its
// enqueue is aborted and the communicator refuses later calls, so does a wait for the stream when
// a peer fails, a borrowed nonblocking communicator waits for its collectives, and without a
// timeout the join is NCCL's blocking one. Skips in builds without the NCCL backend.
#include <gtest/gtest.h>

#include <chrono>
#include <string>

#include "nvfp4mla/error.h"

#if defined(NVFP4MLA_FAKE_NCCL_PATH) && defined(NVFP4MLA_WITH_CUDA)
#include <dlfcn.h>
#include <nccl.h>

#include "nvfp4mla/cuda/dcp_comm.h"
#include "support/fake_nccl.h"

namespace {

using nvfp4mla::Error;
using nvfp4mla::cuda::make_nccl_communicator;
using nvfp4mla::cuda::NcclUniqueId;
using Clock = std::chrono::steady_clock;

class DcpNcclTimeout : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string why;
    if (!nvfp4mla::cuda::nccl_available(kLib, &why)) GTEST_SKIP() << why;
    handle_ = dlopen(kLib, RTLD_NOW | RTLD_LOCAL);
    ASSERT_NE(handle_, nullptr) << dlerror();
    auto control = reinterpret_cast<FakeNccl* (*)()>(dlsym(handle_, "nvfp4mla_fake_nccl"));
    ASSERT_NE(control, nullptr);
    fake_ = control();
    *fake_ = FakeNccl{0, ncclSuccess, 0, 0, ncclSuccess, 0, 0, 0, 0, 0, 0};
  }
  void TearDown() override {
    if (handle_) dlclose(handle_);
  }
  // Throws the backend's Error, or returns what make_nccl_communicator made.
  std::unique_ptr<nvfp4mla::cuda::DcpCommunicator> join(double timeout_seconds, int world = 2, int rank = 0) {
    return make_nccl_communicator(NcclUniqueId{}, world, rank, kLib, timeout_seconds);
  }
  static void all_gather(nvfp4mla::cuda::DcpCommunicator& comm) {
    char send[4] = {}, recv[8] = {};
    const void* s[1] = {send};
    void* r[1] = {recv};
    const cudaStream_t streams[1] = {nullptr};
    comm.all_gather(s, r, sizeof send, streams);
  }
  static constexpr const char* kLib = NVFP4MLA_FAKE_NCCL_PATH;
  void* handle_ = nullptr;
  FakeNccl* fake_ = nullptr;
};

TEST_F(DcpNcclTimeout, AJoinThatNeverCompletesIsAbortedAtTheTimeout) {
  fake_->join_polls = -1;
  const auto start = Clock::now();
  try {
    join(0.2);
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("the join of rank 0 of 2 did not complete within 0.2 s"), std::string::npos)
        << e.what();
    EXPECT_NE(std::string(e.what()).find("aborted"), std::string::npos) << e.what();
  }
  const double waited = std::chrono::duration<double>(Clock::now() - start).count();
  EXPECT_GE(waited, 0.2);
  EXPECT_LT(waited, 10.0);
  EXPECT_EQ(fake_->nonblocking_inits, 1);
  EXPECT_EQ(fake_->blocking_inits, 0);
  EXPECT_EQ(fake_->aborts, 1);
  EXPECT_EQ(fake_->destroys, 0);
}

TEST_F(DcpNcclTimeout, ALateJoinSucceedsAndTheCommunicatorWorks) {
  fake_->join_polls = 30;
  fake_->collective_polls = 3;
  fake_->finalize_polls = 2;
  {
    auto comm = join(30, 4, 3);
    EXPECT_EQ(comm->world_size(), 4);
    EXPECT_EQ(comm->local_rank(0), 3);
    all_gather(*comm);
    all_gather(*comm);
    EXPECT_EQ(fake_->collectives, 2);
  }
  EXPECT_EQ(fake_->finalizes, 1);  // flushed, then destroyed
  EXPECT_EQ(fake_->destroys, 1);
  EXPECT_EQ(fake_->aborts, 0);
}

TEST_F(DcpNcclTimeout, AnErrorDuringTheJoinAbortsAtOnceAndSaysWhy) {
  fake_->join_polls = 2;
  fake_->join_outcome = ncclRemoteError;
  const auto start = Clock::now();
  try {
    join(300);
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("fake: a remote rank failed"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("aborted"), std::string::npos) << e.what();
  }
  EXPECT_LT(Clock::now() - start, std::chrono::seconds(10));  // not the 300 s
  EXPECT_EQ(fake_->aborts, 1);
}

TEST_F(DcpNcclTimeout, ACollectiveStuckInItsEnqueueIsAbortedAndLaterCallsAreRefused) {
  auto comm = join(0.2);
  fake_->collective_polls = -1;
  try {
    all_gather(*comm);
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("ncclAllGather did not complete within 0.2 s"), std::string::npos) << e.what();
  }
  EXPECT_EQ(fake_->aborts, 1);
  try {
    all_gather(*comm);
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("aborted after an earlier error"), std::string::npos) << e.what();
  }
  comm.reset();  // neither finalized nor destroyed again
  EXPECT_EQ(fake_->finalizes, 0);
  EXPECT_EQ(fake_->destroys, 0);
  EXPECT_EQ(fake_->aborts, 1);
}

TEST_F(DcpNcclTimeout, AFlushThatNeverEndsIsAbortedWhenTheCommunicatorGoes) {
  fake_->finalize_polls = -1;
  join(0.2).reset();
  EXPECT_EQ(fake_->finalizes, 1);
  EXPECT_EQ(fake_->aborts, 1);
  EXPECT_EQ(fake_->destroys, 0);
}

// A peer that fails after the join shows in the communicator's state: waiting for the stream
// aborts at once, says why, and the communicator refuses later collectives.
TEST_F(DcpNcclTimeout, WaitingForTheStreamAbortsWhenAPeerFails) {
  auto comm = join(300);
  fake_->async_error = ncclRemoteError;
  const auto start = Clock::now();
  try {
    nvfp4mla::cuda::dcp_stream_synchronize(*comm, nullptr, "step");
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("NCCL: step: fake: a remote rank failed"), std::string::npos) << e.what();
  }
  EXPECT_LT(Clock::now() - start, std::chrono::seconds(10));
  EXPECT_EQ(fake_->aborts, 1);
  EXPECT_THROW(all_gather(*comm), Error);
  EXPECT_THROW(nvfp4mla::cuda::dcp_stream_synchronize(*comm, nullptr, "step"), Error);
  comm.reset();
  EXPECT_EQ(fake_->destroys, 0);
  EXPECT_EQ(fake_->aborts, 1);
}

// An engine's nonblocking communicator, borrowed: a collective in progress is waited for (not an
// error), and a failure is reported without aborting what the engine owns.
TEST_F(DcpNcclTimeout, ABorrowedNonblockingCommunicatorWaitsForItsCollectives) {
  using InitConfig = ncclResult_t (*)(ncclComm_t*, int, ncclUniqueId, int, ncclConfig_t*);
  using Destroy = ncclResult_t (*)(ncclComm_t);
  const auto init = reinterpret_cast<InitConfig>(dlsym(handle_, "ncclCommInitRankConfig"));
  const auto destroy = reinterpret_cast<Destroy>(dlsym(handle_, "ncclCommDestroy"));
  ASSERT_TRUE(init && destroy);
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  ncclComm_t engine_comm = nullptr;
  ASSERT_EQ(init(&engine_comm, 2, ncclUniqueId{}, 1, &config), ncclSuccess);  // join_polls 0: joined at once
  {
    auto borrowed = make_nccl_communicator(engine_comm, kLib);
    EXPECT_EQ(borrowed->world_size(), 2);
    fake_->collective_polls = 5;
    all_gather(*borrowed);
    EXPECT_EQ(fake_->collectives, 1);
    fake_->collective_polls = -1;
    fake_->async_error = ncclRemoteError;
    try {
      all_gather(*borrowed);
      ADD_FAILURE() << "no error";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("fake: a remote rank failed"), std::string::npos) << e.what();
      EXPECT_EQ(std::string(e.what()).find("aborted"), std::string::npos) << e.what();
    }
  }
  EXPECT_EQ(fake_->aborts, 0);
  EXPECT_EQ(fake_->destroys, 0);  // the owner's to destroy
  EXPECT_EQ(destroy(engine_comm), ncclSuccess);
}

TEST_F(DcpNcclTimeout, WithoutATimeoutTheJoinIsNcclsBlockingOne) {
  join(0).reset();
  EXPECT_EQ(fake_->blocking_inits, 1);
  EXPECT_EQ(fake_->nonblocking_inits, 0);
  EXPECT_EQ(fake_->finalizes, 0);
  EXPECT_EQ(fake_->destroys, 1);
  EXPECT_THROW(join(-1), Error);
  EXPECT_EQ(fake_->blocking_inits + fake_->nonblocking_inits, 1);
}

}  // namespace
#else
TEST(DcpNcclTimeout, NeedsTheNcclBackend) { GTEST_SKIP() << "this build has no NCCL backend (or no stand-in libnccl)"; }
#endif
