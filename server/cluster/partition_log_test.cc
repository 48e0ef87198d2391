// The partitioned log against a real three-server NATS JetStream cluster.
#include "server/cluster/partition_log.h"

#include <atomic>
#include <map>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/nats_cluster.h"
#include "tests/testing/status_matchers.h"
#include "tests/testing/temp_dir.h"
#include "tests/testing/test_certificates.h"
#include "tests/testing/wait.h"

namespace sonde::cluster {
namespace {

using ::sonde::testing::WaitUntil;

TEST(PartitionLogOpen, ChecksItsOptionsBeforeConnecting) {
  PartitionLog::Options o;
  EXPECT_EQ(PartitionLog::Open(o).status().code(), absl::StatusCode::kInvalidArgument);
  o.servers = {"nats://127.0.0.1:1"};
  o.name = "sonde.data";
  EXPECT_EQ(PartitionLog::Open(o).status().code(), absl::StatusCode::kInvalidArgument);
  o.name = "SONDE";
  o.replicas = 7;
  EXPECT_EQ(PartitionLog::Open(o).status().code(), absl::StatusCode::kInvalidArgument);
  o.replicas = 3;
  o.timeout = absl::Seconds(1);
  EXPECT_EQ(PartitionLog::Open(o).status().code(), absl::StatusCode::kUnavailable);
}

class PartitionLogTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!testing::HaveNats()) GTEST_SKIP() << "no " << testing::kNatsBinary;
    nats_ = std::make_unique<testing::NatsCluster>(dir_.path(), 3);
    SONDE_ASSERT_OK(nats_->Start());
    log_ = OpenLog();
    ASSERT_NE(log_, nullptr);
  }

  std::unique_ptr<PartitionLog> OpenLog() {
    PartitionLog::Options o;
    o.servers = nats_->urls();
    o.partitions = 2;
    o.replicas = 3;
    o.max_entry_bytes = 64 << 10;
    std::unique_ptr<PartitionLog> log;
    // Stream creation needs JetStream's meta leader, elected just after start.
    EXPECT_TRUE(WaitUntil([&] {
      auto opened = PartitionLog::Open(o);
      if (opened.ok()) log = std::move(*opened);
      return opened.ok();
    }, absl::Seconds(30)));
    return log;
  }

  // Every entry of the partition, read from sequence 1.
  std::vector<PartitionLog::Entry> ReadAll(PartitionLog& log, int partition) {
    std::vector<PartitionLog::Entry> out;
    auto last = log.LastSequence(partition);
    EXPECT_TRUE(last.ok()) << last.status();
    auto reader = log.Read(partition, 1);
    EXPECT_TRUE(reader.ok()) << reader.status();
    if (!last.ok() || !reader.ok()) return out;
    while (out.size() < *last) {
      auto next = (*reader)->Next(absl::Seconds(10));
      EXPECT_TRUE(next.ok()) << next.status();
      if (!next.ok() || !next->has_value()) break;
      out.push_back(std::move(**next));
    }
    return out;
  }

  testing::TempDir dir_;
  std::unique_ptr<testing::NatsCluster> nats_;
  std::unique_ptr<PartitionLog> log_;
};

TEST_F(PartitionLogTest, EntriesComeBackInOrderWithTheirIdsAndARepeatIsStoredOnce) {
  auto a = log_->Append(0, "job/w0/s1", "first");
  auto b = log_->Append(0, "job/w0/s2", "second");
  auto other = log_->Append(1, "job/w1/s1", "elsewhere");
  SONDE_ASSERT_OK(a);
  SONDE_ASSERT_OK(b);
  SONDE_ASSERT_OK(other);
  EXPECT_EQ(a->sequence, 1u);
  EXPECT_EQ(b->sequence, 2u);
  EXPECT_EQ(other->sequence, 1u);  // partitions are numbered apart
  EXPECT_FALSE(b->duplicate);
  auto again = log_->Append(0, "job/w0/s1", "first");  // a resend after a lost ack
  SONDE_ASSERT_OK(again);
  EXPECT_TRUE(again->duplicate);
  EXPECT_EQ(again->sequence, 1u);
  std::vector<PartitionLog::Entry> entries = ReadAll(*log_, 0);
  ASSERT_EQ(entries.size(), 2u);
  EXPECT_EQ(entries[0].id, "job/w0/s1");
  EXPECT_EQ(entries[0].bytes, "first");
  EXPECT_EQ(entries[1].sequence, 2u);
  EXPECT_EQ(entries[1].bytes, "second");
  // The stream's own time of storing, in order, close to now.
  EXPECT_GT(entries[0].unix_micros, absl::ToUnixMicros(absl::Now() - absl::Minutes(5)));
  EXPECT_GE(entries[1].unix_micros, entries[0].unix_micros);
  // From the middle.
  auto reader = log_->Read(0, 2);
  SONDE_ASSERT_OK(reader);
  auto next = (*reader)->Next(absl::Seconds(10));
  SONDE_ASSERT_OK(next);
  ASSERT_TRUE(next->has_value());
  EXPECT_EQ((*next)->id, "job/w0/s2");
  auto none = (*reader)->Next(absl::Milliseconds(200));
  SONDE_ASSERT_OK(none);
  EXPECT_FALSE(none->has_value());
}

