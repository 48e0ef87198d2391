#include "client/hook_config_json.h"

#include <set>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "nlohmann/json.hpp"

namespace sonde {
namespace {

absl::StatusOr<std::map<std::string, std::string>> StringMap(const nlohmann::json& j,
                                                             absl::string_view what) {
  std::map<std::string, std::string> out;
  if (j.is_null()) return out;
  if (!j.is_object()) return absl::InvalidArgumentError(absl::StrCat(what, " must be an object"));
  for (auto it = j.begin(); it != j.end(); ++it) {
    out[it.key()] = it.value().is_string() ? it.value().get<std::string>() : it.value().dump();
  }
  return out;
}

absl::StatusOr<bool> ParseBool(const std::string& key, const std::string& v) {
  const std::string s = absl::AsciiStrToLower(v);
  if (s == "true" || s == "1") return true;
  if (s == "false" || s == "0") return false;
  return absl::InvalidArgumentError(absl::StrCat(key, "='", v, "' is not true or false"));
}

std::vector<std::string> SplitList(const std::string& v) {
  std::vector<std::string> out;
  for (absl::string_view p : absl::StrSplit(v, ',', absl::SkipWhitespace())) {
    out.emplace_back(absl::StripAsciiWhitespace(p));
  }
  return out;
}

// Reduction settings of a parameter map, if it has any.
absl::StatusOr<std::optional<ReductionConfig>> Reductions(
    const std::map<std::string, std::string>& p) {
  auto r = p.find("reductions");
  auto raw = p.find("save_raw_tensor");
  if (r == p.end() && raw == p.end()) return std::optional<ReductionConfig>();
  bool save_raw = false;
  if (raw != p.end()) {
    auto b = ParseBool("save_raw_tensor", raw->second);
    if (!b.ok()) return b.status();
    save_raw = *b;
  }
  auto rc = ReductionConfig::FromString(r == p.end() ? "" : r->second, save_raw);
  if (!rc.ok()) return rc.status();
  return std::optional<ReductionConfig>(*rc);
}

}  // namespace

absl::StatusOr<ParsedHookConfig> ParseHookConfigJson(absl::string_view text) {
  nlohmann::json doc = nlohmann::json::parse(text.begin(), text.end(), nullptr, false);
  if (doc.is_discarded() || !doc.is_object()) {
    return absl::InvalidArgumentError("hook config is not a JSON object");
  }
  ParsedHookConfig out;
  static const std::set<std::string> kTopLevel = {"LocalPath", "S3OutputPath", "HookParameters",
                                                  "CollectionConfigurations"};
  for (auto it = doc.begin(); it != doc.end(); ++it) {
    if (kTopLevel.count(it.key()) == 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("hook config: unknown top-level key '", it.key(), "'"));
    }
  }
  auto hook = StringMap(doc.contains("HookParameters") ? doc["HookParameters"] : nlohmann::json(),
                        "HookParameters");
  if (!hook.ok()) return hook.status();
  // smdebug parameters Sonde accepts but has no use for (see the header).
  static const std::set<std::string> kIgnored = {"tensorboard_dir", "dry_run", "save_shape",
                                                 "save_histogram"};
  for (const auto& [key, value] : *hook) {
    if (SaveConfig::IsSaveKey(key) || kIgnored.count(key) > 0) continue;
    if (key == "collector" || key == "job") {
      out.sonde_parameters[key] = value;
    } else if (key == "export_tensorboard") {
      auto b = ParseBool(key, value);
      if (!b.ok()) return b.status();
      out.sonde_parameters[key] = *b ? "true" : "false";
    } else if (key == "include_workers") {
      const std::string v = absl::AsciiStrToLower(value);
      if (v != "one" && v != "all") {
        return absl::InvalidArgumentError(
            absl::StrCat("include_workers='", value, "' is not one or all"));
      }
      out.sonde_parameters[key] = v;
    } else if (key == "include_regex") {
      out.config.include_regex = SplitList(value);
    } else if (key == "save_all") {
      auto b = ParseBool(key, value);
      if (!b.ok()) return b.status();
      out.config.save_all = *b;
    } else if (key == "include_collections") {
      out.config.include_collections = SplitList(value);
    } else if (key != "reductions" && key != "save_raw_tensor") {
      return absl::InvalidArgumentError(
          absl::StrCat("hook config: unknown hook parameter '", key, "'"));
    }
  }
  auto save = SaveConfig::FromParameters(*hook);
  if (!save.ok()) return save.status();
  out.config.save_config = *save;
  auto red = Reductions(*hook);
  if (!red.ok()) return red.status();
  out.config.reduction_config = *red;

  if (doc.contains("CollectionConfigurations")) {
    const nlohmann::json& list = doc["CollectionConfigurations"];
    if (!list.is_array()) {
      return absl::InvalidArgumentError("CollectionConfigurations must be a list");
    }
    for (const nlohmann::json& c : list) {
      if (!c.is_object() || !c.contains("CollectionName") || !c["CollectionName"].is_string()) {
        return absl::InvalidArgumentError(
            "each CollectionConfigurations entry needs a CollectionName string");
      }
      CollectionConfig cc;
      cc.name = c["CollectionName"].get<std::string>();
      auto params = StringMap(
          c.contains("CollectionParameters") ? c["CollectionParameters"] : nlohmann::json(),
          "CollectionParameters");
      if (!params.ok()) return params.status();
      for (const auto& [key, value] : *params) {
        if (SaveConfig::IsSaveKey(key) || (kIgnored.count(key) > 0 && key != "save_histogram") ||
            key == "reductions" ||
            key == "save_raw_tensor") {
          continue;
        }
        if (key == "include_regex") {
          cc.include_regex = SplitList(value);
        } else if (key == "save_histogram") {
          auto b = ParseBool(key, value);
          if (!b.ok()) return b.status();
          cc.save_histogram = *b;
        } else {
          return absl::InvalidArgumentError(absl::StrCat(
              "collection '", cc.name, "': unknown parameter '", key, "'"));
        }
      }
      bool has_save_key = false;
      for (const auto& [key, value] : *params) has_save_key |= SaveConfig::IsSaveKey(key);
      if (has_save_key) {
        auto sc = SaveConfig::FromParameters(*hook, *params);
        if (!sc.ok()) return sc.status();
        cc.save_config = *sc;
      }
      auto cr = Reductions(*params);
      if (!cr.ok()) return cr.status();
      cc.reduction_config = *cr;
      out.config.collections.push_back(std::move(cc));
    }
  }
  return out;
}

}  // namespace sonde
