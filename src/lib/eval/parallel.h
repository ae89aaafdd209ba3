#pragma once
// Work spread over threads for the evaluation (threads/parallel_for.h) and its progress reports.
#include <mutex>
#include <string>

#include "nvfp4mla/eval/evaluation.h"
#include "threads/parallel_for.h"

namespace nvfp4mla::eval::detail {

inline int resolve_threads(int requested) { return requested > 0 ? requested : nvfp4mla::detail::hardware_threads(); }

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

using nvfp4mla::detail::parallel_for;

}  // namespace nvfp4mla::eval::detail
