#pragma once
// Work spread over threads for the evaluation. Items are independent and write only their own
// results, so the outcome does not depend on the thread count or the schedule.
#include <algorithm>
#include <atomic>
#include <exception>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "nvfp4mla/eval/evaluation.h"

namespace nvfp4mla::eval::detail {

inline int resolve_threads(int requested) {
  if (requested > 0) return requested;
  return std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
}

// Reports progress of one stage from many threads, one call at a time.
class StageProgress {
 public:
  StageProgress(const ProgressFn& fn, std::string stage, int64_t total) : fn_(fn), stage_(std::move(stage)), total_(total) {
    if (fn_) fn_(stage_, 0, total_);
  }
  void advance(int64_t units = 1) {
    if (!fn_) return;
    std::lock_guard<std::mutex> lock(mu_);
    done_ += units;
    fn_(stage_, done_, total_);
  }

 private:
  const ProgressFn& fn_;
  std::string stage_;
  int64_t total_;
  int64_t done_ = 0;
  std::mutex mu_;
};

// Calls fn(i) for i in [0, n) on up to `threads` threads; rethrows the first exception.
inline void parallel_for(int64_t n, int threads, const std::function<void(int64_t)>& fn) {
  const int t = static_cast<int>(std::min<int64_t>(n, std::max(1, threads)));
  if (t <= 1) {
    for (int64_t i = 0; i < n; ++i) fn(i);
    return;
  }
  std::atomic<int64_t> next{0};
  std::exception_ptr error;
  std::mutex error_mu;
  auto worker = [&] {
    for (;;) {
      const int64_t i = next.fetch_add(1);
      if (i >= n) return;
      try {
        fn(i);
      } catch (...) {
        std::lock_guard<std::mutex> lock(error_mu);
        if (!error) error = std::current_exception();
        next.store(n);
      }
    }
  };
  std::vector<std::thread> pool;
  for (int k = 0; k < t; ++k) pool.emplace_back(worker);
  for (auto& th : pool) th.join();
  if (error) std::rethrow_exception(error);
}

}  // namespace nvfp4mla::eval::detail
