// Membership, ownership and fencing against a real three-member etcd.
#include "server/cluster/membership.h"

#include <map>
#include <set>
#include <string>
#include <vector>

#include "absl/synchronization/notification.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/etcd_cluster.h"
#include "tests/testing/status_matchers.h"
#include "tests/testing/tcp_proxy.h"
#include "tests/testing/temp_dir.h"
#include "tests/testing/wait.h"

namespace sonde::cluster {
namespace {

using ::sonde::testing::WaitUntil;
using ::testing::HasSubstr;

TEST(PreferredNodes, RanksTheSameEverywhereAndMovesLittleWhenANodeJoins) {
  const std::vector<std::string> three = {"a", "b", "c"};
  std::map<std::string, int> first;
  int moved = 0;
  for (int p = 0; p < 64; ++p) {
    const std::vector<std::string> before = PreferredNodes(p, three);
    ASSERT_EQ(before.size(), 3u);
    EXPECT_EQ(before, PreferredNodes(p, {"c", "a", "b"}));  // input order does not matter
    ++first[before[0]];
    const std::vector<std::string> after = PreferredNodes(p, {"a", "b", "c", "d"});
    if (after[0] != before[0]) {
      EXPECT_EQ(after[0], "d") << "partition " << p << " moved between old nodes";
      ++moved;
    }
    // Without the new node, the order is what it was.
    std::vector<std::string> without;
    for (const std::string& n : after) {
      if (n != "d") without.push_back(n);
    }
    EXPECT_EQ(without, before);
  }
  for (const auto& [node, n] : first) EXPECT_GE(n, 10) << node << " gets too few partitions";
  EXPECT_GT(moved, 5);   // the new node takes a share...
  EXPECT_LT(moved, 30);  // ...not everything
}

class MembershipTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!testing::HaveEtcd()) GTEST_SKIP() << "no " << testing::kEtcdBinary;
    cluster_ = std::make_unique<testing::EtcdCluster>(dir_.path(), 3);
    SONDE_ASSERT_OK(cluster_->Start());
    etcd_ = Client(cluster_->endpoints());
  }

  static std::unique_ptr<Etcd> Client(std::vector<std::string> endpoints) {
    Etcd::Options o;
    o.endpoints = std::move(endpoints);
    o.timeout = absl::Seconds(2);
    auto etcd = Etcd::Connect(o);
    EXPECT_TRUE(etcd.ok()) << etcd.status();
    return etcd.ok() ? std::move(*etcd) : nullptr;
  }

  static Membership::Options Node(const std::string& name) {
    Membership::Options o;
    o.prefix = "/sonde/test";
    o.node = name;
    o.address = "127.0.0.1:" + std::to_string(7000 + name.size());
    o.lease_ttl = absl::Seconds(2);
    return o;
  }

  testing::TempDir dir_;
  std::unique_ptr<testing::EtcdCluster> cluster_;
  std::unique_ptr<Etcd> etcd_;
};

TEST_F(MembershipTest, NamesAreUniqueAmongLiveNodesAndChecked) {
  auto a = Membership::Join(etcd_.get(), Node("node-a"));
  SONDE_ASSERT_OK(a);
  auto again = Membership::Join(etcd_.get(), Node("node-a"));
  EXPECT_EQ(again.status().code(), absl::StatusCode::kAlreadyExists) << again.status();
  EXPECT_EQ(Membership::Join(etcd_.get(), Node("a/b")).status().code(),
            absl::StatusCode::kInvalidArgument);
  auto bad_prefix = Node("node-b");
  bad_prefix.prefix = "sonde/";
  EXPECT_EQ(Membership::Join(etcd_.get(), bad_prefix).status().code(),
            absl::StatusCode::kInvalidArgument);
  auto nodes = (*a)->LiveNodes();
  SONDE_ASSERT_OK(nodes);
  ASSERT_EQ(nodes->size(), 1u);
  EXPECT_EQ((*nodes)[0].first, "node-a");
  a->reset();  // a clean leave frees the name at once
  SONDE_EXPECT_OK(Membership::Join(etcd_.get(), Node("node-a")));
}

TEST_F(MembershipTest, OnePartitionOneOwnerAndEachNewOwnershipHasALargerEpoch) {
  auto a = Membership::Join(etcd_.get(), Node("node-a"));
  auto b = Membership::Join(etcd_.get(), Node("node-b"));
  SONDE_ASSERT_OK(a);
  SONDE_ASSERT_OK(b);
  auto e1 = (*a)->TryAcquire(0);
  SONDE_ASSERT_OK(e1);
  ASSERT_TRUE(e1->has_value());
  auto taken = (*b)->TryAcquire(0);
  SONDE_ASSERT_OK(taken);
  EXPECT_FALSE(taken->has_value());
  auto mine = (*a)->TryAcquire(0);  // asking again returns the same claim
  SONDE_ASSERT_OK(mine);
  EXPECT_EQ(*mine, *e1);
  auto owners = (*b)->Owners(2);
  SONDE_ASSERT_OK(owners);
  ASSERT_TRUE((*owners)[0].has_value());
  EXPECT_EQ((*owners)[0]->node, "node-a");
  EXPECT_EQ((*owners)[0]->epoch, **e1);
  EXPECT_FALSE((*owners)[1].has_value());

  SONDE_ASSERT_OK((*a)->Release(0, **e1));  // a hand-over
  EXPECT_EQ((*a)->Release(0, **e1).code(), absl::StatusCode::kFailedPrecondition);
  auto e2 = (*b)->TryAcquire(0);
  SONDE_ASSERT_OK(e2);
  ASSERT_TRUE(e2->has_value());
  EXPECT_GT(**e2, **e1);
}

