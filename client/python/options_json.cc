#include "client/python/options_json.h"

#include <cstdint>
#include <limits>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status_macros.h"
#include "nlohmann/json.hpp"
#include "rules/rule_config.h"

namespace sonde {
namespace {

using nlohmann::json;

// Checks that `object` is an object whose keys are all in `allowed`.
absl::Status CheckKeys(const json& object, const std::set<std::string>& allowed,
                       const std::string& where) {
  if (!object.is_object()) return absl::InvalidArgumentError(absl::StrCat(where, " must be an object"));
  for (const auto& [key, value] : object.items()) {
    if (allowed.count(key) == 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "unknown option '", key, "' in ", where, " (known: ", absl::StrJoin(allowed, ", "), ")"));
    }
  }
  return absl::OkStatus();
}

absl::Status GetString(const json& o, const char* key, std::string* out) {
  if (!o.contains(key) || o[key].is_null()) return absl::OkStatus();
  if (!o[key].is_string()) return absl::InvalidArgumentError(absl::StrCat("'", key, "' must be a string"));
  *out = o[key].get<std::string>();
  return absl::OkStatus();
}

template <typename Int>
absl::Status GetInt(const json& o, const char* key, Int* out) {
  if (!o.contains(key) || o[key].is_null()) return absl::OkStatus();
  if (!o[key].is_number_integer()) {
    return absl::InvalidArgumentError(absl::StrCat("'", key, "' must be an integer"));
  }
  const int64_t v = o[key].get<int64_t>();
  if (v < 0) return absl::InvalidArgumentError(absl::StrCat("'", key, "' must not be negative"));
  if (static_cast<uint64_t>(v) > static_cast<uint64_t>(std::numeric_limits<Int>::max())) {
    return absl::InvalidArgumentError(
        absl::StrCat("'", key, "' is ", v, ", more than ", std::numeric_limits<Int>::max()));
  }
  *out = static_cast<Int>(v);
  return absl::OkStatus();
}

absl::Status GetSeconds(const json& o, const char* key, absl::Duration* out) {
  if (!o.contains(key) || o[key].is_null()) return absl::OkStatus();
  if (!o[key].is_number() || o[key].get<double>() < 0) {
    return absl::InvalidArgumentError(absl::StrCat("'", key, "' must be a number of seconds >= 0"));
  }
  *out = absl::Seconds(o[key].get<double>());
  return absl::OkStatus();
}

absl::Status GetBool(const json& o, const char* key, bool* out) {
  if (!o.contains(key) || o[key].is_null()) return absl::OkStatus();
  if (!o[key].is_boolean()) return absl::InvalidArgumentError(absl::StrCat("'", key, "' must be true or false"));
  *out = o[key].get<bool>();
  return absl::OkStatus();
}

absl::Status GetStrings(const json& o, const char* key, std::vector<std::string>* out) {
  if (!o.contains(key) || o[key].is_null()) return absl::OkStatus();
  if (!o[key].is_array()) return absl::InvalidArgumentError(absl::StrCat("'", key, "' must be a list of strings"));
  for (const json& v : o[key]) {
    if (!v.is_string()) return absl::InvalidArgumentError(absl::StrCat("'", key, "' must be a list of strings"));
    out->push_back(v.get<std::string>());
  }
  return absl::OkStatus();
}

absl::StatusOr<SaveConfig> ParseSaveConfig(const json& o) {
  SONDE_RETURN_IF_ERROR(CheckKeys(o, {"1", "2", "3", "4"}, "save_config"));
  SaveConfig config;
  for (const auto& [key, m] : o.items()) {
    SONDE_RETURN_IF_ERROR(
        CheckKeys(m, {"save_interval", "start_step", "end_step", "save_steps"}, "save_config mode"));
    SaveConfigMode mode;
    SONDE_RETURN_IF_ERROR(GetInt(m, "save_interval", &mode.save_interval));
    if (mode.save_interval <= 0) return absl::InvalidArgumentError("save_interval must be positive");
    SONDE_RETURN_IF_ERROR(GetInt(m, "start_step", &mode.start_step));
    if (m.contains("end_step") && !m["end_step"].is_null()) {
      int64_t end = 0;
      SONDE_RETURN_IF_ERROR(GetInt(m, "end_step", &end));
      mode.end_step = end;
    }
    if (m.contains("save_steps") && !m["save_steps"].is_null()) {
      if (!m["save_steps"].is_array()) return absl::InvalidArgumentError("'save_steps' must be a list");
      for (const json& s : m["save_steps"]) {
        if (!s.is_number_integer() || s.get<int64_t>() < 0) {
          return absl::InvalidArgumentError("'save_steps' must hold steps >= 0");
        }
        mode.save_steps.insert(s.get<int64_t>());
      }
    }
    config.Set(static_cast<v1::Mode>(std::stoi(key)), mode);
  }
  return config;
}

