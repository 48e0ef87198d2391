// A fixed-size pool of worker threads with a bounded queue, and a Strand
// that runs its tasks one at a time, in order, on a pool. Rule evaluation
// and storage commits run here, never on gRPC's threads.
// Thread-safe. Destroying the pool runs every queued task, then joins.
#ifndef SONDE_COMMON_THREAD_POOL_H_
#define SONDE_COMMON_THREAD_POOL_H_

#include <cstddef>
#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace sonde {

class ThreadPool {
 public:
  // `threads` >= 1 workers; Schedule waits while `max_queue` tasks are queued.
  ThreadPool(int threads, size_t max_queue);
  ~ThreadPool();

  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  // Queues `task`; blocks while the queue is full (backpressure).
  void Schedule(std::function<void()> task);

  size_t queue_depth() const;

 private:
  void WorkerLoop();

  const size_t max_queue_;
  mutable absl::Mutex mu_;
  std::deque<std::function<void()>> queue_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<std::thread> workers_;
};

// Runs tasks in submission order, one at a time, on a pool. Thread-safe.
// Must outlive its queued tasks: call Drain() before destroying it.
class Strand {
 public:
  explicit Strand(ThreadPool* pool) : pool_(pool) {}
  ~Strand() { Drain(); }

  void Post(std::function<void()> task);
  // Waits until every posted task has run.
  void Drain();

 private:
  void RunNext();

  ThreadPool* const pool_;
  absl::Mutex mu_;
  std::deque<std::function<void()>> tasks_ ABSL_GUARDED_BY(mu_);
  bool running_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace sonde

#endif  // SONDE_COMMON_THREAD_POOL_H_
