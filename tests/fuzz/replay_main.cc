// main() for a fuzz target built without libFuzzer (the ordinary gcc
// build): runs LLVMFuzzerTestOneInput once on every file named on the
// command line, or on every file of a named folder, so a crash input found
// by deploy/fuzz.sh can be replayed under a debugger:
//   bazel run //tests/fuzz:chunks_fuzzer -- /path/to/crash-1234
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);

namespace {

int RunFile(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    std::fprintf(stderr, "cannot read %s\n", path.c_str());
    return 1;
  }
  const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::fprintf(stderr, "running %s (%zu bytes)\n", path.c_str(), bytes.size());
  LLVMFuzzerTestOneInput(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: %s FILE_OR_FOLDER...\n", argv[0]);
    return 2;
  }
  int failed = 0;
  int ran = 0;
  for (int i = 1; i < argc; ++i) {
    const std::filesystem::path arg(argv[i]);
    if (std::filesystem::is_directory(arg)) {
      for (const auto& entry : std::filesystem::directory_iterator(arg)) {
        if (!entry.is_regular_file()) continue;
        failed += RunFile(entry.path());
        ++ran;
      }
    } else {
      failed += RunFile(arg);
      ++ran;
    }
  }
  std::fprintf(stderr, "ran %d inputs, %d unreadable\n", ran, failed);
  return failed == 0 ? 0 : 1;
}
