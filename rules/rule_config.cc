#include "rules/rule_config.h"

#include <fstream>
#include <set>
#include <sstream>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/status_macros.h"
#include "nlohmann/json.hpp"
#include "rules/rule_factory.h"

namespace sonde::rules {

absl::StatusOr<std::vector<v1::RuleSpec>> ParseRuleFlag(absl::string_view flag) {
  std::vector<v1::RuleSpec> out;
  for (absl::string_view item : absl::StrSplit(flag, ';', absl::SkipWhitespace())) {
    item = absl::StripAsciiWhitespace(item);
    v1::RuleSpec spec;
    const size_t open = item.find('(');
    if (open == absl::string_view::npos) {
      spec.set_rule_type(std::string(item));
    } else {
      if (item.back() != ')') {
        return absl::InvalidArgumentError(absl::StrCat("rule '", item, "': missing ')'"));
      }
      spec.set_rule_type(std::string(absl::StripAsciiWhitespace(item.substr(0, open))));
      absl::string_view args = item.substr(open + 1, item.size() - open - 2);
      for (absl::string_view kv : absl::StrSplit(args, ',', absl::SkipWhitespace())) {
        std::pair<absl::string_view, absl::string_view> p = absl::StrSplit(kv, absl::MaxSplits('=', 1));
        const std::string key(absl::StripAsciiWhitespace(p.first));
        const std::string value(absl::StripAsciiWhitespace(p.second));
        if (key.empty() || kv.find('=') == absl::string_view::npos) {
          return absl::InvalidArgumentError(
              absl::StrCat("rule '", item, "': '", kv, "' is not key=value"));
        }
        if (key == "name") {
          spec.set_name(value);
        } else if (key == "actions") {
          for (absl::string_view a : absl::StrSplit(value, '|', absl::SkipWhitespace())) {
            spec.add_actions(std::string(a));
          }
        } else {
          (*spec.mutable_parameters())[key] = value;
        }
      }
    }
    SONDE_ASSIGN_OR_RETURN(v1::RuleSpec normalized, NormalizeRuleSpec(spec));
    out.push_back(std::move(normalized));
  }
  return out;
}

namespace {

// CollectionConfig parameters that choose reductions: the collector keeps
// every tensor's statistics, from which each of them is answered, and
// histograms follow the hook's settings, so they need no request.
const std::set<std::string> kReductionKeys = {"reductions", "abs_reductions", "norms",
                                              "abs_norms", "save_histogram", "save_shape"};

std::string AsString(const nlohmann::json& v) {
  if (v.is_string()) return v.get<std::string>();
  return v.dump();  // numbers and booleans, as SageMaker turns them into strings
}

}  // namespace

absl::StatusOr<std::vector<v1::RuleSpec>> ParseRulesJson(absl::string_view text) {
  nlohmann::json doc = nlohmann::json::parse(text.begin(), text.end(), nullptr,
                                             /*allow_exceptions=*/false);
  if (doc.is_discarded()) return absl::InvalidArgumentError("rules file is not valid JSON");
  const nlohmann::json* list = nullptr;
  if (doc.is_array()) {
    list = &doc;
  } else if (doc.is_object() && doc.contains("rules") && doc["rules"].is_array()) {
    list = &doc["rules"];
  } else {
    return absl::InvalidArgumentError("rules file must be a list or {\"rules\": [...]}");
  }
  std::vector<v1::RuleSpec> out;
  for (const nlohmann::json& r : *list) {
    if (!r.is_object()) return absl::InvalidArgumentError("each rule must be an object");
    v1::RuleSpec spec;
    for (auto it = r.begin(); it != r.end(); ++it) {
      const std::string& key = it.key();
      if (key == "name" || key == "RuleConfigurationName") {
        spec.set_name(AsString(it.value()));
      } else if (key == "rule_type" || key == "type") {
        spec.set_rule_type(AsString(it.value()));
      } else if (key == "rule_parameters" || key == "RuleParameters" ||
                 key == "parameters") {
        if (!it.value().is_object()) {
          return absl::InvalidArgumentError(absl::StrCat("'", key, "' must be an object"));
        }
        for (auto p = it.value().begin(); p != it.value().end(); ++p) {
          if (p.key() == "rule_to_invoke") {
            spec.set_rule_type(AsString(p.value()));
          } else {
            (*spec.mutable_parameters())[p.key()] = AsString(p.value());
          }
        }
      } else if (key == "collections_to_save" || key == "CollectionsToSave") {
        // SageMaker's [CollectionConfig(name, parameters)], as JSON:
        // [{"name": "weights", "parameters": {"save_interval": "10"}}].
        if (!it.value().is_array()) {
          return absl::InvalidArgumentError(absl::StrCat("'", key, "' must be a list"));
        }
        for (const nlohmann::json& c : it.value()) {
          if (!c.is_object()) {
            return absl::InvalidArgumentError(
                absl::StrCat("each of '", key, "' must be an object with a name"));
          }
          v1::CollectionRequest* request = spec.add_collections_to_save();
          for (auto f = c.begin(); f != c.end(); ++f) {
            if (f.key() == "name" || f.key() == "CollectionName") {
              request->set_name(AsString(f.value()));
            } else if (f.key() == "parameters" || f.key() == "CollectionParameters") {
              if (f.value().is_null()) continue;
              if (!f.value().is_object()) {
                return absl::InvalidArgumentError(
                    absl::StrCat("collection parameters in '", key, "' must be an object"));
              }
              for (auto p = f.value().begin(); p != f.value().end(); ++p) {
                // A list (save_steps: [1, 2]) as smdebug's comma-separated string.
                std::string value;
                if (p.value().is_array()) {
                  for (const nlohmann::json& v : p.value()) {
                    absl::StrAppend(&value, value.empty() ? "" : ",", AsString(v));
                  }
                } else {
                  value = AsString(p.value());
                }
                if (p.key() == "include_regex") {
                  for (absl::string_view r : absl::StrSplit(value, ',', absl::SkipWhitespace())) {
                    request->add_include_regex(std::string(absl::StripAsciiWhitespace(r)));
                  }
                } else if (p.key() == "save_raw_tensor") {
                  request->set_values(absl::AsciiStrToLower(value) == "true" || value == "1");
                } else if (kReductionKeys.count(p.key()) == 0) {
                  (*request->mutable_parameters())[p.key()] = value;
                }
              }
            } else {
              return absl::InvalidArgumentError(
                  absl::StrCat("unknown field '", f.key(), "' in '", key, "'"));
            }
          }
        }
      } else if (key == "actions") {
        if (!it.value().is_array()) {
          return absl::InvalidArgumentError("'actions' must be a list");
        }
        for (const auto& a : it.value()) spec.add_actions(AsString(a));
      } else {
        return absl::InvalidArgumentError(absl::StrCat("unknown rule field '", key, "'"));
      }
    }
    SONDE_ASSIGN_OR_RETURN(v1::RuleSpec normalized, NormalizeRuleSpec(spec));
    out.push_back(std::move(normalized));
  }
  return out;
}

absl::StatusOr<std::vector<v1::RuleSpec>> LoadDefaultRules(absl::string_view flag,
                                                           const std::string& config_file) {
  if (config_file.empty()) return ParseRuleFlag(flag);
  std::ifstream in(config_file);
  if (!in) {
    return absl::NotFoundError(absl::StrCat("cannot read --rules_config '", config_file, "'"));
  }
  std::stringstream text;
  text << in.rdbuf();
  absl::StatusOr<std::vector<v1::RuleSpec>> rules = ParseRulesJson(text.str());
  if (!rules.ok()) {
    return absl::Status(rules.status().code(),
                        absl::StrCat(config_file, ": ", rules.status().message()));
  }
  return rules;
}

}  // namespace sonde::rules
