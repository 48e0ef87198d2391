// Waiting in tests for state that changes elsewhere with nothing here to
// wait on: a collector's records seen over RPC, a hook's counters. Tests
// wait for the state they need, never for a fixed time.
#ifndef SONDE_TESTS_TESTING_WAIT_H_
#define SONDE_TESTS_TESTING_WAIT_H_

#include <algorithm>

#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace sonde::testing {

// True once `done()` holds; false if it still does not after `timeout`.
// Checks at once, then at growing intervals (1 ms doubling to 32 ms), so a
// fast change is seen fast and a slow one costs few checks.
template <typename Fn>
bool WaitUntil(Fn done, absl::Duration timeout = absl::Seconds(30)) {
  const absl::Time deadline = absl::Now() + timeout;
  absl::Duration pause = absl::Milliseconds(1);
  while (!done()) {
    const absl::Time now = absl::Now();
    if (now >= deadline) return false;
    absl::SleepFor(std::min(pause, deadline - now));
    pause = std::min(pause * 2, absl::Milliseconds(32));
  }
  return true;
}

}  // namespace sonde::testing

#endif  // SONDE_TESTS_TESTING_WAIT_H_
