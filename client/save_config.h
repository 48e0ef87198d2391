// What to save and when, with smdebug's names and semantics.
//
// SaveConfig: per mode (TRAIN, EVAL, PREDICT, GLOBAL), a SaveConfigMode
// {save_interval=500, start_step=0, end_step=none, save_steps={}}. Mode step
// s is saved if s is in save_steps, or if start_step <= s < end_step and
// s % save_interval == 0 (the interval counts from step 0, not from
// start_step; end_step is exclusive), as smdebug's should_save_step.
//
// ReductionConfig: reductions/abs_reductions (min, max, mean, std,
// variance, sum), norms/abs_norms (l1, l2), save_raw_tensor. Sonde always
// computes the full statistics record; a reduction config without
// save_raw_tensor means "statistics only, no values".
//
// Plain values; thread-compatible.
#ifndef SONDE_CLIENT_SAVE_CONFIG_H_
#define SONDE_CLIENT_SAVE_CONFIG_H_

#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "proto/tensor.pb.h"

namespace sonde {

struct SaveConfigMode {
  int64_t save_interval = 500;
  int64_t start_step = 0;
  std::optional<int64_t> end_step;  // exclusive; none: no end
  std::set<int64_t> save_steps;

  bool ShouldSave(int64_t mode_step) const;
};

class SaveConfig {
 public:
  SaveConfig() = default;
  // The same settings for every mode.
  explicit SaveConfig(SaveConfigMode all);
  static SaveConfig Every(int64_t interval) {
    SaveConfigMode m;
    m.save_interval = interval;
    return SaveConfig(m);
  }

  void Set(v1::Mode mode, SaveConfigMode config) { modes_[Index(mode)] = config; }
  const SaveConfigMode& Get(v1::Mode mode) const { return modes_[Index(mode)]; }
  bool ShouldSave(v1::Mode mode, int64_t mode_step) const {
    return Get(mode).ShouldSave(mode_step);
  }

  // Builds a config from smdebug's string parameters: save_interval,
  // save_steps (comma-separated), start_step, end_step, each optionally
  // prefixed by "train.", "eval.", "predict." or "global.". `base` is
  // applied first (the hook's parameters), `overrides` on top (a
  // collection's). Keys that are not save keys are ignored.
  static absl::StatusOr<SaveConfig> FromParameters(
      const std::map<std::string, std::string>& base,
      const std::map<std::string, std::string>& overrides = {});

  // These settings with smdebug's parameters applied on top (keys as for
  // FromParameters; the others are ignored).
  absl::StatusOr<SaveConfig> WithParameters(
      const std::map<std::string, std::string>& parameters) const;

  // True if `key` (possibly mode-prefixed) is one of the save keys.
  static bool IsSaveKey(const std::string& key);

 private:
  static int Index(v1::Mode mode);
  SaveConfigMode modes_[4];
};

struct ReductionConfig {
  std::vector<std::string> reductions;
  std::vector<std::string> abs_reductions;
  std::vector<std::string> norms;
  std::vector<std::string> abs_norms;
  bool save_raw_tensor = false;

  // Checks names against smdebug's allowed lists.
  absl::Status Validate() const;

  // smdebug's JSON form: "reductions": "mean,abs_max,l2_norm,abs_l1_norm".
  static absl::StatusOr<ReductionConfig> FromString(const std::string& list,
                                                    bool save_raw_tensor);
};

}  // namespace sonde

#endif  // SONDE_CLIENT_SAVE_CONFIG_H_
