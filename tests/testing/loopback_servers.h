// N processes of one kind of server on 127.0.0.1 for tests (an etcd
// cluster, a NATS cluster), each with its own ports, data under `dir` and
// log file, which a test can kill -9 and start again. Start() picks fresh
// ports and waits until every server says it is healthy over plain HTTP;
// ports are picked by binding to port 0 and closing (these servers cannot
// share a port held open), so another process may take one meanwhile, and
// Start() then tries again with new ports.
#ifndef SONDE_TESTS_TESTING_LOOPBACK_SERVERS_H_
#define SONDE_TESTS_TESTING_LOOPBACK_SERVERS_H_

#include <sys/types.h>

#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "tests/testing/child_process.h"
#include "tests/testing/http_get.h"
#include "tests/testing/unused_port.h"
#include "tests/testing/wait.h"

namespace sonde::testing {

class LoopbackServers {
 public:
  virtual ~LoopbackServers() = default;

  // Starts every server and waits until each is healthy.
  absl::Status Start() {
    absl::Status last;
    for (attempt_ = 0; attempt_ < 3; ++attempt_) {
      last = StartOnce();
      if (last.ok()) return last;
      for (auto& p : processes_) p->Kill();
    }
    return last;
  }

  int size() const { return count_; }
  pid_t pid(int i) const { return processes_[i]->pid(); }
  // kill -9 of server i.
  void Kill(int i) { processes_[i]->Kill(); }
  // Starts server i again on its ports and data.
  absl::Status Restart(int i) {
    if (!Launch(i, /*again=*/true)) return absl::InternalError(absl::StrCat("cannot start ", what_));
    return WaitHealthy(i);
  }

 protected:
  // `ports`: how many ports each server listens on; `health_port` is the
  // one whose `health_path` answers over plain HTTP.
  LoopbackServers(std::string what, std::string dir, int count, int ports, int health_port,
                  std::string health_path)
      : what_(std::move(what)),
        dir_(std::move(dir)),
        count_(count),
        ports_per_server_(ports),
        health_port_(health_port),
        health_path_(std::move(health_path)) {}

  // Starts server i's process (again: on data it had before).
  virtual bool Launch(int i, bool again) = 0;
  // Whether the health endpoint's answer says the server serves.
  virtual bool Healthy(const HttpReply& reply) const { return reply.status == 200; }

  int port(int i, int k) const { return ports_[i * ports_per_server_ + k]; }
  int attempt() const { return attempt_; }
  const std::string& dir() const { return dir_; }
  std::string LogPath(int i) const { return absl::StrCat(dir_, "/", what_, "-", i, ".log"); }
  bool Run(int i, std::vector<std::string> argv) {
    return processes_[i]->Start(std::move(argv), LogPath(i));
  }

 private:
  absl::Status StartOnce() {
    ports_.clear();
    processes_.clear();
    for (int i = 0; i < count_ * ports_per_server_; ++i) ports_.push_back(UnusedLoopbackPort());
    for (int i = 0; i < count_; ++i) processes_.push_back(std::make_unique<ChildProcess>());
    for (int i = 0; i < count_; ++i) {
      if (!Launch(i, /*again=*/false)) {
        return absl::InternalError(absl::StrCat("cannot start ", what_));
      }
    }
    for (int i = 0; i < count_; ++i) {
      absl::Status s = WaitHealthy(i);
      if (!s.ok()) return s;
    }
    return absl::OkStatus();
  }

  absl::Status WaitHealthy(int i) {
    const std::string address = absl::StrCat("127.0.0.1:", port(i, health_port_));
    std::string last = "no answer";
    const bool up = WaitUntil(
        [&] {
          if (!processes_[i]->Running()) return true;
          const HttpReply reply = HttpGetWithin(address, health_path_, 1);
          last = reply.raw.empty() ? "no answer" : reply.body;
          return Healthy(reply);
        },
        absl::Seconds(30));
    if (!processes_[i]->Running()) {
      return absl::UnavailableError(
          absl::StrCat(what_, " ", i, " exited; see ", LogPath(i)));
    }
    if (!up) return absl::DeadlineExceededError(absl::StrCat(what_, " ", i, ": ", last));
    return absl::OkStatus();
  }

  const std::string what_;
  const std::string dir_;
  const int count_;
  const int ports_per_server_;
  const int health_port_;
  const std::string health_path_;
  int attempt_ = 0;
  std::vector<int> ports_;
  std::vector<std::unique_ptr<ChildProcess>> processes_;
};

}  // namespace sonde::testing

#endif  // SONDE_TESTS_TESTING_LOOPBACK_SERVERS_H_
