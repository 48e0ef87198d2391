// The etcd client against a real three-member etcd cluster on 127.0.0.1.
#include "server/cluster/etcd.h"

#include <string>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/etcd_cluster.h"
#include "tests/testing/status_matchers.h"
#include "tests/testing/temp_dir.h"
#include "tests/testing/test_certificates.h"
#include "tests/testing/wait.h"

namespace sonde::cluster {
namespace {

using ::sonde::testing::EtcdCluster;
using ::sonde::testing::WaitUntil;
using ::testing::ElementsAre;

TEST(PrefixEnd, IsTheFirstKeyAfterThePrefix) {
  EXPECT_EQ(PrefixEnd("/a/"), "/a0");
  EXPECT_EQ(PrefixEnd("a\xff"), "b");
  EXPECT_EQ(PrefixEnd("\xff\xff"), std::string(1, '\0'));
  EXPECT_EQ(PrefixEnd(""), std::string(1, '\0'));
}

TEST(EtcdConnect, NeedsEndpoints) {
  EXPECT_EQ(Etcd::Connect(Etcd::Options()).status().code(), absl::StatusCode::kInvalidArgument);
  Etcd::Options o;
  o.endpoints = {""};
  EXPECT_EQ(Etcd::Connect(o).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(EtcdConnect, NothingListeningIsUnavailableWithTheKeyInTheMessage) {
  Etcd::Options o;
  o.endpoints = {"127.0.0.1:1"};
  o.timeout = absl::Seconds(2);
  auto etcd = Etcd::Connect(o);
  SONDE_ASSERT_OK(etcd);
  auto got = (*etcd)->Get("/k");
  EXPECT_EQ(got.status().code(), absl::StatusCode::kUnavailable) << got.status();
  EXPECT_THAT(std::string(got.status().message()), ::testing::HasSubstr("get '/k'"));
}

class EtcdTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!testing::HaveEtcd()) GTEST_SKIP() << "no " << testing::kEtcdBinary;
    cluster_ = std::make_unique<EtcdCluster>(dir_.path(), 3);
    SONDE_ASSERT_OK(cluster_->Start());
    Etcd::Options o;
    o.endpoints = cluster_->endpoints();
    o.timeout = absl::Seconds(3);
    auto etcd = Etcd::Connect(o);
    SONDE_ASSERT_OK(etcd);
    etcd_ = std::move(*etcd);
  }

