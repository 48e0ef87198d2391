// PartitionApplier against a real Store, JobRegistry and rule runner, fed
// log entries directly and through a real NATS JetStream log.
#include "server/cluster/applier.h"

#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "common/crc32c.h"
#include "common/tensor_chunks.h"
#include "common/thread_pool.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "rules/builtin_rules.h"
#include "server/cluster/partition_log.h"
#include "server/job_registry.h"
#include "storage/store.h"
#include "tests/testing/logged_stream.h"
#include "tests/testing/nats_cluster.h"
#include "tests/testing/status_matchers.h"
#include "tests/testing/temp_dir.h"
#include "tests/testing/wait.h"

namespace sonde::cluster {
namespace {

using ::sonde::testing::TempDir;

using ::sonde::testing::LoggedStream;

std::vector<float> Weights(int64_t step) {
  std::vector<float> w(10);
  for (size_t i = 0; i < w.size(); ++i) w[i] = static_cast<float>(step * 100 + i);
  return w;
}

// A collector node's state: store, registry and an applier for partition 0.
class Node {
 public:
  explicit Node(const std::string& db) {
    storage::Store::Options o;
    o.path = db;
    auto store = storage::Store::Open(o);
    EXPECT_TRUE(store.ok()) << store.status();
    store_ = std::move(*store);
    registry_ = std::make_unique<server::JobRegistry>(store_.get(), &pool_, factory_.get(),
                                                      std::vector<v1::RuleSpec>{},
                                                      absl::Seconds(60));
    registry_->set_worker_lease(absl::ZeroDuration());  // as sonde-cluster runs nodes
    applier_ = std::make_unique<PartitionApplier>(0, registry_.get(), store_.get(),
                                                  server::IngestLimits());
  }
  ~Node() {
    applier_.reset();
    registry_.reset();
  }

  PartitionApplier& applier() { return *applier_; }
  storage::Store& store() { return *store_; }

