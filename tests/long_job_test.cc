// A long job read back whole: a tensor with its histogram at each of
// 10,000 steps of one worker of 512. Its series (a histogram a point) and
// its step list (511 missing workers a step) are larger than one gRPC
// message carries (the collector sends at most 5 MiB, Python and grpcurl
// take 4 MiB); readers page through them and get every point once.
#include <algorithm>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "client/hook.h"
#include "client/query_client.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/server.h"
#include "grpcpp/server_builder.h"
#include "gtest/gtest.h"
#include "proto/query.grpc.pb.h"
#include "tests/testing/in_process_collector.h"
#include "tests/testing/status_matchers.h"

namespace sonde {
namespace {

using ::sonde::testing::InProcessCollector;
using ::sonde::testing::StatusIs;

constexpr int kSteps = 10000;
constexpr int kWorkers = 512;

class LongJobTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    collector_ = new InProcessCollector();
    HookOptions o;
    o.collector = collector_->address();
    o.job = "long";
    o.world_size = kWorkers;
    o.spool_dir = "";
    o.config.save_config = SaveConfig::Every(1);
    CollectionConfig weights;
    weights.name = "weights";
    weights.save_histogram = true;
    o.config.collections.push_back(weights);
    o.config.include_collections = {"weights"};
    o.close_timeout = absl::Seconds(120);
    auto hook = Hook::Create(o);
    ASSERT_TRUE(hook.ok()) << hook.status();
    const absl::Time start = absl::Now();
    for (int step = 0; step < kSteps; ++step) {
      (*hook)->StartStep();
      std::vector<float> w(16, 1.0f / (1 + step));
      ASSERT_TRUE((*hook)->SaveTensor("w", HostTensor(w.data(), {16}), {"weights"}).ok());
    }
    ASSERT_TRUE((*hook)->Close().ok());
    std::cerr << kSteps << " steps stored in " << absl::Now() - start << "\n";
  }
  static void TearDownTestSuite() { delete collector_; }
  static InProcessCollector* collector_;
};
InProcessCollector* LongJobTest::collector_ = nullptr;

TEST_F(LongJobTest, TheWholeSeriesReadsBackInPages) {
  auto q = QueryClient::Connect(collector_->address(), absl::Seconds(60));
  auto series = q->ReadSeries("long", "w");
  SONDE_ASSERT_OK(series);
  ASSERT_EQ(series->size(), static_cast<size_t>(kSteps));
  for (int step = 0; step < kSteps; ++step) {
    ASSERT_EQ((*series)[step].step(), step);
    ASSERT_FLOAT_EQ((*series)[step].statistics().mean(), 1.0f / (1 + step));
    ASSERT_TRUE((*series)[step].has_histogram());
  }
}

TEST_F(LongJobTest, TheWholeStepListReadsBackInPages) {
  auto q = QueryClient::Connect(collector_->address(), absl::Seconds(60));
  auto steps = q->ListSteps("long");
  SONDE_ASSERT_OK(steps);
  ASSERT_EQ(steps->size(), static_cast<size_t>(kSteps));
  for (int step = 0; step < kSteps; ++step) {
    ASSERT_EQ((*steps)[step].step(), step);
    ASSERT_EQ((*steps)[step].missing_workers_size(), kWorkers - 1);
  }
}