  testing::TempDir dir_;
  std::unique_ptr<EtcdCluster> cluster_;
  std::unique_ptr<Etcd> etcd_;
};

std::vector<std::string> Keys(const std::vector<KeyValue>& kvs) {
  std::vector<std::string> out;
  for (const KeyValue& kv : kvs) out.push_back(kv.key);
  return out;
}

TEST_F(EtcdTest, PutGetAndListUnderAPrefix) {
  auto absent = etcd_->Get("/s/a");
  SONDE_ASSERT_OK(absent);
  EXPECT_FALSE(absent->has_value());
  auto r1 = etcd_->Put("/s/b", "2");
  SONDE_ASSERT_OK(r1);
  auto r2 = etcd_->Put("/s/a", "1");
  SONDE_ASSERT_OK(r2);
  EXPECT_GT(*r2, *r1);
  SONDE_ASSERT_OK(etcd_->Put("/t/c", "3"));
  auto a = etcd_->Get("/s/a");
  SONDE_ASSERT_OK(a);
  ASSERT_TRUE(a->has_value());
  EXPECT_EQ((*a)->value, "1");
  EXPECT_EQ((*a)->create_revision, *r2);
  int64_t revision = 0;
  auto listed = etcd_->List("/s/", &revision);
  SONDE_ASSERT_OK(listed);
  EXPECT_THAT(Keys(*listed), ElementsAre("/s/a", "/s/b"));
  EXPECT_GE(revision, *r2 + 1);
}

TEST_F(EtcdTest, ATransactionWritesOnlyWhenEveryConditionHolds) {
  auto first = etcd_->Txn({Compare::Absent("/own/p0")}, {Write::Put("/own/p0", "node-a")});
  SONDE_ASSERT_OK(first);
  EXPECT_TRUE(first->succeeded);
  auto second = etcd_->Txn({Compare::Absent("/own/p0")}, {Write::Put("/own/p0", "node-b")});
  SONDE_ASSERT_OK(second);
  EXPECT_FALSE(second->succeeded);
  auto owner = etcd_->Get("/own/p0");
  SONDE_ASSERT_OK(owner);
  EXPECT_EQ((*owner)->value, "node-a");
  // Two keys at once, on the owner's creation: a fenced write.
  auto fenced = etcd_->Txn({Compare::CreatedAt("/own/p0", first->revision)},
                           {Write::Put("/act/1", "fired"), Write::Delete("/own/p0")});
  SONDE_ASSERT_OK(fenced);
  EXPECT_TRUE(fenced->succeeded);
  auto stale = etcd_->Txn({Compare::CreatedAt("/own/p0", first->revision)},
                          {Write::Put("/act/2", "fired")});
  SONDE_ASSERT_OK(stale);
  EXPECT_FALSE(stale->succeeded);
  auto acts = etcd_->List("/act/");
  SONDE_ASSERT_OK(acts);
  EXPECT_THAT(Keys(*acts), ElementsAre("/act/1"));
}

TEST_F(EtcdTest, KeysUnderALeaseGoWithIt) {
  auto lease = etcd_->GrantLease(absl::Seconds(30));
  SONDE_ASSERT_OK(lease);
  SONDE_ASSERT_OK(etcd_->Put("/nodes/a", "127.0.0.1:1", *lease));
  SONDE_ASSERT_OK(etcd_->KeepAlive(*lease));
  SONDE_ASSERT_OK(etcd_->RevokeLease(*lease));
  auto gone = etcd_->Get("/nodes/a");
  SONDE_ASSERT_OK(gone);
  EXPECT_FALSE(gone->has_value());
  EXPECT_EQ(etcd_->KeepAlive(*lease).code(), absl::StatusCode::kNotFound);

  // Left to expire: gone within its TTL (etcd rounds TTLs up to its minimum
  // of election timeout-based 1-2 s).
  auto short_lease = etcd_->GrantLease(absl::Seconds(1));
  SONDE_ASSERT_OK(short_lease);
  SONDE_ASSERT_OK(etcd_->Put("/nodes/b", "x", *short_lease));
  EXPECT_TRUE(WaitUntil(
      [&] {
        auto b = etcd_->Get("/nodes/b");
        return b.ok() && !b->has_value();
      },
      absl::Seconds(15)));
}

TEST_F(EtcdTest, AWatchSeesEveryChangeInOrderAcrossAMemberKilled) {
  int64_t revision = 0;
  SONDE_ASSERT_OK(etcd_->List("/w/", &revision));
  absl::Mutex mu;
  std::vector<std::string> seen;
  std::vector<int64_t> revisions;
  auto watch = etcd_->WatchPrefix(
      "/w/", revision,
      [&](const std::vector<Event>& events) {
        absl::MutexLock lock(&mu);
        for (const Event& e : events) {
          seen.push_back(absl::StrCat(e.type == Event::Type::kPut ? "put " : "delete ", e.kv.key));
          revisions.push_back(e.kv.mod_revision);
        }
      },
      [](const absl::Status& s) { ADD_FAILURE() << "watch lost: " << s; });
  constexpr int kKeys = 40;
  for (int i = 0; i < kKeys; ++i) {
    if (i == kKeys / 2) cluster_->Kill(0);  // the member calls start at
    // A write may meet the election that follows; it is retried.
    ASSERT_TRUE(WaitUntil([&] { return etcd_->Put(absl::StrCat("/w/", i), "v").ok(); },
                          absl::Seconds(20)));
  }
  ASSERT_TRUE(WaitUntil([&] {
    absl::MutexLock lock(&mu);
    return seen.size() >= kKeys;
  }));
  absl::MutexLock lock(&mu);
  ASSERT_EQ(seen.size(), size_t{kKeys});  // none missed, none twice
  for (int i = 0; i < kKeys; ++i) EXPECT_EQ(seen[i], absl::StrCat("put /w/", i));
  for (size_t i = 1; i < revisions.size(); ++i) EXPECT_GT(revisions[i], revisions[i - 1]);
}

TEST_F(EtcdTest, AKilledMemberComesBackAndServes) {
  SONDE_ASSERT_OK(etcd_->Put("/r/before", "1"));
  cluster_->Kill(1);
  cluster_->Kill(2);  // no quorum: writes fail, with a status
  auto refused = etcd_->Put("/r/during", "2");
  EXPECT_FALSE(refused.ok());
  SONDE_ASSERT_OK(cluster_->Restart(1));
  ASSERT_TRUE(WaitUntil([&] { return etcd_->Put("/r/after", "3").ok(); }, absl::Seconds(20)));
  auto before = etcd_->Get("/r/before");
  SONDE_ASSERT_OK(before);
  EXPECT_TRUE(before->has_value());
}

}  // namespace
}  // namespace sonde::cluster

