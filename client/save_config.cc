#include "client/save_config.h"

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace sonde {
namespace {

constexpr const char* kModePrefixes[] = {"train.", "eval.", "predict.", "global."};
constexpr v1::Mode kModes[] = {v1::MODE_TRAIN, v1::MODE_EVAL, v1::MODE_PREDICT,
                               v1::MODE_GLOBAL};

absl::Status ApplyKey(SaveConfigMode& m, const std::string& key, const std::string& value) {
  auto parse_int = [&](int64_t& out, int64_t min) -> absl::Status {
    int64_t v;
    if (!absl::SimpleAtoi(value, &v) || v < min) {
      return absl::InvalidArgumentError(absl::StrCat(
          "save config: ", key, "='", value, "' is not an integer >= ", min));
    }
    out = v;
    return absl::OkStatus();
  };
  if (key == "save_interval") return parse_int(m.save_interval, 1);
  if (key == "start_step") return parse_int(m.start_step, 0);
  if (key == "end_step") {
    int64_t v;
    absl::Status s = parse_int(v, 0);
    if (s.ok()) m.end_step = v;
    return s;
  }
  if (key == "save_steps") {
    m.save_steps.clear();
    for (absl::string_view part : absl::StrSplit(value, ',', absl::SkipWhitespace())) {
      int64_t v;
      if (!absl::SimpleAtoi(absl::StripAsciiWhitespace(part), &v) || v < 0) {
        return absl::InvalidArgumentError(absl::StrCat(
            "save config: save_steps='", value, "' must be step numbers separated by commas"));
      }
      m.save_steps.insert(v);
    }
    return absl::OkStatus();
  }
  return absl::OkStatus();
}

bool IsPlainSaveKey(absl::string_view key) {
  return key == "save_interval" || key == "start_step" || key == "end_step" ||
         key == "save_steps";
}

// Applies the un-prefixed keys, then the keys prefixed for `mode_index`.
absl::Status ApplyParameters(SaveConfigMode& m, const std::map<std::string, std::string>& p,
                             int mode_index) {
  for (const auto& [key, value] : p) {
    if (IsPlainSaveKey(key)) {
      absl::Status s = ApplyKey(m, key, value);
      if (!s.ok()) return s;
    }
  }
  const std::string prefix = kModePrefixes[mode_index];
  for (const auto& [key, value] : p) {
    if (absl::StartsWith(key, prefix) && IsPlainSaveKey(key.substr(prefix.size()))) {
      absl::Status s = ApplyKey(m, key.substr(prefix.size()), value);
      if (!s.ok()) return s;
    }
  }
  return absl::OkStatus();
}

}  // namespace

bool SaveConfigMode::ShouldSave(int64_t s) const {
  if (save_steps.count(s) > 0) return true;
  return s >= start_step && (!end_step.has_value() || s < *end_step) &&
         s % save_interval == 0;
}

SaveConfig::SaveConfig(SaveConfigMode all) {
  for (auto& m : modes_) m = all;
}

int SaveConfig::Index(v1::Mode mode) {
  switch (mode) {
    case v1::MODE_TRAIN: return 0;
    case v1::MODE_EVAL: return 1;
    case v1::MODE_PREDICT: return 2;
    default: return 3;
  }
}

bool SaveConfig::IsSaveKey(const std::string& key) {
  if (IsPlainSaveKey(key)) return true;
  for (const char* prefix : kModePrefixes) {
    if (absl::StartsWith(key, prefix) && IsPlainSaveKey(key.substr(strlen(prefix)))) {
      return true;
    }
  }
  return false;
}

absl::StatusOr<SaveConfig> SaveConfig::FromParameters(
    const std::map<std::string, std::string>& base,
    const std::map<std::string, std::string>& overrides) {
  SaveConfig config;
  for (int i = 0; i < 4; ++i) {
    SaveConfigMode m;
    absl::Status s = ApplyParameters(m, base, i);
    if (s.ok()) s = ApplyParameters(m, overrides, i);
    if (!s.ok()) return s;
    config.Set(kModes[i], m);
  }
  return config;
}

absl::StatusOr<SaveConfig> SaveConfig::WithParameters(
    const std::map<std::string, std::string>& parameters) const {
  SaveConfig config = *this;
  for (int i = 0; i < 4; ++i) {
    absl::Status s = ApplyParameters(config.modes_[i], parameters, i);
    if (!s.ok()) return s;
  }
  return config;
}

absl::Status ReductionConfig::Validate() const {
  static const std::set<std::string> kReductions = {"min", "max", "mean", "std",
                                                    "variance", "sum"};
  static const std::set<std::string> kNorms = {"l1", "l2"};
  for (const auto* list : {&reductions, &abs_reductions}) {
    for (const std::string& r : *list) {
      if (kReductions.count(r) == 0) {
        return absl::InvalidArgumentError(absl::StrCat(
            "unknown reduction '", r, "' (known: min, max, mean, std, variance, sum)"));
      }
    }
  }
  for (const auto* list : {&norms, &abs_norms}) {
    for (const std::string& n : *list) {
      if (kNorms.count(n) == 0) {
        return absl::InvalidArgumentError(
            absl::StrCat("unknown norm '", n, "' (known: l1, l2)"));
      }
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<ReductionConfig> ReductionConfig::FromString(const std::string& list,
                                                            bool save_raw_tensor) {
  ReductionConfig c;
  c.save_raw_tensor = save_raw_tensor;
  for (absl::string_view part : absl::StrSplit(list, ',', absl::SkipWhitespace())) {
    std::string name(absl::StripAsciiWhitespace(part));
    bool abs = false;
    if (absl::StartsWith(name, "abs_")) {
      abs = true;
      name = name.substr(4);
    }
    if (absl::EndsWith(name, "_norm")) {
      name = name.substr(0, name.size() - 5);
      (abs ? c.abs_norms : c.norms).push_back(name);
    } else {
      (abs ? c.abs_reductions : c.reductions).push_back(name);
    }
  }
  absl::Status s = c.Validate();
  if (!s.ok()) return s;
  return c;
}

}  // namespace sonde
