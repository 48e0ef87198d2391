// The whole cluster on 127.0.0.1, every server its own process: 3 etcd
// members, 3 nats-servers, 3 Sonde nodes and 2 gateways (sonde-cluster),
// with 8 training clients streaming through the gateways. Every hop is TLS
// with certificates of one test CA: hook and CLI to gateways, gateways to
// nodes, both to etcd and NATS (client certificates required there), etcd
// members and NATS servers among themselves. While the clients stream,
// Sonde nodes, log servers, gateways and etcd members are killed with
// SIGKILL and restarted, round after round. At the end every acknowledged
// step is stored once with its values by the node that owns its job's
// partition, every job is finished with nothing dropped, and the
// StopTraining one job's rule asked for fired once and reached its client.
#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <fstream>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "client/hook.h"
#include "client/query_client.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/cluster/etcd.h"
#include "server/cluster/membership.h"
#include "tests/testing/child_process.h"
#include "tests/testing/etcd_cluster.h"
#include "tests/testing/http_get.h"
#include "tests/testing/nats_cluster.h"
#include "tests/testing/status_matchers.h"
#include "tests/testing/temp_dir.h"
#include "tests/testing/test_certificates.h"
#include "tests/testing/unused_port.h"
#include "tests/testing/wait.h"

namespace sonde {
namespace {

using ::sonde::testing::WaitUntil;

constexpr int kPartitions = 4;
constexpr int kSteps = 100;
// job-0 trains until its rule stops it, as a training loop that checks
// should_stop() does, for at most this many steps.
constexpr int kMaxStepsUntilStopped = 600;
constexpr int kClients = 8;
constexpr char kPrefix[] = "/sonde/loop";

std::string ClusterBinary() {
  const char* srcdir = std::getenv("TEST_SRCDIR");
  const char* workspace = std::getenv("TEST_WORKSPACE");
  return absl::StrCat(srcdir ? srcdir : ".", "/", workspace ? workspace : "sonde",
                      "/server/cluster/sonde-cluster");
}

// A sonde-cluster process on a fixed port, which a test can kill -9 and
// start again on the same port and data.
class SondeProcess {
 public:
  SondeProcess(std::vector<std::string> args, std::string log)
      : args_(std::move(args)), log_(std::move(log)) {}

  void Start(bool metrics = false) {
    port_ = testing::UnusedLoopbackPort();
    if (metrics) metrics_port_ = testing::UnusedLoopbackPort();
    Launch();
  }
  // Its /metrics endpoint (Start(true) only).
  std::string metrics_address() const { return absl::StrCat("127.0.0.1:", metrics_port_); }
  const std::string& log() const { return log_; }
  void Kill() { process_.Kill(); }
  void Restart() { Launch(); }
  std::string address() const { return absl::StrCat("127.0.0.1:", port_); }
  bool Running() { return process_.Running(); }
  // Accepts TCP connections (its gRPC server is up).
  bool Listening() {
    const int fd = testing::ConnectTo(address());
    if (fd < 0) return false;
    close(fd);
    return true;
  }

 private:
  void Launch() {
    std::vector<std::string> argv = {ClusterBinary()};
    argv.insert(argv.end(), args_.begin(), args_.end());
    argv.push_back("--listen=" + address());
    if (metrics_port_ > 0) argv.push_back("--metrics_listen=" + metrics_address());
    ASSERT_TRUE(process_.Start(argv, log_));
  }

