// A real etcd cluster on 127.0.0.1 for tests: N members (Debian's
// etcd-server, /usr/bin/etcd), each its own process with a data directory
// under `dir`, which a test can kill -9 and restart.
//
// Elections are fast (50 ms heartbeats, 500 ms election timeout) so that
// losing the leader costs a test about a second. Ports are picked by binding
// to port 0 and closing (etcd 3.4 cannot share a port held open), so
// another process may take one meanwhile; Start() then tries again with
// new ports.
#ifndef SONDE_TESTS_TESTING_ETCD_CLUSTER_H_
#define SONDE_TESTS_TESTING_ETCD_CLUSTER_H_

#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "tests/testing/child_process.h"
#include "tests/testing/http_get.h"
#include "tests/testing/unused_port.h"
#include "tests/testing/wait.h"

namespace sonde::testing {

inline constexpr char kEtcdBinary[] = "/usr/bin/etcd";

// Whether etcd is installed (deploy/install-deps.sh installs it).
inline bool HaveEtcd() { return access(kEtcdBinary, X_OK) == 0; }

class EtcdCluster {
 public:
  EtcdCluster(std::string dir, int members)
      : dir_(std::move(dir)), members_(members) {}

  // Before Start: serve clients and peers over TLS with client
  // certificates required, with `certs_dir`'s ca.pem, server.pem and
  // server.key (tests/testing/test_certificates.h). Health stays on a
  // plaintext metrics port.
  void set_tls(std::string certs_dir) { tls_ = std::move(certs_dir); }

  // Starts every member and waits until the cluster answers.
  absl::Status Start() {
    absl::Status last;
    for (int attempt = 0; attempt < 3; ++attempt) {
      last = StartOnce(attempt);
      if (last.ok()) return last;
      for (auto& p : processes_) p->Kill();
    }
    return last;
  }

  std::vector<std::string> endpoints() const {
    std::vector<std::string> out;
    for (int port : client_ports_)
      out.push_back(absl::StrCat("127.0.0.1:", port));
    return out;
  }
  int size() const { return members_; }

  pid_t pid(int i) const { return processes_[i]->pid(); }

  // kill -9 of member i.
  void Kill(int i) { processes_[i]->Kill(); }
  // Starts member i again on its data directory and ports.
  absl::Status Restart(int i) {
    if (!Launch(i, /*existing=*/true))
      return absl::InternalError("cannot fork etcd");
    return WaitServing(i);
  }

 private:
  absl::Status StartOnce(int attempt) {
    client_ports_.clear();
    peer_ports_.clear();
    metrics_ports_.clear();
    processes_.clear();
    token_ = absl::StrCat("sonde-test-", getpid(), "-", attempt);
    for (int i = 0; i < members_; ++i) {
      client_ports_.push_back(UnusedLoopbackPort());
      peer_ports_.push_back(UnusedLoopbackPort());
      metrics_ports_.push_back(UnusedLoopbackPort());
      processes_.push_back(std::make_unique<ChildProcess>());
    }
    for (int i = 0; i < members_; ++i) {
      if (!Launch(i, /*existing=*/false))
        return absl::InternalError("cannot fork etcd");
    }
    for (int i = 0; i < members_; ++i) {
      absl::Status s = WaitServing(i);
      if (!s.ok()) return s;
    }
    return absl::OkStatus();
  }

  bool Launch(int i, bool existing) {
    const std::string scheme = tls_.empty() ? "http" : "https";
    std::vector<std::string> peers;
    for (int m = 0; m < members_; ++m) {
      peers.push_back(
          absl::StrCat("m", m, "=", scheme, "://127.0.0.1:", peer_ports_[m]));
    }
    const std::string client =
        absl::StrCat(scheme, "://127.0.0.1:", client_ports_[i]);
    const std::string peer =
        absl::StrCat(scheme, "://127.0.0.1:", peer_ports_[i]);
    const std::string data = absl::StrCat(dir_, "/etcd-", token_, "-m", i);
    std::vector<std::string> tls;
    if (!tls_.empty()) {
      for (const char* side : {"", "peer-"}) {
        tls.push_back(
            absl::StrCat("--", side, "cert-file=", tls_, "/server.pem"));
        tls.push_back(
            absl::StrCat("--", side, "key-file=", tls_, "/server.key"));
        tls.push_back(
            absl::StrCat("--", side, "trusted-ca-file=", tls_, "/ca.pem"));
        tls.push_back(absl::StrCat("--", side, "client-cert-auth"));
      }
    }
    std::vector<std::string> argv = {
        kEtcdBinary,
        absl::StrCat("--name=m", i),
        "--data-dir=" + data,
        "--listen-client-urls=" + client,
        "--advertise-client-urls=" + client,
        "--listen-peer-urls=" + peer,
        "--initial-advertise-peer-urls=" + peer,
        "--initial-cluster=" + absl::StrJoin(peers, ","),
        std::string("--initial-cluster-state=") +
            (existing ? "existing" : "new"),
        "--initial-cluster-token=" + token_,
        "--heartbeat-interval=50",
        "--election-timeout=500",
        "--logger=zap",
        "--log-level=warn",
        absl::StrCat("--listen-metrics-urls=http://127.0.0.1:",
                     metrics_ports_[i])};
    argv.insert(argv.end(), tls.begin(), tls.end());
    return processes_[i]->Start(argv, absl::StrCat(dir_, "/etcd-m", i, ".log"));
  }

  // Member i says it is healthy (it has joined a cluster with a leader).
  // Asked over HTTP/1.1: a gRPC channel that connects before the member is
  // ready stalls for ~10 s (see server/cluster/etcd.cc).
  absl::Status WaitServing(int i) {
    const std::string address = absl::StrCat("127.0.0.1:", metrics_ports_[i]);
    std::string last = "no answer";
    const bool up = WaitUntil(
        [&] {
          if (!processes_[i]->Running()) return true;
          const HttpReply reply = HttpGetWithin(address, "/health", 1);
          last = reply.raw.empty() ? "no answer" : reply.body;
          return reply.status == 200 &&
                 reply.body.find("\"true\"") != std::string::npos;
        },
        absl::Seconds(30));
    if (!processes_[i]->Running()) {
      return absl::UnavailableError(absl::StrCat(
          "etcd member ", i, " exited; see ", dir_, "/etcd-m", i, ".log"));
    }
    if (!up)
      return absl::DeadlineExceededError(
          absl::StrCat("etcd member ", i, ": ", last));
    return absl::OkStatus();
  }

  const std::string dir_;
  const int members_;
  std::string token_;
  std::vector<int> client_ports_;
  std::vector<int> peer_ports_;
  std::vector<int> metrics_ports_;
  std::string tls_;
  std::vector<std::unique_ptr<ChildProcess>> processes_;
};

}  // namespace sonde::testing

#endif  // SONDE_TESTS_TESTING_ETCD_CLUSTER_H_
