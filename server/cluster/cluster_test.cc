// The cluster's parts together, in one process but over real sockets: a
// three-member etcd and three nats-servers as child processes, collector
// nodes and a gateway in this process, and real C++ hooks streaming
// through the gateway as training processes do.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "client/hook.h"
#include "client/query_client.h"
#include "gmock/gmock.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "server/cluster/etcd.h"
#include "server/cluster/gateway.h"
#include "server/cluster/membership.h"
#include "server/cluster/node.h"
#include "server/cluster/partition_log.h"
#include "server/cluster/query_front.h"
#include "proto/cluster.pb.h"
#include "server/collector.h"
#include "storage/store.h"
#include "rules/rule_config.h"
#include "tests/testing/etcd_cluster.h"
#include "tests/testing/http_server.h"
#include "tests/testing/smtp_server.h"
#include "tests/testing/logged_stream.h"
#include "tests/testing/nats_cluster.h"
#include "tests/testing/status_matchers.h"
#include "tests/testing/temp_dir.h"
#include "tests/testing/unused_port.h"
#include "tests/testing/wait.h"

namespace sonde::cluster {
namespace {

using ::sonde::testing::WaitUntil;

constexpr int kPartitions = 4;

std::unique_ptr<PartitionLog> OpenLog(const std::vector<std::string>& servers,
                                      int partitions = kPartitions) {
  PartitionLog::Options o;
  o.servers = servers;
  o.partitions = partitions;
  o.replicas = 3;
  std::unique_ptr<PartitionLog> log;
  EXPECT_TRUE(WaitUntil([&] {
    auto opened = PartitionLog::Open(o);
    if (opened.ok()) log = std::move(*opened);
    return opened.ok();
  }));
  return log;
}

std::unique_ptr<Etcd> EtcdClient(const std::vector<std::string>& endpoints) {
  Etcd::Options o;
  o.endpoints = endpoints;
  auto etcd = Etcd::Connect(o);
  EXPECT_TRUE(etcd.ok()) << etcd.status();
  return etcd.ok() ? std::move(*etcd) : nullptr;
}

// One collector node, as sonde-cluster --role=node runs it: a Collector
// serving Query (its ingest off) with a ClusterNode on its registry and
// store, and connections of its own.
class TestNode {
 public:
  TestNode(const std::string& name, const std::string& db, const std::vector<std::string>& etcd,
           const std::vector<std::string>& nats, int partitions = kPartitions,
           int standbys = 1, const std::string& smtp_url = "") {
    server::CollectorOptions co;
    co.notifications.smtp.url = smtp_url;
    co.listen = "127.0.0.1:0";
    co.data_dir = db;
    co.step_wait = absl::Seconds(30);
    co.serve_ingest = false;
    co.worker_lease = absl::ZeroDuration();  // as sonde-cluster runs nodes
    co.limits.max_chunk_bytes = 256 << 10;  // well inside a log entry
    auto collector = server::Collector::Start(co);
    EXPECT_TRUE(collector.ok()) << collector.status();
    collector_ = std::move(*collector);
    etcd_ = EtcdClient(etcd);
    log_ = OpenLog(nats, partitions);
    ClusterNode::Options o;
    o.membership.prefix = "/sonde/test";
    o.membership.node = name;
    o.membership.address = collector_->address();
    o.membership.lease_ttl = absl::Seconds(2);
    o.placement_interval = absl::Milliseconds(200);
    o.limits = co.limits;
    o.standbys = standbys;
    auto node = ClusterNode::Start(etcd_.get(), log_.get(), collector_->registry(),
                                   collector_->store(), o);
    EXPECT_TRUE(node.ok()) << node.status();
    node_ = std::move(*node);
  }
  ~TestNode() { Stop(); }

  void Stop() {
    node_.reset();
    if (collector_ != nullptr) collector_->Shutdown();
  }

  ClusterNode& node() { return *node_; }
  storage::Store& store() { return *collector_->store(); }