TEST_F(LongJobTest, APageStopsWhereAskedAndTheNextStartsAfterIt) {
  auto channel = grpc::CreateChannel(collector_->address(), grpc::InsecureChannelCredentials());
  auto query = v1::Query::NewStub(channel);
  v1::ListStepsRequest req;
  req.set_job("long");
  req.set_start_step(100);
  req.set_max_steps(7);
  v1::ListStepsResponse resp;
  grpc::ClientContext ctx;
  ASSERT_TRUE(query->ListSteps(&ctx, req, &resp).ok());
  ASSERT_EQ(resp.steps_size(), 7);
  EXPECT_TRUE(resp.truncated());
  EXPECT_EQ(resp.steps(0).step(), 100);
  EXPECT_EQ(resp.steps(6).step(), 106);
  // By size alone: about 3 MiB, however many were asked for.
  req.set_start_step(0);
  req.set_max_steps(1000000);
  v1::ListStepsResponse big;
  grpc::ClientContext ctx2;
  ASSERT_TRUE(query->ListSteps(&ctx2, req, &big).ok());
  EXPECT_TRUE(big.truncated());
  EXPECT_LT(big.ByteSizeLong(), size_t{4} << 20);
  EXPECT_GT(big.steps_size(), 1000);
  // The last page says nothing more follows.
  req.set_start_step(kSteps - 3);
  v1::ListStepsResponse last;
  grpc::ClientContext ctx3;
  ASSERT_TRUE(query->ListSteps(&ctx3, req, &last).ok());
  EXPECT_EQ(last.steps_size(), 3);
  EXPECT_FALSE(last.truncated());
}

// Two workers: a page ends between steps, never between the workers of one.
// The hooks of workers 0 and 1 of a job of two, saving every step.
void TwoWorkers(const std::string& address, const std::string& job,
                std::vector<std::unique_ptr<Hook>>* hooks) {
  for (int worker = 0; worker < 2; ++worker) {
    HookOptions o;
    o.collector = address;
    o.job = job;
    o.worker = worker;
    o.world_size = 2;
    o.spool_dir = "";
    o.config.save_config = SaveConfig::Every(1);
    auto hook = Hook::Create(o);
    SONDE_ASSERT_OK(hook);
    hooks->push_back(std::move(*hook));
  }
}

TEST(Paging, ASeriesPageHoldsEveryWorkerOfItsSteps) {
  InProcessCollector collector;
  std::vector<std::unique_ptr<Hook>> hooks;
  ASSERT_NO_FATAL_FAILURE(TwoWorkers(collector.address(), "two", &hooks));
  for (int step = 0; step < 5; ++step) {
    for (int worker = 0; worker < 2; ++worker) {
      hooks[worker]->StartStep();
      SONDE_ASSERT_OK(hooks[worker]->SaveScalar("loss", step + worker, {"losses"}));
    }
  }
  for (auto& h : hooks) SONDE_ASSERT_OK(h->Close());
  auto query = v1::Query::NewStub(
      grpc::CreateChannel(collector.address(), grpc::InsecureChannelCredentials()));
  v1::ReadSeriesRequest req;
  req.set_job("two");
  req.set_tensor("loss");
  req.set_worker(-1);
  req.set_max_points(3);
  v1::ReadSeriesResponse page;
  grpc::ClientContext ctx;
  ASSERT_TRUE(query->ReadSeries(&ctx, req, &page).ok());
  ASSERT_EQ(page.points_size(), 4);  // steps 0 and 1, both workers
  EXPECT_TRUE(page.truncated());
  EXPECT_EQ(page.points(3).step(), 1);
  req.set_start_step(2);
  v1::ReadSeriesResponse next;
  grpc::ClientContext ctx2;
  ASSERT_TRUE(query->ReadSeries(&ctx2, req, &next).ok());
  EXPECT_EQ(next.points(0).step(), 2);
  auto q = QueryClient::Connect(collector.address());
  auto all = q->ReadSeries("two", "loss");
  SONDE_ASSERT_OK(all);
  EXPECT_EQ(all->size(), 10u);
}

