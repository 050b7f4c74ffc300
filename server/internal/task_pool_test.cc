#include "server/internal/task_pool.h"

#include <gtest/gtest.h>

#include <atomic>
#include <mutex>
#include <set>
#include <thread>
#include <vector>

namespace asyncps::server::internal {
namespace {

TEST(TaskPoolTest, RunsEveryItemExactlyOnceEveryTime) {
  for (int threads : {1, 2, 4}) {
    TaskPool pool(threads);
    EXPECT_EQ(pool.threads(), threads);
    for (size_t n : {size_t{0}, size_t{1}, size_t{3}, size_t{100}}) {
      for (int round = 0; round < 50; ++round) {
        std::vector<std::atomic<int>> hits(n);
        pool.Run(n, [&](size_t i) { hits[i].fetch_add(1); });
        for (size_t i = 0; i < n; ++i) {
          ASSERT_EQ(hits[i].load(), 1) << threads << " threads, n " << n;
        }
      }
    }
  }
}

TEST(TaskPoolTest, UsesThePoolThreadsAndTheCaller) {
  TaskPool pool(3);
  std::mutex mu;
  std::set<std::thread::id> seen;
  // Items that wait for each other can only finish on distinct threads.
  std::atomic<int> arrived{0};
  pool.Run(3, [&](size_t) {
    {
      std::lock_guard<std::mutex> l(mu);
      seen.insert(std::this_thread::get_id());
    }
    arrived.fetch_add(1);
    while (arrived.load() < 3) std::this_thread::yield();
  });
  EXPECT_EQ(seen.size(), 3u);
  EXPECT_TRUE(seen.count(std::this_thread::get_id()));
}

}  // namespace
}  // namespace asyncps::server::internal
