// Job isolation in queries: whatever names a client crafts, no query of one
// job returns another job's data. Keys start with the job's fixed 8-byte id
// and names end with 0x00 (storage/keys.h); this drives the real collector
// and query service with names built to confuse a prefix scan.
#include <string>
#include <vector>

#include "client/hook.h"
#include "client/query_client.h"
#include "gtest/gtest.h"
#include "tests/testing/in_process_collector.h"
#include "tests/testing/status_matchers.h"

namespace sonde {
namespace {

using ::sonde::testing::InProcessCollector;
using ::sonde::testing::IsOk;

void SaveJob(const std::string& address, const std::string& job,
             const std::vector<std::string>& names, float base) {
  HookOptions o;
  o.collector = address;
  o.job = job;
  o.config.save_config = SaveConfig::Every(1);
  o.config.include_collections = {"weights"};
  auto hook = Hook::Create(o);
  ASSERT_THAT(hook, IsOk());
  for (int step = 0; step < 3; ++step) {
    (*hook)->StartStep();
    for (size_t i = 0; i < names.size(); ++i) {
      const float v[2] = {base + step, base + static_cast<float>(i)};
      ASSERT_THAT((*hook)->SaveTensor(names[i], HostTensor(v, {2}), {"weights"}), IsOk());
    }
  }
  ASSERT_THAT((*hook)->Close(), IsOk());
}

TEST(Isolation, CraftedNamesNeverReachAnotherJobsKeys) {
  InProcessCollector collector;
  // Names that are prefixes of one another, contain bytes that look like
  // encoded ids and steps, or end where another begins.
  const std::vector<std::string> crafted = {
      "fc1", "fc10", "fc1\x01", std::string("\x01\x02\x03\x04\x05\x06\x07\x08", 8),
      "fc1/\x7f\x7f\x7f\x7f\x7f\x7f\x7f\x7f"};
  SaveJob(collector.address(), "iso", {"mine"}, 1000);
  SaveJob(collector.address(), "iso-a", crafted, 0);
  SaveJob(collector.address(), "iso-b", {"other"}, 500);
  auto q = QueryClient::Connect(collector.address());

  // Another job sees none of the crafted names, by any query.
  for (const std::string job : {"iso", "iso-b"}) {
    auto tensors = q->ListTensors(job);
    ASSERT_THAT(tensors, IsOk());
    ASSERT_EQ(tensors->size(), 1u) << job;
    for (const std::string& name : crafted) {
      EXPECT_EQ(q->ReadTensor(job, name, 0).status().code(), absl::StatusCode::kNotFound)
          << job << " / " << name;
      auto series = q->ReadSeries(job, name);
      EXPECT_TRUE(!series.ok() || series->empty()) << job << " / " << name;
    }
    auto steps = q->ListSteps(job);
    ASSERT_THAT(steps, IsOk());
    for (const v1::StepInfo& s : *steps) EXPECT_EQ(s.tensor_count(), 1u) << job;
  }
  // Within the job, "fc1" is only fc1: not fc10, not "fc1\x01".
  auto series = q->ReadSeries("iso-a", "fc1");
  ASSERT_THAT(series, IsOk());
  ASSERT_EQ(series->size(), 3u);
  for (const v1::SeriesPoint& p : *series) {
    EXPECT_EQ(p.statistics().max(), static_cast<double>(p.step()));  // {step, 0}: only fc1's
  }
  auto tensors = q->ListTensors("iso-a");
  ASSERT_THAT(tensors, IsOk());
  EXPECT_EQ(tensors->size(), crafted.size());
  // A job name that is a prefix of another names nothing of the other.
  EXPECT_EQ(q->GetJob("iso-").status().code(), absl::StatusCode::kNotFound);
  auto mine = q->ReadTensor("iso", "mine", 2);
  ASSERT_THAT(mine, IsOk());
  EXPECT_EQ(mine->header.statistics().min(), 1000.0);
}

}  // namespace
}  // namespace sonde