// Two workers in two modes at each global step: the step list has two
// entries per number, and a page never separates them (the next page
// starts past the number).
TEST(Paging, AStepListPageHoldsEveryEntryOfItsLastNumber) {
  InProcessCollector collector;
  std::vector<std::unique_ptr<Hook>> hooks;
  ASSERT_NO_FATAL_FAILURE(TwoWorkers(collector.address(), "modes", &hooks));
  hooks[0]->SetMode(v1::MODE_TRAIN);
  hooks[1]->SetMode(v1::MODE_EVAL);
  for (int step = 0; step < 4; ++step) {
    for (int worker = 0; worker < 2; ++worker) {
      hooks[worker]->StartStep();
      SONDE_ASSERT_OK(hooks[worker]->SaveScalar("loss", step + worker, {"losses"}));
    }
  }
  for (auto& h : hooks) SONDE_ASSERT_OK(h->Close());
  auto q = QueryClient::Connect(collector.address());
  auto all = q->ListSteps("modes");
  SONDE_ASSERT_OK(all);
  ASSERT_EQ(all->size(), 8u);  // one entry per step and mode
  auto query = v1::Query::NewStub(
      grpc::CreateChannel(collector.address(), grpc::InsecureChannelCredentials()));
  v1::ListStepsRequest req;
  req.set_job("modes");
  req.set_max_steps(1);
  v1::ListStepsResponse page;
  grpc::ClientContext ctx;
  ASSERT_TRUE(query->ListSteps(&ctx, req, &page).ok());
  ASSERT_EQ(page.steps_size(), 2);  // before: 1, and the next page skipped the other
  EXPECT_TRUE(page.truncated());
  EXPECT_EQ(page.steps(0).step(), 0);
  EXPECT_EQ(page.steps(1).step(), 0);
  EXPECT_NE(page.steps(0).mode(), page.steps(1).mode());
}

// A peer that says its pages are cut but sends nothing in them: a reader
// that asked again would loop, one that stopped would return a short list
// as if it were whole.
class StallingQuery final : public v1::Query::Service {
 public:
  grpc::Status ListSteps(grpc::ServerContext*, const v1::ListStepsRequest*,
                         v1::ListStepsResponse* response) override {
    response->set_truncated(true);
    return grpc::Status::OK;
  }
  grpc::Status ReadSeries(grpc::ServerContext*, const v1::ReadSeriesRequest* request,
                          v1::ReadSeriesResponse* response) override {
    // A point before where it was asked to start: no progress either.
    v1::SeriesPoint* p = response->add_points();
    p->set_step(request->start_step() - 1);
    response->set_truncated(true);
    return grpc::Status::OK;
  }
};

TEST(Paging, APageCutWithoutProgressIsAnError) {
  StallingQuery service;
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
  builder.RegisterService(&service);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  ASSERT_NE(server, nullptr);
  auto q = QueryClient::Connect("127.0.0.1:" + std::to_string(port));
  EXPECT_THAT(q->ListSteps("any"),
              StatusIs(absl::StatusCode::kInternal, "cut its answer of steps from step 0"));
  EXPECT_THAT(q->ReadSeries("any", "loss"),
              StatusIs(absl::StatusCode::kInternal, "without going past it"));
  server->Shutdown();
}

