#include "client/collections.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace sonde {
namespace {

// Collections whose tensors are always saved with their values (scalars).
bool AlwaysValues(const std::string& c) {
  return c == "losses" || c == "metrics" || c == "scalars";
}

absl::StatusOr<Pattern> Compile(const std::string& pattern) {
  return Pattern::Compile(pattern, "include_regex");
}

}  // namespace

CollectionSet::Collection& CollectionSet::Get(const std::string& name) {
  return collections_[name];
}

absl::StatusOr<CollectionSet> CollectionSet::Create(const HookConfig& config) {
  CollectionSet set;
  set.config_ = config;
  if (config.reduction_config.has_value()) {
    absl::Status s = config.reduction_config->Validate();
    if (!s.ok()) return s;
  }
  // smdebug's built-in patterns, whose lookaheads RE2 does not have, as a
  // pattern and an exclusion: "^(?!gradient).*weight" is "weight" but not
  // "^gradient"; "[Ll]oss_(?!input).*output" is "[Ll]oss_.*output" but not
  // "[Ll]oss_input".
  const struct {
    const char* name;
    const char* include;
    const char* exclude;
  } builtins[] = {
      {"weights", "weight", "^gradient"},
      {"biases", "bias", "^gradient"},
      {"gradients", "^gradient", nullptr},
      {"losses", "[Ll]oss_.*output", "[Ll]oss_input"},
      {"all", "", nullptr},
  };
  for (const auto& b : builtins) {
    auto re = Compile(b.include);
    if (!re.ok()) return re.status();
    Collection& c = set.Get(b.name);
    c.regexes.push_back(*re);
    if (b.exclude != nullptr) {
      auto ex = Compile(b.exclude);
      if (!ex.ok()) return ex.status();
      c.excludes.push_back(*ex);
    }
  }
  for (const char* name : {"metrics", "inputs", "outputs", "scalars", "default"}) {
    set.Get(name);
  }
  for (const std::string& pattern : config.include_regex) {
    auto re = Compile(pattern);
    if (!re.ok()) return re.status();
    set.Get("default").regexes.push_back(*re);
  }
  for (const CollectionConfig& c : config.collections) {
    if (c.name.empty()) return absl::InvalidArgumentError("a collection has no name");
    Collection& coll = set.Get(c.name);
    for (const std::string& pattern : c.include_regex) {
      auto re = Compile(pattern);
      if (!re.ok()) return re.status();
      coll.regexes.push_back(*re);
    }
    if (c.reduction_config.has_value()) {
      absl::Status s = c.reduction_config->Validate();
      if (!s.ok()) return s;
    }
    coll.save_config = c.save_config;
    coll.user_save_config = c.save_config.has_value();
    coll.reduction_config = c.reduction_config;
    coll.save_histogram = c.save_histogram;
    set.included_.insert(c.name);
  }
  set.included_.insert("losses");
  for (const std::string& c : config.include_collections) set.included_.insert(c);
  if (!config.include_regex.empty()) set.included_.insert("default");
  if (config.save_all) set.included_.insert("all");
  return set;
}

absl::Status CollectionSet::Require(const v1::CollectionRequest& request) {
  if (request.name().empty()) return absl::InvalidArgumentError("collection request has no name");
  if (request.name() == "all" && request.include_regex().empty()) return absl::OkStatus();
  const bool asked_before = included_.count(request.name()) > 0;
  Collection& c = Get(request.name());
  for (const std::string& pattern : request.include_regex()) {
    if (!c.requested_patterns.insert(pattern).second) continue;  // again after a reconnect
    auto re = Compile(pattern);
    if (!re.ok()) return re.status();
    c.regexes.push_back(*re);
  }
  // The same settings again (a reconnect's hello ack) change nothing.
  std::string settings;
  for (const auto& [key, value] : std::map<std::string, std::string>(
           request.parameters().begin(), request.parameters().end())) {
    absl::StrAppend(&settings, key, "=", value, ";");
  }
  if (!request.parameters().empty() && !c.user_save_config &&
      c.requested_settings.count(settings) == 0) {
    auto sc = config_.save_config.WithParameters(std::map<std::string, std::string>(
        request.parameters().begin(), request.parameters().end()));
    if (!sc.ok()) return sc.status();
    c.requested_settings.insert(settings);
    if (asked_before) {
      c.rule_schedules.push_back(*sc);
    } else {
      c.save_config = *sc;
    }
  }
  c.force_values = c.force_values || request.values();
  included_.insert(request.name());
  member_cache_.clear();
  Changed();
  return absl::OkStatus();
}

