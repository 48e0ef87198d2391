// The cluster path against the single-node path, on this machine, as ratios
// measured in the same run (docs/cluster.md, "Measured here"):
//
//   single: the hook -> sonde-collector (one process, RocksDB)
//   cluster: the hook -> gateway -> NATS JetStream (3 servers, R3) ->
//            node (RocksDB); etcd (1 member) for membership
//
// For each: bytes per second a client streams (steps of one tensor, then a
// Flush), the CPU seconds every server process spent per MiB acknowledged
// (/proc/<pid>/stat, the bench's own process excluded), split per process
// for the model of throughput against node count, and ack latency (EndStep
// plus Flush of a single step, one at a time: median and p99).
//
// Then failover: two nodes, one job streamed into the one partition and
// left open, the owner killed -9; how long until a new client's hello is
// answered and until the survivor holds every step, with a standby
// (--standbys=1: it applied the partition all along) and without one
// (--standbys=0: the survivor replays the log from its start).
//
//   bazel run -c opt //tests/bench:cluster_bench -- --steps=400 --tensor_kib=256
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "client/hook.h"
#include "client/query_client.h"
#include "server/cluster/etcd.h"
#include "tests/testing/child_process.h"
#include "tests/testing/etcd_cluster.h"
#include "tests/testing/http_get.h"
#include "tests/testing/nats_cluster.h"
#include "tests/testing/temp_dir.h"
#include "tests/testing/unused_port.h"
#include "tests/testing/wait.h"

ABSL_FLAG(int, steps, 400, "steps streamed in the throughput phase");
ABSL_FLAG(int, tensor_kib, 256, "size of the one tensor saved per step");
ABSL_FLAG(int, latency_steps, 200, "steps of the latency phase (one at a time)");
ABSL_FLAG(int, failover_steps, 400, "steps streamed before the owner is killed");