// 25,000 names of 250 bytes (7 MB of TensorInfo): more than one answer
// carries. Before, ListTensors failed with RESOURCE_EXHAUSTED.
TEST(Paging, ManyTensorNamesAreListedInPagesWithTheirFilters) {
  InProcessCollector collector;
  HookOptions o;
  o.collector = collector.address();
  o.job = "names";
  o.spool_dir = "";
  o.config.save_config = SaveConfig::Every(1);
  o.config.include_collections = {"weights", "gradients"};
  auto hook = Hook::Create(o);
  SONDE_ASSERT_OK(hook);
  constexpr int kNames = 25000;
  const std::string stem(240, 'n');
  std::vector<float> w(1, 1.0f);
  (*hook)->StartStep();
  for (int t = 0; t < kNames; ++t) {
    SONDE_ASSERT_OK((*hook)->SaveTensor(absl::StrCat(stem, 100000 + t), HostTensor(w.data(), {1}),
                                        {t % 2 == 0 ? "weights" : "gradients"}));
  }
  SONDE_ASSERT_OK((*hook)->Close());

  auto q = QueryClient::Connect(collector.address(), absl::Seconds(60));
  auto all = q->ListTensors("names");
  SONDE_ASSERT_OK(all);
  ASSERT_EQ(all->size(), static_cast<size_t>(kNames));
  for (int t = 0; t < kNames; ++t) {
    ASSERT_EQ((*all)[t].name(), absl::StrCat(stem, 100000 + t));  // each once, in order
  }
  auto gradients = q->ListTensors("names", "gradients");
  SONDE_ASSERT_OK(gradients);
  ASSERT_EQ(gradients->size(), static_cast<size_t>(kNames / 2));
  EXPECT_EQ(gradients->front().name(), absl::StrCat(stem, 100001));
  auto some = q->ListTensors("names", "", "12[0-9]{3}$");
  SONDE_ASSERT_OK(some);
  EXPECT_EQ(some->size(), 1000u);

  auto query = v1::Query::NewStub(
      grpc::CreateChannel(collector.address(), grpc::InsecureChannelCredentials()));
  v1::ListTensorsRequest req;
  req.set_job("names");
  req.set_max_tensors(7);
  req.set_start_after(absl::StrCat(stem, 100010));
  v1::ListTensorsResponse page;
  grpc::ClientContext ctx;
  ASSERT_TRUE(query->ListTensors(&ctx, req, &page).ok());
  ASSERT_EQ(page.tensors_size(), 7);
  EXPECT_TRUE(page.truncated());
  EXPECT_EQ(page.tensors(0).name(), absl::StrCat(stem, 100011));
  // By size alone: about 3 MiB, however many were asked for.
  req.clear_start_after();
  req.set_max_tensors(1000000);
  v1::ListTensorsResponse big;
  grpc::ClientContext ctx2;
  ASSERT_TRUE(query->ListTensors(&ctx2, req, &big).ok());
  EXPECT_TRUE(big.truncated());
  EXPECT_LT(big.ByteSizeLong(), size_t{4} << 20);
  EXPECT_GT(big.tensors_size(), 10000);
}

// GLOBAL's mode steps are not global steps once a job switches modes: a
// page of GLOBAL steps from a global step still starts there.
TEST(Paging, GlobalStepsOfAJobThatSwitchesModesPageByGlobalStep) {
  InProcessCollector collector;
  HookOptions o;
  o.collector = collector.address();
  o.job = "switching";
  o.spool_dir = "";
  o.config.save_config = SaveConfig::Every(1);
  auto hook = Hook::Create(o);
  SONDE_ASSERT_OK(hook);
  for (int step = 0; step < 30; ++step) {
    // Global steps 0-9 and 20-29 in GLOBAL (mode steps 0-19), 10-19 in TRAIN.
    (*hook)->SetMode(step >= 10 && step < 20 ? v1::MODE_TRAIN : v1::MODE_GLOBAL);
    (*hook)->StartStep();
    SONDE_ASSERT_OK((*hook)->SaveScalar("loss", step, {"losses"}));
  }
  SONDE_ASSERT_OK((*hook)->Close());
  auto query = v1::Query::NewStub(
      grpc::CreateChannel(collector.address(), grpc::InsecureChannelCredentials()));
  v1::ListStepsRequest req;
  req.set_job("switching");
  req.set_mode(v1::MODE_GLOBAL);
  req.set_start_step(15);
  req.set_max_steps(4);
  v1::ListStepsResponse page;
  grpc::ClientContext ctx;
  ASSERT_TRUE(query->ListSteps(&ctx, req, &page).ok());
  ASSERT_EQ(page.steps_size(), 4);
  EXPECT_EQ(page.steps(0).step(), 20);
  EXPECT_EQ(page.steps(0).mode_step(), 10);
  EXPECT_TRUE(page.truncated());
  auto q = QueryClient::Connect(collector.address());
  auto global = q->ListSteps("switching", v1::MODE_GLOBAL);
  SONDE_ASSERT_OK(global);
  EXPECT_EQ(global->size(), 20u);
  auto train = q->ListSteps("switching", v1::MODE_TRAIN);
  SONDE_ASSERT_OK(train);
  ASSERT_EQ(train->size(), 10u);
  EXPECT_EQ(train->front().step(), 10);
}

