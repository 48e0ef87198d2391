// sonde-collector: receives tensors from training clients, stores them in
// RocksDB, runs rules, and answers queries. Prints the address it listens
// on as the first line of stdout.
#include <csignal>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/flags/usage_config.h"
#include "absl/strings/match.h"
#include "glog/logging.h"
#include "rules/rule_config.h"
#include "server/collector.h"
#include "server/smtp_flags.h"
#include "server/tensorboard/summary.h"

ABSL_FLAG(std::string, listen, "127.0.0.1:7070",
          "host:port to listen on; port 0 picks a free port. Use 0.0.0.0:PORT to accept "
          "clients from other hosts.");
ABSL_FLAG(std::string, metrics_listen, "",
          "host:port of the HTTP endpoint for operators (/metrics in Prometheus format, "
          "/healthz, /readyz, job reports on /reports and /report?job=NAME), e.g. "
          "127.0.0.1:9464; port 0 picks a free port. Empty: off");
ABSL_FLAG(std::string, metrics_reports, "auto",
          "serve job reports on --metrics_listen: auto (yes, unless --metrics_listen is not "
          "loopback and either gRPC uses TLS, since the endpoint is plain HTTP and bearer "
          "tokens would cross in clear, or no --auth_tokens are set and --allow_insecure is "
          "not), on, off");
ABSL_FLAG(absl::Duration, report_timeout, absl::Seconds(60),
          "how long a report asked over HTTP may wait for and take to render before the "
          "client gets 503");
ABSL_FLAG(std::string, data_dir, "sonde-data", "directory of the RocksDB database");
ABSL_FLAG(std::string, rules, "ExplodingTensor(actions=StopTraining);LossNotDecreasing",
          "rules run for every job: 'Type(key=value,...);...'; keys 'name' and 'actions' "
          "(e.g. actions=StopTraining) are special. Empty: none");
ABSL_FLAG(std::string, rules_config, "",
          "JSON file of rules run for every job (replaces --rules when given)");
ABSL_FLAG(std::vector<std::string>, rule_plugins, {},
          "comma-separated shared libraries of rule types (see rules/plugin_api.h)");
ABSL_FLAG(bool, sync_writes, false,
          "fsync the write-ahead log on every commit (survives power loss, slower)");
ABSL_FLAG(uint64_t, max_chunk_bytes, 4 << 20, "largest chunk payload a client may send");
ABSL_FLAG(uint64_t, max_tensor_bytes, uint64_t{1} << 30, "largest tensor a client may send");
ABSL_FLAG(uint64_t, max_step_bytes, uint64_t{2} << 30,
          "largest total of tensor values one worker may send for one step");
ABSL_FLAG(uint32_t, max_tensors_per_step, 100000,
          "most tensors one worker may send for one step");
ABSL_FLAG(uint64_t, max_open_step_bytes, uint64_t{1} << 30,
          "bytes of open (received, not yet committed) steps all streams together may hold in "
          "memory; past it a stream is ended with RESOURCE_EXHAUSTED and its client resends "
          "later; 0: no limit");
ABSL_FLAG(absl::Duration, step_wait, absl::Seconds(60),
          "how long a step waits for every worker before rules judge it with what arrived");
ABSL_FLAG(absl::Duration, worker_end_timeout, absl::ZeroDuration(),
          "end a job that has had no worker connected for this long although some of its "
          "world_size workers never sent their job end (crashed); 0: wait for them forever");
ABSL_FLAG(absl::Duration, worker_lease, absl::Seconds(60),
          "how long a worker stays its last client's after that client's stream went: "
          "another client for it is refused (ALREADY_EXISTS) meanwhile, unless the owner "
          "ended");
ABSL_FLAG(int, storage_threads, 2, "threads committing to RocksDB");
ABSL_FLAG(int, rule_threads, 2, "threads evaluating rules");
ABSL_FLAG(absl::Duration, retention_max_age, absl::ZeroDuration(),
          "delete jobs that ended (finished or stopped) longer ago than this, e.g. 720h; "
          "0: keep them whatever their age");