TEST_F(PartitionLogTest, OversizedAndMisaddressedEntriesAreRefused) {
  EXPECT_EQ(log_->Append(0, "big", std::string(65 << 10, 'x')).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(log_->Append(2, "x", "y").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(log_->Append(0, "", "y").status().code(), absl::StatusCode::kInvalidArgument);
  auto last = log_->LastSequence(0);
  SONDE_ASSERT_OK(last);
  EXPECT_EQ(*last, 0u);
}

TEST_F(PartitionLogTest, AcknowledgedEntriesSurviveKillingServersMidStream) {
  constexpr int kEntries = 300;
  std::set<std::string> acknowledged;
  int retried = 0;
  for (int i = 0; i < kEntries; ++i) {
    if (i == 100) nats_->Kill(0);
    if (i == 200) {
      SONDE_ASSERT_OK(nats_->Restart(0));
      nats_->Kill(1);
    }
    const std::string id = "job/w0/s" + std::to_string(i);
    const std::string bytes = "entry " + std::to_string(i);
    // As a gateway does: the same id until an acknowledgement comes.
    absl::StatusOr<PartitionLog::Appended> appended;
    ASSERT_TRUE(WaitUntil([&] {
      appended = log_->Append(0, id, bytes);
      if (!appended.ok()) ++retried;
      return appended.ok();
    }, absl::Seconds(30))) << appended.status();
    acknowledged.insert(id);
  }
  SONDE_ASSERT_OK(nats_->Restart(1));
  std::vector<PartitionLog::Entry> entries = ReadAll(*log_, 0);
  std::map<std::string, int> seen;
  for (size_t i = 0; i < entries.size(); ++i) {
    ++seen[entries[i].id];
    EXPECT_EQ(entries[i].sequence, i + 1);
    EXPECT_EQ(entries[i].bytes, "entry " + entries[i].id.substr(std::string("job/w0/s").size()));
  }
  for (const std::string& id : acknowledged) EXPECT_EQ(seen[id], 1) << id;
  EXPECT_EQ(entries.size(), size_t{kEntries});  // none lost, none twice
  RecordProperty("retried_appends", retried);
}

}  // namespace
}  // namespace sonde::cluster

namespace sonde::cluster {
namespace {

// Clients and routes over TLS, client certificates verified: the log
// works as before for a client holding one, and refuses one without.
TEST(PartitionLogTls, AppendsAndReadsOverTlsOnlyWithACertificate) {
  if (!testing::HaveNats()) GTEST_SKIP() << "no " << testing::kNatsBinary;
  testing::Certificates certs;
  ASSERT_TRUE(certs.ok()) << "openssl failed; see " << certs("openssl.log");
  testing::TempDir dir;
  testing::NatsCluster nats(dir.path(), 3);
  nats.set_tls(certs.dir());
  SONDE_ASSERT_OK(nats.Start());
  PartitionLog::Options o;
  o.servers = nats.urls();
  o.partitions = 1;
  o.replicas = 3;
  o.tls_ca_file = certs("ca.pem");
  o.tls_cert_file = certs("client.pem");
  o.tls_key_file = certs("client.key");
  std::unique_ptr<PartitionLog> log;
  ASSERT_TRUE(WaitUntil([&] {
    auto opened = PartitionLog::Open(o);
    if (opened.ok()) log = std::move(*opened);
    return opened.ok();
  }, absl::Seconds(30)));
  auto appended = log->Append(0, "tls/1", "over TLS");
  SONDE_ASSERT_OK(appended);
  auto reader = log->Read(0, appended->sequence);
  SONDE_ASSERT_OK(reader);
  auto entry = (*reader)->Next(absl::Seconds(10));
  SONDE_ASSERT_OK(entry);
  ASSERT_TRUE(entry->has_value());
  EXPECT_EQ((*entry)->bytes, "over TLS");

  PartitionLog::Options anonymous = o;
  anonymous.tls_cert_file.clear();
  anonymous.tls_key_file.clear();
  anonymous.timeout = absl::Seconds(2);
  EXPECT_FALSE(PartitionLog::Open(anonymous).ok());
  PartitionLog::Options plaintext = anonymous;
  plaintext.tls_ca_file.clear();
  EXPECT_FALSE(PartitionLog::Open(plaintext).ok());
}

}  // namespace
}  // namespace sonde::cluster
