// Runs every fuzz target, built with the ordinary compiler, over its
// committed seed corpus and over inputs derived from the seeds: the fuzz
// targets' properties become regression tests in `bazel test //...`. A
// violated property aborts the test binary (see FuzzFail); a target
// returning non-zero fails the test. Also checks that the seeds reach the
// states their names promise.
#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "tests/fuzz/chunks_fuzz.h"
#include "tests/fuzz/corpus_seeds.h"
#include "tests/fuzz/ingest_fuzz.h"

namespace sonde::fuzz {
namespace {

std::filesystem::path CorpusDir(const std::string& target) {
  const char* srcdir = std::getenv("TEST_SRCDIR");
  const char* workspace = std::getenv("TEST_WORKSPACE");
  std::filesystem::path root = srcdir != nullptr ? srcdir : ".";
  if (workspace != nullptr) root /= workspace;
  return root / "tests/fuzz/corpus" / target;
}

std::string ReadFile(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

int RunTarget(const FuzzTarget& target, const std::string& input) {
  return target.fuzz(reinterpret_cast<const uint8_t*>(input.data()), input.size());
}

class CorpusTest : public ::testing::TestWithParam<FuzzTarget> {};

TEST_P(CorpusTest, CommittedSeedsEqualWhatTheGeneratorMakes) {
  const std::vector<Seed> seeds = GetParam().seeds();
  ASSERT_GE(seeds.size(), 5u);
  for (const Seed& seed : seeds) {
    const std::filesystem::path path = CorpusDir(GetParam().name) / seed.name;
    ASSERT_TRUE(std::filesystem::exists(path))
        << path << " is missing: run `bazel run //tests/fuzz:make_corpus` and commit it";
    EXPECT_EQ(ReadFile(path), seed.bytes)
        << path << " differs from its generator: run `bazel run //tests/fuzz:make_corpus`";
  }
}

TEST_P(CorpusTest, EveryCorpusFilePasses) {
  const std::filesystem::path dir = CorpusDir(GetParam().name);
  ASSERT_TRUE(std::filesystem::is_directory(dir)) << dir;
  std::vector<std::filesystem::path> files;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    if (entry.is_regular_file()) files.push_back(entry.path());
  }
  std::sort(files.begin(), files.end());
  EXPECT_GE(files.size(), GetParam().seeds().size());
  for (const auto& path : files) {
    SCOPED_TRACE(path.string());
    const std::string bytes = ReadFile(path);
    EXPECT_LE(bytes.size(), 16u << 10) << "corpus files stay small";
    EXPECT_EQ(RunTarget(GetParam(), bytes), 0);
  }
}

// Every prefix length of every seed (at most 96 per seed, evenly spread),
// and seeds with a few bytes changed, inserted or removed.
TEST_P(CorpusTest, TruncatedAndMutatedSeedsPass) {
  std::mt19937 rng(20240501);
  int runs = 0;
  for (const Seed& seed : GetParam().seeds()) {
    const size_t n = seed.bytes.size();
    const size_t step = std::max<size_t>(1, n / 96);
    for (size_t len = 0; len < n; len += step) {
      ASSERT_EQ(RunTarget(GetParam(), seed.bytes.substr(0, len)), 0)
          << seed.name << " cut at " << len;
      ++runs;
    }
    for (int i = 0; i < 96 && n > 0; ++i) {
      std::string m = seed.bytes;
      const int edits = 1 + static_cast<int>(rng() % 4);
      for (int e = 0; e < edits && !m.empty(); ++e) {
        const size_t at = rng() % m.size();
        switch (rng() % 4) {
          case 0: m.erase(at, 1); break;
          case 1: m.insert(m.begin() + at, static_cast<char>(rng())); break;
          case 2: m[at] = static_cast<char>(m[at] ^ (1 << (rng() % 8))); break;
          default: m[at] = static_cast<char>(rng()); break;
        }
      }
      ASSERT_EQ(RunTarget(GetParam(), m), 0) << seed.name << " mutant " << i;
      ++runs;
    }
  }
  EXPECT_GT(runs, 100);
}

TEST_P(CorpusTest, RandomBytesPass) {
  std::mt19937 rng(7);
  for (int i = 0; i < 300; ++i) {
    std::string input(rng() % 600, '\0');
    for (char& c : input) c = static_cast<char>(rng());
    ASSERT_EQ(RunTarget(GetParam(), input), 0) << "random input " << i;
  }
}

INSTANTIATE_TEST_SUITE_P(Targets, CorpusTest, ::testing::ValuesIn(FuzzTargets()),
                         [](const ::testing::TestParamInfo<FuzzTarget>& info) {
                           return info.param.name;
                         });

// The seeds reach what their names say, so the corpus starts the fuzzer
// deep in the code rather than at the first parse error.
std::string SeedBytes(const std::vector<Seed>& seeds, const std::string& name) {
  for (const Seed& s : seeds) {
    if (s.name == name) return s.bytes;
  }
  ADD_FAILURE() << "no seed " << name;
  return "";
}

ChunkOutcome RunChunkSeed(const std::string& name) {
  const std::string b = SeedBytes(ChunkSeeds(), name);
  return RunChunkInput(reinterpret_cast<const uint8_t*>(b.data()), b.size());
}

IngestOutcome RunIngestSeed(const std::string& name) {
  const std::string b = SeedBytes(IngestSeeds(), name);
  return RunIngestInput(reinterpret_cast<const uint8_t*>(b.data()), b.size());
}

TEST(ChunkSeeds, ReachCompletionAndEachKindOfRefusal) {
  ChunkOutcome o = RunChunkSeed("seed-three-chunks-f32");
  EXPECT_EQ(o.accepted, 3);
  EXPECT_EQ(o.completed, 1);
  EXPECT_EQ(o.refused + o.crc_refused, 0);

  o = RunChunkSeed("seed-crc-mismatch-then-fixed");
  EXPECT_EQ(o.crc_refused, 1);
  EXPECT_EQ(o.accepted, 1);

  o = RunChunkSeed("seed-two-tensors-and-extra-chunk");
  EXPECT_EQ(o.completed, 2);
  EXPECT_EQ(o.refused, 1);  // the chunk after completion

  EXPECT_EQ(RunChunkSeed("seed-empty-tensor").completed, 1);
  EXPECT_EQ(RunChunkSeed("seed-default-limits-scalar").completed, 1);
  for (const char* refused : {"seed-out-of-order", "seed-fields-change-between-chunks",
                              "seed-oversized-chunk", "seed-shape-overflow"}) {
    o = RunChunkSeed(refused);
    EXPECT_GE(o.refused, 1) << refused;
    EXPECT_EQ(o.completed, 0) << refused;
  }
}

TEST(IngestSeeds, HappyPathsCommitAndEndTheJob) {
  IngestOutcome o = RunIngestSeed("seed-happy-path");
  EXPECT_EQ(o.joins, 1);
  EXPECT_EQ(o.commits, 2);
  EXPECT_EQ(o.job_ends, 1);
  EXPECT_EQ(o.errors, 0);

  o = RunIngestSeed("seed-two-workers");
  EXPECT_EQ(o.joins, 2);
  EXPECT_EQ(o.commits, 4);
  EXPECT_EQ(o.job_ends, 2);
  EXPECT_EQ(o.errors, 0);

  o = RunIngestSeed("seed-collector-restart");
  EXPECT_EQ(o.joins, 2);
  EXPECT_EQ(o.commits, 3);
  EXPECT_EQ(o.job_ends, 1);
  EXPECT_EQ(o.errors, 0);

  o = RunIngestSeed("seed-nan-stops-training");
  EXPECT_EQ(o.commits, 2);
  EXPECT_EQ(o.errors, 0);

  o = RunIngestSeed("seed-statistics-histogram-rule");
  EXPECT_EQ(o.commits, 1);
  EXPECT_EQ(o.job_ends, 1);
  EXPECT_EQ(o.errors, 0);
}

TEST(IngestSeeds, ErrorSeedsEndStreamsAndReconnect) {
  IngestOutcome o = RunIngestSeed("seed-protocol-errors");
  EXPECT_EQ(o.errors, 4);  // chunk before hello, bad seq, bad CRC, third tensor of 2
  EXPECT_EQ(o.joins, 2);

  o = RunIngestSeed("seed-default-limits");
  EXPECT_EQ(o.joins, 1);
  EXPECT_EQ(o.errors, 1);

  o = RunIngestSeed("seed-reconnect-resend");
  EXPECT_GE(o.joins, 2);
  EXPECT_GE(o.commits, 2);
}

}  // namespace
}  // namespace sonde::fuzz
