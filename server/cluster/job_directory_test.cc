// JobDirectory against a real one-member etcd.
#include "server/cluster/job_directory.h"

#include <memory>
#include <string>

#include "gtest/gtest.h"
#include "server/cluster/membership.h"
#include "tests/testing/etcd_cluster.h"
#include "tests/testing/status_matchers.h"
#include "tests/testing/temp_dir.h"

namespace sonde::cluster {
namespace {

class JobDirectoryTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!testing::HaveEtcd()) GTEST_SKIP() << "no " << testing::kEtcdBinary;
    cluster_ = std::make_unique<testing::EtcdCluster>(dir_.path(), 1);
    SONDE_ASSERT_OK(cluster_->Start());
    Etcd::Options o;
    o.endpoints = cluster_->endpoints();
    auto etcd = Etcd::Connect(o);
    SONDE_ASSERT_OK(etcd);
    etcd_ = std::move(*etcd);
  }

  testing::TempDir dir_;
  std::unique_ptr<testing::EtcdCluster> cluster_;
  std::unique_ptr<Etcd> etcd_;
};

// A job whose partition differs between 4 and 64 partitions.
std::string MovingJob() {
  for (int i = 0;; ++i) {
    const std::string job = "job-" + std::to_string(i);
    if (JobPartition(job, 4) != JobPartition(job, 64)) return job;
  }
}

TEST_F(JobDirectoryTest, AJobKeepsItsPartitionWhenTheClusterGetsMore) {
  const std::string job = MovingJob();
  JobDirectory four(etcd_.get(), "/sonde/t", 4);
  // Asking without recording changes nothing.
  auto asked = four.PartitionOf(job, /*record=*/false);
  SONDE_ASSERT_OK(asked);
  EXPECT_EQ(*asked, JobPartition(job, 4));
  JobDirectory sixty_four(etcd_.get(), "/sonde/t", 64);
  auto unrecorded = sixty_four.PartitionOf(job, false);
  SONDE_ASSERT_OK(unrecorded);
  EXPECT_EQ(*unrecorded, JobPartition(job, 64));
  // Recorded by a process of the 4-partition cluster...
  auto recorded = four.PartitionOf(job, /*record=*/true);
  SONDE_ASSERT_OK(recorded);
  EXPECT_EQ(*recorded, JobPartition(job, 4));
  // ... it stays there for processes given 64 partitions, new ones or not.
  JobDirectory later(etcd_.get(), "/sonde/t", 64);
  for (JobDirectory* d : {&sixty_four, &later}) {
    for (bool record : {false, true}) {
      auto p = d->PartitionOf(job, record);
      SONDE_ASSERT_OK(p);
      EXPECT_EQ(*p, JobPartition(job, 4));
    }
  }
  // A new job goes where the 64 partitions put it.
  auto fresh = later.PartitionOf("fresh", true);
  SONDE_ASSERT_OK(fresh);
  EXPECT_EQ(*fresh, JobPartition("fresh", 64));
  auto all = later.All();
  SONDE_ASSERT_OK(all);
  EXPECT_EQ(all->size(), 2u);
  EXPECT_EQ(all->at(job), JobPartition(job, 4));
  EXPECT_EQ(all->at("fresh"), JobPartition("fresh", 64));
}

TEST_F(JobDirectoryTest, FewerPartitionsThanAJobsIsAClearError) {
  std::string job;
  for (int i = 0; job.empty(); ++i) {
    if (JobPartition("far-" + std::to_string(i), 64) >= 4) job = "far-" + std::to_string(i);
  }
  JobDirectory many(etcd_.get(), "/sonde/t", 64);
  auto p = many.PartitionOf(job, true);
  SONDE_ASSERT_OK(p);
  ASSERT_GE(*p, 4);
  JobDirectory few(etcd_.get(), "/sonde/t", 4);
  auto refused = few.PartitionOf(job, false);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(refused.status().message().find("--partitions"), absl::string_view::npos)
      << refused.status();
  SONDE_ASSERT_OK(etcd_->Put("/sonde/t/jobs/garbled", "x"));
  EXPECT_EQ(few.PartitionOf("garbled", false).status().code(), absl::StatusCode::kDataLoss);
}

}  // namespace
}  // namespace sonde::cluster
