#pragma once
// Fixed-size worker pool with a bounded task queue (private to the offload store): submit()
// waits while the queue is full, so a producer faster than the disk is slowed down instead of
// buffering without bound.
#include <condition_variable>
#include <cstddef>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace nvfp4mla::offload {

class ThreadPool {
 public:
  ThreadPool(int threads, size_t max_queued);
  ~ThreadPool();  // runs every queued task, then joins
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  // Tasks must not throw (the store wraps each item).
  void submit(std::function<void()> task);

 private:
  void work();

  size_t max_queued_;
  std::mutex mu_;
  std::condition_variable not_empty_, not_full_;
  std::deque<std::function<void()>> queue_;
  bool stopping_ = false;
  std::vector<std::thread> workers_;
};

}  // namespace nvfp4mla::offload
