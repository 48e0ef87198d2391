// The collector survives kill -9 at any moment. A real sonde-collector
// process is killed with SIGKILL again and again, at random times, and
// restarted on the same port and data, while several training clients
// stream (three workers of one job, one of another). At the end every
// tensor of every step each client saved is stored exactly once, bit-exact,
// with the statistics of its values; rule verdicts did not fire twice.
//
// Fast by default (CI). Long runs:
//   bazel test //tests:crash_test --test_env=SONDE_CRASH_KILLS=400
//     --test_env=SONDE_CRASH_STEPS=1500 --test_timeout=7200 --test_output=streamed
//   (one command line)
// (add --test_env=SONDE_CRASH_QUIET_MS=10000 past a few thousand steps).
#include <fcntl.h>
#include <iostream>
#include <algorithm>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <memory>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "client/hook.h"
#include "client/query_client.h"
#include "stats/statistics.h"
#include "gtest/gtest.h"
#include "tests/testing/http_server.h"
#include "tests/testing/free_address.h"
#include "tests/testing/status_matchers.h"
#include "tests/testing/temp_dir.h"

namespace sonde {
namespace {

using ::sonde::testing::IsOk;
using ::sonde::testing::TempDir;
using ::sonde::testing::TestHttpServer;

int EnvInt(const char* name, int fallback) {
  const char* v = std::getenv(name);
  int out = 0;
  return v != nullptr && absl::SimpleAtoi(v, &out) && out > 0 ? out : fallback;
}

std::string CollectorBinary() {
  const char* srcdir = std::getenv("TEST_SRCDIR");
  const char* workspace = std::getenv("TEST_WORKSPACE");
  return absl::StrCat(srcdir ? srcdir : ".", "/", workspace ? workspace : "sonde",
                      "/server/sonde-collector");
}

// A sonde-collector child process on a fixed address and data directory.
class CollectorProcess {
 public:
  CollectorProcess(std::string address, std::string data_dir, std::string rules,
                   std::string log)
      : address_(std::move(address)),
        data_dir_(std::move(data_dir)),
        rules_(std::move(rules)),
        log_(std::move(log)) {}
  ~CollectorProcess() { Kill(); }

  // Starts it and waits until it prints its address (it is serving).
  bool Start() {
    for (int attempt = 0; attempt < 50; ++attempt) {
      if (StartOnce()) return true;
      absl::SleepFor(absl::Milliseconds(100));  // the port may still be held
    }
    return false;
  }

  void Kill() {
    if (pid_ <= 0) return;
    kill(pid_, SIGKILL);
    waitpid(pid_, nullptr, 0);
    pid_ = -1;
  }

  // SIGTERM: a clean shutdown. True if it exited with status 0.
  bool Terminate() {
    if (pid_ <= 0) return false;
    kill(pid_, SIGTERM);
    int status = 0;
    waitpid(pid_, &status, 0);
    pid_ = -1;
    return WIFEXITED(status) && WEXITSTATUS(status) == 0;
  }

