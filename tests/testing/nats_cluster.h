// A real NATS JetStream cluster on 127.0.0.1 for tests: N nats-server
// processes (Debian's nats-server) routed to each other, each with its own
// store directory under `dir`, which a test can kill -9 and restart.
// Ports are picked as in etcd_cluster.h (bind to port 0 and close).
#ifndef SONDE_TESTS_TESTING_NATS_CLUSTER_H_
#define SONDE_TESTS_TESTING_NATS_CLUSTER_H_

#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "tests/testing/child_process.h"
#include "tests/testing/http_get.h"
#include "tests/testing/unused_port.h"
#include "tests/testing/wait.h"

namespace sonde::testing {

inline constexpr char kNatsBinary[] = "/usr/sbin/nats-server";

inline bool HaveNats() { return access(kNatsBinary, X_OK) == 0; }

class NatsCluster {
 public:
  NatsCluster(std::string dir, int servers)
      : dir_(std::move(dir)), servers_(servers) {}

  // Before Start: clients and routes over TLS, client certificates
  // verified, with `certs_dir`'s ca.pem, server.pem and server.key
  // (tests/testing/test_certificates.h). Monitoring stays plaintext.
  void set_tls(std::string certs_dir) { tls_ = std::move(certs_dir); }

  // Starts every server and waits until JetStream is healthy on each.
  absl::Status Start() {
    absl::Status last;
    for (int attempt = 0; attempt < 3; ++attempt) {
      last = StartOnce(attempt);
      if (last.ok()) return last;
      for (auto& p : processes_) p->Kill();
    }
    return last;
  }

  // nats://127.0.0.1:port of each server.
  std::vector<std::string> urls() const {
    std::vector<std::string> out;
    for (int port : client_ports_)
      out.push_back(absl::StrCat("nats://127.0.0.1:", port));
    return out;
  }

  void Kill(int i) { processes_[i]->Kill(); }
  pid_t pid(int i) const { return processes_[i]->pid(); }
  absl::Status Restart(int i) {
    if (!processes_[i]->Start({kNatsBinary, "-c", ConfigPath(i)}, LogPath(i))) {
      return absl::InternalError("cannot fork nats-server");
    }
    return WaitHealthy(i);
  }

 private:
  std::string ConfigPath(int i) const {
    return absl::StrCat(dir_, "/nats-", attempt_, "-n", i, ".conf");
  }
  std::string LogPath(int i) const {
    return absl::StrCat(dir_, "/nats-n", i, ".log");
  }

  absl::Status StartOnce(int attempt) {
    attempt_ = attempt;
    client_ports_.clear();
    route_ports_.clear();
    monitor_ports_.clear();
    processes_.clear();
    for (int i = 0; i < servers_; ++i) {
      client_ports_.push_back(UnusedLoopbackPort());
      route_ports_.push_back(UnusedLoopbackPort());
      monitor_ports_.push_back(UnusedLoopbackPort());
      processes_.push_back(std::make_unique<ChildProcess>());
    }
    std::vector<std::string> routes;
    for (int port : route_ports_)
      routes.push_back(absl::StrCat("nats-route://127.0.0.1:", port));
    for (int i = 0; i < servers_; ++i) {
      std::ofstream conf(ConfigPath(i));
      conf << "server_name: n" << i << "\n"
           << "listen: 127.0.0.1:" << client_ports_[i] << "\n"
           << "http: 127.0.0.1:" << monitor_ports_[i] << "\n"
           << "jetstream { store_dir: \"" << dir_ << "/nats-" << attempt << "-n"
           << i << "\" }\n";
      const std::string tls =
          tls_.empty() ? ""
                       : absl::StrCat("tls { cert_file: \"", tls_,
                                      "/server.pem\", key_file: \"", tls_,
                                      "/server.key\", ca_file: \"", tls_,
                                      "/ca.pem\", verify: true }\n");
      conf << tls;
      if (servers_ > 1) {  // one server alone runs JetStream unclustered
        conf << "cluster {\n  name: sonde-test\n  listen: 127.0.0.1:"
             << route_ports_[i] << "\n  routes: ["
             << absl::StrJoin(routes, ", ") << "]\n"
             << tls << "}\n";
      }
      if (!conf) return absl::InternalError("cannot write " + ConfigPath(i));
    }
    for (int i = 0; i < servers_; ++i) {
      if (!processes_[i]->Start({kNatsBinary, "-c", ConfigPath(i)},
                                LogPath(i))) {
        return absl::InternalError("cannot fork nats-server");
      }
    }
    for (int i = 0; i < servers_; ++i) {
      absl::Status s = WaitHealthy(i);
      if (!s.ok()) return s;
    }
    return absl::OkStatus();
  }

  // /healthz answers 200 once the server's JetStream is current.
  absl::Status WaitHealthy(int i) {
    const std::string address = absl::StrCat("127.0.0.1:", monitor_ports_[i]);
    std::string last = "no answer";
    const bool up = WaitUntil(
        [&] {
          if (!processes_[i]->Running()) return true;
          const HttpReply reply = HttpGetWithin(address, "/healthz", 1);
          last = reply.raw.empty() ? "no answer" : reply.body;
          return reply.status == 200;
        },
        absl::Seconds(30));
    if (!processes_[i]->Running()) {
      return absl::UnavailableError(
          absl::StrCat("nats-server ", i, " exited; see ", LogPath(i)));
    }
    if (!up)
      return absl::DeadlineExceededError(
          absl::StrCat("nats-server ", i, ": ", last));
    return absl::OkStatus();
  }

  const std::string dir_;
  const int servers_;
  std::string tls_;
  int attempt_ = 0;
  std::vector<int> client_ports_;
  std::vector<int> route_ports_;
  std::vector<int> monitor_ports_;
  std::vector<std::unique_ptr<ChildProcess>> processes_;
};

}  // namespace sonde::testing

#endif  // SONDE_TESTS_TESTING_NATS_CLUSTER_H_