namespace sonde {
namespace {

// Ends the bench and every server it started (they are in its process
// group, which Main makes its own): a failure must not leave etcd, NATS or
// Sonde processes running.
[[noreturn]] void Fail() {
  std::fflush(stderr);
  kill(0, SIGKILL);
  std::_Exit(1);
}

std::string Runfile(const std::string& argv0, const std::string& path) {
  const char* dir = std::getenv("RUNFILES_DIR");
  const std::string root = dir != nullptr ? dir : argv0 + ".runfiles";
  return absl::StrCat(root, "/sonde/", path);
}

// CPU seconds (user + system) a process has used so far.
double CpuSeconds(pid_t pid) {
  std::ifstream f(absl::StrCat("/proc/", pid, "/stat"));
  std::string line;
  std::getline(f, line);
  const size_t close = line.rfind(')');
  if (close == std::string::npos) return 0;
  std::vector<std::string> fields = absl::StrSplit(line.substr(close + 2), ' ');
  // After "pid (comm) ": state is field 0; utime 11, stime 12.
  if (fields.size() < 13) return 0;
  const double ticks = static_cast<double>(sysconf(_SC_CLK_TCK));
  return (std::stod(fields[11]) + std::stod(fields[12])) / ticks;
}

struct Process {
  std::string name;
  pid_t pid;
};

struct Result {
  double mib_per_s = 0;         // acknowledged
  double stored_mib_per_s = 0;  // stored where queries read it
  std::map<std::string, double> cpu_per_mib;  // by process name
  double cpu_per_mib_total = 0;
  double latency_median_ms = 0;
  double latency_p99_ms = 0;
};

// A hook streaming `job` to `address`, once its hello is answered.
std::unique_ptr<Hook> Connected(const std::string& address, const std::string& job) {
  HookOptions o;
  o.collector = address;
  o.job = job;
  o.config.save_config = SaveConfig::Every(1);
  o.config.include_collections = {"weights"};
  o.close_timeout = absl::Seconds(120);
  auto hook = Hook::Create(o);
  if (!hook.ok() || !(*hook)->WaitUntilConnected(absl::Seconds(60)).ok()) {
    std::fprintf(stderr, "%s: never connected\n", job.c_str());
    Fail();
  }
  return std::move(*hook);
}

// `stored_through(job)`: the last step the store holds (the cluster's
// node stores after the log acknowledged), so CPU is read once all of it
// is stored.
Result Measure(const std::string& address, const std::vector<Process>& servers,
               const std::string& job, const std::string& query_address) {
  Result r;
  std::unique_ptr<Hook> hook = Connected(address, job);
  const int64_t n = absl::GetFlag(FLAGS_tensor_kib) * 1024 / 4;
  std::vector<float> w(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) w[i] = 0.001f * static_cast<float>(i % 1000);
  // Throughput: many steps, then one Flush.
  std::map<std::string, double> cpu_before;
  for (const Process& p : servers) cpu_before[p.name] += CpuSeconds(p.pid);
  const int steps = absl::GetFlag(FLAGS_steps);
  const absl::Time start = absl::Now();
  for (int step = 0; step < steps; ++step) {
    hook->StartStep();
    w[0] = static_cast<float>(step);
    hook->SaveTensor("fc.weight", HostTensor(w.data(), {n}), {"weights"}).IgnoreError();
    hook->EndStep();
  }
  if (!hook->Flush(absl::Seconds(300)).ok()) {
    std::fprintf(stderr, "%s: flush failed\n", job.c_str());
    Fail();
  }
  const double seconds = absl::ToDoubleSeconds(absl::Now() - start);
  const double mib = static_cast<double>(steps) * static_cast<double>(n) * 4 / (1 << 20);
  r.mib_per_s = mib / seconds;
  auto query = QueryClient::Connect(query_address);
  testing::WaitUntil(
      [&] {
        auto info = query->GetJob(job);
        return info.ok() && info->last_step() >= steps - 1;
      },
      absl::Seconds(300));
  r.stored_mib_per_s = mib / absl::ToDoubleSeconds(absl::Now() - start);
  std::map<std::string, double> cpu_after;
  for (const Process& p : servers) cpu_after[p.name] += CpuSeconds(p.pid);
  for (const auto& [name, before] : cpu_before) {
    r.cpu_per_mib[name] = (cpu_after[name] - before) / mib;
    r.cpu_per_mib_total += r.cpu_per_mib[name];
  }
  // Latency: one small step at a time, acknowledged before the next.
  std::vector<double> ms;
  float x = 0;
  for (int step = 0; step < absl::GetFlag(FLAGS_latency_steps); ++step) {
    hook->StartStep();
    x += 1;
    hook->SaveTensor("small", HostTensor(&x, {1}), {"weights"}).IgnoreError();
    const absl::Time t = absl::Now();
    hook->Flush(absl::Seconds(60)).IgnoreError();
    ms.push_back(absl::ToDoubleMilliseconds(absl::Now() - t));
  }
  std::sort(ms.begin(), ms.end());
  r.latency_median_ms = ms[ms.size() / 2];
  r.latency_p99_ms = ms[std::min(ms.size() - 1, ms.size() * 99 / 100)];
  hook->Close().IgnoreError();
  return r;
}

// Starts `argv` on a fresh loopback port (given as --listen) and waits
// until it accepts connections.
std::string StartServer(testing::ChildProcess& p, std::vector<std::string> argv,
                        const std::string& log) {
  for (int attempt = 0; attempt < 5; ++attempt) {
    const std::string address = absl::StrCat("127.0.0.1:", testing::UnusedLoopbackPort());
    std::vector<std::string> args = argv;
    args.push_back("--listen=" + address);
    p.Start(args, log);
    const bool up = testing::WaitUntil(
        [&] {
          if (!p.Running()) return true;
          const int fd = testing::ConnectTo(address);
          if (fd >= 0) close(fd);
          return fd >= 0;
        },
        absl::Seconds(60));
    if (up && p.Running()) return address;
  }
  std::fprintf(stderr, "cannot start %s; see %s\n", argv[0].c_str(), log.c_str());
  Fail();
}


struct Failover {
  double logged_mib = 0;     // in the partition when the owner died
  double hello_s = 0;        // kill -> a new client's hello answered
  double caught_up_s = 0;    // kill -> the survivor holds every step
};

// Two nodes applying one partition (`standbys` each), a gateway, a job of
// --failover_steps steps left open; the owner is killed -9.
Failover MeasureFailover(const std::string& cluster_bin, const testing::TempDir& dir,
                         const testing::EtcdCluster& etcd, const testing::NatsCluster& nats,
                         int standbys) {
  const std::string cluster = absl::StrCat("failover", standbys);
  const std::vector<std::string> common = {
      "--nats=" + absl::StrJoin(nats.urls(), ","), "--cluster=" + cluster, "--partitions=1",
      "--replicas=3", "--etcd=" + absl::StrJoin(etcd.endpoints(), ","), "--lease=2s"};
  testing::ChildProcess nodes[2], gateway;
  std::string addresses[2];
  for (int i = 0; i < 2; ++i) {
    std::vector<std::string> args = {cluster_bin, "--role=node", absl::StrCat("--name=n", i),
                                     "--data_dir=" + dir.Sub(absl::StrCat(cluster, "-n", i)),
                                     "--rules=", absl::StrCat("--standbys=", standbys)};
    args.insert(args.end(), common.begin(), common.end());
    addresses[i] = StartServer(nodes[i], args, dir.Sub(absl::StrCat(cluster, "-n", i, ".log")));
  }
  std::vector<std::string> gateway_args = {cluster_bin, "--role=gateway", "--name=gw"};
  gateway_args.insert(gateway_args.end(), common.begin(), common.end());
  const std::string gateway_address =
      StartServer(gateway, gateway_args, dir.Sub(cluster + "-gw.log"));

  cluster::Etcd::Options eo;
  eo.endpoints = etcd.endpoints();
  auto client = cluster::Etcd::Connect(eo);
  if (!client.ok()) Fail();
  const std::string prefix = "/sonde/" + cluster;
  std::unique_ptr<Hook> hook = Connected(gateway_address, "streaming");
  const int steps = absl::GetFlag(FLAGS_failover_steps);
  const int64_t n = absl::GetFlag(FLAGS_tensor_kib) * 1024 / 4;
  std::vector<float> w(static_cast<size_t>(n), 0.5f);
  for (int step = 0; step < steps; ++step) {
    hook->StartStep();
    w[0] = static_cast<float>(step);
    hook->SaveTensor("fc.weight", HostTensor(w.data(), {n}), {"weights"}).IgnoreError();
    hook->EndStep();
  }
  if (!hook->Flush(absl::Seconds(300)).ok()) Fail();
  // The owner, and (with a standby) the survivor caught up, before the kill.
  std::string owner;
  testing::WaitUntil(
      [&] {
        auto kv = (*client)->Get(prefix + "/owners/0");
        if (kv.ok() && kv->has_value()) owner = (*kv)->value;
        return !owner.empty();
      },
      absl::Seconds(60));
  const int dead = owner == "n0" ? 0 : 1;
  const int survivor = 1 - dead;
  auto holds_all = [&](const std::string& address) {
    auto info = QueryClient::Connect(address)->GetJob("streaming");
    return info.ok() && info->last_step() >= steps - 1;
  };
  testing::WaitUntil([&] { return holds_all(addresses[dead]); }, absl::Seconds(300));
  if (standbys > 0) {
    testing::WaitUntil([&] { return holds_all(addresses[survivor]); }, absl::Seconds(300));
  }
  Failover f;
  f.logged_mib = static_cast<double>(steps) * static_cast<double>(n) * 4 / (1 << 20);
  const absl::Time killed = absl::Now();
  nodes[dead].Kill();
  std::unique_ptr<Hook> late = Connected(gateway_address, "late");
  f.hello_s = absl::ToDoubleSeconds(absl::Now() - killed);
  testing::WaitUntil([&] { return holds_all(addresses[survivor]); }, absl::Seconds(300));
  f.caught_up_s = absl::ToDoubleSeconds(absl::Now() - killed);
  late->Close().IgnoreError();
  hook->Close().IgnoreError();
  gateway.Terminate();
  nodes[survivor].Terminate();
  return f;
}

void Print(const char* name, const Result& r) {
  std::printf("%-8s acked %6.1f MiB/s, stored %6.1f MiB/s  %7.4f CPU s/MiB (", name, r.mib_per_s,
              r.stored_mib_per_s, r.cpu_per_mib_total);
  std::vector<std::string> parts;
  for (const auto& [p, c] : r.cpu_per_mib) parts.push_back(absl::StrCat(p, " ", c));
  std::printf("%s)  ack median %.2f ms, p99 %.2f ms\n", absl::StrJoin(parts, ", ").c_str(),
              r.latency_median_ms, r.latency_p99_ms);
}

int Main(const std::string& argv0) {
  setpgid(0, 0);  // a group of its own, with the servers it starts (Fail)
  testing::TempDir dir;
  const std::string collector_bin = Runfile(argv0, "server/sonde-collector");
  const std::string cluster_bin = Runfile(argv0, "server/cluster/sonde-cluster");

  testing::ChildProcess single;
  const std::string single_address =
      StartServer(single, {collector_bin, "--data_dir=" + dir.Sub("single"), "--rules="},
                  dir.Sub("single.log"));
  const Result one =
      Measure(single_address, {{"collector", single.pid()}}, "bench-single", single_address);
  single.Terminate();

  testing::EtcdCluster etcd(dir.path(), 1);
  testing::NatsCluster nats(dir.path(), 3);
  if (!etcd.Start().ok() || !nats.Start().ok()) {
    std::fprintf(stderr, "cannot start etcd or NATS; see %s\n", dir.path().c_str());
    return 1;
  }
  const std::vector<std::string> common = {
      "--nats=" + absl::StrJoin(nats.urls(), ","), "--cluster=bench", "--partitions=1",
      "--replicas=3"};
  testing::ChildProcess node, gateway;
  std::vector<std::string> node_args = {cluster_bin, "--role=node", "--name=node-0",
                                        "--etcd=" + absl::StrJoin(etcd.endpoints(), ","),
                                        "--data_dir=" + dir.Sub("node"), "--rules="};
  node_args.insert(node_args.end(), common.begin(), common.end());
  const std::string node_address = StartServer(node, node_args, dir.Sub("node.log"));
  std::vector<std::string> gateway_args = {cluster_bin, "--role=gateway", "--name=gw-0"};
  gateway_args.insert(gateway_args.end(), common.begin(), common.end());
  const std::string gateway_address = StartServer(gateway, gateway_args, dir.Sub("gw.log"));
  std::vector<Process> servers = {{"gateway", gateway.pid()}, {"node", node.pid()}};
  for (int i = 0; i < 3; ++i) servers.push_back({"nats", nats.pid(i)});
  servers.push_back({"etcd", etcd.pid(0)});
  const Result many = Measure(gateway_address, servers, "bench-cluster", node_address);
  gateway.Terminate();
  node.Terminate();
  const Failover warm = MeasureFailover(cluster_bin, dir, etcd, nats, 1);
  const Failover cold = MeasureFailover(cluster_bin, dir, etcd, nats, 0);

  std::printf("cluster_bench: %d steps of %d KiB, %d one-step acks\n", absl::GetFlag(FLAGS_steps),
              absl::GetFlag(FLAGS_tensor_kib), absl::GetFlag(FLAGS_latency_steps));
  Print("single", one);
  Print("cluster", many);
  std::printf("ratios cluster/single: acked throughput %.2f, stored throughput %.2f, CPU per "
              "byte %.2f, ack median %.2f, ack p99 %.2f\n",
              many.mib_per_s / one.mib_per_s, many.stored_mib_per_s / one.stored_mib_per_s,
              many.cpu_per_mib_total / one.cpu_per_mib_total,
              many.latency_median_ms / one.latency_median_ms,
              many.latency_p99_ms / one.latency_p99_ms);
  std::printf("failover (lease 2 s, %.0f MiB logged on the partition, owner killed -9):\n",
              warm.logged_mib);
  std::printf("  with a standby:    new hello answered after %.2f s, survivor holds every step "
              "after %.2f s\n", warm.hello_s, warm.caught_up_s);
  std::printf("  without (replay):  new hello answered after %.2f s, survivor holds every step "
              "after %.2f s (replayed at %.0f MiB/s once the lease expired)\n",
              cold.hello_s, cold.caught_up_s, cold.logged_mib / std::max(cold.caught_up_s - 2, 0.01));
  return 0;
}

}  // namespace
}  // namespace sonde

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  return sonde::Main(argv[0]);
}
