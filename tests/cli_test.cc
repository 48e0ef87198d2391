// The `sonde` CLI binary run as a user would, against a real collector.
#include <sys/wait.h>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "client/hook.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/testing/in_process_collector.h"
#include "tests/testing/status_matchers.h"

namespace sonde {
namespace {

struct CliRun {
  int exit_code;
  std::string out;  // stdout and stderr together
};

CliRun Cli(const std::string& args) {
  const char* srcdir = std::getenv("TEST_SRCDIR");
  const char* workspace = std::getenv("TEST_WORKSPACE");
  const std::string binary = absl::StrCat(srcdir ? srcdir : ".", "/",
                                          workspace ? workspace : "sonde", "/client/sonde");
  const std::string cmd = absl::StrCat(binary, " ", args, " 2>&1");
  CliRun r{-1, ""};
  FILE* p = popen(cmd.c_str(), "r");
  if (p == nullptr) return r;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof(buf), p)) > 0) r.out.append(buf, n);
  const int status = pclose(p);
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return r;
}

class CliTest : public ::testing::Test {
 protected:
  void SetUp() override {
    HookOptions o;
    o.collector = collector_.address();
    o.job = "cli-job";
    o.config.save_config = SaveConfig::Every(1);
    o.config.include_collections = {"weights", "losses"};
    auto hook = Hook::Create(o);
    SONDE_ASSERT_OK(hook);
    (*hook)->SetMode(v1::MODE_TRAIN);
    for (int step = 0; step < 5; ++step) {
      (*hook)->StartStep();
      std::vector<float> w = {0.5f * step, -1.0f, 2.0f};
      SONDE_ASSERT_OK((*hook)->SaveTensor("fc.weight", HostTensor(w.data(), {3}), {"weights"}));
      SONDE_ASSERT_OK((*hook)->SaveScalar("loss", 4.0 / (step + 1), {"losses"}));
    }
    SONDE_ASSERT_OK((*hook)->Close());
  }

  std::string Flags() const { return absl::StrCat("--collector=", collector_.address()); }

  testing::InProcessCollector collector_{"ExplodingTensor(actions=StopTraining)"};
};

TEST_F(CliTest, JobsJsonListsTheJobWithStatusAndLastStepPerMode) {
  CliRun r = Cli(absl::StrCat("jobs --json ", Flags()));
  ASSERT_EQ(r.exit_code, 0) << r.out;
  auto jobs = nlohmann::json::parse(r.out);
  ASSERT_TRUE(jobs.is_array());
  ASSERT_EQ(jobs.size(), 1u);
  EXPECT_EQ(jobs[0]["job"], "cli-job");
  EXPECT_EQ(jobs[0]["status"], "Finished");
  EXPECT_EQ(jobs[0]["last_step_by_mode"]["TRAIN"], 4);
}

TEST_F(CliTest, JobsTableIsReadable) {
  CliRun r = Cli(absl::StrCat("jobs ", Flags()));
  ASSERT_EQ(r.exit_code, 0) << r.out;
  EXPECT_NE(r.out.find("JOB"), std::string::npos);
  EXPECT_NE(r.out.find("cli-job"), std::string::npos);
  EXPECT_NE(r.out.find("TRAIN:4"), std::string::npos) << r.out;
}

TEST_F(CliTest, RulesJsonHasRuleStatusStepAndMessage) {
  // Wait for the end-of-job verdict through `watch`, which returns when the job is over.
  CliRun w = Cli(absl::StrCat("watch --json --job=cli-job --timeout=30s ", Flags()));
  ASSERT_EQ(w.exit_code, 0) << w.out;
  CliRun r = Cli(absl::StrCat("rules --json --job=cli-job ", Flags()));
  ASSERT_EQ(r.exit_code, 0) << r.out;
  auto rules = nlohmann::json::parse(r.out);
  ASSERT_EQ(rules.size(), 1u);
  EXPECT_EQ(rules[0]["rule"], "ExplodingTensor");
  EXPECT_EQ(rules[0]["status"], "NoIssuesFound");
  EXPECT_EQ(rules[0]["step"], 4);
  EXPECT_NE(rules[0]["message"].get<std::string>().find("no issues"), std::string::npos);
}

TEST_F(CliTest, ShowPrintsTheValuesOfOneStep) {
  CliRun r = Cli(absl::StrCat("show --json --job=cli-job --tensor=fc.weight --mode=TRAIN --step=3 ",
                           Flags()));
  ASSERT_EQ(r.exit_code, 0) << r.out;
  auto t = nlohmann::json::parse(r.out);
  EXPECT_EQ(t["dtype"], "float32");
  EXPECT_EQ(t["values"], nlohmann::json::array({1.5, -1.0, 2.0}));
  EXPECT_EQ(t["statistics"]["max"], 2.0);
  CliRun table = Cli(absl::StrCat("show --job=cli-job --tensor=fc.weight --step=3 ", Flags()));
  ASSERT_EQ(table.exit_code, 0) << table.out;
  EXPECT_NE(table.out.find("values: [1.5, -1, 2]"), std::string::npos) << table.out;
}

