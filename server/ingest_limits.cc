#include "server/ingest_limits.h"

#include <algorithm>

namespace sonde::server {

bool OpenStepBudget::TryTake(uint64_t n, uint64_t held) {
  absl::MutexLock lock(&mu_);
  if (held_ + n > limit_ && held_ > held) return false;
  held_ += n;
  peak_ = std::max(peak_, held_);
  return true;
}

void OpenStepBudget::Give(uint64_t n) {
  absl::MutexLock lock(&mu_);
  held_ -= std::min(held_, n);
}

uint64_t OpenStepBudget::held() const {
  absl::MutexLock lock(&mu_);
  return held_;
}

uint64_t OpenStepBudget::peak() const {
  absl::MutexLock lock(&mu_);
  return peak_;
}

}  // namespace sonde::server
