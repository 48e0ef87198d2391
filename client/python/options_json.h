// The Python hook's options, as the JSON document sonde/torch/hook.py
// writes (one place to parse and test them):
//   {"collector": "host:port", "job": "name", "worker": 0, "world_size": 1,
//    "metadata": {"k": "v"}, "rules": "ExplodingTensor(actions=StopTraining)",
//    "token": "", "ca_file": "", "cert_file": "", "key_file": "",
//    "server_name_override": "",
//    "max_queue_bytes": 268435456, "max_chunk_bytes": 1048576,
//    "backpressure": "spill" | "drop" | "block", "spill_dir": "",
//    "max_spill_bytes": 4294967296, "max_block_seconds": 1,
//    "close_timeout_seconds": 30,
//    "profiler": {"enabled": false, "interval_seconds": 0.5, "system": true,
//                 "framework": true, "nvml_library": "libnvidia-ml.so.1"},
//    "config_file": "debughookconfig.json",     (SageMaker's hook config)
//    "config": {"save_config": SAVE, "reduction_config": RED | null,
//               "include_regex": [...], "include_collections": [...],
//               "save_all": false,
//               "collections": [{"name": "...", "include_regex": [...],
//                                "save_config": SAVE | null,
//                                "reduction_config": RED | null,
//                                "save_histogram": false}]}}
//   SAVE: {"1": MODE, "2": MODE, "3": MODE, "4": MODE} keyed by mode number,
//   MODE: {"save_interval": 500, "start_step": 0, "end_step": null,
//          "save_steps": [...]}
//   RED:  {"reductions": [...], "abs_reductions": [...], "norms": [...],
//          "abs_norms": [...], "save_raw_tensor": false}
// Every key is optional except "job" (which a config file may supply).
// Unknown keys are errors, so a misspelt option is never silently ignored.
#ifndef SONDE_CLIENT_PYTHON_OPTIONS_JSON_H_
#define SONDE_CLIENT_PYTHON_OPTIONS_JSON_H_

#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "client/hook.h"

namespace sonde {

struct PythonHookOptions {
  HookOptions options;
  std::string config_file;  // SageMaker hook-config JSON to apply, if any
};

absl::StatusOr<PythonHookOptions> ParsePythonHookOptions(absl::string_view json);

}  // namespace sonde

#endif  // SONDE_CLIENT_PYTHON_OPTIONS_JSON_H_
