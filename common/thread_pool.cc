#include "common/thread_pool.h"

#include <utility>

namespace sonde {

ThreadPool::ThreadPool(int threads, size_t max_queue)
    : max_queue_(max_queue == 0 ? 1 : max_queue) {
  if (threads < 1) threads = 1;
  workers_.reserve(threads);
  for (int i = 0; i < threads; ++i) workers_.emplace_back([this] { WorkerLoop(); });
}

ThreadPool::~ThreadPool() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  for (auto& t : workers_) t.join();
}

void ThreadPool::Schedule(std::function<void()> task) {
  absl::MutexLock lock(&mu_);
  auto has_room = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return queue_.size() < max_queue_ || stopping_;
  };
  mu_.Await(absl::Condition(&has_room));
  queue_.push_back(std::move(task));
}

size_t ThreadPool::queue_depth() const {
  absl::MutexLock lock(&mu_);
  return queue_.size();
}

void ThreadPool::WorkerLoop() {
  while (true) {
    std::function<void()> task;
    {
      absl::MutexLock lock(&mu_);
      auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return !queue_.empty() || stopping_;
      };
      mu_.Await(absl::Condition(&ready));
      if (queue_.empty()) return;  // stopping and drained
      task = std::move(queue_.front());
      queue_.pop_front();
    }
    task();
  }
}

void Strand::Post(std::function<void()> task) {
  bool start = false;
  {
    absl::MutexLock lock(&mu_);
    tasks_.push_back(std::move(task));
    if (!running_) {
      running_ = true;
      start = true;
    }
  }
  if (start) pool_->Schedule([this] { RunNext(); });
}

void Strand::RunNext() {
  std::function<void()> task;
  {
    absl::MutexLock lock(&mu_);
    task = std::move(tasks_.front());
    tasks_.pop_front();
  }
  task();
  bool more;
  {
    absl::MutexLock lock(&mu_);
    more = !tasks_.empty();
    if (!more) running_ = false;
  }
  if (more) pool_->Schedule([this] { RunNext(); });
}

void Strand::Drain() {
  absl::MutexLock lock(&mu_);
  auto idle = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return !running_ && tasks_.empty();
  };
  mu_.Await(absl::Condition(&idle));
}

}  // namespace sonde
