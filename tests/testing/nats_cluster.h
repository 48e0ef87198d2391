// A real NATS JetStream cluster on 127.0.0.1 for tests: N nats-server
// processes (Debian's nats-server) routed to each other, each with its own
// store directory under `dir`, which a test can kill -9 and restart
// (LoopbackServers). A server is up once its /healthz answers 200 (its
// JetStream is current).
#ifndef SONDE_TESTS_TESTING_NATS_CLUSTER_H_
#define SONDE_TESTS_TESTING_NATS_CLUSTER_H_

#include <unistd.h>

#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "tests/testing/loopback_servers.h"

namespace sonde::testing {

inline constexpr char kNatsBinary[] = "/usr/sbin/nats-server";

inline bool HaveNats() { return access(kNatsBinary, X_OK) == 0; }

class NatsCluster : public LoopbackServers {
 public:
  NatsCluster(std::string dir, int servers)
      : LoopbackServers("nats", std::move(dir), servers, /*ports=*/3, kMonitor, "/healthz") {}

  // Before Start: clients and routes over TLS, client certificates
  // verified, with `certs_dir`'s ca.pem, server.pem and server.key
  // (tests/testing/test_certificates.h). Monitoring stays plaintext.
  void set_tls(std::string certs_dir) { tls_ = std::move(certs_dir); }

  // nats://127.0.0.1:port of each server.
  std::vector<std::string> urls() const {
    std::vector<std::string> out;
    for (int i = 0; i < size(); ++i) out.push_back(absl::StrCat("nats://127.0.0.1:", port(i, kClient)));
    return out;
  }

 private:
  static constexpr int kClient = 0, kRoute = 1, kMonitor = 2;

  // Writes server i's configuration (the same again on a restart) and
  // starts it.
  bool Launch(int i, bool) override {
    const std::string config = absl::StrCat(dir(), "/nats-", attempt(), "-n", i, ".conf");
    std::vector<std::string> routes;
    for (int s = 0; s < size(); ++s) {
      routes.push_back(absl::StrCat("nats-route://127.0.0.1:", port(s, kRoute)));
    }
    const std::string tls =
        tls_.empty() ? ""
                     : absl::StrCat("tls { cert_file: \"", tls_, "/server.pem\", key_file: \"",
                                    tls_, "/server.key\", ca_file: \"", tls_,
                                    "/ca.pem\", verify: true }\n");
    std::ofstream conf(config);
    conf << "server_name: n" << i << "\n"
         << "listen: 127.0.0.1:" << port(i, kClient) << "\n"
         << "http: 127.0.0.1:" << port(i, kMonitor) << "\n"
         << "jetstream { store_dir: \"" << dir() << "/nats-" << attempt() << "-n" << i
         << "\" }\n"
         << tls;
    if (size() > 1) {  // one server alone runs JetStream unclustered
      conf << "cluster {\n  name: sonde-test\n  listen: 127.0.0.1:" << port(i, kRoute)
           << "\n  routes: [" << absl::StrJoin(routes, ", ") << "]\n"
           << tls << "}\n";
    }
    conf.close();
    if (!conf) return false;
    return Run(i, {kNatsBinary, "-c", config});
  }

  std::string tls_;
};

}  // namespace sonde::testing

#endif  // SONDE_TESTS_TESTING_NATS_CLUSTER_H_