void CollectionSet::AddToCollection(const std::string& collection, const std::string& tensor) {
  Get(collection).tensors.insert(tensor);
  member_cache_.erase(tensor);
  Changed();
}

void CollectionSet::Include(const std::string& collection) {
  Get(collection);
  included_.insert(collection);
  Changed();
}

const CollectionSet::Collection* CollectionSet::Find(const std::string& c) const {
  auto it = collections_.find(c);
  return it == collections_.end() ? nullptr : &it->second;
}

bool CollectionSet::DueAt(const std::string& c, const Collection* coll, v1::Mode mode,
                          int64_t mode_step) const {
  if (c == "gradients" && (mode == v1::MODE_EVAL || mode == v1::MODE_PREDICT)) return false;
  const SaveConfig& sc =
      coll != nullptr && coll->save_config.has_value() ? *coll->save_config : config_.save_config;
  if (sc.ShouldSave(mode, mode_step)) return true;
  if (coll == nullptr) return false;
  return std::any_of(coll->rule_schedules.begin(), coll->rule_schedules.end(),
                     [&](const SaveConfig& r) { return r.ShouldSave(mode, mode_step); });
}

bool CollectionSet::AnyDue(v1::Mode mode, int64_t mode_step) {
  for (const auto& [c, info] : DueMemo(mode, mode_step)) {
    if (info.due) return true;
  }
  return false;
}

std::vector<std::string> CollectionSet::DueCollections(v1::Mode mode, int64_t mode_step) const {
  std::vector<std::string> due;
  for (const std::string& c : included_) {
    if (DueAt(c, Find(c), mode, mode_step)) due.push_back(c);
  }
  return due;
}

const std::vector<std::string>& CollectionSet::Members(const std::string& tensor) {
  auto it = member_cache_.find(tensor);
  if (it != member_cache_.end()) return it->second;
  std::vector<std::string> members;
  for (const auto& [name, c] : collections_) {
    if (name == "all") continue;  // membership of "all" is implicit
    bool in = c.tensors.count(tensor) > 0;
    for (const Pattern& re : c.regexes) {
      if (in) break;
      in = re.Search(tensor);
    }
    for (const Pattern& ex : c.excludes) {
      if (in && ex.Search(tensor) && c.tensors.count(tensor) == 0) in = false;
    }
    if (in) members.push_back(name);
  }
  return member_cache_.emplace(tensor, std::move(members)).first->second;
}

const absl::flat_hash_map<std::string, CollectionSet::DueInfo>& CollectionSet::DueMemo(
    v1::Mode mode, int64_t mode_step) {
  if (memo_generation_ == generation_ && memo_mode_ == mode && memo_mode_step_ == mode_step) {
    return memo_;
  }
  memo_.clear();
  for (const std::string& c : included_) {
    const Collection* coll = Find(c);
    DueInfo& info = memo_[c];
    info.due = DueAt(c, coll, mode, mode_step);
    info.histogram = coll != nullptr && coll->save_histogram;
    const std::optional<ReductionConfig>& rc =
        coll != nullptr && coll->reduction_config.has_value() ? coll->reduction_config
                                                              : config_.reduction_config;
    info.values = AlwaysValues(c) || !rc.has_value() || rc->save_raw_tensor ||
                  (coll != nullptr && coll->force_values);
  }
  memo_generation_ = generation_;
  memo_mode_ = mode;
  memo_mode_step_ = mode_step;
  return memo_;
}

SaveDecision CollectionSet::Decide(const std::string& tensor,
                                   const std::vector<std::string>& explicit_collections,
                                   v1::Mode mode, int64_t mode_step) {
  SaveDecision d;
  d.collections = Members(tensor);
  for (const std::string& c : explicit_collections) {
    if (std::find(d.collections.begin(), d.collections.end(), c) == d.collections.end()) {
      d.collections.push_back(c);
    }
  }
  const absl::flat_hash_map<std::string, DueInfo>& due = DueMemo(mode, mode_step);
  bool any_values = false;
  auto consider = [&](const std::string& c) {
    auto it = due.find(c);  // only included collections are there
    if (it == due.end() || !it->second.due) return;
    d.save = true;
    d.histogram = d.histogram || it->second.histogram;
    any_values = any_values || it->second.values;
  };
  for (const std::string& c : d.collections) consider(c);
  // "all" holds every tensor, however it was included: save_all,
  // include_collections=["all"] (as in smdebug), or a rule's request.
  consider("all");
  d.values = d.save && any_values;
  return d;
}

}  // namespace sonde