 private:
  ThreadPool pool_{2, 64};
  std::unique_ptr<rules::RuleFactory> factory_ = rules::BuiltinRuleFactory();
  std::unique_ptr<storage::Store> store_;
  std::unique_ptr<server::JobRegistry> registry_;
  std::unique_ptr<PartitionApplier> applier_;
};

// Values of fc.weight at `step` of `worker`, as stored.
std::vector<float> StoredWeights(storage::Store& store, const std::string& job, int64_t step,
                                 int32_t worker) {
  auto info = store.GetJob(job);
  EXPECT_TRUE(info.ok()) << info.status();
  if (!info.ok()) return {};
  std::string bytes;
  auto read = store.ReadTensor(info->job_id(), v1::MODE_TRAIN, step, "fc.weight", worker,
                               [&](const v1::TensorRecord&, absl::string_view piece) {
                                 bytes.append(piece.data(), piece.size());
                                 return absl::OkStatus();
                               });
  EXPECT_TRUE(read.ok()) << read.status();
  std::vector<float> out(bytes.size() / sizeof(float));
  if (!out.empty()) std::memcpy(out.data(), bytes.data(), bytes.size());
  return out;
}

int CountAcks(const PartitionApplier::Outcome& o, bool duplicate) {
  int n = 0;
  for (const v1::ServerMessage& m : o.replies) {
    // A step's ack counts its tensors; a job end's has none.
    if (m.has_ack() && m.ack().tensors() > 0 && m.ack().duplicate() == duplicate) ++n;
  }
  return n;
}

TEST(PartitionApplier, AppliesInterleavedStreamsAsASingleCollectorWould) {
  TempDir dir;
  Node node(dir.Sub("db"));
  SONDE_ASSERT_OK(node.applier().ReadFrom());
  LoggedStream w0("gw-a", 1), w1("gw-b", 7);
  std::vector<v1::LogEntry> log = {w0.Hello("two", 0, 2, 11), w1.Hello("two", 1, 2, 22)};
  for (int64_t s = 0; s < 4; ++s) {
    log.push_back(w1.Step(s, Weights(s + 50)));
    log.push_back(w0.Step(s, Weights(s)));
  }
  log.push_back(w0.JobEnd());
  log.push_back(w1.JobEnd());
  int acks = 0;
  for (size_t i = 0; i < log.size(); ++i) {
    auto outcome = node.applier().Apply(i + 1, log[i]);
    SONDE_ASSERT_OK(outcome);
    SONDE_EXPECT_OK(outcome->ended) << "entry " << i + 1;
    EXPECT_FALSE(outcome->replayed);
    acks += CountAcks(*outcome, /*duplicate=*/false);
    if (i < 2) {
      ASSERT_FALSE(outcome->replies.empty());
      EXPECT_TRUE(outcome->replies[0].has_hello_ack());
      EXPECT_EQ(outcome->replies[0].hello_ack().resume_step(), -1);
    }
  }
  EXPECT_EQ(acks, 8);
  EXPECT_EQ(node.applier().open_streams(), 0u);
  auto job = node.store().GetJob("two");
  SONDE_ASSERT_OK(job);
  EXPECT_EQ(job->status(), v1::JOB_STATUS_FINISHED);
  auto steps = node.store().ListSteps(job->job_id(), v1::MODE_TRAIN);
  SONDE_ASSERT_OK(steps);
  ASSERT_EQ(steps->size(), 4u);
  for (const v1::StepInfo& s : *steps) EXPECT_EQ(s.workers_size(), 2) << "step " << s.step();
  EXPECT_EQ(StoredWeights(node.store(), "two", 2, 0), Weights(2));
  EXPECT_EQ(StoredWeights(node.store(), "two", 3, 1), Weights(53));
  auto position = node.store().GetLogPosition(0);
  SONDE_ASSERT_OK(position);
  EXPECT_EQ(position->applied(), log.size());
  EXPECT_EQ(position->replay_from(), log.size() + 1);  // no stream open
}

TEST(PartitionApplier, ARestartedNodeRebuildsOpenStreamsAndStoresEachStepOnce) {
  TempDir dir;
  LoggedStream w0("gw-a", 3);
  std::vector<v1::LogEntry> log = {w0.Hello("resumed", 0, 1, 42)};
  for (int64_t s = 0; s < 3; ++s) log.push_back(w0.Step(s, Weights(s)));
  {
    Node node(dir.Sub("db"));
    auto from = node.applier().ReadFrom();
    SONDE_ASSERT_OK(from);
    EXPECT_EQ(*from, 1u);
    for (size_t i = 0; i < log.size(); ++i) {
      auto outcome = node.applier().Apply(i + 1, log[i]);
      SONDE_ASSERT_OK(outcome);
      SONDE_ASSERT_OK(outcome->ended);
    }
    // The step's own write carried the position: applied 4, and a replay
    // must start at the open stream's hello.
    auto position = node.store().GetLogPosition(0);
    SONDE_ASSERT_OK(position);
    EXPECT_EQ(position->applied(), 4u);
    EXPECT_EQ(position->replay_from(), 1u);
  }  // the node stops
  log.push_back(w0.Step(3, Weights(3)));
  log.push_back(w0.JobEnd());
  Node node(dir.Sub("db"));
  auto from = node.applier().ReadFrom();
  SONDE_ASSERT_OK(from);
  ASSERT_EQ(*from, 1u);
  int duplicates = 0, stored = 0;
  for (size_t i = *from - 1; i < log.size(); ++i) {
    auto outcome = node.applier().Apply(i + 1, log[i]);
    SONDE_ASSERT_OK(outcome);
    SONDE_EXPECT_OK(outcome->ended) << "entry " << i + 1;
    EXPECT_EQ(outcome->replayed, i + 1 <= 4);
    duplicates += CountAcks(*outcome, true);
    stored += CountAcks(*outcome, false);
  }
  EXPECT_EQ(duplicates, 3);  // steps 0-2, stored before the restart
  EXPECT_EQ(stored, 1);      // step 3
  auto job = node.store().GetJob("resumed");
  SONDE_ASSERT_OK(job);
  EXPECT_EQ(job->status(), v1::JOB_STATUS_FINISHED);
  auto steps = node.store().ListSteps(job->job_id(), v1::MODE_TRAIN);
  SONDE_ASSERT_OK(steps);
  ASSERT_EQ(steps->size(), 4u);
  for (int64_t s = 0; s < 4; ++s) EXPECT_EQ(StoredWeights(node.store(), "resumed", s, 0), Weights(s));
}

TEST(PartitionApplier, ARefusedStreamEndsAloneAndStoresNothingOfItsBadStep) {
  TempDir dir;
  Node node(dir.Sub("db"));
  SONDE_ASSERT_OK(node.applier().ReadFrom());
  LoggedStream bad("gw-a", 1), good("gw-a", 2);
  std::vector<v1::LogEntry> log = {bad.Hello("bad", 0, 1, 5), good.Hello("good", 0, 1, 6),
                                   bad.Step(0, Weights(0)), bad.Step(1, Weights(1), true),
                                   good.Step(0, Weights(9)), bad.Step(2, Weights(2)),
                                   good.JobEnd(), bad.Close()};
  std::vector<absl::Status> ended;
  for (size_t i = 0; i < log.size(); ++i) {
    auto outcome = node.applier().Apply(i + 1, log[i]);
    SONDE_ASSERT_OK(outcome);
    ended.push_back(outcome->ended);
  }
  EXPECT_EQ(ended[3].code(), absl::StatusCode::kDataLoss) << ended[3];
  EXPECT_THAT(std::string(ended[3].message()), ::testing::HasSubstr("crc32c mismatch"));
  EXPECT_EQ(ended[5].code(), absl::StatusCode::kAborted);  // after its stream ended
  SONDE_EXPECT_OK(ended[4]);
  SONDE_EXPECT_OK(ended[6]);
  EXPECT_EQ(node.applier().open_streams(), 0u);
  auto job = node.store().GetJob("bad");
  SONDE_ASSERT_OK(job);
  auto steps = node.store().ListSteps(job->job_id(), v1::MODE_TRAIN);
  SONDE_ASSERT_OK(steps);
  ASSERT_EQ(steps->size(), 1u);  // step 0 only
  EXPECT_EQ((*steps)[0].step(), 0);
  // The log had acknowledged steps 1 and 2 to the client: both are counted
  // as dropped, so the gap shows.
  auto bad_job = node.store().GetJob("bad");
  SONDE_ASSERT_OK(bad_job);
  EXPECT_EQ(bad_job->steps_dropped(), 2u);
  auto good_job = node.store().GetJob("good");
  SONDE_ASSERT_OK(good_job);
  EXPECT_EQ(good_job->status(), v1::JOB_STATUS_FINISHED);
}

// A client whose gateway died reconnects through another: its new hello
// takes the worker over, the old stream ends (its gateway is told), and it
// no longer holds back where a restarted node would replay from.
TEST(PartitionApplier, AStreamWhoseWorkerIsTakenOverEndsAndFreesTheReplayPosition) {
  TempDir dir;
  Node node(dir.Sub("db"));
  SONDE_ASSERT_OK(node.applier().ReadFrom());
  LoggedStream old_stream("gw-dead", 1), new_stream("gw-b", 9);
  std::vector<v1::LogEntry> log = {old_stream.Hello("moved", 0, 1, 77), old_stream.Step(0, Weights(0)),
                                   new_stream.Hello("moved", 0, 1, 77),
                                   new_stream.Step(1, Weights(1)), new_stream.JobEnd()};
  std::vector<PartitionApplier::Outcome> outcomes;
  for (size_t i = 0; i < log.size(); ++i) {
    auto outcome = node.applier().Apply(i + 1, log[i]);
    SONDE_ASSERT_OK(outcome);
    SONDE_EXPECT_OK(outcome->ended) << "entry " << i + 1;
    outcomes.push_back(*std::move(outcome));
    if (i == 2) {
      ASSERT_EQ(outcomes[2].others_ended.size(), 1u);
      EXPECT_EQ(outcomes[2].others_ended[0].gateway, "gw-dead");
      EXPECT_EQ(outcomes[2].others_ended[0].connection, 1u);
      EXPECT_EQ(outcomes[2].others_ended[0].status.code(), absl::StatusCode::kAborted);
      EXPECT_EQ(node.applier().open_streams(), 1u);
      auto position = node.store().GetLogPosition(0);
      SONDE_ASSERT_OK(position);
      EXPECT_EQ(position->replay_from(), 3u);  // the new stream's hello, not 1
    }
  }
  auto job = node.store().GetJob("moved");
  SONDE_ASSERT_OK(job);
  EXPECT_EQ(job->status(), v1::JOB_STATUS_FINISHED);
  auto steps = node.store().ListSteps(job->job_id(), v1::MODE_TRAIN);
  SONDE_ASSERT_OK(steps);
  EXPECT_EQ(steps->size(), 2u);
}

// A gateway that dies while its client never comes back: once the other
// gateways' entries show a minute of log time without a word from it, its
// streams end as disconnected ones, and the replay position moves past them.
TEST(PartitionApplier, AStreamOfAGatewaySilentPastTheTimeoutEnds) {
  TempDir dir;
  Node node(dir.Sub("db"));
  SONDE_ASSERT_OK(node.applier().ReadFrom());
  LoggedStream lost("gw-dead", 1), alive("gw-b", 2);
  const int64_t t0 = 1'800'000'000'000'000;  // unix micros
  auto at = [](v1::LogEntry e, int64_t micros) {
    e.set_unix_micros(micros);
    return e;
  };
  v1::LogEntry beat;
  beat.set_gateway("gw-b");
  beat.set_heartbeat(true);
  std::vector<v1::LogEntry> log = {
      at(lost.Hello("orphan", 0, 1, 3), t0), at(lost.Step(0, Weights(0)), t0 + 1'000'000),
      at(alive.Hello("other", 0, 1, 4), t0 + 2'000'000),
      at(beat, t0 + 30'000'000),   // half a minute: nothing ends
      at(beat, t0 + 62'000'000)};  // gw-dead silent 61 s
  std::vector<PartitionApplier::Outcome> outcomes;
  for (size_t i = 0; i < log.size(); ++i) {
    auto outcome = node.applier().Apply(i + 1, log[i]);
    SONDE_ASSERT_OK(outcome);
    outcomes.push_back(*std::move(outcome));
  }
  EXPECT_TRUE(outcomes[3].others_ended.empty());
  ASSERT_EQ(outcomes[4].others_ended.size(), 1u);
  EXPECT_EQ(outcomes[4].others_ended[0].gateway, "gw-dead");
  EXPECT_EQ(outcomes[4].others_ended[0].status.code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(node.applier().open_streams(), 1u);  // gw-b's
  auto position = node.store().GetLogPosition(0);
  SONDE_ASSERT_OK(position);
  EXPECT_EQ(position->replay_from(), 3u);  // gw-b's hello
  auto orphan = node.store().GetJob("orphan");
  SONDE_ASSERT_OK(orphan);
  EXPECT_EQ(orphan->status(), v1::JOB_STATUS_DISCONNECTED);  // its step 0 kept
  auto steps = node.store().ListSteps(orphan->job_id(), v1::MODE_TRAIN);
  SONDE_ASSERT_OK(steps);
  EXPECT_EQ(steps->size(), 1u);
}

// With the log's own time, a gateway whose clock is ten minutes behind
// another's is not taken for dead.
TEST(PartitionApplier, TheLogsClockDecidesGatewaySilenceNotTheGateways) {
  TempDir dir;
  Node node(dir.Sub("db"));
  SONDE_ASSERT_OK(node.applier().ReadFrom());
  LoggedStream slow("gw-slow-clock", 1), fast("gw-fast-clock", 2);
  const int64_t t0 = 1'800'000'000'000'000;
  std::vector<std::pair<v1::LogEntry, int64_t>> log;  // entry, its gateway's stamp
  log.push_back({slow.Hello("skewed", 0, 1, 1), t0 - 600'000'000});
  log.push_back({fast.Hello("other", 0, 1, 2), t0});
  for (int64_t s = 0; s < 3; ++s) {
    log.push_back({slow.Step(s, Weights(s)), t0 - 600'000'000 + s * 1'000'000});
    log.push_back({fast.Step(s, Weights(s)), t0 + s * 1'000'000});
  }
  for (size_t i = 0; i < log.size(); ++i) {
    v1::LogEntry e = log[i].first;
    e.set_unix_micros(log[i].second);
    // The log stored them a second apart, in order.
    auto outcome = node.applier().Apply(i + 1, e, t0 + static_cast<int64_t>(i) * 1'000'000);
    SONDE_ASSERT_OK(outcome);
    EXPECT_TRUE(outcome->others_ended.empty()) << "entry " << i + 1;
  }
  EXPECT_EQ(node.applier().open_streams(), 2u);
}

// EnableRules and PostRuleResult logged as entries: applied in their place
// among the job's entries, with the Query service's answers and refusals.
TEST(PartitionApplier, ControlEntriesMakeTheirChangesInLogOrder) {
  TempDir dir;
  Node node(dir.Sub("db"));
  SONDE_ASSERT_OK(node.applier().ReadFrom());
  v1::LogEntry enable;
  enable.set_gateway("gw-a");
  enable.set_connection(100);
  enable.set_closed(true);
  enable.mutable_enable_rules()->set_job("ruled");
  v1::RuleSpec* spec = enable.mutable_enable_rules()->add_rules();
  spec->set_rule_type("LossNotDecreasing");
  spec->set_name("early_loss");
  auto enabled = node.applier().Apply(1, enable);
  SONDE_ASSERT_OK(enabled);
  SONDE_ASSERT_OK(enabled->ended);
  v1::EnableRulesResponse answer;
  ASSERT_TRUE(answer.ParseFromString(enabled->response));
  ASSERT_EQ(answer.rules_size(), 1);
  EXPECT_EQ(answer.rules(0).name(), "early_loss");
  EXPECT_EQ(node.applier().open_streams(), 0u);  // a control entry opens no session

  LoggedStream w("gw-a", 1);
  auto hello = node.applier().Apply(2, w.Hello("ruled", 0, 1, 9));
  SONDE_ASSERT_OK(hello);
  SONDE_ASSERT_OK(hello->ended);
  auto job = node.store().GetJob("ruled");
  SONDE_ASSERT_OK(job);
  bool found = false;
  for (const v1::RuleSpec& r : job->rules()) found = found || r.name() == "early_loss";
  EXPECT_TRUE(found);

  // Enabling rules once the job has started is refused, as by the service.
  enable.set_connection(101);
  auto late = node.applier().Apply(3, enable);
  SONDE_ASSERT_OK(late);
  EXPECT_EQ(late->ended.code(), absl::StatusCode::kFailedPrecondition) << late->ended;
  // So is deleting it while its worker streams.
  v1::LogEntry del;
  del.set_gateway("gw-a");
  del.set_connection(103);
  del.set_closed(true);
  del.mutable_delete_job()->set_job("ruled");
  auto refused = node.applier().Apply(5, del);
  SONDE_ASSERT_OK(refused);
  EXPECT_EQ(refused->ended.code(), absl::StatusCode::kFailedPrecondition) << refused->ended;
  SONDE_EXPECT_OK(node.store().GetJob("ruled").status());

  v1::LogEntry post;
  post.set_gateway("gw-a");
  post.set_connection(102);
  post.set_closed(true);
  v1::RuleResult* result = post.mutable_post_rule_result()->mutable_result();
  result->set_job("no-such-job");
  result->set_rule("external");
  result->set_status(v1::RULE_STATUS_NO_ISSUES_FOUND);
  auto posted = node.applier().Apply(4, post);
  SONDE_ASSERT_OK(posted);
  EXPECT_EQ(posted->ended.code(), absl::StatusCode::kNotFound) << posted->ended;
  // After its job end, the delete goes through.
  auto ended = node.applier().Apply(6, w.JobEnd());
  SONDE_ASSERT_OK(ended);
  SONDE_ASSERT_OK(ended->ended);
  del.set_connection(104);
  auto erased = node.applier().Apply(7, del);
  SONDE_ASSERT_OK(erased);
  SONDE_ASSERT_OK(erased->ended);
  v1::DeleteJobResponse gone;
  ASSERT_TRUE(gone.ParseFromString(erased->response));
  EXPECT_GT(gone.job_id(), 0u);
  EXPECT_EQ(node.store().GetJob("ruled").status().code(), absl::StatusCode::kNotFound);
}

// A second client takes a worker over after the first one's stream has
// ended. Two nodes apply the same log, one slowly (as the entries came)
// and one at once (a node that took the partition over and replays it):
// both accept the takeover and store the same steps, so neither refuses a
// client the other acknowledged.
TEST(PartitionApplier, ATakeoverIsDecidedTheSameWhenTheLogIsReplayedAtOnce) {
  TempDir dir;
  LoggedStream first("gw-a", 1), second("gw-b", 2);
  std::vector<v1::LogEntry> log = {first.Hello("handover", 0, 1, 111)};
  for (int64_t s = 0; s < 3; ++s) log.push_back(first.Step(s, Weights(s)));
  log.push_back(first.Close());  // the first client's process went away
  log.push_back(second.Hello("handover", 0, 1, 222));  // a restarted process
  for (int64_t s = 3; s < 5; ++s) log.push_back(second.Step(s, Weights(s)));
  log.push_back(second.JobEnd());
  for (const absl::Duration pace : {absl::Milliseconds(30), absl::ZeroDuration()}) {
    Node node(dir.Sub(absl::StrCat("db-", absl::ToInt64Milliseconds(pace))));
    SONDE_ASSERT_OK(node.applier().ReadFrom());
    for (size_t i = 0; i < log.size(); ++i) {
      auto outcome = node.applier().Apply(i + 1, log[i]);
      SONDE_ASSERT_OK(outcome);
      SONDE_EXPECT_OK(outcome->ended) << "entry " << i + 1 << " at pace " << pace;
      if (i + 1 == 6) {  // the second client's hello: not its steps to resend
        ASSERT_FALSE(outcome->replies.empty());
        EXPECT_EQ(outcome->replies[0].hello_ack().resume_step(), -1);
      }
      absl::SleepFor(pace);
    }
    auto job = node.store().GetJob("handover");
    SONDE_ASSERT_OK(job);
    EXPECT_EQ(job->status(), v1::JOB_STATUS_FINISHED) << pace;
    EXPECT_EQ(job->steps_dropped(), 0u) << pace;
    auto steps = node.store().ListSteps(job->job_id(), v1::MODE_TRAIN);
    SONDE_ASSERT_OK(steps);
    EXPECT_EQ(steps->size(), 5u) << pace;
  }
}

// The pieces together: a gateway's entries through a real JetStream log,
// applied by a node that is stopped and restarted halfway.
TEST(PartitionApplier, AppliesARealLogAcrossANodeRestart) {
  if (!testing::HaveNats()) GTEST_SKIP() << "no " << testing::kNatsBinary;
  TempDir dir;
  testing::NatsCluster nats(dir.path(), 1);
  SONDE_ASSERT_OK(nats.Start());
  PartitionLog::Options lo;
  lo.servers = nats.urls();
  lo.partitions = 1;
  lo.replicas = 1;
  std::unique_ptr<PartitionLog> log;
  ASSERT_TRUE(testing::WaitUntil([&] {
    auto opened = PartitionLog::Open(lo);
    if (opened.ok()) log = std::move(*opened);
    return opened.ok();
  }));
  LoggedStream w0("gw-a", 1), w1("gw-a", 2);
  std::vector<v1::LogEntry> entries = {w0.Hello("logged", 0, 2, 1), w1.Hello("logged", 1, 2, 2)};
  for (int64_t s = 0; s < 6; ++s) {
    entries.push_back(w0.Step(s, Weights(s)));
    entries.push_back(w1.Step(s, Weights(s + 1000)));
  }
  entries.push_back(w0.JobEnd());
  entries.push_back(w1.JobEnd());
  for (size_t i = 0; i < entries.size(); ++i) {
    auto appended = log->Append(0, absl::StrCat("e", i), entries[i].SerializeAsString());
    SONDE_ASSERT_OK(appended);
  }
  // Applies entries until `count` have been applied (or replayed).
  auto run = [&](Node& node, size_t count) {
    auto from = node.applier().ReadFrom();
    ASSERT_TRUE(from.ok()) << from.status();
    auto reader = log->Read(0, *from);
    ASSERT_TRUE(reader.ok()) << reader.status();
    while (node.applier().applied() < count) {
      auto next = (*reader)->Next(absl::Seconds(10));
      ASSERT_TRUE(next.ok()) << next.status();
      ASSERT_TRUE(next->has_value()) << "the log ran dry at " << node.applier().applied();
      v1::LogEntry entry;
      ASSERT_TRUE(entry.ParseFromString((*next)->bytes));
      auto outcome = node.applier().Apply((*next)->sequence, entry);
      ASSERT_TRUE(outcome.ok()) << outcome.status();
      EXPECT_TRUE(outcome->ended.ok()) << outcome->ended;
    }
  };
  {
    Node node(dir.Sub("db"));
    run(node, 7);
  }
  Node node(dir.Sub("db"));
  run(node, entries.size());
  auto job = node.store().GetJob("logged");
  SONDE_ASSERT_OK(job);
  EXPECT_EQ(job->status(), v1::JOB_STATUS_FINISHED);
  auto steps = node.store().ListSteps(job->job_id(), v1::MODE_TRAIN);
  SONDE_ASSERT_OK(steps);
  ASSERT_EQ(steps->size(), 6u);
  for (const v1::StepInfo& s : *steps) {
    EXPECT_EQ(s.workers_size(), 2);
    EXPECT_EQ(StoredWeights(node.store(), "logged", s.step(), 1), Weights(s.step() + 1000));
  }
}

}  // namespace
}  // namespace sonde::cluster