// A series by global step across modes (blocks of TRAIN, EVAL, PREDICT and
// GLOBAL steps, two workers) reads back the same in pages of any size, from
// any start, as in one answer; the GLOBAL mode alone too; every worker's
// points and each worker's. Worker 1 takes one TRAIN step more first, so
// the workers' mode steps disagree on global steps. (A page of one
// worker's points reads each mode from where its global steps reach the
// page's start, not the job from its first step.)
TEST(Paging, ASeriesByGlobalStepAcrossModesPagesLikeOneRead) {
  InProcessCollector collector;
  constexpr int kSteps = 120;
  const v1::Mode kBlocks[] = {v1::MODE_TRAIN, v1::MODE_EVAL, v1::MODE_TRAIN, v1::MODE_PREDICT,
                              v1::MODE_GLOBAL, v1::MODE_TRAIN, v1::MODE_GLOBAL};
  std::vector<std::unique_ptr<Hook>> hooks;
  ASSERT_NO_FATAL_FAILURE(TwoWorkers(collector.address(), "modes", &hooks));
  hooks[1]->SetMode(v1::MODE_TRAIN);
  hooks[1]->StartStep();  // global step 0, TRAIN step 0 of worker 1 only
  SONDE_ASSERT_OK(hooks[1]->SaveScalar("loss", 1, {"losses"}));
  for (int step = 0; step < kSteps; ++step) {
    const v1::Mode mode = kBlocks[(step / 6) % 7];  // blocks of 6 steps
    for (int worker = 0; worker < 2; ++worker) {
      hooks[worker]->SetMode(mode);
      hooks[worker]->StartStep();
      // The loss on every step of worker 0, every third of worker 1.
      if (worker == 0 || step % 3 == 0) {
        // Worker 1's global steps are one past the loop's.
        SONDE_ASSERT_OK(
            hooks[worker]->SaveScalar("loss", (step + worker) * 10 + worker, {"losses"}));
      }
    }
  }
  for (auto& h : hooks) SONDE_ASSERT_OK(h->Close());
  auto query = v1::Query::NewStub(
      grpc::CreateChannel(collector.address(), grpc::InsecureChannelCredentials()));
  auto read = [&](v1::Mode mode, int32_t worker, int64_t start, uint32_t max_points,
                  v1::ReadSeriesResponse* out) {
    v1::ReadSeriesRequest req;
    req.set_job("modes");
    req.set_tensor("loss");
    req.set_worker(worker);
    req.set_mode(mode);
    req.set_start_step(start);
    req.set_max_points(max_points);
    grpc::ClientContext ctx;
    return query->ReadSeries(&ctx, req, out);
  };
  auto key = [](const v1::SeriesPoint& p) {
    return std::make_tuple(p.step(), p.worker(), p.mode(), p.mode_step(),
                           p.statistics().max());
  };
  for (v1::Mode mode : {v1::MODE_UNSPECIFIED, v1::MODE_GLOBAL}) {
    for (int32_t worker : {-1, 0, 1}) {
      v1::ReadSeriesResponse whole;
      ASSERT_TRUE(read(mode, worker, 0, 0, &whole).ok());
      ASSERT_FALSE(whole.truncated());
      // Every point of worker 0, a third of worker 1's, and worker 1's first.
      if (mode == v1::MODE_UNSPECIFIED) {
        ASSERT_EQ(whole.points_size(),
                  (worker <= 0 ? kSteps : 0) + (worker != 0 ? kSteps / 3 + 1 : 0));
      } else {
        ASSERT_GT(whole.points_size(), 0);
      }
      std::vector<std::tuple<int64_t, int32_t, int, int64_t, double>> want;
      for (const auto& p : whole.points()) {
        ASSERT_EQ(p.statistics().max(), p.step() * 10 + p.worker());
        want.push_back(key(p));
      }
      ASSERT_TRUE(std::is_sorted(want.begin(), want.end(), [](const auto& a, const auto& b) {
        return std::get<0>(a) < std::get<0>(b);
      }));
      for (uint32_t page_size : {1u, 2u, 5u, 13u}) {
        for (int64_t first : {int64_t{0}, int64_t{7}, int64_t{31}, int64_t{100}}) {
          std::vector<std::tuple<int64_t, int32_t, int, int64_t, double>> got;
          int64_t start = first;
          for (int pages = 0;; ++pages) {
            ASSERT_LT(pages, 1000) << "no end";
            v1::ReadSeriesResponse page;
            ASSERT_TRUE(read(mode, worker, start, page_size, &page).ok());
            for (const auto& p : page.points()) got.push_back(key(p));
            if (!page.truncated()) break;
            ASSERT_GT(page.points_size(), 0);
            start = page.points(page.points_size() - 1).step() + 1;
          }
          std::vector<std::tuple<int64_t, int32_t, int, int64_t, double>> tail;
          for (const auto& k : want) {
            if (std::get<0>(k) >= first) tail.push_back(k);
          }
          EXPECT_EQ(got, tail) << "mode " << mode << ", worker " << worker << ", pages of "
                               << page_size << " from " << first;
        }
      }
    }
  }
}

