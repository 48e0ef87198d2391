#include "client/value_pool.h"

#include <algorithm>

namespace sonde {

void ValuePool::Return::operator()(char* buffer) const {
  if (buffer == nullptr) return;
  if (pool != nullptr) {
    pool->Keep(buffer, capacity);
    pool.reset();
  } else {
    delete[] buffer;
  }
}

std::shared_ptr<ValuePool> ValuePool::Create(uint64_t max_bytes) {
  return std::shared_ptr<ValuePool>(new ValuePool(max_bytes));
}

ValuePool::~ValuePool() {
  for (const auto& [capacity, buffer] : free_) delete[] buffer;
}

ValuePool::Buffer ValuePool::Take(uint64_t bytes) {
  bytes = std::max<uint64_t>(bytes, 1);
  {
    absl::MutexLock lock(&mu_);
    auto it = free_.lower_bound(bytes);
    if (it != free_.end() && it->first / 2 <= bytes) {
      const uint64_t capacity = it->first;
      char* buffer = it->second;
      free_.erase(it);
      kept_ -= capacity;
      ++reused_;
      return Buffer(buffer, Return{shared_from_this(), capacity});
    }
  }
  return Buffer(new char[bytes], Return{shared_from_this(), bytes});
}

void ValuePool::Keep(char* buffer, uint64_t capacity) {
  {
    absl::MutexLock lock(&mu_);
    if (kept_ + capacity <= max_bytes_) {
      free_.emplace(capacity, buffer);
      kept_ += capacity;
      return;
    }
  }
  delete[] buffer;
}

uint64_t ValuePool::kept_bytes() const {
  absl::MutexLock lock(&mu_);
  return kept_;
}

uint64_t ValuePool::reused() const {
  absl::MutexLock lock(&mu_);
  return reused_;
}

}  // namespace sonde
