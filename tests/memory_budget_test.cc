// The collector's memory for open steps is bounded (issue 16, item 5): all
// streams together hold at most --max_open_step_bytes of steps not yet
// committed, a stream past it is told RESOURCE_EXHAUSTED and its client
// resends later with nothing lost; a tensor's buffer grows as its bytes
// arrive, not as declared; and shutdown ends within its grace whatever the
// clients do.
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/time/clock.h"
#include "client/hook.h"
#include "client/query_client.h"
#include "common/crc32c.h"
#include "gtest/gtest.h"
#include "proto/collector.pb.h"
#include "server/collector.h"
#include "tests/testing/in_process_collector.h"
#include "tests/testing/raw_stream.h"
#include "tests/testing/status_matchers.h"
#include "tests/testing/wait.h"

namespace sonde {
namespace {

using ::sonde::testing::InProcessCollector;
using ::sonde::testing::RawStream;

// VmSize or VmRSS of this process, in bytes.
uint64_t ProcStatus(const std::string& field) {
  std::ifstream in("/proc/self/status");
  std::string key;
  while (in >> key) {
    uint64_t kb = 0;
    if (key == field + ":" && (in >> kb)) return kb << 10;
    in.ignore(1 << 20, '\n');
  }
  return 0;
}

std::vector<float> Values(int client, int step, int tensor, size_t n) {
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = client * 1000.0f + step * 10.0f + tensor + i * 1e-6f;
  return v;
}

TEST(MemoryBudget, StreamsPastTheBudgetResendLaterAndNothingIsLost) {
  constexpr uint64_t kBudget = 6 << 20;
  InProcessCollector collector("", server::IngestLimits(), [](server::CollectorOptions& o) {
    o.max_open_step_bytes = kBudget;
  });
  constexpr int kClients = 4, kSteps = 6, kTensors = 4;
  constexpr size_t kFloats = 1 << 18;  // 1 MiB a tensor, 4 MiB a step, 16 MiB at once
  std::vector<std::thread> threads;
  std::vector<Hook::Counters> counters(kClients);
  for (int c = 0; c < kClients; ++c) {
    threads.emplace_back([&, c] {
      HookOptions o;
      o.collector = collector.address();
      o.job = "budget-" + std::to_string(c);
      o.config.save_config = SaveConfig::Every(1);
      o.config.include_collections = {"weights"};
      o.max_chunk_bytes = 1 << 20;
      o.close_timeout = absl::Seconds(120);
      auto hook = Hook::Create(o);
      ASSERT_TRUE(hook.ok()) << hook.status();
      for (int step = 0; step < kSteps; ++step) {
        (*hook)->StartStep();
        for (int t = 0; t < kTensors; ++t) {
          std::vector<float> v = Values(c, step, t, kFloats);
          SONDE_EXPECT_OK((*hook)->SaveTensor("w" + std::to_string(t) + ".weight",
                                              HostTensor(v.data(), {kFloats}), {"weights"}));
        }
        (*hook)->EndStep();
      }
      SONDE_EXPECT_OK((*hook)->Close());
      counters[c] = (*hook)->counters();
    });
  }
  for (auto& t : threads) t.join();
  const server::OpenStepBudget* budget = collector.collector().open_steps();
  ASSERT_NE(budget, nullptr);
  // At most the budget, plus what one stream alone may take past it.
  EXPECT_LE(budget->peak(), kBudget + (4 << 20) + (1 << 20)) << budget->peak();
  EXPECT_EQ(budget->held(), 0u);
  uint64_t reconnects = 0;
  for (const Hook::Counters& c : counters) {
    EXPECT_EQ(c.tensors_dropped, 0u);
    EXPECT_EQ(c.steps_dropped, 0u);
    reconnects += c.reconnects;
  }
  EXPECT_GT(reconnects, 0u) << "16 MiB of open steps never met a 6 MiB budget";
  auto q = QueryClient::Connect(collector.address());
  for (int c = 0; c < kClients; ++c) {
    const std::string job = "budget-" + std::to_string(c);
    auto steps = q->ListSteps(job);
    SONDE_ASSERT_OK(steps);
    ASSERT_EQ(steps->size(), static_cast<size_t>(kSteps)) << job;
    for (int step = 0; step < kSteps; step += 5) {
      auto value = q->ReadTensor(job, "w3.weight", step);
      SONDE_ASSERT_OK(value);
      const std::vector<float> want = Values(c, step, 3, kFloats);
      EXPECT_TRUE(value->bytes == std::string(reinterpret_cast<const char*>(want.data()),
                                              want.size() * 4));
    }
  }
}

v1::ClientMessage Hello(const std::string& job, uint64_t seq) {
  v1::ClientMessage m;
  m.set_seq(seq);
  m.mutable_hello()->set_job(job);
  m.mutable_hello()->set_world_size(1);
  m.mutable_hello()->set_client_id(seq + 1000);
  return m;
}

// A first chunk declaring 1 GiB that carries 16 bytes.
v1::ClientMessage HugeDeclaration() {
  v1::ClientMessage m;
  m.set_seq(2);
  v1::TensorChunk* c = m.mutable_chunk();
  c->set_tensor_name("huge");
  c->set_step(0);
  c->set_dtype(v1::DTYPE_F32);
  c->add_shape(1 << 28);
  c->set_chunk_count(1 << 10);
  c->set_total_bytes(uint64_t{1} << 30);
  c->set_payload(std::string(16, 'x'));
  c->set_crc32c(Crc32c(c->payload()));
  return m;
}

TEST(MemoryBudget, DeclaredBytesAreNotReservedAndStuckClientsCannotHoldShutdown) {
  auto collector = std::make_unique<InProcessCollector>();
  const uint64_t vm_before = ProcStatus("VmSize");
  std::vector<std::unique_ptr<RawStream>> stuck;
  for (int i = 0; i < 10; ++i) {
    stuck.push_back(std::make_unique<RawStream>(collector->address(), std::chrono::seconds(60)));
    ASSERT_TRUE(stuck.back()->Write(Hello("stuck-" + std::to_string(i), 1)));
    v1::ServerMessage ack;
    ASSERT_TRUE(stuck.back()->Read(&ack));
    ASSERT_TRUE(stuck.back()->Write(HugeDeclaration()));
  }
  // Ten streams declaring 1 GiB each: reserved 10 GiB before; now each
  // holds what arrived and at most two chunks' worth of reservation.
  sonde::testing::WaitUntil([&] { return collector->collector().open_steps()->held() >= 160; },
                           absl::Seconds(10));
  EXPECT_EQ(collector->collector().open_steps()->held(), 160u);
  const uint64_t vm_after = ProcStatus("VmSize");
  EXPECT_LT(vm_after, vm_before + (uint64_t{1} << 30))
      << "VmSize grew by " << (vm_after - vm_before) / (1 << 20) << " MiB";
  // The clients neither send nor read any more: shutdown still ends within
  // its grace (2 s) and some slack.
  const absl::Time start = absl::Now();
  collector.reset();
  const absl::Duration took = absl::Now() - start;
  EXPECT_LT(took, absl::Seconds(10)) << took;
  std::printf("shutdown with 10 stuck streams took %s; VmSize grew %llu MiB\n",
              absl::FormatDuration(took).c_str(),
              static_cast<unsigned long long>((vm_after - vm_before) >> 20));
}

}  // namespace
}  // namespace sonde
