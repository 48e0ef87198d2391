#include "common/thread_pool.h"

#include <atomic>
#include <vector>

#include "absl/synchronization/notification.h"
#include "gtest/gtest.h"

namespace sonde {
namespace {

TEST(ThreadPool, RunsEveryTaskBeforeDestruction) {
  std::atomic<int> done{0};
  {
    ThreadPool pool(2, 4);
    for (int i = 0; i < 100; ++i) pool.Schedule([&] { done.fetch_add(1); });
  }
  EXPECT_EQ(done.load(), 100);
}

TEST(Strand, RunsTasksInOrderOneAtATime) {
  ThreadPool pool(2, 16);
  Strand strand(&pool);
  std::vector<int> order;  // touched only by strand tasks, one at a time
  std::atomic<int> concurrent{0};
  std::atomic<int> max_concurrent{0};
  for (int i = 0; i < 200; ++i) {
    strand.Post([&, i] {
      int now = concurrent.fetch_add(1) + 1;
      int seen = max_concurrent.load();
      while (now > seen && !max_concurrent.compare_exchange_weak(seen, now)) {
      }
      order.push_back(i);
      concurrent.fetch_sub(1);
    });
  }
  strand.Drain();
  ASSERT_EQ(order.size(), 200u);
  for (int i = 0; i < 200; ++i) EXPECT_EQ(order[i], i);
  EXPECT_EQ(max_concurrent.load(), 1);
}

TEST(Strand, TwoStrandsShareAPoolWithoutBlockingEachOther) {
  ThreadPool pool(2, 16);
  Strand a(&pool);
  Strand b(&pool);
  absl::Notification release_a;
  absl::Notification b_ran;
  a.Post([&] { release_a.WaitForNotification(); });
  b.Post([&] { b_ran.Notify(); });
  b_ran.WaitForNotification();  // b progresses while a is blocked
  release_a.Notify();
  a.Drain();
  EXPECT_TRUE(b_ran.HasBeenNotified());
}

}  // namespace
}  // namespace sonde
