#include "core/threads.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <thread>
#include <vector>

namespace tessera {
namespace {

TEST(Threads, CpuBlocksAreEqualAndContiguousWithTheRemainderInNone) {
  const std::vector<int> cpus = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9};  // 10 CPUs, 4 ranks: 2 each, 8 and 9 spare
  EXPECT_EQ(cpu_block(cpus, 0, 4), (std::vector<int>{0, 1}));
  EXPECT_EQ(cpu_block(cpus, 3, 4), (std::vector<int>{6, 7}));
  EXPECT_EQ(cpu_block(cpus, 1, 1), std::vector<int>{});  // no such block
  EXPECT_EQ(cpu_block({4, 6, 9}, 2, 3), std::vector<int>{9});
  EXPECT_EQ(cpu_block({0, 1}, 0, 3), std::vector<int>{});  // fewer CPUs than ranks
  EXPECT_EQ(cpu_block({0, 1}, -1, 2), std::vector<int>{});
}

// Items go to threads as they come free: while one thread is held up by a slow item, the others
// run all the rest, and every item runs once. Item 0 holds its thread until the other items have
// run (or 5 s have passed, as they do where its thread has items of its own queued).
TEST(Threads, ParallelForEachGivesTheRestToThreadsThatAreFree) {
  const int saved = num_threads();
  set_num_threads(2);
  constexpr int64_t kItems = 12;
  std::vector<int> thread_of(kItems, -1);
  std::vector<std::atomic<int>> runs(kItems);
  std::atomic<int64_t> others_done{0};
  parallel_for_each(kItems, [&](int64_t i, int thread) {
    if (i == 0) {
      const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
      while (others_done.load() < kItems - 1 && std::chrono::steady_clock::now() < deadline) {
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
      }
    } else {
      ++others_done;
    }
    thread_of[static_cast<size_t>(i)] = thread;
    runs[static_cast<size_t>(i)].fetch_add(1);
  });
  set_num_threads(saved);
  for (int64_t i = 0; i < kItems; ++i) EXPECT_EQ(runs[static_cast<size_t>(i)].load(), 1) << "item " << i;
  const int64_t with_slow = std::count(thread_of.begin(), thread_of.end(), thread_of[0]);
  EXPECT_EQ(with_slow, 1) << "the thread held up by item 0 also ran " << with_slow - 1 << " others";
}

TEST(Threads, CpuListJoinsRuns) {
  EXPECT_EQ(cpu_list({}), "");
  EXPECT_EQ(cpu_list({3}), "3");
  EXPECT_EQ(cpu_list({0, 1, 2, 3, 8, 10, 11}), "0-3,8,10-11");
}

// Binding holds for the thread that binds and for the threads it starts afterwards (OpenMP's
// team and the collectives' workers start after the worker binds).
TEST(Threads, BindingHoldsForTheThreadAndThoseItStarts) {
  const std::vector<int> all = allowed_cpus();
  ASSERT_FALSE(all.empty());
  std::vector<int> bound, child;
  bool ok = false;
  std::thread t([&] {
    ok = bind_to_cpus({all.back()});
    bound = allowed_cpus();
    std::thread([&] { child = allowed_cpus(); }).join();
  });
  t.join();
  ASSERT_TRUE(ok);
  EXPECT_EQ(bound, std::vector<int>{all.back()});
  EXPECT_EQ(child, std::vector<int>{all.back()});
  EXPECT_EQ(allowed_cpus(), all);  // this thread is untouched
}

}  // namespace
}  // namespace tessera
