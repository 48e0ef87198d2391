// Reads a hook configuration in the JSON shape of SageMaker's
// debughookconfig.json (what smdebug's Hook.create_from_json_file reads):
//   {"LocalPath": "...",                      (ignored: Sonde streams)
//    "HookParameters": {"save_interval": "10", "reductions": "mean,abs_max",
//                       "save_raw_tensor": "false", "include_regex": "fc1.*",
//                       "save_all": "false", "collector": "host:port", "job": "name"},
//    "CollectionConfigurations": [
//      {"CollectionName": "weights", "CollectionParameters": {"save_interval": "100"}}]}
// All values are strings, as SageMaker writes them. Save keys may carry mode
// prefixes ("train.save_interval"). "collector" and "job" are Sonde's
// additions and come back in `sonde_parameters`. Thread-safe.
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
  std::map<std::string, std::string> sonde_parameters;  // collector, job
};

absl::StatusOr<ParsedHookConfig> ParseHookConfigJson(absl::string_view json);

}  // namespace sonde

#endif  // SONDE_CLIENT_HOOK_CONFIG_JSON_H_
