// A real etcd cluster on 127.0.0.1 for tests: N members (Debian's
// etcd-server, /usr/bin/etcd), each its own process with a data directory
// under `dir`, which a test can kill -9 and restart (LoopbackServers).
//
// Elections are fast (50 ms heartbeats, 500 ms election timeout) so that
// losing the leader costs a test about a second. A member is up once its
// /health says true, asked over HTTP/1.1 on its metrics port: a gRPC
// channel that connects before the member is ready stalls for ~10 s (see
// server/cluster/etcd.cc).
#ifndef SONDE_TESTS_TESTING_ETCD_CLUSTER_H_
#define SONDE_TESTS_TESTING_ETCD_CLUSTER_H_

#include <unistd.h>

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "tests/testing/loopback_servers.h"

namespace sonde::testing {

inline constexpr char kEtcdBinary[] = "/usr/bin/etcd";

// Whether etcd is installed (deploy/install-deps.sh installs it).
inline bool HaveEtcd() { return access(kEtcdBinary, X_OK) == 0; }

class EtcdCluster : public LoopbackServers {
 public:
  EtcdCluster(std::string dir, int members)
      : LoopbackServers("etcd", std::move(dir), members, /*ports=*/3, kMetrics, "/health") {}

  // Before Start: serve clients and peers over TLS with client
  // certificates required, with `certs_dir`'s ca.pem, server.pem and
  // server.key (tests/testing/test_certificates.h). Health stays on the
  // plaintext metrics port.
  void set_tls(std::string certs_dir) { tls_ = std::move(certs_dir); }

  std::vector<std::string> endpoints() const {
    std::vector<std::string> out;
    for (int i = 0; i < size(); ++i) out.push_back(absl::StrCat("127.0.0.1:", port(i, kClient)));
    return out;
  }

 private:
  static constexpr int kClient = 0, kPeer = 1, kMetrics = 2;

  bool Healthy(const HttpReply& reply) const override {
    return reply.status == 200 && reply.body.find("\"true\"") != std::string::npos;
  }

  bool Launch(int i, bool again) override {
    const std::string scheme = tls_.empty() ? "http" : "https";
    std::vector<std::string> peers;
    for (int m = 0; m < size(); ++m) {
      peers.push_back(absl::StrCat("m", m, "=", scheme, "://127.0.0.1:", port(m, kPeer)));
    }
    const std::string client = absl::StrCat(scheme, "://127.0.0.1:", port(i, kClient));
    const std::string peer = absl::StrCat(scheme, "://127.0.0.1:", port(i, kPeer));
    const std::string token = absl::StrCat("sonde-test-", getpid(), "-", attempt());
    std::vector<std::string> argv = {
        kEtcdBinary,
        absl::StrCat("--name=m", i),
        absl::StrCat("--data-dir=", dir(), "/etcd-", token, "-m", i),
        "--listen-client-urls=" + client,
        "--advertise-client-urls=" + client,
        "--listen-peer-urls=" + peer,
        "--initial-advertise-peer-urls=" + peer,
        "--initial-cluster=" + absl::StrJoin(peers, ","),
        std::string("--initial-cluster-state=") + (again ? "existing" : "new"),
        "--initial-cluster-token=" + token,
        "--heartbeat-interval=50",
        "--election-timeout=500",
        "--logger=zap",
        "--log-level=warn",
        absl::StrCat("--listen-metrics-urls=http://127.0.0.1:", port(i, kMetrics))};
    if (!tls_.empty()) {
      for (const char* side : {"", "peer-"}) {
        argv.push_back(absl::StrCat("--", side, "cert-file=", tls_, "/server.pem"));
        argv.push_back(absl::StrCat("--", side, "key-file=", tls_, "/server.key"));
        argv.push_back(absl::StrCat("--", side, "trusted-ca-file=", tls_, "/ca.pem"));
        argv.push_back(absl::StrCat("--", side, "client-cert-auth"));
      }
    }
    return Run(i, std::move(argv));
  }

  std::string tls_;
};

}  // namespace sonde::testing

#endif  // SONDE_TESTS_TESTING_ETCD_CLUSTER_H_
