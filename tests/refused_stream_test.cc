// What a hook does when a collector refuses what it sent (a permanent gRPC
// error after the hello was taken): an older collector that does not tell
// its limits, or a bug. The steps it refused are dropped and counted, and
// the job still ends at the collector. The peer is a real gRPC server over
// a real socket that plays such a collector: the real one no longer
// refuses these steps (end_to_end_test, ValuesPastTheCollectorsLimits...).
#include <memory>
#include <string>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "client/hook.h"
#include "grpcpp/server.h"
#include "grpcpp/server_builder.h"
#include "gtest/gtest.h"
#include "proto/collector.grpc.pb.h"
#include "tests/testing/status_matchers.h"
#include "tests/testing/wait.h"

namespace sonde {
namespace {

// Its first stream takes the hello, reads everything up to the job end
// without acknowledging any of it, then refuses the stream as a collector
// refuses a tensor past its limit. Later streams acknowledge every step
// end and the job end, and record them.
class RefusingCollector final : public v1::Collector::Service {
 public:
  // Every stream refuses, the job end's too.
  explicit RefusingCollector(bool always = false) : always_(always) {}

  grpc::Status Stream(
      grpc::ServerContext*,
      grpc::ServerReaderWriter<v1::ServerMessage, v1::ClientMessage>* stream) override {
    int number;
    {
      absl::MutexLock lock(&mu_);
      number = ++streams_;
    }
    v1::ClientMessage in;
    while (stream->Read(&in)) {
      v1::ServerMessage out;
      if (in.has_hello()) {
        out.mutable_hello_ack()->set_job_id(1);
        out.mutable_hello_ack()->set_resume_step(-1);
        out.mutable_hello_ack()->set_max_chunk_bytes(4 << 20);
        stream->Write(out);
        continue;
      }
      if (number == 1 || always_) {
        if (in.has_job_end()) {
          return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                              "chunk 0 of tensor 'big' at step 0: 8192 bytes exceeds the limit");
        }
        continue;
      }
      if (in.has_step_end()) {
        out.mutable_ack()->set_acked_seq(in.seq());
        out.mutable_ack()->set_step(in.step_end().step());
        out.mutable_ack()->set_mode(in.step_end().mode());
        absl::MutexLock lock(&mu_);
        step_ends_.push_back(in.step_end());
      } else if (in.has_job_end()) {
        out.mutable_ack()->set_acked_seq(in.seq());
        absl::MutexLock lock(&mu_);
        job_ends_.push_back(in.job_end());
      } else {
        continue;
      }
      stream->Write(out);
    }
    return grpc::Status::OK;
  }

  int streams() {
    absl::MutexLock lock(&mu_);
    return streams_;
  }
  std::vector<v1::StepEnd> step_ends() {
    absl::MutexLock lock(&mu_);
    return step_ends_;
  }
  std::vector<v1::JobEnd> job_ends() {
    absl::MutexLock lock(&mu_);
    return job_ends_;
  }

 private:
  const bool always_;
  absl::Mutex mu_;
  int streams_ ABSL_GUARDED_BY(mu_) = 0;
  std::vector<v1::StepEnd> step_ends_ ABSL_GUARDED_BY(mu_);
  std::vector<v1::JobEnd> job_ends_ ABSL_GUARDED_BY(mu_);
};

std::unique_ptr<grpc::Server> Serve(RefusingCollector* service, int* port) {
  grpc::ServerBuilder builder;
  builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), port);
  builder.RegisterService(service);
  return builder.BuildAndStart();
}

// A hook of job "refused" that has saved `steps` steps of one tensor.
std::unique_ptr<Hook> HookWithSteps(int port, int steps) {
  HookOptions o;
  o.collector = "127.0.0.1:" + std::to_string(port);
  o.job = "refused";
  o.config.save_config = SaveConfig::Every(1);
  o.config.include_collections = {"weights"};
  o.close_timeout = absl::Seconds(20);
  o.spool_dir = "";  // nothing outlives the test
  auto hook = Hook::Create(o);
  EXPECT_TRUE(hook.ok()) << hook.status();
  if (!hook.ok()) return nullptr;
  std::vector<float> w(256, 1.0f);
  for (int step = 0; step < steps; ++step) {
    (*hook)->StartStep();
    EXPECT_TRUE((*hook)->SaveTensor("w", HostTensor(w.data(), {256}), {"weights"}).ok());
  }
  return std::move(*hook);
}

TEST(RefusedStream, TheRefusedStepsAreCountedAndTheJobStillEnds) {
  RefusingCollector service;
  int port = 0;
  std::unique_ptr<grpc::Server> server = Serve(&service, &port);
  ASSERT_NE(server, nullptr);
  ASSERT_GT(port, 0);
  constexpr int kSteps = 3;
  std::unique_ptr<Hook> hook = HookWithSteps(port, kSteps);
  ASSERT_NE(hook, nullptr);
  const absl::Time start = absl::Now();
  // Before, the job end went with the refused steps: never sent again, it
  // left the job unfinished at the collector and Close waited its 20 s.
  SONDE_EXPECT_OK(hook->Close());
  EXPECT_LT(absl::Now() - start, absl::Seconds(15));
  const Hook::Counters c = hook->counters();
  EXPECT_EQ(c.steps_dropped, static_cast<uint64_t>(kSteps));
  EXPECT_EQ(c.tensors_dropped, static_cast<uint64_t>(kSteps));
  EXPECT_GE(service.streams(), 2);
  EXPECT_TRUE(service.step_ends().empty());  // all refused, none resent
  auto ends = service.job_ends();
  ASSERT_EQ(ends.size(), 1u);
  // The collector learns what was lost.
  EXPECT_EQ(ends[0].counters().steps_dropped(), static_cast<uint64_t>(kSteps));
  EXPECT_EQ(ends[0].counters().tensors_dropped(), static_cast<uint64_t>(kSteps));
  server->Shutdown();
}