 private:
  std::unique_ptr<server::Collector> collector_;
  std::unique_ptr<Etcd> etcd_;
  std::unique_ptr<PartitionLog> log_;
  std::unique_ptr<ClusterNode> node_;
};

// A gateway serving ingest and, through a QueryFront, the Query API.
class TestGateway {
 public:
  TestGateway(const std::vector<std::string>& nats, const std::vector<std::string>& etcd,
              int partitions = kPartitions) {
    log_ = OpenLog(nats, partitions);
    etcd_ = EtcdClient(etcd);
    Gateway::Options o;
    o.name = "gw-test";
    o.hello_timeout = absl::Seconds(20);
    o.heartbeat_interval = absl::Milliseconds(200);
    o.etcd = etcd_.get();
    o.prefix = "/sonde/test";
    auto gateway = Gateway::Create(log_.get(), o);
    EXPECT_TRUE(gateway.ok()) << gateway.status();
    gateway_ = std::move(*gateway);
    QueryFront::Options fo;
    fo.prefix = "/sonde/test";
    fo.partitions = partitions;
    fo.gateway = gateway_.get();
    front_ = std::make_unique<QueryFront>(etcd_.get(), fo);
    grpc::ServerBuilder builder;
    int port = 0;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
    builder.RegisterService(gateway_.get());
    builder.RegisterService(front_.get());
    server_ = builder.BuildAndStart();
    address_ = "127.0.0.1:" + std::to_string(port);
  }
  ~TestGateway() {
    server_->Shutdown(absl::ToChronoTime(absl::Now() + absl::Seconds(5)));
    server_->Wait();
  }
  const std::string& address() const { return address_; }

 private:
  std::unique_ptr<PartitionLog> log_;
  std::unique_ptr<Etcd> etcd_;
  std::unique_ptr<Gateway> gateway_;
  std::unique_ptr<QueryFront> front_;
  std::unique_ptr<grpc::Server> server_;
  std::string address_;
};

std::unique_ptr<Hook> Client(const std::string& gateway, const std::string& job,
                             const std::string& rules = "", int32_t worker = 0,
                             int32_t world_size = 1) {
  HookOptions o;
  o.worker = worker;
  o.world_size = world_size;
  if (!rules.empty()) {
    auto parsed = rules::ParseRuleFlag(rules);
    EXPECT_TRUE(parsed.ok()) << parsed.status();
    if (parsed.ok()) o.rules = *parsed;
  }
  o.collector = gateway;
  o.job = job;
  o.config.save_config = SaveConfig::Every(1);
  o.config.include_collections = {"weights", "losses"};
  o.close_timeout = absl::Seconds(60);
  auto hook = Hook::Create(o);
  EXPECT_TRUE(hook.ok()) << hook.status();
  return hook.ok() ? std::move(*hook) : nullptr;
}

// Steps [from, to); the loss is NaN at `nan_at`.
void Train(Hook& hook, int from, int to, int nan_at = -1) {
  std::vector<float> w(64);
  for (int step = from; step < to; ++step) {
    hook.StartStep();
    for (size_t i = 0; i < w.size(); ++i) w[i] = static_cast<float>(step) + 0.01f * i;
    SONDE_EXPECT_OK(hook.SaveTensor("fc.weight", HostTensor(w.data(), {64}), {"weights"}));
    SONDE_EXPECT_OK(
        hook.SaveScalar("loss", step == nan_at ? std::nan("") : 1.0 / (step + 1), {"losses"}));
    hook.EndStep();
  }
}

// The steps of `job` stored in `store` (none if the job is not there).
std::vector<int64_t> StoredSteps(storage::Store& store, const std::string& job) {
  auto info = store.GetJob(job);
  if (!info.ok()) return {};
  auto steps = store.ListSteps(info->job_id(), v1::MODE_UNSPECIFIED);
  std::vector<int64_t> out;
  if (steps.ok()) {
    for (const v1::StepInfo& s : *steps) out.push_back(s.step());
  }
  return out;
}

bool Finished(storage::Store& store, const std::string& job) {
  auto info = store.GetJob(job);
  return info.ok() && info->status() == v1::JOB_STATUS_FINISHED;
}

// Entries in all partitions of the log.
uint64_t LoggedEntries(PartitionLog* log) {
  uint64_t n = 0;
  for (int p = 0; p < kPartitions; ++p) {
    auto last = log->LastSequence(p);
    EXPECT_TRUE(last.ok()) << last.status();
    if (last.ok()) n += *last;
  }
  return n;
}

std::vector<int64_t> Range(int64_t n) {
  std::vector<int64_t> out;
  for (int64_t i = 0; i < n; ++i) out.push_back(i);
  return out;
}

class ClusterTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!testing::HaveEtcd() || !testing::HaveNats()) GTEST_SKIP() << "no etcd or nats-server";
    etcd_ = std::make_unique<testing::EtcdCluster>(dir_.path(), 3);
    nats_ = std::make_unique<testing::NatsCluster>(dir_.path(), 3);
    SONDE_ASSERT_OK(etcd_->Start());
    SONDE_ASSERT_OK(nats_->Start());
  }

  // A member that owns `partition`, ranking ahead of node-b, at `address`,
  // and applies nothing: an owner that hangs or died before its lease.
  std::unique_ptr<Membership> SilentOwner(int partition, const std::string& address) {
    std::string name;
    for (int i = 0; name.empty(); ++i) {
      const std::string candidate = absl::StrCat("silent-", i);
      if (PreferredNodes(partition, {candidate, "node-b"})[0] == candidate) name = candidate;
    }
    silent_etcd_ = EtcdClient(etcd_->endpoints());
    Membership::Options mo;
    mo.prefix = "/sonde/test";
    mo.node = name;
    mo.address = address;
    auto owner = Membership::Join(silent_etcd_.get(), mo);
    EXPECT_TRUE(owner.ok()) << owner.status();
    if (!owner.ok()) return nullptr;
    auto epoch = (*owner)->TryAcquire(partition);
    EXPECT_TRUE(epoch.ok() && epoch->has_value()) << epoch.status();
    return std::move(*owner);
  }

  std::unique_ptr<TestNode> StartNode(const std::string& name, int partitions = kPartitions,
                                      int standbys = 1, const std::string& smtp_url = "") {
    return std::make_unique<TestNode>(name, dir_.Sub(name), etcd_->endpoints(), nats_->urls(),
                                      partitions, standbys, smtp_url);
  }

  testing::TempDir dir_;
  std::unique_ptr<testing::EtcdCluster> etcd_;
  std::unique_ptr<testing::NatsCluster> nats_;
  std::unique_ptr<Etcd> silent_etcd_;  // SilentOwner's connection
};