namespace sonde::cluster {
namespace {

// etcd with TLS on clients and peers and client certificates required:
// only a client holding a certificate of the CA gets in.
TEST(EtcdTls, MembersAnswerOnlyClientsWithACertificateOfTheirCa) {
  if (!testing::HaveEtcd()) GTEST_SKIP() << "no " << testing::kEtcdBinary;
  testing::Certificates certs;
  ASSERT_TRUE(certs.ok()) << "openssl failed; see " << certs("openssl.log");
  testing::TempDir dir;
  EtcdCluster cluster(dir.path(), 3);
  cluster.set_tls(certs.dir());
  SONDE_ASSERT_OK(cluster.Start());
  Etcd::Options o;
  o.endpoints = cluster.endpoints();
  o.timeout = absl::Seconds(3);
  o.tls_ca_file = certs("ca.pem");
  o.tls_cert_file = certs("client.pem");
  o.tls_key_file = certs("client.key");
  auto etcd = Etcd::Connect(o);
  SONDE_ASSERT_OK(etcd);
  ASSERT_TRUE(WaitUntil([&] { return (*etcd)->Put("/tls/k", "v").ok(); }, absl::Seconds(20)));
  auto got = (*etcd)->Get("/tls/k");
  SONDE_ASSERT_OK(got);
  ASSERT_TRUE(got->has_value());
  EXPECT_EQ((*got)->value, "v");

  Etcd::Options without_certificate = o;
  without_certificate.tls_cert_file.clear();
  without_certificate.tls_key_file.clear();
  auto anonymous = Etcd::Connect(without_certificate);
  SONDE_ASSERT_OK(anonymous);
  EXPECT_FALSE((*anonymous)->Get("/tls/k").ok());
  Etcd::Options other_ca = o;
  other_ca.tls_cert_file = certs("other_client.pem");
  other_ca.tls_key_file = certs("other_client.key");
  auto stranger = Etcd::Connect(other_ca);
  SONDE_ASSERT_OK(stranger);
  EXPECT_FALSE((*stranger)->Get("/tls/k").ok());
  Etcd::Options plaintext = o;
  plaintext.tls_ca_file.clear();
  plaintext.tls_cert_file.clear();
  plaintext.tls_key_file.clear();
  EXPECT_EQ(Etcd::Connect(plaintext).status().code(), absl::StatusCode::kOk);
  EXPECT_FALSE((*Etcd::Connect(plaintext))->Get("/tls/k").ok());
  // A certificate without its CA is a configuration error, said at once.
  Etcd::Options no_ca = o;
  no_ca.tls_ca_file.clear();
  EXPECT_EQ(Etcd::Connect(no_ca).status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace sonde::cluster
