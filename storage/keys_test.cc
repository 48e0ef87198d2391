#include "storage/keys.h"

#include <algorithm>
#include <limits>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "tests/testing/status_matchers.h"
#include "common/names.h"

namespace sonde::storage {
namespace {

using ::sonde::testing::StatusIs;

TEST(Keys, IntegersRoundTrip) {
  for (int64_t v : {std::numeric_limits<int64_t>::min(), int64_t{-1}, int64_t{0},
                    int64_t{1}, int64_t{1} << 40, std::numeric_limits<int64_t>::max()}) {
    std::string s;
    AppendI64(s, v);
    absl::string_view in(s);
    EXPECT_EQ(*ConsumeI64(in), v);
    EXPECT_TRUE(in.empty());
  }
  std::string s;
  AppendU64(s, 0x0102030405060708ull);
  EXPECT_EQ(s, std::string("\x01\x02\x03\x04\x05\x06\x07\x08", 8));
  AppendI32(s, -7);
  AppendU32(s, 9);
  absl::string_view in(s);
  EXPECT_EQ(*ConsumeU64(in), 0x0102030405060708ull);
  EXPECT_EQ(*ConsumeI32(in), -7);
  EXPECT_EQ(*ConsumeU32(in), 9u);
  EXPECT_THAT(ConsumeU32(in), StatusIs(absl::StatusCode::kDataLoss, "truncated"));
}

TEST(Keys, ByteOrderEqualsNumericOrder) {
  std::mt19937_64 rng(1);
  std::vector<int64_t> values = {std::numeric_limits<int64_t>::min(), -1, 0, 1, 255, 256};
  for (int i = 0; i < 200; ++i) values.push_back(static_cast<int64_t>(rng()));
  std::vector<std::string> encoded;
  for (int64_t v : values) {
    std::string s;
    AppendI64(s, v);
    encoded.push_back(s);
  }
  for (size_t i = 0; i < values.size(); ++i) {
    for (size_t j = 0; j < values.size(); ++j) {
      EXPECT_EQ(values[i] < values[j], encoded[i] < encoded[j]);
    }
  }
}

TEST(Keys, StatsKeyRoundTrips) {
  TensorKey k{42, 1, 120, "gradient/fc1.weight", 3};
  auto back = DecodeStatsKey(StatsKey(k));
  SONDE_ASSERT_OK(back);
  EXPECT_EQ(back->job_id, 42u);
  EXPECT_EQ(back->mode, 1);
  EXPECT_EQ(back->mode_step, 120);
  EXPECT_EQ(back->name, "gradient/fc1.weight");
  EXPECT_EQ(back->worker, 3);
  EXPECT_THAT(DecodeStatsKey(StatsKey(k).substr(0, 12)),
              StatusIs(absl::StatusCode::kDataLoss, "truncated"));
}

TEST(Keys, StepScanReturnsStepsInOrderAndStaysInsideItsStep) {
  std::vector<std::string> keys;
  for (int64_t step : {10, 2, 100, 1, 1000000}) {
    keys.push_back(StatsKey({7, 1, step, "w", 0}));
  }
  std::sort(keys.begin(), keys.end());
  std::vector<int64_t> order;
  for (auto& k : keys) order.push_back(DecodeStatsKey(k)->mode_step);
  EXPECT_EQ(order, (std::vector<int64_t>{1, 2, 10, 100, 1000000}));
  const std::string prefix = StatsStepPrefix(7, 1, 10);
  EXPECT_EQ(StatsKey({7, 1, 10, "w", 0}).rfind(prefix, 0), 0u);
  EXPECT_NE(StatsKey({7, 1, 100, "w", 0}).rfind(prefix, 0), 0u);
}

TEST(Keys, TensorNamePrefixesDoNotCollide) {
  // "fc1" must not be a key prefix of "fc10", whatever follows.
  const std::string fc1 = SeriesPrefix(1, "fc1", 1);
  const std::string fc10 = SeriesKey({1, 1, 5, "fc10", 0});
  EXPECT_NE(fc10.rfind(fc1, 0), 0u);
  EXPECT_NE(TensorNameKey(1, "fc10").rfind(TensorNameKey(1, "fc1"), 0), 0u);
}

TEST(Keys, JobsAreIsolatedByFixedWidthIds) {
  // Job 1's prefix never matches job 256's keys, whatever the names.
  EXPECT_NE(StatsKey({256, 1, 0, "x", 0}).rfind(StatsStepPrefix(1, 1, 0), 0), 0u);
  EXPECT_NE(RuleResultKey(256, "r").rfind(RuleResultPrefix(1), 0), 0u);
  EXPECT_EQ(RuleResultPrefix(1).size(), 9u);
}

TEST(Keys, SeriesScanBoundsAreOrdered) {
  EXPECT_LT(SeriesSeek(1, "w", 1, 5), SeriesKey({1, 1, 5, "w", 0}));
  EXPECT_LT(SeriesKey({1, 1, 5, "w", 99}), SeriesSeek(1, "w", 1, 6));
  EXPECT_LT(SeriesKey({1, 1, 5, "w", 0}), PrefixEnd(SeriesPrefix(1, "w", 1)));
}

TEST(Keys, PrefixEnd) {
  EXPECT_EQ(PrefixEnd("ab"), "ac");
  EXPECT_EQ(PrefixEnd(std::string("a\xff", 2)), "b");
  EXPECT_EQ(PrefixEnd(std::string("\xff\xff", 2)), "");
}

TEST(Keys, ValidateDataName) {
  SONDE_EXPECT_OK(ValidateDataName("tensor name", "fc1.weight"));
  EXPECT_THAT(ValidateDataName("tensor name", ""),
              StatusIs(absl::StatusCode::kInvalidArgument, "tensor name is empty"));
  EXPECT_THAT(ValidateDataName("tensor name", std::string("a\0b", 3)),
              StatusIs(absl::StatusCode::kInvalidArgument, "NUL"));
  EXPECT_THAT(ValidateDataName("job name", std::string(2000, 'x')),
              StatusIs(absl::StatusCode::kInvalidArgument, "2000 bytes"));
}

// Every key builder's output for job `id` lies in exactly one of the job's
// prefix ranges of its family, and in none of a neighbouring job's.
TEST(Keys, EventKeyRoundTripsAndTheEndTellsSameStartEventsApart) {
  const std::string key = EventKey(42, 3, 5, "augment", -7, 1700000000000000);
  absl::string_view after(key);
  after.remove_prefix(EventPrefix(42).size());
  auto back = DecodeEventKey(after);
  SONDE_ASSERT_OK(back);
  EXPECT_EQ(back->worker, 3);
  EXPECT_EQ(back->kind, 5);
  EXPECT_EQ(back->name, "augment");
  EXPECT_EQ(back->start_micros, -7);
  EXPECT_EQ(back->end_micros, 1700000000000000);
  EXPECT_NE(EventKey(42, 3, 5, "augment", 10, 20), EventKey(42, 3, 5, "augment", 10, 30));
  EXPECT_LT(EventKey(42, 3, 5, "augment", 10, 90), EventKey(42, 3, 5, "augment", 11, 12));
  EXPECT_THAT(DecodeEventKey(after.substr(0, after.size() - 1)),
              StatusIs(absl::StatusCode::kDataLoss, "truncated"));
}

TEST(Keys, JobKeyPrefixesCoverEveryKeyOfTheJobAndNoOther) {
  for (uint64_t id : {uint64_t{1}, uint64_t{255}, uint64_t{256}, uint64_t{0x00ffffffffffffff}}) {
    const TensorKey t{id, 1, -3, "fc1.weight", 7};
    const std::vector<std::string> jobs_keys = {
        JobInfoKey(id), StepKey(id, 2, 5, 0), GlobalStepKey(id, 9, 1),
        TensorNameKey(id, "fc1"), DeletingJobKey(id), WorkerProgressKey(id, 3)};
    const std::vector<std::string> data_keys = {StatsKey(t), SeriesKey(t), PayloadKey(t, 3)};
    const std::vector<std::string> rules_keys = {RuleResultKey(id, "Loss"),
                                                 RuleStateKey(id, "Loss")};
    auto in = [](const std::string& key, const std::string& prefix) {
      return key >= prefix && key < PrefixEnd(prefix);
    };
    auto count_in = [&](const std::string& key, const std::vector<std::string>& prefixes) {
      return std::count_if(prefixes.begin(), prefixes.end(),
                           [&](const std::string& p) { return in(key, p); });
    };
    for (uint64_t owner : {id - 1, id, id + 1}) {
      const JobKeyPrefixes p = JobKeyPrefixesOf(owner);
      const int expected = owner == id ? 1 : 0;
      for (const std::string& k : jobs_keys) {
        EXPECT_EQ(count_in(k, p.jobs), expected) << "job " << id << " owner " << owner;
      }
      for (const std::string& k : data_keys) {
        EXPECT_EQ(in(k, p.stats), expected == 1) << "job " << id << " owner " << owner;
        EXPECT_EQ(p.series, p.stats);
        EXPECT_EQ(p.payloads, p.stats);
      }
      for (const std::string& k : rules_keys) {
        EXPECT_EQ(count_in(k, p.rules), expected) << "job " << id << " owner " << owner;
      }
      // The name key and the next-id key are no job's prefix range.
      EXPECT_EQ(count_in(JobNameKey("x"), p.jobs), 0);
      EXPECT_EQ(count_in("I", p.jobs), 0);
    }
  }
}

}  // namespace
}  // namespace sonde::storage