TEST_F(ClusterTest, StepsStreamedThroughAGatewayAreStoredOnceByTheirPartitionsOwner) {
  auto a = StartNode("node-a");
  auto b = StartNode("node-b");
  // Every partition owned by its first choice before clients come (node-a
  // may take them all before node-b joins, then hand some over).
  std::vector<int> a_first, b_first;
  for (int p = 0; p < kPartitions; ++p) {
    (PreferredNodes(p, {"node-a", "node-b"})[0] == "node-a" ? a_first : b_first).push_back(p);
  }
  ASSERT_TRUE(WaitUntil([&] { return a->node().owned() == a_first && b->node().owned() == b_first; }));
  TestGateway gateway(nats_->urls(), etcd_->endpoints());
  const std::vector<std::string> jobs = {"job-0", "job-1", "job-2", "job-3"};
  std::vector<std::unique_ptr<Hook>> hooks;
  for (const std::string& job : jobs) {
    hooks.push_back(Client(gateway.address(), job));
    ASSERT_NE(hooks.back(), nullptr);
  }
  for (auto& h : hooks) Train(*h, 0, 12);
  absl::SleepFor(absl::Milliseconds(500));  // streams open: heartbeats go out
  // An action fired in etcd (as a node's FireOnce writes it) reaches the
  // streams of its job and worker through the gateway's watch, and only
  // them.
  {
    v1::Action stop;
    stop.set_type(v1::ACTION_STOP_TRAINING);
    stop.set_rule("manual");
    stop.set_step(5);
    auto etcd = EtcdClient(etcd_->endpoints());
    SONDE_ASSERT_OK(etcd->Put("/sonde/test/actions/job-2/0/1/manual/5", stop.SerializeAsString()));
    EXPECT_TRUE(WaitUntil([&] { return hooks[2]->should_stop(); }, absl::Seconds(10)));
    EXPECT_EQ(hooks[2]->stop_action()->rule(), "manual");
    EXPECT_FALSE(hooks[1]->should_stop());
  }
  for (auto& h : hooks) {
    SONDE_EXPECT_OK(h->Close());
    EXPECT_EQ(h->counters().steps_dropped, 0u);
    EXPECT_EQ(h->counters().reconnects, 0u);
  }
  for (const std::string& job : jobs) {
    const int p = JobPartition(job, kPartitions);
    std::vector<int> owned_a = a->node().owned();
    TestNode& owner =
        std::find(owned_a.begin(), owned_a.end(), p) != owned_a.end() ? *a : *b;
    TestNode& standby = &owner == a.get() ? *b : *a;
    ASSERT_TRUE(WaitUntil([&] { return Finished(owner.store(), job); })) << job;
    EXPECT_EQ(StoredSteps(owner.store(), job), Range(12)) << job;
    // The other node stands by for the partition, with a copy of its own.
    ASSERT_TRUE(WaitUntil([&] { return Finished(standby.store(), job); })) << job;
    EXPECT_EQ(StoredSteps(standby.store(), job), Range(12)) << job;
  }
  EXPECT_EQ(a->node().standing_by(), b_first);
  EXPECT_EQ(b->node().standing_by(), a_first);
  // The Query API through the gateway, as against a single collector.
  auto q = QueryClient::Connect(gateway.address());
  auto listed = q->ListJobs();
  SONDE_ASSERT_OK(listed);
  std::vector<std::string> names;
  for (const v1::JobInfo& j : *listed) names.push_back(j.job());
  std::sort(names.begin(), names.end());
  EXPECT_EQ(names, jobs);
  for (const std::string& job : jobs) {
    auto steps = q->ListSteps(job);
    SONDE_ASSERT_OK(steps);
    EXPECT_EQ(steps->size(), 12u) << job;
    auto value = q->ReadTensor(job, "fc.weight", 7);  // streamed through
    SONDE_ASSERT_OK(value);
    ASSERT_EQ(value->bytes.size(), 64 * sizeof(float));
    float first = 0;
    std::memcpy(&first, value->bytes.data(), sizeof(float));
    EXPECT_EQ(first, 7.0f);
  }
  EXPECT_EQ(q->GetJob("no-such-job").status().code(), absl::StatusCode::kNotFound);
  // Deleting a finished job goes through the log too.
  auto deleted = q->DeleteJob("job-1");
  SONDE_ASSERT_OK(deleted);
  EXPECT_GT(deleted->job_id(), 0u);
  EXPECT_EQ(q->GetJob("job-1").status().code(), absl::StatusCode::kNotFound);
  auto left = q->ListJobs();
  SONDE_ASSERT_OK(left);
  EXPECT_EQ(left->size(), jobs.size() - 1);
  // The gateway told every partition it streamed to that it was alive, with
  // its clock, while it had streams open there.
  std::unique_ptr<PartitionLog> log = OpenLog(nats_->urls());
  const int p = JobPartition("job-0", kPartitions);
  auto last = log->LastSequence(p);
  SONDE_ASSERT_OK(last);
  auto reader = log->Read(p, 1);
  SONDE_ASSERT_OK(reader);
  int beats = 0;
  for (uint64_t i = 0; i < *last; ++i) {
    auto e = (*reader)->Next(absl::Seconds(10));
    SONDE_ASSERT_OK(e);
    ASSERT_TRUE(e->has_value());
    v1::LogEntry entry;
    ASSERT_TRUE(entry.ParseFromString((*e)->bytes));
    EXPECT_GT(entry.unix_micros(), 0);
    if (entry.heartbeat()) ++beats;
  }
  EXPECT_GE(beats, 1);
}

