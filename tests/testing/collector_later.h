// A real in-process collector on an address fixed in advance, started when
// the test says: for clients that must begin while no collector runs (an
// outage from the start) and find it later on the same address.
#ifndef SONDE_TESTS_TESTING_COLLECTOR_LATER_H_
#define SONDE_TESTS_TESTING_COLLECTOR_LATER_H_

#include <memory>
#include <string>

#include "gtest/gtest.h"
#include "server/collector.h"
#include "tests/testing/free_address.h"
#include "tests/testing/temp_dir.h"

namespace sonde::testing {

class CollectorLater {
 public:
  const std::string& address() const { return reserved_.address(); }
  void Start(const server::IngestLimits& limits = server::IngestLimits()) {
    server::CollectorOptions o;
    o.listen = reserved_.address();
    o.data_dir = dir_.Sub("db");
    o.limits = limits;
    auto c = server::Collector::Start(o);
    ASSERT_TRUE(c.ok()) << c.status();
    collector_ = std::move(*c);
  }
  void Stop() { collector_.reset(); }

 private:
  TempDir dir_;
  ReservedLoopbackAddress reserved_;
  std::unique_ptr<server::Collector> collector_;
};

}  // namespace sonde::testing

#endif  // SONDE_TESTS_TESTING_COLLECTOR_LATER_H_
