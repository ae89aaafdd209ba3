#include "thread_pool.h"

#include "nvfp4mla/error.h"

namespace nvfp4mla::offload {

ThreadPool::ThreadPool(int threads, size_t max_queued) : max_queued_(max_queued) {
  if (threads < 1) throw Error("the offload store needs at least one I/O thread, got " + std::to_string(threads));
  if (max_queued < 1) throw Error("the offload store's queue must hold at least one item");
  workers_.reserve(static_cast<size_t>(threads));
  for (int i = 0; i < threads; ++i) workers_.emplace_back([this] { work(); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard lock(mu_);
    stopping_ = true;
  }
  not_empty_.notify_all();
  for (auto& t : workers_) t.join();
}

void ThreadPool::submit(std::function<void()> task) {
  std::unique_lock lock(mu_);
  not_full_.wait(lock, [this] { return queue_.size() < max_queued_; });
  queue_.push_back(std::move(task));
  lock.unlock();
  not_empty_.notify_one();
}

void ThreadPool::work() {
  for (;;) {
    std::function<void()> task;
    {
      std::unique_lock lock(mu_);
      not_empty_.wait(lock, [this] { return stopping_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stopping and drained
      task = std::move(queue_.front());
      queue_.pop_front();
    }
    not_full_.notify_one();
    task();
  }
}

}  // namespace nvfp4mla::offload