TEST_F(ClusterTest, WhenANodeLeavesItsPartitionsMoveAndTheNewOwnerHasEveryStep) {
  // The NaN loss at step 5 fires a webhook and a mail: once each, though
  // the partition's log is applied again by each new owner.
  testing::TestHttpServer webhook;
  testing::TestSmtpServer relay;
  auto a = StartNode("node-a", kPartitions, 1, relay.Url());
  ASSERT_TRUE(WaitUntil([&] { return a->node().owned().size() == kPartitions; }));
  TestGateway gateway(nats_->urls(), etcd_->endpoints());
  // Rules enabled before the job starts are logged: every node that
  // applies the partition has them.
  auto rules = rules::ParseRuleFlag("LossNotDecreasing(name=early_loss)");
  SONDE_ASSERT_OK(rules);
  auto enabled = QueryClient::Connect(gateway.address())->EnableRules("moving", *rules);
  SONDE_ASSERT_OK(enabled);
  auto hook = Client(gateway.address(), "moving",
                     "ExplodingTensor(actions=Webhook:" + webhook.Url("/sonde") +
                         "|Email:ops@example.com)");
  ASSERT_NE(hook, nullptr);
  Train(*hook, 0, 8, /*nan_at=*/5);
  ASSERT_EQ(webhook.WaitForRequests(1, absl::Seconds(20)).size(), 1u);
  ASSERT_EQ(relay.WaitForMails(1, absl::Seconds(20)).size(), 1u);
  SONDE_ASSERT_OK(hook->Flush(absl::Seconds(30)));
  // A second node joins: the partitions that rank it first move to it, and
  // it replays their log from the start.
  auto b = StartNode("node-b", kPartitions, 1, relay.Url());
  ASSERT_TRUE(WaitUntil([&] {
    return a->node().owned().size() + b->node().owned().size() == kPartitions &&
           !b->node().owned().empty();
  }));
  Train(*hook, 8, 14);
  SONDE_ASSERT_OK(hook->Flush(absl::Seconds(30)));
  // Listed once, from its partition's owner now, though the node that
  // owned it before may still hold a copy.
  auto listed = QueryClient::Connect(gateway.address())->ListJobs();
  SONDE_ASSERT_OK(listed);
  EXPECT_EQ(listed->size(), 1u);
  a->Stop();  // node-a leaves: everything is node-b's
  ASSERT_TRUE(WaitUntil([&] { return b->node().owned().size() == kPartitions; }));
  Train(*hook, 14, 20);
  SONDE_ASSERT_OK(hook->Close());
  EXPECT_EQ(hook->counters().steps_dropped, 0u);
  ASSERT_TRUE(WaitUntil([&] { return Finished(b->store(), "moving"); }));
  EXPECT_EQ(StoredSteps(b->store(), "moving"), Range(20));
  // node-b stood by for node-a's partitions from the moment it joined, so
  // it took them over without a replay: it applied each entry of the log
  // once (nothing is logged once the hook has closed).
  const uint64_t logged = LoggedEntries(OpenLog(nats_->urls()).get());
  ASSERT_TRUE(WaitUntil([&] { return b->node().entries_applied() >= logged; }));
  EXPECT_EQ(b->node().entries_applied(), logged);
  // Each partition it took, when node-a handed it over and when node-a
  // left, it took with its copy caught up.
  EXPECT_EQ(b->node().takeovers(/*caught_up=*/true), static_cast<uint64_t>(kPartitions));
  EXPECT_EQ(b->node().takeovers(/*caught_up=*/false), 0u);
  absl::SleepFor(absl::Milliseconds(500));  // a second post would be out by now
  EXPECT_EQ(webhook.requests().size(), 1u);
  ASSERT_EQ(relay.mails().size(), 1u);
  EXPECT_EQ(relay.mails()[0].to, std::vector<std::string>{"ops@example.com"});
  EXPECT_EQ(relay.mails()[0].Header("Subject"),
            "[sonde] job moving: ExplodingTensor found issues at step 5");
  auto info = b->store().GetJob("moving");
  SONDE_ASSERT_OK(info);
  bool has_early = false;
  for (const v1::RuleSpec& r : info->rules()) has_early = has_early || r.name() == "early_loss";
  EXPECT_TRUE(has_early) << "the rule enabled before the job started is lost on its new owner";
}

