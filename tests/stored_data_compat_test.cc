// A database written by an earlier collector still reads, the same.
//
// tests/testdata/db_99d18cc is the RocksDB database the collector of commit
// 99d18cc wrote while examples/demo ran against it (a healthy job and one
// stopped by ExplodingTensor); db_99d18cc.golden.txt is what the Query
// service answered about it before the records left the service protos
// (commit 2d78302). This test opens a copy with today's
// collector and compares every answer, over real gRPC, to the golden text:
// moving messages between .proto files, or any other change, must keep
// stored records readable (field numbers and the package are the schema).
//
// To regenerate the golden text (only when the answers are meant to change):
//   SONDE_WRITE_GOLDEN=$PWD/tests/testdata/db_99d18cc.golden.txt
//     bazel test //tests:stored_data_compat_test --test_env=SONDE_WRITE_GOLDEN
//     --spawn_strategy=local
//   (one command line)
#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "client/query_client.h"
#include "common/crc32c.h"
#include "google/protobuf/text_format.h"
#include "gtest/gtest.h"
#include "server/collector.h"
#include "tests/testing/status_matchers.h"
#include "tests/testing/temp_dir.h"

namespace sonde {
namespace {

namespace fs = std::filesystem;

std::string Runfile(const std::string& path) {
  const char* srcdir = std::getenv("TEST_SRCDIR");
  const char* workspace = std::getenv("TEST_WORKSPACE");
  return absl::StrCat(srcdir ? srcdir : ".", "/", workspace ? workspace : "sonde", "/", path);
}

std::string Text(const google::protobuf::Message& m) {
  std::string out;
  google::protobuf::TextFormat::Printer printer;
  printer.SetSingleLineMode(true);
  printer.PrintToString(m, &out);
  return out;
}

// Everything the Query service answers about the stored jobs, one line a
// record, in a stable order.
void Dump(QueryClient& q, std::ostream& out) {
  auto jobs = q.ListJobs();
  ASSERT_TRUE(jobs.ok()) << jobs.status();
  ASSERT_FALSE(jobs->empty());
  std::sort(jobs->begin(), jobs->end(),
            [](const v1::JobInfo& a, const v1::JobInfo& b) { return a.job() < b.job(); });
  for (const v1::JobInfo& listed : *jobs) {
    auto job = q.GetJob(listed.job());
    ASSERT_TRUE(job.ok()) << job.status();
    out << "job " << Text(*job) << "\n";
    auto steps = q.ListSteps(listed.job());
    ASSERT_TRUE(steps.ok()) << steps.status();
    for (const v1::StepInfo& s : *steps) out << "step " << Text(s) << "\n";
    auto tensors = q.ListTensors(listed.job());
    ASSERT_TRUE(tensors.ok()) << tensors.status();
    for (const v1::TensorInfo& t : *tensors) {
      out << "tensor " << Text(t) << "\n";
      auto series = q.ReadSeries(listed.job(), t.name());
      ASSERT_TRUE(series.ok()) << series.status();
      for (const v1::SeriesPoint& p : *series) out << "  point " << Text(p) << "\n";
      if (steps->empty()) continue;
      // The values at the first and the last stored step, by checksum.
      for (int64_t step : {steps->front().step(), steps->back().step()}) {
        auto value = q.ReadTensor(listed.job(), t.name(), step);
        if (!value.ok()) {
          out << "  value step " << step << ": " << value.status().code() << "\n";
          continue;
        }
        out << "  value step " << step << ": " << value->bytes.size() << " bytes, crc32c "
            << absl::StrFormat("%08x", Crc32c(value->bytes)) << ", header "
            << Text(value->header) << "\n";
      }
    }
    auto results = q.RuleResults(listed.job());
    ASSERT_TRUE(results.ok()) << results.status();
    for (const v1::RuleResult& r : *results) out << "rule " << Text(r) << "\n";
  }
}

TEST(StoredDataCompat, ADatabaseWrittenBefore99d18ccReadsTheSame) {
  testing::TempDir dir;
  const std::string db = dir.Sub("db");
  fs::copy(Runfile("tests/testdata/db_99d18cc"), db, fs::copy_options::recursive);
  for (const auto& e : fs::directory_iterator(db)) {
    fs::permissions(e.path(), fs::perms::owner_read | fs::perms::owner_write,
                    fs::perm_options::add);
  }
  server::CollectorOptions o;
  o.listen = "127.0.0.1:0";
  o.data_dir = db;
  auto collector = server::Collector::Start(o);
  SONDE_ASSERT_OK(collector);
  auto q = QueryClient::Connect((*collector)->address());
  ASSERT_NE(q, nullptr);
  std::ostringstream now;
  Dump(*q, now);
  ASSERT_FALSE(HasFatalFailure());

  if (const char* write = std::getenv("SONDE_WRITE_GOLDEN"); write != nullptr && *write) {
    std::ofstream(write) << now.str();
    GTEST_SKIP() << "wrote the golden text to " << write;
  }
  std::ifstream golden_file(Runfile("tests/testdata/db_99d18cc.golden.txt"));
  ASSERT_TRUE(golden_file.good());
  std::stringstream golden;
  golden << golden_file.rdbuf();
  // Line by line, so a difference names its record.
  std::istringstream a(golden.str()), b(now.str());
  std::string la, lb;
  int line = 0;
  while (true) {
    const bool more_a = static_cast<bool>(std::getline(a, la));
    const bool more_b = static_cast<bool>(std::getline(b, lb));
    ++line;
    if (!more_a && !more_b) break;
    ASSERT_EQ(more_a, more_b) << "line " << line << ": golden has " << (more_a ? la : "<end>")
                              << "\nnow: " << (more_b ? lb : "<end>");
    ASSERT_EQ(la, lb) << "line " << line;
  }
  EXPECT_GT(line, 100);  // the demo's two jobs: steps, tensors, points, rule results
}

}  // namespace
}  // namespace sonde