// Every worker's points of a tensor saved on few steps (3 of 6,000, the
// other steps saving another tensor) read in pages like in one answer: a
// page walks the global step index at most about 4,096 steps past its
// first point before it ends, so reading on walks the job once.
TEST(Paging, ASparseSeriesOfEveryWorkerPagesLikeOneRead) {
  InProcessCollector collector;
  std::vector<std::unique_ptr<Hook>> hooks;
  ASSERT_NO_FATAL_FAILURE(TwoWorkers(collector.address(), "sparse", &hooks));
  constexpr int kSteps = 6000;
  for (int step = 0; step < kSteps; ++step) {
    for (int worker = 0; worker < 2; ++worker) {
      hooks[worker]->StartStep();
      SONDE_ASSERT_OK(hooks[worker]->SaveScalar("other", step, {"losses"}));
      if (step % 2500 == 0) {
        SONDE_ASSERT_OK(hooks[worker]->SaveScalar("loss", step * 10 + worker, {"losses"}));
      }
    }
  }
  for (auto& h : hooks) SONDE_ASSERT_OK(h->Close());
  auto query = v1::Query::NewStub(
      grpc::CreateChannel(collector.address(), grpc::InsecureChannelCredentials()));
  for (uint32_t page_size : {0u, 1u, 13u}) {
    std::vector<std::pair<int64_t, int32_t>> got;
    int64_t start = 0;
    int pages = 0;
    while (true) {
      ASSERT_LT(pages++, 100) << "no end";
      v1::ReadSeriesRequest req;
      req.set_job("sparse");
      req.set_tensor("loss");
      req.set_worker(-1);
      req.set_start_step(start);
      req.set_max_points(page_size);
      v1::ReadSeriesResponse page;
      grpc::ClientContext ctx;
      ASSERT_TRUE(query->ReadSeries(&ctx, req, &page).ok());
      for (const auto& p : page.points()) {
        EXPECT_EQ(p.statistics().max(), p.step() * 10 + p.worker());
        got.emplace_back(p.step(), p.worker());
      }
      if (!page.truncated()) break;
      ASSERT_GT(page.points_size(), 0);
      start = page.points(page.points_size() - 1).step() + 1;
    }
    const std::vector<std::pair<int64_t, int32_t>> want = {{0, 0},    {0, 1},    {2500, 0},
                                                           {2500, 1}, {5000, 0}, {5000, 1}};
    EXPECT_EQ(got, want) << "pages of " << page_size;
    // One answer; pages of 1: a step's two workers each; pages of 13: the
    // first ends after walking 4,096 steps (past step 2500's points), the
    // second holds step 5000's (without the walk's end, one page of 6).
    EXPECT_EQ(pages, page_size == 0 ? 1 : page_size == 1 ? 3 : 2) << "pages of " << page_size;
  }
}

}  // namespace
}  // namespace sonde
