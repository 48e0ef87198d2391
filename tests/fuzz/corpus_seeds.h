// The seed corpus of every fuzz target, built from real messages (split
// tensors, valid statistics and histograms, real keys) rather than typed by
// hand. make_corpus writes them to tests/fuzz/corpus/<target>/<name>, where
// they are committed; corpus_test checks the committed files still equal
// what this generates, and replays every file of the folder.
// Thread-safe; no state.
#ifndef SONDE_TESTS_FUZZ_CORPUS_SEEDS_H_
#define SONDE_TESTS_FUZZ_CORPUS_SEEDS_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace sonde::fuzz {

struct Seed {
  std::string name;   // file name: "seed-" and what it exercises
  std::string bytes;
};

struct FuzzTarget {
  std::string name;  // corpus folder and fuzzer binary: <name>_fuzzer
  int (*fuzz)(const uint8_t* data, size_t size);
  std::vector<Seed> (*seeds)();
};

std::vector<Seed> ChunkSeeds();
std::vector<Seed> KeySeeds();
std::vector<Seed> IngestSeeds();
std::vector<Seed> PatternSeeds();

// "chunks", "keys", "ingest" and "patterns".
const std::vector<FuzzTarget>& FuzzTargets();

}  // namespace sonde::fuzz

#endif  // SONDE_TESTS_FUZZ_CORPUS_SEEDS_H_