// The case fencing exists for: an owner cut off from etcd past its lease
// still believes it owns the partition when it comes back.
TEST_F(MembershipTest, AStaleOwnerIsFencedAndAnActionFiresOnceAcrossTheFailover) {
  testing::TcpProxy proxy(cluster_->endpoints()[0]);
  std::unique_ptr<Etcd> cut_off = Client({proxy.address()});  // node-a's only way to etcd
  absl::Notification lost;
  Membership::Options oa = Node("node-a");
  oa.on_lost = [&lost](const absl::Status&) { lost.Notify(); };
  auto a = Membership::Join(cut_off.get(), oa);
  auto b = Membership::Join(etcd_.get(), Node("node-b"));
  SONDE_ASSERT_OK(a);
  SONDE_ASSERT_OK(b);
  auto e1 = (*a)->TryAcquire(3);
  SONDE_ASSERT_OK(e1);
  ASSERT_TRUE(e1->has_value());
  const std::string stop = "/sonde/test/actions/job-1/StopTraining/loss_not_decreasing";
  auto fired = (*a)->FireOnce(3, **e1, stop, "step 40");
  SONDE_ASSERT_OK(fired);
  EXPECT_TRUE(*fired);
  auto twice = (*a)->FireOnce(3, **e1, stop, "step 41");
  SONDE_ASSERT_OK(twice);
  EXPECT_FALSE(*twice);

  proxy.set_partitioned(true);
  ASSERT_TRUE(lost.WaitForNotificationWithTimeout(absl::Seconds(20)));
  EXPECT_FALSE((*a)->alive());
  std::optional<int64_t> e2;
  ASSERT_TRUE(WaitUntil([&] {  // free once etcd has expired node-a's lease
    auto got = (*b)->TryAcquire(3);
    if (got.ok()) e2 = *got;
    return e2.has_value();
  }, absl::Seconds(20)));
  EXPECT_GT(*e2, **e1);

  proxy.set_partitioned(false);
  absl::StatusOr<bool> stale;
  ASSERT_TRUE(WaitUntil([&] {  // once node-a's channel has reconnected
    stale = (*a)->FencedTxn(3, **e1, {}, {Write::Put("/sonde/test/results/job-1", "stale")});
    return !absl::IsUnavailable(stale.status());
  }, absl::Seconds(20)));
  EXPECT_EQ(stale.status().code(), absl::StatusCode::kFailedPrecondition) << stale.status();
  EXPECT_THAT(std::string(stale.status().message()), HasSubstr("'node-b' owns it"));
  EXPECT_EQ((*a)->TryAcquire(4).status().code(), absl::StatusCode::kFailedPrecondition);
  auto written = etcd_->Get("/sonde/test/results/job-1");
  SONDE_ASSERT_OK(written);
  EXPECT_FALSE(written->has_value());

  // The new owner replays the same verdict: the action has fired already.
  auto replayed = (*b)->FireOnce(3, *e2, stop, "step 40");
  SONDE_ASSERT_OK(replayed);
  EXPECT_FALSE(*replayed);
  auto next = (*b)->FireOnce(3, *e2, stop + "-2", "step 90");
  SONDE_ASSERT_OK(next);
  EXPECT_TRUE(*next);
  auto fired_value = etcd_->Get(stop);
  SONDE_ASSERT_OK(fired_value);
  EXPECT_EQ((*fired_value)->value, "step 40");
}

TEST_F(MembershipTest, OwnershipSurvivesTheLossOfAnEtcdMember) {
  auto a = Membership::Join(etcd_.get(), Node("node-a"));
  SONDE_ASSERT_OK(a);
  auto e1 = (*a)->TryAcquire(1);
  SONDE_ASSERT_OK(e1);
  ASSERT_TRUE(e1->has_value());
  cluster_->Kill(0);
  cluster_->Kill(1);  // no quorum for a moment: renewals fail, the lease holds
  absl::SleepFor(absl::Milliseconds(500));
  SONDE_ASSERT_OK(cluster_->Restart(1));
  ASSERT_TRUE(WaitUntil([&] { return (*a)->FireOnce(1, **e1, "/sonde/test/x", "1").ok(); },
                        absl::Seconds(20)));
  EXPECT_TRUE((*a)->alive());
  auto owner = (*a)->OwnerOf(1);
  SONDE_ASSERT_OK(owner);
  ASSERT_TRUE(owner->has_value());
  EXPECT_EQ((*owner)->epoch, **e1);
}

}  // namespace
}  // namespace sonde::cluster