// An owner that dies between its rules' verdicts and firing their
// actions: its standby, which decided the same, fires them when it takes
// the partition over, once.
TEST_F(ClusterTest, AStandbyThatTakesOverFiresWhatItsOwnerNeverFired) {
  const std::string job = "orphaned";
  const int p = JobPartition(job, kPartitions);
  // The owner holds the partition in etcd but applies nothing.
  std::unique_ptr<Membership> owner = SilentOwner(p, "127.0.0.1:1");
  ASSERT_NE(owner, nullptr);
  auto etcd = EtcdClient(etcd_->endpoints());
  auto b = StartNode("node-b");
  auto standing_by = [&] {
    std::vector<int> s = b->node().standing_by();
    return std::find(s.begin(), s.end(), p) != s.end();
  };
  ASSERT_TRUE(WaitUntil(standing_by));

  testing::TestHttpServer webhook;
  auto rules = rules::ParseRuleFlag("ExplodingTensor(name=nan_check,actions=StopTraining|Webhook:" +
                                    webhook.Url("/sonde") + ")");
  SONDE_ASSERT_OK(rules);
  std::unique_ptr<PartitionLog> log = OpenLog(nats_->urls());
  testing::LoggedStream w("gw-gone", 1);
  int appended = 0;
  auto append = [&](const v1::LogEntry& e) {
    SONDE_ASSERT_OK(log->Append(p, absl::StrCat("e", ++appended), e.SerializeAsString()));
  };
  append(w.Hello(job, 0, 1, 7, *rules));
  append(w.Step(0, std::vector<float>(10, 1.0f)));
  append(w.Step(1, std::vector<float>(10, std::nanf(""))));
  auto verdict = [&] {
    auto info = b->store().GetJob(job);
    if (!info.ok()) return false;
    auto results = b->store().RuleResults(info->job_id());
    if (!results.ok()) return false;
    for (const v1::RuleResult& r : *results) {
      if (r.rule() == "nan_check" && r.status() == v1::RULE_STATUS_ISSUES_FOUND) return true;
    }
    return false;
  };
  ASSERT_TRUE(WaitUntil(verdict)) << "the standby's rules did not judge step 1";
  append(w.Step(2, std::vector<float>(10, 1.0f)));  // its answer carries the stop
  ASSERT_TRUE(WaitUntil([&] { return b->node().entries_applied() >= 4; }));
  absl::SleepFor(absl::Milliseconds(500));
  // A standby tells no one.
  auto fired = etcd->List("/sonde/test/actions/" + job + "/");
  SONDE_ASSERT_OK(fired);
  EXPECT_TRUE(fired->empty());
  EXPECT_TRUE(webhook.requests().empty());

  owner.reset();  // the owner dies (its lease is revoked)
  ASSERT_TRUE(WaitUntil([&] {
    std::vector<int> o = b->node().owned();
    return std::find(o.begin(), o.end(), p) != o.end();
  }));
  ASSERT_TRUE(WaitUntil([&] {
    auto stop = etcd->Get(absl::StrCat("/sonde/test/actions/", job, "/0/",
                                       static_cast<int>(v1::ACTION_STOP_TRAINING), "/nan_check/1"));
    return stop.ok() && stop->has_value();
  })) << "the StopTraining the owner never fired was not fired by its standby";
  ASSERT_EQ(webhook.WaitForRequests(1, absl::Seconds(10)).size(), 1u);
  absl::SleepFor(absl::Milliseconds(500));  // a second post would be out by now
  EXPECT_EQ(webhook.requests().size(), 1u);
  // Taken over warm: every entry applied once, none replayed.
  EXPECT_EQ(b->node().entries_applied(), static_cast<uint64_t>(appended));
}

