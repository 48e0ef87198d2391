// Collections: named groups of tensors, each with its own save and
// reduction settings, as in smdebug. Built-ins (PyTorch naming):
//   weights   ^(?!gradient).*weight      biases   ^(?!gradient).*bias
//   gradients ^gradient                  losses   [Ll]oss_(?!input).*output
//   metrics, inputs, outputs, scalars    (membership given explicitly)
//   default   the hook's include_regex   all      every tensor
// A tensor belongs to the collections passed with it, to those whose regex
// matches its name, and to those it was added to. It is saved at a step if
// one of its *included* collections (include_collections, the configured
// ones, losses always, all if save_all or asked for) saves at that mode step; with
// values unless every such collection asks for statistics only. Like
// smdebug, gradients are not saved in EVAL or PREDICT mode.
// Thread-compatible (the Hook guards it).
#ifndef SONDE_CLIENT_COLLECTIONS_H_
#define SONDE_CLIENT_COLLECTIONS_H_

#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/node_hash_map.h"
#include "absl/status/statusor.h"
#include "common/pattern.h"
#include "client/save_config.h"
#include "proto/rule.pb.h"

namespace sonde {

struct CollectionConfig {
  std::string name;
  std::vector<std::string> include_regex;
  std::optional<SaveConfig> save_config;            // default: the hook's
  std::optional<ReductionConfig> reduction_config;  // default: the hook's
  // smdebug's save_histogram: also send a histogram of the tensor's values
  // (bins from HookOptions::histogram, independent of the data).
  bool save_histogram = false;
};

// smdebug's hook parameters: what to save.
struct HookConfig {
  SaveConfig save_config;                           // default interval 500
  std::optional<ReductionConfig> reduction_config;  // none: save values
  std::vector<std::string> include_regex;           // fills "default"
  std::vector<std::string> include_collections;     // "losses" is always added
  bool save_all = false;
  std::vector<CollectionConfig> collections;        // settings per collection
};

struct SaveDecision {
  bool save = false;
  bool values = false;                   // raw values, else statistics only
  bool histogram = false;                // a saving collection has save_histogram
  std::vector<std::string> collections;  // every collection the tensor is in
};

class CollectionSet {
 public:
  static absl::StatusOr<CollectionSet> Create(const HookConfig& config);

  // Adds a tensor name to a collection (creating a custom collection).
  void AddToCollection(const std::string& collection, const std::string& tensor);
  // Saves the collection from now on (with its own save config, else the
  // hook's), as if it had been in include_collections.
  void Include(const std::string& collection);
  // Could any tensor be saved at this mode step? False only when no
  // included collection's save config says this step: callers use it to
  // skip all per-tensor work on steps that save nothing.
  bool AnyDue(v1::Mode mode, int64_t mode_step);
  // The included collections due at this mode step.
  std::vector<std::string> DueCollections(v1::Mode mode, int64_t mode_step) const;
  // The collections a tensor of this name belongs to by name or regex
  // (cached per name; explicit collections of a save come on top).
  const std::vector<std::string>& Members(const std::string& tensor);

  // What a rule needs (from the collector's hello ack): the collection is
  // included from now on, gains the request's regexes, and is saved with
  // values when the rule reads values. The request's save settings apply
  // on top of the hook's, except to a collection whose save settings the
  // user gave (those stay): alone for a collection only rules ask for, and
  // in addition to the collection's own schedule for one the user included
  // (losses always) or another rule asked for, so a rule never thins out
  // what is saved.
  // A bare request for "all" (no regex; older collectors sent it for rules
  // that judge whatever is saved) is ignored. InvalidArgument for a bad
  // regex or setting.
  absl::Status Require(const v1::CollectionRequest& request);

  SaveDecision Decide(const std::string& tensor, const std::vector<std::string>& explicit_collections,
                      v1::Mode mode, int64_t mode_step);

  const std::set<std::string>& included() const { return included_; }

 private:
  struct Collection {
    std::vector<Pattern> regexes;
    std::vector<Pattern> excludes;  // names the regexes match that are not members
    std::set<std::string> tensors;
    std::optional<SaveConfig> save_config;
    bool user_save_config = false;           // save_config is the user's
    std::vector<SaveConfig> rule_schedules;  // also due when one of these says so
    std::optional<ReductionConfig> reduction_config;
    bool force_values = false;  // a rule reads its raw values
    bool save_histogram = false;
    std::set<std::string> requested_patterns;  // regexes added by Require
    std::set<std::string> requested_settings;  // save settings taken by Require
  };
  Collection& Get(const std::string& name);
  // The settings of collection `c`; null when it has none.
  const Collection* Find(const std::string& c) const;
  // Is collection `c` (settings `coll`, from Find) due at this mode step by
  // its save config, else the hook's, or by a rule's? Gradients are never due in EVAL or
  // PREDICT. Whether `c` is included is the caller's to check.
  bool DueAt(const std::string& c, const Collection* coll, v1::Mode mode,
             int64_t mode_step) const;

  // What an included collection asks of its tensors at one mode step.
  struct DueInfo {
    bool due = false;
    bool histogram = false;
    bool values = false;
  };
  // The included collections' DueInfo at this mode step: computed once a
  // step (and again after any change), not once a tensor.
  const absl::flat_hash_map<std::string, DueInfo>& DueMemo(v1::Mode mode, int64_t mode_step);
  void Changed() { ++generation_; }

  HookConfig config_;
  std::map<std::string, Collection> collections_;
  std::set<std::string> included_;
  // Node-based: Members hands out references to its values.
  absl::node_hash_map<std::string, std::vector<std::string>> member_cache_;
  uint64_t generation_ = 0;  // bumped by every change of collections or inclusion
  uint64_t memo_generation_ = ~uint64_t{0};
  v1::Mode memo_mode_ = v1::MODE_UNSPECIFIED;
  int64_t memo_mode_step_ = -1;
  absl::flat_hash_map<std::string, DueInfo> memo_;
};

}  // namespace sonde

#endif  // SONDE_CLIENT_COLLECTIONS_H_
