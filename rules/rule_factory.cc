#include "rules/rule_factory.h"

#include <algorithm>
#include <map>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "absl/strings/str_cat.h"
#include "common/names.h"
#include "common/pattern.h"
#include "common/status_macros.h"

namespace sonde::rules {

absl::Status RuleFactory::Register(RuleInfo info, RuleMaker maker) {
  if (info.rule_type.empty()) return absl::InvalidArgumentError("rule type is empty");
  if (Find(info.rule_type) != nullptr) {
    return absl::AlreadyExistsError(
        absl::StrCat("rule type '", info.rule_type, "' is already registered"));
  }
  entries_.push_back({std::move(info), std::move(maker)});
  return absl::OkStatus();
}

const RuleInfo* RuleFactory::Find(const std::string& rule_type) const {
  for (const Entry& e : entries_) {
    if (e.info.rule_type == rule_type) return &e.info;
  }
  return nullptr;
}

std::vector<RuleInfo> RuleFactory::Catalog() const {
  std::vector<RuleInfo> out;
  for (const Entry& e : entries_) out.push_back(e.info);
  return out;
}

absl::StatusOr<std::unique_ptr<Rule>> RuleFactory::Create(const v1::RuleSpec& spec) const {
  for (const Entry& e : entries_) {
    if (e.info.rule_type != spec.rule_type()) continue;
    RuleParams params(spec.rule_type(),
                      std::map<std::string, std::string>(spec.parameters().begin(),
                                                         spec.parameters().end()),
                      environment_);
    SONDE_ASSIGN_OR_RETURN(auto rule, e.maker(params));
    SONDE_RETURN_IF_ERROR(params.CheckAllUsed());
    if (rule == nullptr) {
      return absl::InternalError(absl::StrCat("rule type '", spec.rule_type(),
                                              "' made no rule"));
    }
    return rule;
  }
  std::string known;
  for (const Entry& e : entries_) {
    absl::StrAppend(&known, known.empty() ? "" : ", ", e.info.rule_type);
  }
  return absl::NotFoundError(absl::StrCat("unknown rule type '", spec.rule_type(),
                                          "' (known: ", known, ")"));
}

namespace {

// One of smdebug's save settings, as the hooks read them
// (client/save_config.cc, a layer above): save_interval >= 1, start_step
// and end_step >= 0, save_steps a list of steps; each key also with a mode
// prefix.
absl::Status CheckSaveSetting(const std::string& key, const std::string& value) {
  absl::string_view plain = key;
  for (absl::string_view prefix : {"train.", "eval.", "predict.", "global."}) {
    if (absl::ConsumePrefix(&plain, prefix)) break;
  }
  auto is_int = [](absl::string_view v, int64_t min) {
    int64_t n;
    return absl::SimpleAtoi(absl::StripAsciiWhitespace(v), &n) && n >= min;
  };
  if (plain == "save_interval" || plain == "start_step" || plain == "end_step") {
    const int64_t min = plain == "save_interval" ? 1 : 0;
    if (is_int(value, min)) return absl::OkStatus();
    return absl::InvalidArgumentError(
        absl::StrCat(key, "='", value, "' is not an integer >= ", min));
  }
  if (plain == "save_steps") {
    for (absl::string_view part : absl::StrSplit(value, ',', absl::SkipWhitespace())) {
      if (!is_int(part, 0)) {
        return absl::InvalidArgumentError(
            absl::StrCat(key, "='", value, "' must be step numbers separated by commas"));
      }
    }
    return absl::OkStatus();
  }
  return absl::InvalidArgumentError(
      absl::StrCat("'", key, "' is not a save setting (save_interval, start_step, end_step, "
                   "save_steps, each also with a mode prefix such as train.)"));
}

}  // namespace

absl::StatusOr<v1::RuleSpec> NormalizeRuleSpec(v1::RuleSpec spec) {
  if (spec.rule_type().empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("rule '", spec.name(), "' has no rule_type"));
  }
  if (spec.name().empty()) spec.set_name(spec.rule_type());
  for (const std::string& a : spec.actions()) {
    if (a == "StopTraining" || a == "Log") continue;
    if (absl::StartsWith(a, "Webhook:")) {
      const std::string url = a.substr(8);
      if (!absl::StartsWith(url, "http://") && !absl::StartsWith(url, "https://")) {
        return absl::InvalidArgumentError(absl::StrCat(
            "rule '", spec.name(), "': webhook URL '", url, "' must start with http:// or https://"));
      }
      continue;
    }
    if (absl::StartsWith(a, "Email:")) {
      if (absl::Status s = ValidateMailAddress(a.substr(6)); !s.ok()) {
        return absl::InvalidArgumentError(absl::StrCat("rule '", spec.name(), "': ", s.message()));
      }
      continue;
    }
    return absl::InvalidArgumentError(
        absl::StrCat("rule '", spec.name(), "': unknown action '", a,
                     "' (known: StopTraining, Log, Webhook:<url>, Email:<address>)"));
  }
  for (const v1::CollectionRequest& c : spec.collections_to_save()) {
    if (c.name().empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("rule '", spec.name(), "': a collection to save has no name"));
    }
    // Checked here, so that a mistake is the rule author's error at the
    // collector rather than a failure in training.
    for (const std::string& regex : c.include_regex()) {
      absl::StatusOr<Pattern> p = Pattern::Compile(regex, "include_regex");
      if (!p.ok()) {
        return absl::InvalidArgumentError(absl::StrCat("rule '", spec.name(), "': collection '",
                                                       c.name(), "': ", p.status().message()));
      }
    }
    for (const auto& [key, value] : c.parameters()) {
      absl::Status s = CheckSaveSetting(key, value);
      if (!s.ok()) {
        return absl::InvalidArgumentError(absl::StrCat("rule '", spec.name(), "': collection '",
                                                       c.name(), "': ", s.message()));
      }
    }
  }
  return spec;
}

