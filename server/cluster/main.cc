// sonde-cluster: one process of a Sonde cluster (docs/cluster.md).
//
//   sonde-cluster --role=node --name=node-1 --etcd=HOST:PORT,... --nats=nats://HOST:PORT,...
//                 --listen=HOST:PORT --data_dir=DIR
//       a collector node: owns partitions, applies them to its RocksDB,
//       runs the rules, and serves the Query API for its jobs on --listen.
//   sonde-cluster --role=gateway --name=gw-1 --nats=nats://HOST:PORT,... --listen=HOST:PORT
//       a gateway: serves the Collector stream the hook speaks on --listen.
//
// Prints the address it listens on as the first line of stdout; SIGTERM or
// SIGINT stops it cleanly.
#include <algorithm>
#include <atomic>
#include <csignal>
#include <fstream>
#include <sstream>
#include <iostream>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_split.h"
#include "common/http/http_server.h"
#include "common/metrics/metrics.h"
#include "glog/logging.h"
#include "grpcpp/grpcpp.h"
#include "rules/rule_config.h"
#include "server/cluster/etcd.h"
#include "server/cluster/gateway.h"
#include "server/cluster/node.h"
#include "server/cluster/partition_log.h"
#include "server/cluster/query_front.h"
#include "server/auth.h"
#include "server/collector.h"
#include "server/smtp_flags.h"
#include "server/security.h"

ABSL_FLAG(std::string, role, "", "node or gateway");
ABSL_FLAG(std::string, name, "", "this process's name, unique in the cluster ([A-Za-z0-9_-]+)");
ABSL_FLAG(std::string, listen, "127.0.0.1:0",
          "host:port to serve on (node: Query; gateway: Collector); port 0 picks one");
ABSL_FLAG(std::string, advertise, "",
          "node: the host:port other processes reach its Query service at (e.g. the pod's "
          "DNS name); empty: the address it listens on");
ABSL_FLAG(std::vector<std::string>, etcd, {},
          "etcd members, host:port,...: required for nodes; a gateway given them also serves "
          "the Query API, routing each job's calls to the node that owns it");
ABSL_FLAG(std::string, node_tls_ca, "",
          "gateway: PEM CA of the nodes' TLS certificates, for the Query hop to them; empty: "
          "plaintext");
ABSL_FLAG(std::vector<std::string>, nats, {}, "NATS servers, nats://host:port,...");
ABSL_FLAG(std::string, cluster, "default",
          "the cluster's name ([a-z0-9-]+): its etcd prefix is /sonde/<cluster>, its "
          "JetStream streams SONDE_<CLUSTER>_P<p>, so clusters can share etcd and NATS");
ABSL_FLAG(int, partitions, 16,
          "log partitions, the same for every process; may grow (jobs keep theirs, "
          "recorded in etcd), never shrink");
ABSL_FLAG(int, replicas, 3, "copies of each log partition (JetStream replicas)");
ABSL_FLAG(std::string, data_dir, "sonde-data", "the node's RocksDB directory");
ABSL_FLAG(std::string, metrics_listen, "",
          "HTTP endpoint for operators, e.g. 0.0.0.0:9464 (/metrics and /healthz; a node "
          "also /readyz); empty: none");
ABSL_FLAG(int, standbys, 1,
          "nodes that apply each partition beside its owner, ready to take it over "
          "without a replay (each costs the owner's CPU and disk again)");
ABSL_FLAG(std::string, rules, "ExplodingTensor(actions=StopTraining);LossNotDecreasing",
          "rules run for every job, as sonde-collector --rules");
ABSL_FLAG(std::string, rules_config, "",
          "JSON file of rules run for every job (replaces --rules when given)");
ABSL_FLAG(absl::Duration, lease, absl::Seconds(5),
          "how long a node's partitions outlive it when it stops answering etcd");
ABSL_FLAG(absl::Duration, max_connection_age, absl::Minutes(30),
          "gateway: close each client connection after this long (the hook reconnects and "
          "resends what was not acknowledged), so an L4 balancer spreads clients over "
          "gateways added later; 0: never");
ABSL_FLAG(std::string, etcd_tls_ca, "", "PEM CA of the etcd members' certificates: etcd over TLS");
ABSL_FLAG(std::string, etcd_tls_cert, "", "PEM client certificate for etcd (--client-cert-auth)");
ABSL_FLAG(std::string, etcd_tls_key, "", "PEM key of --etcd_tls_cert");
ABSL_FLAG(std::string, nats_tls_ca, "", "PEM CA of the NATS servers' certificates: NATS over TLS");
ABSL_FLAG(std::string, nats_tls_cert, "", "PEM client certificate for NATS (tls { verify: true })");
ABSL_FLAG(std::string, nats_tls_key, "", "PEM key of --nats_tls_cert");
ABSL_FLAG(std::string, tls_cert, "", "PEM certificate chain: serve gRPC over TLS");
ABSL_FLAG(std::string, tls_key, "", "PEM private key of --tls_cert");
ABSL_FLAG(std::string, tls_client_ca, "", "PEM CA: clients must present a certificate it signed");
ABSL_FLAG(std::string, auth_tokens, "",
          "JSON file of bearer tokens and their rights, as sonde-collector --auth_tokens");
