// Writes the seed corpus (corpus_seeds.h) to <folder>/<target>/<seed name>:
//   bazel run //tests/fuzz:make_corpus            (into tests/fuzz/corpus)
//   bazel run //tests/fuzz:make_corpus -- /tmp/c  (anywhere else)
// Other files in the folders (crash inputs kept as regressions) are left.
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

#include "tests/fuzz/corpus_seeds.h"

int main(int argc, char** argv) {
  std::filesystem::path root;
  if (argc > 1) {
    root = argv[1];
  } else if (const char* ws = std::getenv("BUILD_WORKSPACE_DIRECTORY")) {
    root = std::filesystem::path(ws) / "tests/fuzz/corpus";
  } else {
    std::fprintf(stderr, "usage: %s FOLDER (or run it with bazel run)\n", argv[0]);
    return 2;
  }
  for (const sonde::fuzz::FuzzTarget& target : sonde::fuzz::FuzzTargets()) {
    const std::filesystem::path dir = root / target.name;
    std::error_code ec;
    std::filesystem::create_directories(dir, ec);
    if (ec) {
      std::fprintf(stderr, "cannot make %s: %s\n", dir.c_str(), ec.message().c_str());
      return 1;
    }
    int written = 0;
    for (const sonde::fuzz::Seed& seed : target.seeds()) {
      std::ofstream out(dir / seed.name, std::ios::binary | std::ios::trunc);
      out.write(seed.bytes.data(), static_cast<std::streamsize>(seed.bytes.size()));
      if (!out) {
        std::fprintf(stderr, "cannot write %s\n", (dir / seed.name).c_str());
        return 1;
      }
      ++written;
    }
    std::printf("%s: %d seeds in %s\n", target.name.c_str(), written, dir.c_str());
  }
  return 0;
}