  const std::vector<std::string> args_;
  const std::string log_;
  int port_ = 0;
  int metrics_port_ = 0;
  testing::ChildProcess process_;
};

class ClusterLoopbackTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!testing::HaveEtcd() || !testing::HaveNats()) GTEST_SKIP() << "no etcd or nats-server";
    ASSERT_TRUE(certs_.ok()) << "openssl failed; see " << certs_("openssl.log");
    etcd_ = std::make_unique<testing::EtcdCluster>(dir_.path(), 3);
    nats_ = std::make_unique<testing::NatsCluster>(dir_.path(), 3);
    etcd_->set_tls(certs_.dir());
    nats_->set_tls(certs_.dir());
    SONDE_ASSERT_OK(etcd_->Start());
    SONDE_ASSERT_OK(nats_->Start());
    const std::string etcd = "--etcd=" + absl::StrJoin(etcd_->endpoints(), ",");
    const std::string nats = "--nats=" + absl::StrJoin(nats_->urls(), ",");
    const std::vector<std::string> common = {
        nats, "--cluster=loop", absl::StrCat("--partitions=", kPartitions), "--replicas=3",
        "--tls_cert=" + certs_("server.pem"), "--tls_key=" + certs_("server.key"),
        "--nats_tls_ca=" + certs_("ca.pem"), "--nats_tls_cert=" + certs_("client.pem"),
        "--nats_tls_key=" + certs_("client.key"), "--etcd_tls_ca=" + certs_("ca.pem"),
        "--etcd_tls_cert=" + certs_("client.pem"), "--etcd_tls_key=" + certs_("client.key")};
    for (int i = 0; i < 3; ++i) {
      std::vector<std::string> args = common;
      args.insert(args.end(), {"--role=node", absl::StrCat("--name=node-", i), etcd,
                               "--data_dir=" + dir_.Sub(absl::StrCat("node-", i)),
                               "--lease=2s", "--rules=ExplodingTensor(actions=StopTraining)"});
      nodes_.push_back(std::make_unique<SondeProcess>(
          args, dir_.Sub(absl::StrCat("node-", i, ".log"))));
    }
    for (int i = 0; i < 2; ++i) {
      std::vector<std::string> args = common;
      // Gateways also serve the Query API (they know etcd): queries below
      // go through them, as a user's would.
      args.insert(args.end(), {"--role=gateway", absl::StrCat("--name=gw-", i), etcd,
                               "--node_tls_ca=" + certs_("ca.pem")});
      gateways_.push_back(
          std::make_unique<SondeProcess>(args, dir_.Sub(absl::StrCat("gw-", i, ".log"))));
    }
    for (auto& p : nodes_) p->Start(/*metrics=*/true);
    for (auto& p : gateways_) p->Start(/*metrics=*/true);
    cluster::Etcd::Options eo;
    eo.endpoints = etcd_->endpoints();
    eo.tls_ca_file = certs_("ca.pem");
    eo.tls_cert_file = certs_("client.pem");
    eo.tls_key_file = certs_("client.key");
    auto client = cluster::Etcd::Connect(eo);
    SONDE_ASSERT_OK(client);
    etcd_client_ = std::move(*client);
    // Every partition owned and every gateway serving before training starts.
    ASSERT_TRUE(WaitUntil([&] {
      auto owners = etcd_client_->List(absl::StrCat(kPrefix, "/owners/"));
      return owners.ok() && owners->size() == kPartitions;
    }, absl::Seconds(60))) << "partitions never all owned; see " << dir_.path();
    for (auto& g : gateways_) ASSERT_TRUE(WaitUntil([&] { return g->Listening(); }));
  }

  // A client of the cluster's CA, as users' hooks and CLIs are.
  ChannelSecurity Tls() const {
    ChannelSecurity s;
    s.ca_file = certs_("ca.pem");
    return s;
  }
  std::unique_ptr<QueryClient> Query(int gateway) const {
    auto q = QueryClient::Connect(gateways_[gateway]->address(), Tls());
    EXPECT_TRUE(q.ok()) << q.status();
    return q.ok() ? std::move(*q) : nullptr;
  }

  testing::Certificates certs_;
  testing::TempDir dir_;
  std::unique_ptr<testing::EtcdCluster> etcd_;
  std::unique_ptr<testing::NatsCluster> nats_;
  std::vector<std::unique_ptr<SondeProcess>> nodes_;
  std::vector<std::unique_ptr<SondeProcess>> gateways_;
  std::unique_ptr<cluster::Etcd> etcd_client_;
};

float Value(int client, int step, int i) { return client * 1000.0f + step + 0.001f * i; }