namespace {

// Collections rules read that the client does not define itself, with the
// tensors smdebug_rulesconfig puts in them.
const char* KnownRegex(const std::string& collection) {
  static const std::map<std::string, const char*> known = {
      {"all", ".*"},  // every tensor (a bare "all" is ignored by hooks)
      {"relu_output", ".*relu_output"},
      {"relu_input", ".*relu_input"},
      {"input_image", ".*hybridsequential0_input_0"},
      {"input_sequence", ".*embedding0_input_0"},
      {"feature_importance", "^feature_importance/.*"},
      {"trees", "^trees/.*"},
  };
  auto it = known.find(collection);
  return it == known.end() ? nullptr : it->second;
}

}  // namespace

std::vector<v1::CollectionRequest> CollectionRequestsFor(const v1::RuleSpec& spec,
                                                         const RuleInfo& info) {
  std::vector<v1::CollectionRequest> out;
  auto add = [&](const std::string& name, const std::string& regex) {
    v1::CollectionRequest r;
    r.set_name(name);
    if (!regex.empty()) r.add_include_regex(regex);
    r.set_values(info.needs_values);
    r.set_rule(spec.name());
    out.push_back(std::move(r));
  };
  auto param = [&](const char* key) -> std::string {
    auto it = spec.parameters().find(key);
    return it == spec.parameters().end() ? "" : it->second;
  };
  const std::string names = param("collection_names");
  if (!names.empty()) {
    size_t start = 0;
    while (start <= names.size()) {
      size_t comma = names.find(',', start);
      if (comma == std::string::npos) comma = names.size();
      std::string name = names.substr(start, comma - start);
      name.erase(0, name.find_first_not_of(' '));
      name.erase(name.find_last_not_of(' ') + 1);
      if (!name.empty()) {
        const char* regex = KnownRegex(name);
        add(name, regex != nullptr ? regex : "");
      }
      start = comma + 1;
    }
  } else {
    for (const std::string& name : info.default_collections) {
      const char* regex = KnownRegex(name);
      add(name, regex != nullptr ? regex : "");
    }
  }
  // collections_to_save: the settings go with the request for that
  // collection (a default one, or a new one).
  for (const v1::CollectionRequest& c : spec.collections_to_save()) {
    auto same = std::find_if(out.begin(), out.end(), [&](const v1::CollectionRequest& r) {
      return r.name() == c.name();
    });
    if (same == out.end()) {
      const char* regex = KnownRegex(c.name());
      add(c.name(), regex != nullptr ? regex : "");
      same = out.end() - 1;
    }
    for (const auto& [key, value] : c.parameters()) (*same->mutable_parameters())[key] = value;
    if (c.values()) same->set_values(true);  // save_raw_tensor
    for (const std::string& r : c.include_regex()) {
      if (std::find(same->include_regex().begin(), same->include_regex().end(), r) ==
          same->include_regex().end()) {
        same->add_include_regex(r);
      }
    }
  }
  // A regex parameter the spec leaves out is the rule's default (e.g.
  // SaturatedActivation's tanh and sigmoid inputs), which the hook must
  // save too, or the rule would end NoIssuesFound having judged nothing.
  auto param_or_default = [&](const char* key) -> std::string {
    if (spec.parameters().count(key) > 0) return param(key);
    for (const RuleParameterInfo& p : info.parameters) {
      if (p.name == key) return p.default_value;
    }
    return "";
  };
  for (const char* key : {"tensor_regex", "regex", "activation_inputs_regex", "labels_regex",
                          "predictions_regex"}) {
    const std::string regex = param_or_default(key);
    if (regex.empty()) continue;
    const bool requested = std::any_of(out.begin(), out.end(), [&](const v1::CollectionRequest& r) {
      return r.include_regex_size() == 1 && r.include_regex(0) == regex;
    });
    if (!requested) add(absl::StrCat("rule:", spec.name()), regex);
  }
  return out;
}

v1::RuleCatalogEntry ToProto(const RuleInfo& info) {
  v1::RuleCatalogEntry e;
  e.set_rule_type(info.rule_type);
  e.set_description(info.description);
  for (const auto& p : info.parameters) {
    v1::RuleParameterInfo* pi = e.add_parameters();
    pi->set_name(p.name);
    pi->set_default_value(p.default_value);
    pi->set_description(p.description);
  }
  for (const auto& c : info.default_collections) e.add_default_collections(c);
  e.set_suggestion(info.suggestion);
  e.set_source(info.source);
  return e;
}

}  // namespace sonde::rules
