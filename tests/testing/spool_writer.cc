// A training process for the spool tests that dies by kill -9: it streams
// `--steps` steps of "w" (`--floats` floats, the values of StepValues) and a
// loss to `--collector` (which is down), waits until its spool holds them
// all, prints "spooled <n>" and sends itself SIGKILL: no close, no
// destructor, nothing flushed.
#include <signal.h>

#include <cstdint>
#include <cstdlib>
#include <iostream>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/time/clock.h"
#include "client/hook.h"
#include "tests/testing/wait.h"

ABSL_FLAG(std::string, collector, "", "collector address (down)");
ABSL_FLAG(std::string, spool_dir, "", "spool directory");
ABSL_FLAG(std::string, job, "killed", "job name");
ABSL_FLAG(int64_t, steps, 10, "steps to save");
ABSL_FLAG(int64_t, floats, 1000, "floats of w per step");

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  sonde::HookOptions o;
  o.collector = absl::GetFlag(FLAGS_collector);
  o.job = absl::GetFlag(FLAGS_job);
  o.spool_dir = absl::GetFlag(FLAGS_spool_dir);
  o.upload_left_spools = false;
  o.config.save_config = sonde::SaveConfig::Every(1);
  o.config.include_collections = {"weights", "losses"};
  auto hook = sonde::Hook::Create(o);
  if (!hook.ok()) {
    std::cerr << hook.status() << "\n";
    return 1;
  }
  const int64_t steps = absl::GetFlag(FLAGS_steps);
  const int64_t n = absl::GetFlag(FLAGS_floats);
  for (int64_t step = 0; step < steps; ++step) {
    (*hook)->StartStep();
    std::vector<float> w(n);
    for (int64_t i = 0; i < n; ++i) w[i] = static_cast<float>(step) * 1000.0f + i * 0.25f;
    if (!(*hook)->SaveTensor("w", sonde::HostTensor(w.data(), {n}), {"weights"}).ok() ||
        !(*hook)->SaveScalar("loss", static_cast<double>(step), {"losses"}).ok()) {
      return 1;
    }
  }
  (*hook)->StartStep();  // ends the last step; this one stays open (and is lost)
  if (!sonde::testing::WaitUntil(
          [&] { return (*hook)->counters().entries_spooled >= static_cast<uint64_t>(steps); },
          absl::Seconds(60))) {
    return 2;
  }
  std::cout << "spooled " << (*hook)->counters().entries_spooled << std::endl;
  ::raise(SIGKILL);
  return 3;
}