ABSL_FLAG(uint64_t, retention_max_bytes, 0,
          "delete the jobs that ended first while the database is larger than this many "
          "bytes (RocksDB's estimate); 0: no size limit");
ABSL_FLAG(std::string, tls_cert, "",
          "PEM file of the server's certificate chain; with --tls_key the collector serves "
          "TLS only");
ABSL_FLAG(std::string, tls_key, "", "PEM file of the server's private key (with --tls_cert)");
ABSL_FLAG(std::string, tls_client_ca, "",
          "PEM file of the CA(s) that sign client certificates: every client must present "
          "one that verifies (mutual TLS). Needs --tls_cert");
ABSL_FLAG(std::string, auth_tokens, "",
          "JSON file of bearer tokens (SHA-256 hashes), each with rights (read, write, admin) "
          "on a project (job-name prefix) or a list of jobs; see docs/reliability.md. Empty: "
          "no authentication");
ABSL_FLAG(bool, allow_insecure, false,
          "allow plaintext without --auth_tokens on an address that is not loopback");
ABSL_FLAG(absl::Duration, retention_interval, absl::Minutes(10),
          "how often retention runs (it also runs at start) when a retention limit is set");
ABSL_FLAG(std::string, tensorboard_dir, "",
          "write TensorBoard event files of every job under this directory "
          "(<dir>/<job>/<mode>/); a job's hello metadata sonde.tensorboard=off opts out. "
          "Empty: only jobs whose metadata says sonde.tensorboard=on or per_worker, under "
          "<data_dir>/tensorboard");
ABSL_FLAG(bool, tensorboard_per_worker, false,
          "also write one TensorBoard run per worker (<dir>/<job>/worker_<n>/<mode>/)");