// The cluster restarted with more partitions: a job it had keeps its
// partition (recorded in etcd at its first hello), so its later workers
// and its queries find it where its steps are.
TEST_F(ClusterTest, AJobKeepsItsPartitionWhenTheClusterIsGivenMore) {
  std::string job;  // one whose hash moves from 4 to 8 partitions
  for (int i = 0; job.empty(); ++i) {
    const std::string name = absl::StrCat("resumed-", i);
    if (JobPartition(name, kPartitions) != JobPartition(name, 8)) job = name;
  }
  {
    auto node = StartNode("node-a");
    ASSERT_TRUE(WaitUntil([&] { return node->node().owned().size() == kPartitions; }));
    TestGateway gateway(nats_->urls(), etcd_->endpoints());
    auto hook = Client(gateway.address(), job, "", /*worker=*/0, /*world_size=*/2);
    ASSERT_NE(hook, nullptr);
    Train(*hook, 0, 10);
    SONDE_ASSERT_OK(hook->Close());  // worker 1 comes after the restart
  }
  auto node = StartNode("node-a", 8);
  ASSERT_TRUE(WaitUntil([&] { return node->node().owned().size() == 8u; }));
  TestGateway gateway(nats_->urls(), etcd_->endpoints(), 8);
  auto hook = Client(gateway.address(), job, "", /*worker=*/1, /*world_size=*/2);
  ASSERT_NE(hook, nullptr);
  Train(*hook, 0, 10);
  SONDE_ASSERT_OK(hook->Close());
  EXPECT_EQ(hook->counters().steps_dropped, 0u);
  ASSERT_TRUE(WaitUntil([&] { return Finished(node->store(), job); }));
  EXPECT_EQ(StoredSteps(node->store(), job), Range(10));
  auto q = QueryClient::Connect(gateway.address());
  auto steps = q->ListSteps(job);
  SONDE_ASSERT_OK(steps);
  EXPECT_EQ(steps->size(), 10u);
  auto listed = q->ListJobs();
  SONDE_ASSERT_OK(listed);
  ASSERT_EQ(listed->size(), 1u);
  EXPECT_EQ(listed->at(0).job(), job);
  // Its entries went to its first partition, never to the one 8 would give.
  std::unique_ptr<PartitionLog> log = OpenLog(nats_->urls(), 8);
  auto moved = log->LastSequence(JobPartition(job, 8));
  SONDE_ASSERT_OK(moved);
  EXPECT_EQ(*moved, 0u);
}

