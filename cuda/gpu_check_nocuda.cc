// gpu_check in a build without CUDA: says so.
#include <cstdio>

#include "cuda/device_stats.h"

int main() {
  std::printf("gpu_check: no GPU to check: %s\n",
              std::string(sonde::DeviceStats::Probe(0).message()).c_str());
  return 0;
}
