// A real collector for tests: listens on 127.0.0.1 port 0 and stores into a
// fresh temporary directory, so tests are hermetic and can run in parallel.
// Restart() stops it and starts a new one on the same data (and a new port).
#ifndef SONDE_TESTS_TESTING_IN_PROCESS_COLLECTOR_H_
#define SONDE_TESTS_TESTING_IN_PROCESS_COLLECTOR_H_

#include <functional>
#include <memory>
#include <string>

#include "gtest/gtest.h"
#include "rules/rule_config.h"
#include "server/collector.h"
#include "absl/strings/numbers.h"
#include "tests/testing/free_address.h"
#include "tests/testing/temp_dir.h"

namespace sonde::testing {

class InProcessCollector {
 public:
  // `rules` in the --rules flag syntax, e.g. "ExplodingTensor(actions=StopTraining)".
  // `configure` may change any other option (kept across restarts).
  explicit InProcessCollector(
      const std::string& rules = "", server::IngestLimits limits = server::IngestLimits(),
      const std::function<void(server::CollectorOptions&)>& configure = nullptr) {
    options_.listen = "127.0.0.1:0";
    options_.data_dir = dir_.Sub("db");
    options_.limits = limits;
    auto parsed = rules::ParseRuleFlag(rules);
    EXPECT_TRUE(parsed.ok()) << parsed.status();
    if (parsed.ok()) options_.default_rules = *parsed;
    if (configure) configure(options_);
    Start();
  }

  const std::string& address() const { return collector_->address(); }
  const std::string& data_dir() const { return options_.data_dir; }
  server::Collector& collector() { return *collector_; }

  void Stop() { collector_.reset(); }
  // A new collector on the same data (and a new port).
  void Restart() {
    Stop();
    Start();
  }
  // A new collector on the same data and the same address, as a restarted
  // service would be: clients reconnect on their own. `between` runs while
  // no collector is up (e.g. to leave files as a crash would).
  void RestartInPlace(const std::function<void()>& between = nullptr) {
    const std::string address = collector_->address();
    // Held from before the stop until the new collector listens, so no
    // other socket takes the port in between.
    uint32_t port = 0;
    EXPECT_TRUE(absl::SimpleAtoi(address.substr(address.rfind(':') + 1), &port)) << address;
    ReservedLoopbackAddress held(static_cast<uint16_t>(port));
    Stop();
    if (between) between();
    options_.listen = address;
    Start();
    options_.listen = "127.0.0.1:0";
  }

 private:
  void Start() {
    auto c = server::Collector::Start(options_);
    ASSERT_TRUE(c.ok()) << c.status();
    collector_ = std::move(*c);
  }

  TempDir dir_;
  server::CollectorOptions options_;
  std::unique_ptr<server::Collector> collector_;
};

}  // namespace sonde::testing

#endif  // SONDE_TESTS_TESTING_IN_PROCESS_COLLECTOR_H_