 private:
  bool StartOnce() {
    int out[2];
    if (pipe(out) != 0) return false;
    const std::string binary = CollectorBinary();
    std::vector<std::string> args = {binary, "--listen=" + address_, "--data_dir=" + data_dir_,
                                     "--rules=" + rules_, "--step_wait=2s"};
    const pid_t pid = fork();
    if (pid == 0) {
      dup2(out[1], 1);
      const int err = open(log_.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
      if (err >= 0) dup2(err, 2);
      close(out[0]);
      std::vector<char*> argv;
      for (std::string& a : args) argv.push_back(a.data());
      argv.push_back(nullptr);
      execv(binary.c_str(), argv.data());
      _exit(127);
    }
    close(out[1]);
    // Its first line of stdout is the address, once it serves.
    std::string line;
    pollfd p{out[0], POLLIN, 0};
    const absl::Time deadline = absl::Now() + absl::Seconds(60);
    while (absl::Now() < deadline && line.find('\n') == std::string::npos) {
      if (poll(&p, 1, 100) <= 0) continue;
      char buf[256];
      const ssize_t n = read(out[0], buf, sizeof(buf));
      if (n <= 0) break;
      line.append(buf, static_cast<size_t>(n));
    }
    close(out[0]);
    if (line.rfind(address_, 0) != 0) {
      kill(pid, SIGKILL);
      waitpid(pid, nullptr, 0);
      return false;
    }
    pid_ = pid;
    return true;
  }

  const std::string address_;
  const std::string data_dir_;
  const std::string rules_;
  const std::string log_;
  pid_t pid_ = -1;
};

// The values of "w" for one job, worker and step: any two differ.
std::vector<float> Values(int job, int worker, int64_t step, size_t n) {
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) {
    v[i] = static_cast<float>(job * 1e6 + worker * 1e5 + step) + static_cast<float>(i) / 64.0f;
  }
  return v;
}

std::string AsBytes(const std::vector<float>& v) {
  return std::string(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(float));
}

struct Client {
  std::string job;
  int job_index = 0;
  int worker = 0;
  int world_size = 1;
  int64_t nan_at = -1;  // step whose "w" holds a NaN (the rule fires there)
  // Filled by the client thread.
  int64_t steps_saved = 0;
  bool stopped = false;
  absl::Status closed;
  Hook::Counters counters;
};

constexpr size_t kFloats = 4096;  // 16 KiB per "w"

void Train(Client* c, const std::string& address, int steps) {
  HookOptions o;
  o.collector = address;
  o.job = c->job;
  o.worker = c->worker;
  o.world_size = c->world_size;
  o.config.save_config = SaveConfig::Every(1);
  o.config.include_collections = {"weights", "losses"};
  o.max_chunk_bytes = 4096;  // several chunks per tensor: kills land mid-tensor
  o.max_queue_bytes = 256 << 10;  // small: the spill file is used across outages
  o.close_timeout = absl::Seconds(120);
  auto hook = Hook::Create(o);
  if (!hook.ok()) {
    c->closed = hook.status();
    return;
  }
  std::mt19937 rng(c->job_index * 100 + c->worker);
  for (int64_t step = 0; step < steps; ++step) {
    if ((*hook)->should_stop()) {
      c->stopped = true;
      break;
    }
    (*hook)->StartStep();
    std::vector<float> w = Values(c->job_index, c->worker, step, kFloats);
    if (step == c->nan_at) w[7] = std::numeric_limits<float>::quiet_NaN();
    (*hook)->SaveTensor("w", HostTensor(w.data(), {64, 64}), {"weights"}).IgnoreError();
    (*hook)->SaveScalar("loss", 1.0 / (1.0 + step), {"losses"}).IgnoreError();
    c->steps_saved = step + 1;
    absl::SleepFor(absl::Milliseconds(std::uniform_int_distribution<int>(2, 12)(rng)));
  }
  c->closed = (*hook)->Close();
  c->counters = (*hook)->counters();
}

TEST(CrashTest, EveryAcknowledgedStepSurvivesRepeatedKill9BitExactAndExactlyOnce) {
  const int min_kills = EnvInt("SONDE_CRASH_KILLS", 6);
  const int steps = EnvInt("SONDE_CRASH_STEPS", 120);
  // Every tenth collector life lasts this long. A restart replays the
  // job's stored steps to its rules (time grows with the steps stored), so
  // long runs need longer quiet lives for clients to get through.
  const int quiet_ms = EnvInt("SONDE_CRASH_QUIET_MS", 3000);
  TempDir dir;
  TestHttpServer webhook;
  const ::sonde::testing::ReservedLoopbackAddress reserved;
  const std::string& address = reserved.address();
  // ExplodingTensor fires (once) on job B's NaN, posting a webhook and
  // stopping its training.
  const std::string rules = absl::StrCat(
      "ExplodingTensor(actions=StopTraining|Webhook:", webhook.Url("/sonde"), ")");
  CollectorProcess collector(address, dir.Sub("db"), rules, dir.Sub("collector.log"));
  ASSERT_TRUE(collector.Start()) << "sonde-collector did not start; see " << dir.Sub("collector.log");

  std::vector<Client> clients(4);
  for (int w = 0; w < 3; ++w) {
    clients[w].job = "crash-a";
    clients[w].job_index = 1;
    clients[w].worker = w;
    clients[w].world_size = 3;
  }
  clients[3].job = "crash-b";
  clients[3].job_index = 2;
  clients[3].nan_at = steps / 2;

  std::atomic<int> running{static_cast<int>(clients.size())};
  std::vector<std::thread> threads;
  for (Client& c : clients) {
    threads.emplace_back([&c, &address, steps, &running] {
      Train(&c, address, steps);
      --running;
    });
  }
  // The killer: SIGKILL at random moments while clients stream (and at
  // least `min_kills` times), each followed by a restart. Every tenth
  // restart lives quiet_ms, so clients whose reconnect backoff has grown (up
  // to 5 s) get through even when kills come faster than a reconnect takes.
  std::mt19937 rng(12345);
  int kills = 0;
  while (running.load() > 0 || kills < min_kills) {
    const int uptime_ms =
        kills % 10 == 9 ? quiet_ms : std::uniform_int_distribution<int>(50, 500)(rng);
    absl::SleepFor(absl::Milliseconds(uptime_ms));
    collector.Kill();
    ++kills;
    ASSERT_TRUE(collector.Start()) << "restart " << kills << " failed";
  }
  for (std::thread& t : threads) t.join();
  std::cout << "kill -9 injected " << kills << " times while " << clients.size()
            << " clients streamed " << steps << " steps each\n";

  // Everything each client saved is stored exactly once and bit-exact.
  auto q = QueryClient::Connect(address);
  uint64_t resent = 0, reconnects = 0, spilled = 0;
  for (const Client& c : clients) {
    SCOPED_TRACE(absl::StrCat(c.job, " worker ", c.worker));
    EXPECT_THAT(c.closed, IsOk());
    EXPECT_EQ(c.counters.tensors_dropped, 0u);
    EXPECT_EQ(c.counters.memory_bytes, 0u);
    resent += c.counters.messages_resent;
    reconnects += c.counters.reconnects;
    spilled += c.counters.tensors_spilled;
    for (int64_t step = 0; step < c.steps_saved; ++step) {
      auto w = q->ReadTensor(c.job, "w", step, v1::MODE_UNSPECIFIED, c.worker);
      ASSERT_THAT(w, IsOk()) << "step " << step;
      std::vector<float> expected = Values(c.job_index, c.worker, step, kFloats);
      if (step == c.nan_at) expected[7] = std::numeric_limits<float>::quiet_NaN();
      const std::string bytes = AsBytes(expected);
      EXPECT_EQ(w->bytes, bytes) << "step " << step;
      auto stats = ComputeStatistics(bytes, v1::DTYPE_F32);
      ASSERT_THAT(stats, IsOk());
      // The client's statistics, checked against its values by the collector.
      EXPECT_EQ(w->header.statistics().source(), v1::Statistics::SOURCE_CHECKED);
      v1::Statistics stored = w->header.statistics();
      stored.clear_source();
      EXPECT_EQ(stored.SerializeAsString(), stats->SerializeAsString()) << "step " << step;
    }
  }
  for (const std::string job : {"crash-a", "crash-b"}) {
    auto listed = q->ListSteps(job);
    ASSERT_THAT(listed, IsOk());
    std::set<int64_t> seen;
    for (const v1::StepInfo& s : *listed) {
      EXPECT_TRUE(seen.insert(s.step()).second) << job << " step " << s.step() << " twice";
      for (const Client& c : clients) {
        if (c.job != job) continue;
        if (s.step() < c.steps_saved) {
          EXPECT_NE(std::find(s.workers().begin(), s.workers().end(), c.worker), s.workers().end())
              << job << " step " << s.step() << " lacks worker " << c.worker;
        }
      }
      // Each worker's copy of a step holds its two tensors, never more.
      EXPECT_EQ(s.tensor_count(), 2u * s.workers_size()) << job << " step " << s.step();
    }
    auto info = q->GetJob(job);
    ASSERT_THAT(info, IsOk());
    for (const v1::ModeSteps& m : info->modes()) {
      EXPECT_EQ(m.step_count(), static_cast<int64_t>(seen.size())) << job;
    }
    EXPECT_EQ(info->tensors_dropped(), 0u);
  }
  // Job B's NaN was judged once: the verdict is stored at that step and
  // training stopped; the webhook was not posted twice (at most once: a
  // kill between storing the verdict and posting loses the post).
  auto results = q->RuleResults("crash-b");
  ASSERT_THAT(results, IsOk());
  bool found = false;
  for (const v1::RuleResult& r : *results) {
    if (r.rule() != "ExplodingTensor") continue;
    found = true;
    EXPECT_EQ(r.status(), v1::RULE_STATUS_ISSUES_FOUND);
    EXPECT_EQ(r.step(), clients[3].nan_at);
  }
  EXPECT_TRUE(found);
  EXPECT_LE(webhook.requests().size(), 1u);
  std::cout << "messages resent " << resent << ", reconnects " << reconnects
            << ", tensors spilled " << spilled << ", webhook posts "
            << webhook.requests().size() << "\n";
  EXPECT_TRUE(collector.Terminate());
}

}  // namespace
}  // namespace sonde