TEST_F(ClusterLoopbackTest, NothingAcknowledgedIsLostWhileNodesAndLogServersAreKilled) {
  // Eight training processes, four per gateway.
  std::vector<std::unique_ptr<Hook>> hooks;
  for (int c = 0; c < kClients; ++c) {
    HookOptions o;
    o.collector = gateways_[c % 2]->address();
    o.security = Tls();
    o.job = absl::StrCat("job-", c);
    o.config.save_config = SaveConfig::Every(1);
    o.config.include_collections = {"weights", "losses"};
    o.close_timeout = absl::Seconds(120);
    auto hook = Hook::Create(o);
    SONDE_ASSERT_OK(hook);
    hooks.push_back(std::move(*hook));
  }
  std::atomic<int> training{kClients};
  std::vector<int> steps_run(kClients, 0);
  std::vector<std::thread> clients;
  for (int c = 0; c < kClients; ++c) {
    clients.emplace_back([&, c] {
      Hook& hook = *hooks[c];
      std::vector<float> w(64);
      const int steps = c == 0 ? kMaxStepsUntilStopped : kSteps;
      for (int step = 0; step < steps && !hook.should_stop(); ++step) {
        steps_run[c] = step + 1;
        hook.StartStep();
        for (int i = 0; i < 64; ++i) w[i] = Value(c, step, i);
        EXPECT_TRUE(hook.SaveTensor("fc.weight", HostTensor(w.data(), {64}), {"weights"}).ok());
        // job-0's loss explodes at step 40: its rule stops the training.
        const double loss = c == 0 && step == 40 ? std::nan("") : 1.0 / (step + 1);
        EXPECT_TRUE(hook.SaveScalar("loss", loss, {"losses"}).ok());
        hook.EndStep();
        absl::SleepFor(absl::Milliseconds(100));  // 10 s of training
      }
      --training;
    });
  }
  // Chaos while they stream: kill -9 a Sonde node, a log server, a gateway
  // (its clients reconnect to it and resend what was not acknowledged) or
  // an etcd member, let it lie dead a moment, start it again; round and
  // round.
  std::mt19937 rng(19);
  int kills = 0;
  std::map<std::string, int> killed;
  // At least one of each kind, and more while the clients still stream.
  for (int round = 0; training.load() > 0 || kills < 4; ++round) {
    absl::SleepFor(absl::Milliseconds(400));
    switch (round % 4) {
      case 0: {
        const int n = static_cast<int>(rng() % nodes_.size());
        nodes_[n]->Kill();
        absl::SleepFor(absl::Milliseconds(300));
        nodes_[n]->Restart();
        ++killed["node"];
        break;
      }
      case 1: {
        const int s = static_cast<int>(rng() % 3);
        nats_->Kill(s);
        absl::SleepFor(absl::Milliseconds(300));
        SONDE_ASSERT_OK(nats_->Restart(s));
        ++killed["nats"];
        break;
      }
      case 2: {
        const int g = static_cast<int>(rng() % gateways_.size());
        gateways_[g]->Kill();
        absl::SleepFor(absl::Milliseconds(300));
        gateways_[g]->Restart();
        ++killed["gateway"];
        break;
      }
      case 3: {
        const int e = static_cast<int>(rng() % 3);
        etcd_->Kill(e);
        absl::SleepFor(absl::Milliseconds(300));
        SONDE_ASSERT_OK(etcd_->Restart(e));
        ++killed["etcd"];
        break;
      }
    }
    ++kills;
  }
  for (std::thread& t : clients) t.join();
  for (auto& h : hooks) SONDE_EXPECT_OK(h->Close());
  RecordProperty("kills", kills);
  for (const auto& [kind, n] : killed) RecordProperty(kind + "_kills", n);
  EXPECT_GE(kills, 4);
  EXPECT_EQ(killed.size(), 4u);  // each kind at least once

  for (int c = 0; c < kClients; ++c) {
    const std::string job = absl::StrCat("job-", c);
    EXPECT_EQ(hooks[c]->counters().steps_dropped, 0u) << job;
    EXPECT_EQ(hooks[c]->counters().tensors_dropped, 0u) << job;
    // The owner may still be applying (or taking over): wait for the end.
    // Asked through a gateway, which routes to the partition's owner.
    auto q = Query((c + 1) % 2);
    ASSERT_NE(q, nullptr);
    v1::JobInfo info;
    ASSERT_TRUE(WaitUntil([&] {
      auto got = q->GetJob(job);
      if (!got.ok()) return false;
      info = *got;
      return info.status() == v1::JOB_STATUS_FINISHED || info.status() == v1::JOB_STATUS_STOPPED;
    }, absl::Seconds(90))) << job << " never finished; logs in " << dir_.path();
    auto steps = q->ListSteps(job);
    SONDE_ASSERT_OK(steps);
    std::vector<int64_t> stored;
    for (const v1::StepInfo& s : *steps) {
      stored.push_back(s.step());
      EXPECT_EQ(s.workers_size(), 1) << job << " step " << s.step();
    }
    std::vector<int64_t> all(steps_run[c]);
    for (int i = 0; i < steps_run[c]; ++i) all[i] = i;
    EXPECT_EQ(stored, all) << job;  // every step, once, in order
    // Nothing the gateways acknowledged was refused later by a node.
    EXPECT_EQ(info.steps_dropped(), 0u) << job;
    EXPECT_EQ(info.tensors_dropped(), 0u) << job;
    for (int step = 0; step < steps_run[c]; ++step) {
      auto values = q->ReadTensor(job, "fc.weight", step);
      SONDE_ASSERT_OK(values);
      ASSERT_EQ(values->bytes.size(), 64u * sizeof(float)) << job << " step " << step;
      std::vector<float> got(64);
      std::memcpy(got.data(), values->bytes.data(), values->bytes.size());
      for (int i = 0; i < 64; ++i) ASSERT_EQ(got[i], Value(c, step, i)) << job << " " << step;
    }
  }
  auto listed = Query(0)->ListJobs();
  SONDE_ASSERT_OK(listed);
  std::vector<std::string> names, expected;
  for (const v1::JobInfo& j : *listed) names.push_back(j.job());
  for (int c = 0; c < kClients; ++c) expected.push_back(absl::StrCat("job-", c));
  std::sort(names.begin(), names.end());
  EXPECT_EQ(names, expected);  // each job once, from its owner
  // The exploding loss of job-0: its StopTraining fired once and came back.
  // (Asked again for a while: the member asked may be one the last round
  // restarted, still catching up with the others.)
  absl::StatusOr<std::vector<cluster::KeyValue>> fired;
  WaitUntil([&] {
    fired = etcd_client_->List(absl::StrCat(kPrefix, "/actions/job-0/"));
    return fired.ok() && !fired->empty();
  }, absl::Seconds(30));
  SONDE_ASSERT_OK(fired);
  EXPECT_EQ(fired->size(), 1u);
  EXPECT_TRUE(hooks[0]->should_stop());
  EXPECT_LT(steps_run[0], kMaxStepsUntilStopped);  // it stopped training
  EXPECT_GT(steps_run[0], 40);
  RecordProperty("job0_steps_until_stopped", steps_run[0]);
  for (int c = 1; c < kClients; ++c) EXPECT_FALSE(hooks[c]->should_stop()) << c;
  // The killed nodes' partitions went to standbys that had applied them
  // all along (node logs, kept across restarts), and the nodes tell so in
  // their metrics.
  int warm = 0, cold = 0;
  std::string placements;  // what the nodes said of partitions, for a failure
  for (auto& n : nodes_) {
    std::ifstream in(n->log());
    for (std::string line; std::getline(in, line);) {
      if (line.find("(its copy had caught up)") != std::string::npos) ++warm;
      if (line.find("(its copy is catching up)") != std::string::npos) ++cold;
      if (line.find("partition") != std::string::npos) placements += line + "\n";
    }
  }
  RecordProperty("warm_takeovers", warm);
  RecordProperty("cold_takeovers", cold);
  EXPECT_GE(warm, 1) << "no standby took a partition over; the nodes said:\n" << placements;
  // A node or gateway the last round restarted may still be starting (on a
  // busy machine, seconds): ask until it serves.
  auto metrics_of = [](const std::string& address) {
    testing::HttpReply reply;
    WaitUntil([&] {
      reply = testing::HttpGetWithin(address, "/metrics", 5);
      return reply.status == 200;
    }, absl::Seconds(60));
    return reply;
  };
  for (auto& n : nodes_) {
    testing::HttpReply metrics = metrics_of(n->metrics_address());
    EXPECT_EQ(metrics.status, 200) << n->metrics_address();
    EXPECT_NE(metrics.body.find("sonde_cluster_takeovers_total{"), std::string::npos);
    EXPECT_NE(metrics.body.find("sonde_cluster_partitions{"), std::string::npos);
  }
  for (auto& g : gateways_) {
    testing::HttpReply metrics = metrics_of(g->metrics_address());
    EXPECT_EQ(metrics.status, 200) << g->metrics_address();
    EXPECT_NE(metrics.body.find("sonde_gateway_entries_appended_total"), std::string::npos);
    EXPECT_NE(metrics.body.find("sonde_gateway_hello_latency_seconds_bucket"), std::string::npos);
  }
}

}  // namespace
}  // namespace sonde
