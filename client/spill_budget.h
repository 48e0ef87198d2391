// The disk space one hook's spill files may hold together
// (BackpressureOptions::max_spill_bytes): the sender's FIFO spill file
// (client/spill_file.h) and the device values' spill file
// (client/value_spill.h) both charge it, so the two never hold more than
// the one limit the user set. Thread-safe, lock-free.
#ifndef SONDE_CLIENT_SPILL_BUDGET_H_
#define SONDE_CLIENT_SPILL_BUDGET_H_

#include <algorithm>
#include <atomic>
#include <cstdint>

namespace sonde {

class SpillBudget {
 public:
  explicit SpillBudget(uint64_t limit) : limit_(limit) {}
  SpillBudget(const SpillBudget&) = delete;
  SpillBudget& operator=(const SpillBudget&) = delete;

  // Charges `bytes` if they fit under the limit with what is held.
  bool TryTake(uint64_t bytes) {
    uint64_t held = held_.load(std::memory_order_relaxed);
    do {
      if (bytes > limit_ || held > limit_ - bytes) return false;
    } while (!held_.compare_exchange_weak(held, held + bytes, std::memory_order_relaxed));
    return true;
  }
  // Gives back bytes taken before.
  void Give(uint64_t bytes) {
    uint64_t held = held_.load(std::memory_order_relaxed);
    while (!held_.compare_exchange_weak(held, held - std::min(held, bytes),
                                        std::memory_order_relaxed)) {
    }
  }

  uint64_t limit() const { return limit_; }
  uint64_t held() const { return held_.load(std::memory_order_relaxed); }
  uint64_t room() const { return limit_ - std::min(limit_, held()); }

 private:
  const uint64_t limit_;
  std::atomic<uint64_t> held_{0};
};

}  // namespace sonde

#endif  // SONDE_CLIENT_SPILL_BUDGET_H_