ABSL_FLAG(std::vector<std::string>, tensorboard_statistics,
          std::vector<std::string>({"mean", "std", "l2"}),
          "statistics written as '<tensor>/<statistic>' scalars for tensors of more than one "
          "element: min, max, mean, std, variance, sum, l1, l2, abs_ forms, count, "
          "finite_count, nan_count, pos_inf_count, neg_inf_count, zero_count, sum_squares");

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage("Sonde's collector. Example: sonde-collector --listen=127.0.0.1:0 --data_dir=/tmp/sonde");
  // --help lists the collector's flags (by default Abseil lists only those
  // of a file named after the program, "sonde-collector.cc", which does not
  // exist: "No flags matched").
  absl::FlagsUsageConfig usage_config;
  usage_config.contains_help_flags = [](absl::string_view file) {
    return absl::EndsWith(file, "server/main.cc");
  };
  absl::SetFlagsUsageConfig(usage_config);
  absl::ParseCommandLine(argc, argv);
  FLAGS_logtostderr = true;
  google::InitGoogleLogging(argv[0]);

  // Block the stop signals in every thread; one thread waits for them.
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGTERM);
  sigaddset(&stop_signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);

  sonde::server::CollectorOptions options;
  options.listen = absl::GetFlag(FLAGS_listen);
  options.data_dir = absl::GetFlag(FLAGS_data_dir);
  options.metrics_listen = absl::GetFlag(FLAGS_metrics_listen);
  if (auto serve = sonde::server::ParseReportServe(absl::GetFlag(FLAGS_metrics_reports));
      serve.ok()) {
    options.reports.serve = *serve;
  } else {
    std::cerr << "sonde-collector: --metrics_reports: " << serve.status().message() << "\n";
    return 2;
  }
  options.reports.timeout = absl::GetFlag(FLAGS_report_timeout);
  if (options.reports.timeout <= absl::ZeroDuration()) {
    std::cerr << "sonde-collector: --report_timeout must be positive\n";
    return 2;
  }
  options.sync_writes = absl::GetFlag(FLAGS_sync_writes);
  options.limits.max_chunk_bytes = absl::GetFlag(FLAGS_max_chunk_bytes);
  options.limits.max_tensor_bytes = absl::GetFlag(FLAGS_max_tensor_bytes);
  options.limits.max_step_bytes = absl::GetFlag(FLAGS_max_step_bytes);
  options.limits.max_tensors_per_step = absl::GetFlag(FLAGS_max_tensors_per_step);
  if (options.limits.max_tensors_per_step == 0) {
    std::cerr << "sonde-collector: --max_tensors_per_step must be at least 1\n";
    return 2;
  }
  options.max_open_step_bytes = absl::GetFlag(FLAGS_max_open_step_bytes);
  options.storage_threads = absl::GetFlag(FLAGS_storage_threads);
  options.step_wait = absl::GetFlag(FLAGS_step_wait);
  options.worker_end_timeout = absl::GetFlag(FLAGS_worker_end_timeout);
  options.worker_lease = absl::GetFlag(FLAGS_worker_lease);
  options.rule_plugins = absl::GetFlag(FLAGS_rule_plugins);
  options.rule_threads = absl::GetFlag(FLAGS_rule_threads);
  if (absl::GetFlag(FLAGS_retention_max_age) != absl::ZeroDuration()) {
    options.retention.max_age = absl::GetFlag(FLAGS_retention_max_age);
  }
  if (absl::GetFlag(FLAGS_retention_max_bytes) != 0) {
    options.retention.max_bytes = absl::GetFlag(FLAGS_retention_max_bytes);
  }
  options.retention.interval = absl::GetFlag(FLAGS_retention_interval);
  options.security.tls_cert_file = absl::GetFlag(FLAGS_tls_cert);
  options.security.tls_key_file = absl::GetFlag(FLAGS_tls_key);
  options.security.tls_client_ca_file = absl::GetFlag(FLAGS_tls_client_ca);
  options.security.auth_tokens_file = absl::GetFlag(FLAGS_auth_tokens);
  options.security.allow_insecure = absl::GetFlag(FLAGS_allow_insecure);
  options.tensorboard.dir = absl::GetFlag(FLAGS_tensorboard_dir);
  options.tensorboard.export_all = !options.tensorboard.dir.empty();
  options.tensorboard.per_worker = absl::GetFlag(FLAGS_tensorboard_per_worker);
  options.tensorboard.statistics = absl::GetFlag(FLAGS_tensorboard_statistics);
  if (absl::Status s = sonde::server::tensorboard::ValidateStatisticNames(
          options.tensorboard.statistics);
      !s.ok()) {
    std::cerr << "sonde-collector: --tensorboard_statistics: " << s.message() << "\n";
    return 2;
  }
  if (absl::Status s = sonde::server::CheckServerSecurity(options.listen, options.security);
      !s.ok()) {
    std::cerr << "sonde-collector: " << s.message() << "\n";
    return 2;
  }

  absl::StatusOr<sonde::server::SmtpOptions> smtp = sonde::server::SmtpOptionsFromCommandLine();
  if (!smtp.ok()) {
    std::cerr << "sonde-collector: " << smtp.status().message() << "\n";
    return 2;
  }
  options.notifications.smtp = *std::move(smtp);
  absl::StatusOr<std::vector<sonde::v1::RuleSpec>> rules = sonde::rules::LoadDefaultRules(
      absl::GetFlag(FLAGS_rules), absl::GetFlag(FLAGS_rules_config));
  if (!rules.ok()) {
    std::cerr << "sonde-collector: bad rules: " << rules.status() << "\n";
    return 2;
  }
  options.default_rules = *rules;

  auto collector = sonde::server::Collector::Start(options);
  if (!collector.ok()) {
    std::cerr << "sonde-collector: " << collector.status() << "\n";
    return 1;
  }
  std::cout << (*collector)->address() << std::endl;

  int sig = 0;
  sigwait(&stop_signals, &sig);
  LOG(INFO) << "signal " << sig << ": shutting down";
  (*collector)->Shutdown();
  return 0;
}