TEST_F(CliTest, SeriesTensorsAndStepsCoverTheRun) {
  CliRun s = Cli(absl::StrCat("series --json --job=cli-job --tensor=loss --mode=TRAIN --start=1 --end=3 ",
                           Flags()));
  ASSERT_EQ(s.exit_code, 0) << s.out;
  auto points = nlohmann::json::parse(s.out);
  ASSERT_EQ(points.size(), 2u);
  EXPECT_EQ(points[0]["mode_step"], 1);
  EXPECT_DOUBLE_EQ(points[1]["mean"].get<double>(), 4.0 / 3);
  CliRun t = Cli(absl::StrCat("tensors --job=cli-job --collection=weights ", Flags()));
  ASSERT_EQ(t.exit_code, 0) << t.out;
  EXPECT_NE(t.out.find("fc.weight"), std::string::npos);
  EXPECT_EQ(t.out.find("loss"), std::string::npos);
  CliRun st = Cli(absl::StrCat("steps --json --job=cli-job ", Flags()));
  ASSERT_EQ(st.exit_code, 0) << st.out;
  EXPECT_EQ(nlohmann::json::parse(st.out).size(), 5u);
}

TEST_F(CliTest, RuleCatalogListsRulesWithParametersAndDefaults) {
  CliRun r = Cli(absl::StrCat("rule-catalog --json ", Flags()));
  ASSERT_EQ(r.exit_code, 0) << r.out;
  auto rules = nlohmann::json::parse(r.out);
  const nlohmann::json* lnd = nullptr;
  for (const auto& rule : rules) {
    if (rule["rule"] == "LossNotDecreasing") lnd = &rule;
  }
  ASSERT_NE(lnd, nullptr) << r.out;
  EXPECT_EQ((*lnd)["source"], "built-in");
  bool found = false;
  for (const auto& p : (*lnd)["parameters"]) {
    if (p["name"] == "num_steps") {
      EXPECT_EQ(p["default"], "10");
      found = true;
    }
  }
  EXPECT_TRUE(found);
  CliRun table = Cli(absl::StrCat("rule-catalog ", Flags()));
  ASSERT_EQ(table.exit_code, 0);
  EXPECT_NE(table.out.find("ExplodingTensor (built-in)"), std::string::npos) << table.out;
}

TEST_F(CliTest, EnableRulesRegistersAPendingJob) {
  CliRun r = Cli(absl::StrCat("enable-rules --job=next-run --rules='LossNotDecreasing(num_steps=5)' ",
                              Flags()));
  ASSERT_EQ(r.exit_code, 0) << r.out;
  EXPECT_NE(r.out.find("will start with 1 rule(s): LossNotDecreasing"), std::string::npos) << r.out;
  CliRun jobs = Cli(absl::StrCat("jobs --json ", Flags()));
  EXPECT_NE(jobs.out.find("\"Pending\""), std::string::npos) << jobs.out;
  CliRun started = Cli(absl::StrCat("enable-rules --job=cli-job --rules=ExplodingTensor ", Flags()));
  EXPECT_EQ(started.exit_code, 1);
  EXPECT_NE(started.out.find("has started"), std::string::npos) << started.out;
}

TEST_F(CliTest, ErrorsSayWhatWasWrong) {
  CliRun missing = Cli(absl::StrCat("rules --job=nope ", Flags()));
  EXPECT_EQ(missing.exit_code, 3);
  EXPECT_NE(missing.out.find("no job named 'nope'"), std::string::npos) << missing.out;
  CliRun no_job = Cli(absl::StrCat("rules ", Flags()));
  EXPECT_EQ(no_job.exit_code, 2);
  EXPECT_NE(no_job.out.find("needs --job"), std::string::npos);
  CliRun unknown = Cli(absl::StrCat("frobnicate ", Flags()));
  EXPECT_EQ(unknown.exit_code, 2);
  CliRun bad_mode = Cli(absl::StrCat("steps --job=cli-job --mode=TEST ", Flags()));
  EXPECT_EQ(bad_mode.exit_code, 1);
  EXPECT_NE(bad_mode.out.find("unknown mode 'TEST'"), std::string::npos);
  CliRun down = Cli("jobs --collector=127.0.0.1:1");
  EXPECT_EQ(down.exit_code, 1);
  EXPECT_NE(down.out.find("UNAVAILABLE"), std::string::npos) << down.out;
}

TEST_F(CliTest, DeleteRemovesAnEndedJobAndSaysWhatItFreed) {
  // `watch` returns once the job is no longer live (its rules are done).
  CliRun w = Cli(absl::StrCat("watch --job=cli-job --timeout=30s ", Flags()));
  ASSERT_EQ(w.exit_code, 0) << w.out;
  CliRun r = Cli(absl::StrCat("delete --json --job=cli-job ", Flags()));
  ASSERT_EQ(r.exit_code, 0) << r.out;
  auto out = nlohmann::json::parse(r.out);
  EXPECT_EQ(out["job"], "cli-job");
  EXPECT_EQ(out["job_id"], 1);
  EXPECT_GT(out["approximate_bytes"].get<uint64_t>(), 0u);
  CliRun gone = Cli(absl::StrCat("job --job=cli-job ", Flags()));
  EXPECT_EQ(gone.exit_code, 3) << gone.out;
  CliRun again = Cli(absl::StrCat("delete --job=cli-job ", Flags()));
  EXPECT_EQ(again.exit_code, 3);
  EXPECT_NE(again.out.find("no job named 'cli-job'"), std::string::npos) << again.out;
  CliRun no_job = Cli(absl::StrCat("delete ", Flags()));
  EXPECT_EQ(no_job.exit_code, 2);
  EXPECT_NE(no_job.out.find("delete needs --job"), std::string::npos) << no_job.out;
}

}  // namespace
}  // namespace sonde