ABSL_FLAG(bool, allow_insecure, false,
          "allow plaintext without --auth_tokens on an address that is not loopback");
ABSL_FLAG(absl::Duration, step_wait, absl::Seconds(60),
          "how long a step waits for its other workers before the rules see it");

namespace {

using sonde::cluster::ClusterNode;
using sonde::cluster::Etcd;
using sonde::cluster::Gateway;
using sonde::cluster::PartitionLog;

Etcd::Options EtcdOptions() {
  Etcd::Options o;
  o.endpoints = absl::GetFlag(FLAGS_etcd);
  o.tls_ca_file = absl::GetFlag(FLAGS_etcd_tls_ca);
  o.tls_cert_file = absl::GetFlag(FLAGS_etcd_tls_cert);
  o.tls_key_file = absl::GetFlag(FLAGS_etcd_tls_key);
  return o;
}

sonde::server::ServerSecurityOptions Security() {
  sonde::server::ServerSecurityOptions s;
  s.tls_cert_file = absl::GetFlag(FLAGS_tls_cert);
  s.tls_key_file = absl::GetFlag(FLAGS_tls_key);
  s.tls_client_ca_file = absl::GetFlag(FLAGS_tls_client_ca);
  s.auth_tokens_file = absl::GetFlag(FLAGS_auth_tokens);
  s.allow_insecure = absl::GetFlag(FLAGS_allow_insecure);
  return s;
}

sigset_t BlockStopSignals() {
  sigset_t stop;
  sigemptyset(&stop);
  sigaddset(&stop, SIGTERM);
  sigaddset(&stop, SIGINT);
  pthread_sigmask(SIG_BLOCK, &stop, nullptr);
  return stop;
}

absl::StatusOr<std::unique_ptr<PartitionLog>> OpenLog() {
  PartitionLog::Options o;
  o.servers = absl::GetFlag(FLAGS_nats);
  o.partitions = absl::GetFlag(FLAGS_partitions);
  o.replicas = absl::GetFlag(FLAGS_replicas);
  o.name = "SONDE_";
  for (char c : absl::GetFlag(FLAGS_cluster)) o.name += c == '-' ? '_' : absl::ascii_toupper(c);
  o.tls_ca_file = absl::GetFlag(FLAGS_nats_tls_ca);
  o.tls_cert_file = absl::GetFlag(FLAGS_nats_tls_cert);
  o.tls_key_file = absl::GetFlag(FLAGS_nats_tls_key);
  // JetStream elects its meta leader after the servers start: retry a while.
  absl::StatusOr<std::unique_ptr<PartitionLog>> log;
  const absl::Time deadline = absl::Now() + absl::Seconds(60);
  while (true) {
    log = PartitionLog::Open(o);
    if (log.ok() || absl::IsInvalidArgument(log.status()) || absl::Now() > deadline) return log;
    LOG(WARNING) << "the log is not ready yet: " << log.status();
    absl::SleepFor(absl::Milliseconds(500));
  }
}

int RunNode(const sigset_t& stop) {
  absl::StatusOr<std::vector<sonde::v1::RuleSpec>> rules = sonde::rules::LoadDefaultRules(
      absl::GetFlag(FLAGS_rules), absl::GetFlag(FLAGS_rules_config));
  if (!rules.ok()) {
    std::cerr << "sonde-cluster: bad rules: " << rules.status() << std::endl;
    return 2;
  }
  sonde::server::CollectorOptions co;
  absl::StatusOr<sonde::server::SmtpOptions> smtp = sonde::server::SmtpOptionsFromCommandLine();
  if (!smtp.ok()) {
    std::cerr << "sonde-cluster: " << smtp.status().message() << "\n";
    return 2;
  }
  co.notifications.smtp = *std::move(smtp);

  co.listen = absl::GetFlag(FLAGS_listen);
  co.data_dir = absl::GetFlag(FLAGS_data_dir);
  co.default_rules = *rules;
  co.step_wait = absl::GetFlag(FLAGS_step_wait);
  co.serve_ingest = false;
  co.metrics_listen = absl::GetFlag(FLAGS_metrics_listen);
  co.security = Security();
  // Another client may take a worker over as soon as its owner's stream
  // has ended: a node replaying the log must decide as the first one did,
  // and a lease measured on its own clock would not (docs/cluster.md).
  co.worker_lease = absl::ZeroDuration();
  co.limits.max_chunk_bytes = 256 << 10;  // a chunk and its message fit a log entry
  auto collector = sonde::server::Collector::Start(co);
  if (!collector.ok()) {
    std::cerr << "sonde-cluster: " << collector.status() << std::endl;
    return 1;
  }
  auto etcd = Etcd::Connect(EtcdOptions());
  auto log = OpenLog();
  if (!etcd.ok() || !log.ok()) {
    std::cerr << "sonde-cluster: " << (etcd.ok() ? log.status() : etcd.status()) << std::endl;
    return 1;
  }
  ClusterNode::Options no;
  no.membership.prefix = "/sonde/" + absl::GetFlag(FLAGS_cluster);
  no.membership.node = absl::GetFlag(FLAGS_name);
  no.membership.address = absl::GetFlag(FLAGS_advertise).empty()
                              ? (*collector)->address()
                              : absl::GetFlag(FLAGS_advertise);
  no.membership.lease_ttl = absl::GetFlag(FLAGS_lease);
  no.limits = co.limits;
  no.standbys = absl::GetFlag(FLAGS_standbys);
  // A node whose lease is gone stops, to be restarted by its supervisor
  // with a new one (its partitions have moved meanwhile).
  static std::atomic<bool> lost{false};
  no.membership.on_lost = [](const absl::Status& why) {
    LOG(ERROR) << "the node lost its etcd lease; stopping: " << why;
    lost = true;
    kill(getpid(), SIGTERM);
  };
  absl::StatusOr<std::unique_ptr<ClusterNode>> node;
  const absl::Time deadline = absl::Now() + absl::Seconds(60);
  while (true) {  // a restarted node's old lease may hold its name a moment
    node = ClusterNode::Start(etcd->get(), log->get(), (*collector)->registry(),
                              (*collector)->store(), no);
    if (node.ok() || !absl::IsAlreadyExists(node.status()) || absl::Now() > deadline) break;
    absl::SleepFor(absl::Milliseconds(500));
  }
  if (!node.ok()) {
    std::cerr << "sonde-cluster: " << node.status() << std::endl;
    return 1;
  }
  std::cout << (*collector)->address() << std::endl;
  int sig = 0;
  sigwait(&stop, &sig);
  LOG(INFO) << "signal " << sig << ": leaving the cluster";
  node->reset();
  (*collector)->Shutdown();
  return lost ? 1 : 0;
}

int RunGateway(const sigset_t& stop) {
  const std::string listen = absl::GetFlag(FLAGS_listen);
  const sonde::server::ServerSecurityOptions security = Security();
  absl::Status secure = sonde::server::CheckServerSecurity(listen, security);
  auto credentials = sonde::server::MakeServerCredentials(security);
  std::unique_ptr<sonde::server::TokenTable> tokens;
  if (secure.ok() && credentials.ok() && security.auth()) {
    auto loaded = sonde::server::TokenTable::FromFile(security.auth_tokens_file);
    if (loaded.ok()) {
      tokens = std::move(*loaded);
    } else {
      secure = loaded.status();
    }
  }
  if (!secure.ok() || !credentials.ok()) {
    std::cerr << "sonde-cluster: " << (secure.ok() ? credentials.status() : secure) << std::endl;
    return 2;
  }
  auto log = OpenLog();
  if (!log.ok()) {
    std::cerr << "sonde-cluster: " << log.status() << std::endl;
    return 1;
  }
  std::unique_ptr<Etcd> etcd;
  if (!absl::GetFlag(FLAGS_etcd).empty()) {
    auto connected = Etcd::Connect(EtcdOptions());
    if (!connected.ok()) {
      std::cerr << "sonde-cluster: " << connected.status() << std::endl;
      return 1;
    }
    etcd = std::move(*connected);
  }
  Gateway::Options go;
  go.name = absl::GetFlag(FLAGS_name);
  go.tokens = tokens.get();
  go.etcd = etcd.get();
  go.prefix = "/sonde/" + absl::GetFlag(FLAGS_cluster);
  auto gateway = Gateway::Create(log->get(), go);
  if (!gateway.ok()) {
    std::cerr << "sonde-cluster: " << gateway.status() << std::endl;
    return 1;
  }
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort(listen, *credentials, &port);
  builder.SetMaxReceiveMessageSize(static_cast<int>((*log)->options().max_entry_bytes));
  const absl::Duration age = absl::GetFlag(FLAGS_max_connection_age);
  if (age > absl::ZeroDuration()) {
    builder.AddChannelArgument(GRPC_ARG_MAX_CONNECTION_AGE_MS,
                               static_cast<int>(absl::ToInt64Milliseconds(age)));
    builder.AddChannelArgument(GRPC_ARG_MAX_CONNECTION_AGE_GRACE_MS, 10000);
  }
  builder.RegisterService(gateway->get());
  std::unique_ptr<sonde::cluster::QueryFront> front;
  if (etcd != nullptr) {
    sonde::cluster::QueryFront::Options fo;
    fo.prefix = "/sonde/" + absl::GetFlag(FLAGS_cluster);
    fo.partitions = absl::GetFlag(FLAGS_partitions);
    fo.gateway = gateway->get();  // EnableRules, PostRuleResult go through the log
    fo.tokens = tokens.get();
    if (!absl::GetFlag(FLAGS_node_tls_ca).empty()) {
      std::ifstream ca(absl::GetFlag(FLAGS_node_tls_ca));
      std::stringstream pem;
      pem << ca.rdbuf();
      if (!ca) {
        std::cerr << "sonde-cluster: cannot read --node_tls_ca" << std::endl;
        return 2;
      }
      grpc::SslCredentialsOptions ssl;
      ssl.pem_root_certs = pem.str();
      fo.node_credentials = grpc::SslCredentials(ssl);
    }
    front = std::make_unique<sonde::cluster::QueryFront>(etcd.get(), std::move(fo));
    builder.RegisterService(front.get());
  }
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (server == nullptr || port == 0) {
    std::cerr << "sonde-cluster: cannot listen on '" << listen << "'" << std::endl;
    return 1;
  }
  // For operators: the gateway's metrics (sonde_gateway_*, and the gRPC
  // and process ones every Sonde process has), and liveness.
  std::unique_ptr<sonde::http::HttpServer> operator_http;
  if (!absl::GetFlag(FLAGS_metrics_listen).empty()) {
    sonde::http::HttpServerOptions ho;
    ho.listen = absl::GetFlag(FLAGS_metrics_listen);
    std::map<std::string, sonde::http::HttpRoute> routes;
    routes["/metrics"].handler = [](const sonde::http::HttpRequest&) {
      sonde::http::HttpResponse r;
      const sonde::metrics::Registry* registries[] = {&sonde::metrics::Registry::Default()};
      r.body = sonde::metrics::RenderText(registries);
      r.content_type = sonde::metrics::kTextContentType;
      return r;
    };
    routes["/healthz"].handler = [](const sonde::http::HttpRequest&) {
      sonde::http::HttpResponse r;
      r.body = "ok\n";
      return r;
    };
    auto started = sonde::http::HttpServer::Start(ho, std::move(routes));
    if (!started.ok()) {
      std::cerr << "sonde-cluster: --metrics_listen: " << started.status() << std::endl;
      return 1;
    }
    operator_http = std::move(*started);
    LOG(INFO) << "gateway metrics on http://" << operator_http->address() << "/metrics";
  }
  std::cout << listen.substr(0, listen.rfind(':')) << ":" << port << std::endl;
  int sig = 0;
  sigwait(&stop, &sig);
  LOG(INFO) << "signal " << sig << ": stopping the gateway";
  server->Shutdown(absl::ToChronoTime(absl::Now() + absl::Seconds(5)));
  server->Wait();
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage("one process of a Sonde cluster: --role=node or --role=gateway");
  absl::ParseCommandLine(argc, argv);
  FLAGS_logtostderr = true;
  google::InitGoogleLogging(argv[0]);
  const sigset_t stop = BlockStopSignals();
  const std::string role = absl::GetFlag(FLAGS_role);
  if (absl::GetFlag(FLAGS_name).empty() || absl::GetFlag(FLAGS_nats).empty()) {
    std::cerr << "sonde-cluster: --name and --nats are required" << std::endl;
    return 2;
  }
  const std::string cluster = absl::GetFlag(FLAGS_cluster);
  if (cluster.empty() || !std::all_of(cluster.begin(), cluster.end(), [](char c) {
        return absl::ascii_islower(c) || absl::ascii_isdigit(c) || c == '-';
      })) {
    std::cerr << "sonde-cluster: --cluster must be lower-case letters, digits and '-', not '"
              << cluster << "'" << std::endl;
    return 2;
  }
  if (absl::GetFlag(FLAGS_standbys) < 0) {
    std::cerr << "sonde-cluster: --standbys must be 0 or more" << std::endl;
    return 2;
  }
  if (role == "node") {
    if (absl::GetFlag(FLAGS_etcd).empty()) {
      std::cerr << "sonde-cluster: a node needs --etcd" << std::endl;
      return 2;
    }
    return RunNode(stop);
  }
  if (role == "gateway") return RunGateway(stop);
  std::cerr << "sonde-cluster: --role must be node or gateway, not '" << role << "'" << std::endl;
  return 2;
}
