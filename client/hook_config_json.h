// Reads a hook configuration in the JSON shape of SageMaker's
// debughookconfig.json (what smdebug's Hook.create_from_json_file reads):
//   {"LocalPath": "...",                      (ignored: Sonde streams)
//    "HookParameters": {"save_interval": "10", "reductions": "mean,abs_max",
//                       "save_raw_tensor": "false", "include_regex": "fc1.*",
//                       "save_all": "false", "collector": "host:port", "job": "name"},
//    "CollectionConfigurations": [
//      {"CollectionName": "weights", "CollectionParameters": {"save_interval": "100"}}]}
// All values are strings, as SageMaker writes them. Save keys may carry mode
// prefixes ("train.save_interval"). "collector" and "job" (Sonde's
// additions), "export_tensorboard" (checked: true or false) and
// "include_workers" (checked: one or all; only the Python hook, which knows
// the rank, acts on it) come back in `sonde_parameters`. "tensorboard_dir"
// (the collector decides where files go), "dry_run", "save_shape" and
// "save_histogram" are accepted and have no effect. Thread-safe.
#ifndef SONDE_CLIENT_HOOK_CONFIG_JSON_H_
#define SONDE_CLIENT_HOOK_CONFIG_JSON_H_

#include <map>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "client/collections.h"

namespace sonde {

struct ParsedHookConfig {
  HookConfig config;
  // collector, job, export_tensorboard ("true"/"false"), include_workers.
  std::map<std::string, std::string> sonde_parameters;
};

absl::StatusOr<ParsedHookConfig> ParseHookConfigJson(absl::string_view json);

}  // namespace sonde

#endif  // SONDE_CLIENT_HOOK_CONFIG_JSON_H_