// Jobs stored before the cluster recorded partitions in etcd get a record
// from the node that holds them, where the hash over its partitions put
// them, before the cluster can be given more partitions.
TEST_F(ClusterTest, ANodeRecordsThePartitionsOfJobsFromBeforeTheDirectory) {
  {
    storage::Store::Options so;
    so.path = dir_.Sub("node-a");
    auto store = storage::Store::Open(so);
    SONDE_ASSERT_OK(store);
    for (const char* name : {"legacy", "kept"}) {
      v1::JobInfo job;
      job.set_job(name);
      SONDE_ASSERT_OK((*store)->CreateJob(job));
    }
  }
  auto etcd = EtcdClient(etcd_->endpoints());
  // Recorded already (by a gateway, at a later hello): left as it is.
  const std::string kept_at = absl::StrCat((JobPartition("kept", kPartitions) + 1) % kPartitions);
  SONDE_ASSERT_OK(etcd->Put("/sonde/test/jobs/kept", kept_at));
  auto node = StartNode("node-a");
  std::optional<KeyValue> record;
  ASSERT_TRUE(WaitUntil([&] {
    auto got = etcd->Get("/sonde/test/jobs/legacy");
    if (got.ok()) record = *got;
    return record.has_value();
  }));
  EXPECT_EQ(record->value, absl::StrCat(JobPartition("legacy", kPartitions)));
  auto kept = etcd->Get("/sonde/test/jobs/kept");
  SONDE_ASSERT_OK(kept);
  EXPECT_EQ((*kept)->value, kept_at);
}