absl::StatusOr<std::optional<ReductionConfig>> ParseReductionConfig(const json& o) {
  if (o.is_null()) return std::optional<ReductionConfig>();
  SONDE_RETURN_IF_ERROR(CheckKeys(
      o, {"reductions", "abs_reductions", "norms", "abs_norms", "save_raw_tensor"}, "reduction_config"));
  ReductionConfig r;
  SONDE_RETURN_IF_ERROR(GetStrings(o, "reductions", &r.reductions));
  SONDE_RETURN_IF_ERROR(GetStrings(o, "abs_reductions", &r.abs_reductions));
  SONDE_RETURN_IF_ERROR(GetStrings(o, "norms", &r.norms));
  SONDE_RETURN_IF_ERROR(GetStrings(o, "abs_norms", &r.abs_norms));
  SONDE_RETURN_IF_ERROR(GetBool(o, "save_raw_tensor", &r.save_raw_tensor));
  SONDE_RETURN_IF_ERROR(r.Validate());
  return std::optional<ReductionConfig>(r);
}

absl::Status ParseHookConfig(const json& o, HookConfig* config) {
  SONDE_RETURN_IF_ERROR(CheckKeys(o,
                                   {"save_config", "reduction_config", "include_regex",
                                    "include_collections", "save_all", "collections"},
                                   "config"));
  if (o.contains("save_config") && !o["save_config"].is_null()) {
    absl::StatusOr<SaveConfig> sc = ParseSaveConfig(o["save_config"]);
    if (!sc.ok()) return sc.status();
    config->save_config = *sc;
  }
  if (o.contains("reduction_config")) {
    auto rc = ParseReductionConfig(o["reduction_config"]);
    if (!rc.ok()) return rc.status();
    config->reduction_config = *rc;
  }
  SONDE_RETURN_IF_ERROR(GetStrings(o, "include_regex", &config->include_regex));
  SONDE_RETURN_IF_ERROR(GetStrings(o, "include_collections", &config->include_collections));
  SONDE_RETURN_IF_ERROR(GetBool(o, "save_all", &config->save_all));
  if (o.contains("collections") && !o["collections"].is_null()) {
    if (!o["collections"].is_array()) return absl::InvalidArgumentError("'collections' must be a list");
    for (const json& c : o["collections"]) {
      SONDE_RETURN_IF_ERROR(CheckKeys(
          c, {"name", "include_regex", "save_config", "reduction_config", "save_histogram"},
          "collection"));
      CollectionConfig cc;
      SONDE_RETURN_IF_ERROR(GetString(c, "name", &cc.name));
      if (cc.name.empty()) return absl::InvalidArgumentError("a collection has no name");
      SONDE_RETURN_IF_ERROR(GetStrings(c, "include_regex", &cc.include_regex));
      if (c.contains("save_config") && !c["save_config"].is_null()) {
        absl::StatusOr<SaveConfig> sc = ParseSaveConfig(c["save_config"]);
        if (!sc.ok()) return sc.status();
        cc.save_config = *sc;
      }
      if (c.contains("reduction_config")) {
        auto rc = ParseReductionConfig(c["reduction_config"]);
        if (!rc.ok()) return rc.status();
        cc.reduction_config = *rc;
      }
      SONDE_RETURN_IF_ERROR(GetBool(c, "save_histogram", &cc.save_histogram));
      config->collections.push_back(std::move(cc));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<PythonHookOptions> ParsePythonHookOptions(absl::string_view text) {
  const json o = json::parse(text.begin(), text.end(), nullptr, /*allow_exceptions=*/false);
  if (o.is_discarded()) return absl::InvalidArgumentError("hook options are not valid JSON");
  SONDE_RETURN_IF_ERROR(CheckKeys(
      o,
      {"collector", "job", "worker", "world_size", "metadata", "rules", "token", "ca_file",
       "cert_file", "key_file", "server_name_override", "max_queue_bytes", "max_chunk_bytes",
       "backpressure", "spill_dir", "max_spill_bytes", "max_block_seconds",
       "close_timeout_seconds", "spool_dir", "max_spool_bytes", "config_file", "config",
       "profiler", "defer_device_reads"},
      "hook options"));
  PythonHookOptions out;
  HookOptions& h = out.options;
  SONDE_RETURN_IF_ERROR(GetString(o, "collector", &h.collector));
  SONDE_RETURN_IF_ERROR(GetString(o, "job", &h.job));
  SONDE_RETURN_IF_ERROR(GetInt(o, "worker", &h.worker));
  SONDE_RETURN_IF_ERROR(GetInt(o, "world_size", &h.world_size));
  if (o.contains("metadata") && !o["metadata"].is_null()) {
    if (!o["metadata"].is_object()) return absl::InvalidArgumentError("'metadata' must be an object");
    for (const auto& [k, v] : o["metadata"].items()) {
      if (!v.is_string()) {
        return absl::InvalidArgumentError(absl::StrCat("metadata '", k, "' must be a string"));
      }
      h.metadata[k] = v.get<std::string>();
    }
  }
  std::string rules;
  SONDE_RETURN_IF_ERROR(GetString(o, "rules", &rules));
  if (!rules.empty()) {
    absl::StatusOr<std::vector<v1::RuleSpec>> specs = rules::ParseRuleFlag(rules);
    if (!specs.ok()) return specs.status();
    h.rules = std::move(*specs);
  }
  SONDE_RETURN_IF_ERROR(GetString(o, "token", &h.security.token));
  SONDE_RETURN_IF_ERROR(GetString(o, "ca_file", &h.security.ca_file));
  SONDE_RETURN_IF_ERROR(GetString(o, "cert_file", &h.security.cert_file));
  SONDE_RETURN_IF_ERROR(GetString(o, "key_file", &h.security.key_file));
  SONDE_RETURN_IF_ERROR(GetString(o, "server_name_override", &h.security.server_name_override));
  SONDE_RETURN_IF_ERROR(GetInt(o, "max_queue_bytes", &h.max_queue_bytes));
  SONDE_RETURN_IF_ERROR(GetBool(o, "defer_device_reads", &h.device.defer_producer_wait));
  SONDE_RETURN_IF_ERROR(GetInt(o, "max_chunk_bytes", &h.max_chunk_bytes));
  std::string policy = "spill";
  SONDE_RETURN_IF_ERROR(GetString(o, "backpressure", &policy));
  if (policy == "spill") {
    h.backpressure.policy = BackpressurePolicy::kSpill;
  } else if (policy == "drop") {
    h.backpressure.policy = BackpressurePolicy::kDrop;
  } else if (policy == "block") {
    h.backpressure.policy = BackpressurePolicy::kBlock;
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat("backpressure '", policy, "' is not one of spill, drop, block"));
  }
  SONDE_RETURN_IF_ERROR(GetString(o, "spill_dir", &h.backpressure.spill_dir));
  SONDE_RETURN_IF_ERROR(GetInt(o, "max_spill_bytes", &h.backpressure.max_spill_bytes));
  SONDE_RETURN_IF_ERROR(GetSeconds(o, "max_block_seconds", &h.backpressure.max_block));
  SONDE_RETURN_IF_ERROR(GetSeconds(o, "close_timeout_seconds", &h.close_timeout));
  // null: the default directory; "": no spool.
  SONDE_RETURN_IF_ERROR(GetString(o, "spool_dir", &h.spool_dir));
  SONDE_RETURN_IF_ERROR(GetInt(o, "max_spool_bytes", &h.max_spool_bytes));
  SONDE_RETURN_IF_ERROR(GetString(o, "config_file", &out.config_file));
  if (o.contains("profiler") && !o["profiler"].is_null()) {
    const json& p = o["profiler"];
    SONDE_RETURN_IF_ERROR(
        CheckKeys(p, {"enabled", "interval_seconds", "system", "framework", "nvml_library"},
                  "profiler"));
    SONDE_RETURN_IF_ERROR(GetBool(p, "enabled", &h.profiler.enabled));
    SONDE_RETURN_IF_ERROR(GetSeconds(p, "interval_seconds", &h.profiler.interval));
    SONDE_RETURN_IF_ERROR(GetBool(p, "system", &h.profiler.system));
    SONDE_RETURN_IF_ERROR(GetBool(p, "framework", &h.profiler.framework));
    SONDE_RETURN_IF_ERROR(GetString(p, "nvml_library", &h.profiler.nvml_library));
    if (h.profiler.nvml_library.empty()) {
      return absl::InvalidArgumentError(
          "'nvml_library' must not be empty (leave it out for libnvidia-ml.so.1)");
    }
  }
  if (o.contains("config") && !o["config"].is_null()) {
    if (!out.config_file.empty()) {
      return absl::InvalidArgumentError(
          "give either 'config' or 'config_file': the file's configuration would replace it");
    }
    SONDE_RETURN_IF_ERROR(ParseHookConfig(o["config"], &h.config));
  }
  return out;
}

}  // namespace sonde
