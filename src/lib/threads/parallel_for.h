#pragma once
// Independent work items spread over host threads (the CPU references, the evaluation, the tests'
// oracles). Each item writes only its own results, so the outcome does not depend on the thread
// count or the schedule.
#include <algorithm>
#include <atomic>
#include <cstdint>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace nvfp4mla::detail {

// The machine's hardware threads, at least 1.
inline int hardware_threads() { return std::max(1, static_cast<int>(std::thread::hardware_concurrency())); }

// Calls fn(i) for i in [0, n) on up to `threads` new threads (on the calling thread when one is
// enough); rethrows the first exception once every thread has stopped.
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

// Work items of `rows` rows of `heads` heads each for `threads` threads: a row each, or, with fewer
// rows than threads, `blocks` blocks of up to `block_heads` of its heads (at least 8 a block), so
// that a few rows of many heads still use every thread without splitting rows further than that
// (every item dequantizes its row again). item(i) is row i / blocks and its heads from
// (i % blocks) * block_heads.
struct RowHeadItem {
  int row, h0, h1;  // heads [h0, h1); empty when h0 >= h1
};
struct RowHeadBlocks {
  int rows = 0, heads = 0, blocks = 1, block_heads = 0;
  int64_t items() const { return int64_t(rows) * blocks; }
  RowHeadItem item(int64_t i) const {
    const int h0 = static_cast<int>(i % blocks) * block_heads;
    return {static_cast<int>(i / blocks), h0, std::min(heads, h0 + block_heads)};
  }
};
inline RowHeadBlocks row_head_blocks(int rows, int heads, int threads) {
  RowHeadBlocks b;
  b.rows = rows;
  b.heads = heads;
  b.blocks = rows > 0 ? std::clamp((threads + rows - 1) / rows, 1, std::max(1, heads / 8)) : 1;
  b.block_heads = (heads + b.blocks - 1) / b.blocks;
  return b;
}

}  // namespace nvfp4mla::detail