// Without standbys, a node that takes a partition over replays its whole
// log into its own store: every step of the job, stored once, and the job
// goes on through it.
TEST_F(ClusterTest, WithoutAStandbyTheNewOwnerReplaysTheWholeLog) {
  std::string job;  // on a partition that ranks node-a first
  for (int i = 0; job.empty(); ++i) {
    const std::string name = absl::StrCat("replayed-", i);
    if (PreferredNodes(JobPartition(name, kPartitions), {"node-a", "node-b"})[0] == "node-a") {
      job = name;
    }
  }
  auto a = StartNode("node-a", kPartitions, /*standbys=*/0);
  ASSERT_TRUE(WaitUntil([&] { return a->node().owned().size() == kPartitions; }));
  TestGateway gateway(nats_->urls(), etcd_->endpoints());
  auto hook = Client(gateway.address(), job);
  ASSERT_NE(hook, nullptr);
  Train(*hook, 0, 300);
  SONDE_ASSERT_OK(hook->Flush(absl::Seconds(60)));
  auto b = StartNode("node-b", kPartitions, /*standbys=*/0);
  // node-b takes the partitions that rank it first, and stands by for none.
  ASSERT_TRUE(WaitUntil([&] {
    return a->node().owned().size() + b->node().owned().size() == kPartitions &&
           !b->node().owned().empty();
  }));
  EXPECT_TRUE(b->node().standing_by().empty());
  a->Stop();  // node-b takes node-a's partitions with no copy of them
  ASSERT_TRUE(WaitUntil([&] { return b->node().owned().size() == kPartitions; }));
  Train(*hook, 300, 320);
  SONDE_ASSERT_OK(hook->Close());
  EXPECT_EQ(hook->counters().steps_dropped, 0u);
  ASSERT_TRUE(WaitUntil([&] { return Finished(b->store(), job); }, absl::Seconds(60)));
  EXPECT_EQ(StoredSteps(b->store(), job), Range(320));
  EXPECT_GE(b->node().takeovers(/*caught_up=*/false), 1u);
  auto info = b->store().GetJob(job);
  SONDE_ASSERT_OK(info);
  EXPECT_EQ(info->steps_dropped(), 0u);
}

// While a partition's owner cannot be reached (dead, its lease not expired
// yet), reads of its jobs are answered by a copy that has caught up.
TEST_F(ClusterTest, ReadsGoToACaughtUpCopyWhileTheOwnerCannotBeReached) {
  const std::string job = "read-on";
  const int p = JobPartition(job, kPartitions);
  std::unique_ptr<Membership> owner =
      SilentOwner(p, absl::StrCat("127.0.0.1:", testing::UnusedLoopbackPort()));  // nothing listens
  ASSERT_NE(owner, nullptr);
  auto etcd = EtcdClient(etcd_->endpoints());
  auto b = StartNode("node-b");
  std::unique_ptr<PartitionLog> log = OpenLog(nats_->urls());
  testing::LoggedStream w("gw-x", 1);
  int appended = 0;
  for (const v1::LogEntry& e : {w.Hello(job, 0, 1, 5), w.Step(0, std::vector<float>(10, 1.0f)),
                                w.Step(1, std::vector<float>(10, 2.0f))}) {
    SONDE_ASSERT_OK(log->Append(p, absl::StrCat("e", ++appended), e.SerializeAsString()));
  }
  // node-b's copy has caught up (and says so in etcd).
  ASSERT_TRUE(WaitUntil([&] {
    auto said = etcd->Get(absl::StrCat("/sonde/test/caught_up/", p, "/node-b"));
    return said.ok() && said->has_value() && StoredSteps(b->store(), job).size() == 2;
  }));
  TestGateway gateway(nats_->urls(), etcd_->endpoints());
  auto q = QueryClient::Connect(gateway.address());
  auto info = q->GetJob(job);
  SONDE_ASSERT_OK(info);
  EXPECT_EQ(info->job(), job);
  auto steps = q->ListSteps(job);
  SONDE_ASSERT_OK(steps);
  EXPECT_EQ(steps->size(), 2u);
  auto value = q->ReadTensor(job, "fc.weight", 1);  // streamed
  SONDE_ASSERT_OK(value);
  ASSERT_EQ(value->bytes.size(), 10 * sizeof(float));
  float first = 0;
  std::memcpy(&first, value->bytes.data(), sizeof(float));
  EXPECT_EQ(first, 2.0f);
  auto listed = q->ListJobs();
  SONDE_ASSERT_OK(listed);
  ASSERT_EQ(listed->size(), 1u);
  EXPECT_EQ(listed->at(0).job(), job);
}

}  // namespace
}  // namespace sonde::cluster