// Its first stream refuses the stream at the first chunk of tensor "bad";
// later ones acknowledge step ends and the job end and record the step
// ends. Every hello ack says at most 3 tensors per step.
class MidStepRefuser final : public v1::Collector::Service {
 public:
  grpc::Status Stream(
      grpc::ServerContext*,
      grpc::ServerReaderWriter<v1::ServerMessage, v1::ClientMessage>* stream) override {
    int number;
    {
      absl::MutexLock lock(&mu_);
      number = ++streams_;
    }
    v1::ClientMessage in;
    while (stream->Read(&in)) {
      v1::ServerMessage out;
      if (in.has_hello()) {
        out.mutable_hello_ack()->set_job_id(1);
        out.mutable_hello_ack()->set_resume_step(-1);
        out.mutable_hello_ack()->set_max_chunk_bytes(4 << 20);
        out.mutable_hello_ack()->set_max_tensors_per_step(3);
      } else if (number == 1 && in.has_chunk() && in.chunk().tensor_name() == "bad") {
        return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "tensor 'bad' is refused");
      } else if (in.has_step_end()) {
        out.mutable_ack()->set_acked_seq(in.seq());
        out.mutable_ack()->set_step(in.step_end().step());
        out.mutable_ack()->set_mode(in.step_end().mode());
        absl::MutexLock lock(&mu_);
        step_ends_.push_back(in.step_end());
      } else if (in.has_job_end()) {
        out.mutable_ack()->set_acked_seq(in.seq());
      } else {
        continue;
      }
      stream->Write(out);
    }
    return grpc::Status::OK;
  }

  int streams() {
    absl::MutexLock lock(&mu_);
    return streams_;
  }
  std::vector<v1::StepEnd> step_ends() {
    absl::MutexLock lock(&mu_);
    return step_ends_;
  }

 private:
  absl::Mutex mu_;
  int streams_ ABSL_GUARDED_BY(mu_) = 0;
  std::vector<v1::StepEnd> step_ends_ ABSL_GUARDED_BY(mu_);
};

TEST(RefusedStream, TensorsOfAStepRefusedMidStepAreAGapInThatStep) {
  MidStepRefuser service;
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
  builder.RegisterService(&service);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  ASSERT_NE(server, nullptr);
  std::unique_ptr<Hook> hook = HookWithSteps(port, 0);
  ASSERT_NE(hook, nullptr);
  std::vector<float> w(64, 1.0f);
  hook->StartStep();
  for (const char* name : {"a", "bad"}) {
    SONDE_ASSERT_OK(hook->SaveTensor(name, HostTensor(w.data(), {64}), {"weights"}));
  }
  // The stream is refused while the step is open; the hook reconnects.
  ASSERT_TRUE(::sonde::testing::WaitUntil([&] { return service.streams() >= 2; }));
  for (const char* name : {"c", "d"}) {
    SONDE_ASSERT_OK(hook->SaveTensor(name, HostTensor(w.data(), {64}), {"weights"}));
  }
  SONDE_ASSERT_OK(hook->Close());
  const Hook::Counters c = hook->counters();
  EXPECT_EQ(c.tensors_dropped, 2u);
  EXPECT_EQ(c.steps_dropped, 0u);
  auto ends = service.step_ends();
  ASSERT_EQ(ends.size(), 1u);
  // Before, the step looked whole but for d: "a" and "bad" were not
  // counted, and the limit of 3 still counted them, dropping "d".
  EXPECT_EQ(ends[0].tensor_count(), 2u);
  EXPECT_EQ(ends[0].tensors_dropped(), 2u);
  server->Shutdown();
}

TEST(RefusedStream, AJobEndRefusedTwiceEndsCloseAtOnceWithTheReason) {
  RefusingCollector service(/*always=*/true);
  int port = 0;
  std::unique_ptr<grpc::Server> server = Serve(&service, &port);
  ASSERT_NE(server, nullptr);
  ASSERT_GT(port, 0);
  std::unique_ptr<Hook> hook = HookWithSteps(port, 2);
  ASSERT_NE(hook, nullptr);
  const absl::Time start = absl::Now();
  // Before, the job end was dropped after its second refusal and Close
  // waited out its 20 s for an ack that could not come.
  EXPECT_THAT(hook->Close(), ::sonde::testing::StatusIs(absl::StatusCode::kUnavailable,
                                                        "refused the end of job 'refused' twice"));
  EXPECT_LT(absl::Now() - start, absl::Seconds(15));
  EXPECT_EQ(service.streams(), 2);  // sent again once, not in a loop
  EXPECT_EQ(hook->counters().steps_dropped, 2u);
  EXPECT_EQ(hook->counters().tensors_dropped, 2u);
  server->Shutdown();
}

}  // namespace
}  // namespace sonde
