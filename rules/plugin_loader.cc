#include "rules/plugin_loader.h"

#include <dlfcn.h>

#include <cstring>
#include <map>
#include <memory>
#include <vector>

#include "absl/strings/str_cat.h"
#include "rules/plugin_api.h"

namespace sonde::rules {
namespace {

// Storage that keeps the C views of one tensor alive during a call.
struct TensorView {
  std::vector<const char*> collections;
  SondeTensor c{};
};

void Fill(const v1::TensorRecord& r, const std::string* values, TensorView& v) {
  v.collections.clear();
  for (const std::string& c : r.collections()) v.collections.push_back(c.c_str());
  SondeTensor& t = v.c;
  t.name = r.tensor_name().c_str();
  t.worker = r.worker();
  t.collections = v.collections.data();
  t.collection_count = static_cast<int32_t>(v.collections.size());
  t.dtype = r.dtype();
  t.shape = r.shape().data();
  t.rank = r.shape_size();
  const v1::Statistics& s = r.statistics();
  t.count = s.count();
  t.finite_count = s.finite_count();
  t.nan_count = s.nan_count();
  t.pos_inf_count = s.pos_inf_count();
  t.neg_inf_count = s.neg_inf_count();
  t.zero_count = s.zero_count();
  t.min = s.min();
  t.max = s.max();
  t.abs_min = s.abs_min();
  t.abs_max = s.abs_max();
  t.sum = s.sum();
  t.mean = s.mean();
  t.variance = s.variance();
  t.std = s.std();
  t.l1 = s.l1();
  t.l2 = s.l2();
  t.values = values != nullptr ? values->data() : nullptr;
  t.values_bytes = values != nullptr ? values->size() : 0;
}

std::string Terminated(const char* s, size_t n) { return std::string(s, strnlen(s, n)); }

class PluginRule : public Rule {
 public:
  PluginRule(const SondeRuleTypeV1* type, void* instance) : type_(type), instance_(instance) {}
  ~PluginRule() override { type_->destroy(instance_); }

  bool WantsValues(const v1::TensorRecord& record) const override {
    if (type_->wants_values == nullptr) return false;
    TensorView v;
    Fill(record, nullptr, v);
    return type_->wants_values(instance_, &v.c) != 0;
  }

  absl::StatusOr<std::optional<Finding>> OnStep(const StepData& step) override {
    std::vector<TensorView> views(step.tensors.size());
    std::vector<SondeTensor> tensors(step.tensors.size());
    for (size_t i = 0; i < step.tensors.size(); ++i) {
      Fill(step.tensors[i], step.ValuesOf(i), views[i]);
      tensors[i] = views[i].c;
    }
    SondeStep s{step.step, step.mode, step.mode_step, tensors.data(),
                static_cast<int32_t>(tensors.size())};
    SondeFinding f{};
    return Convert(type_->on_step(instance_, &s, &f), f);
  }

  absl::StatusOr<std::optional<Finding>> OnJobEnd() override {
    if (type_->on_job_end == nullptr) return std::optional<Finding>();
    SondeFinding f{};
    return Convert(type_->on_job_end(instance_, &f), f);
  }

 private:
  absl::StatusOr<std::optional<Finding>> Convert(int32_t rc, const SondeFinding& f) {
    if (rc == SONDE_RULE_QUIET) return std::optional<Finding>();
    if (rc != SONDE_RULE_ISSUE) {
      return absl::InternalError(absl::StrCat("plugin rule ", type_->rule_type, ": ",
                                              Terminated(f.message, sizeof(f.message))));
    }
    Finding out;
    out.message = Terminated(f.message, sizeof(f.message));
    const std::string tensor = Terminated(f.tensor, sizeof(f.tensor));
    if (!tensor.empty()) out.tensors.push_back(tensor);
    out.suggestion = Terminated(f.suggestion, sizeof(f.suggestion));
    out.worker = f.worker;
    out.observed = f.observed;
    out.threshold = f.threshold;
    return std::optional<Finding>(std::move(out));
  }

  const SondeRuleTypeV1* type_;
  void* instance_;
};

}  // namespace

absl::Status LoadRulePlugin(const std::string& path, RuleFactory& factory) {
  void* lib = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (lib == nullptr) {
    return absl::NotFoundError(absl::StrCat("cannot load rule plugin '", path, "': ", dlerror()));
  }
  auto fn = reinterpret_cast<SondeRulesV1Fn>(dlsym(lib, SONDE_PLUGIN_SYMBOL_V1));
  if (fn == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat("rule plugin '", path, "' does not export ",
                                                   SONDE_PLUGIN_SYMBOL_V1));
  }
  const SondeRuleTypeV1* types = nullptr;
  int32_t count = 0;
  if (fn(&types, &count) != 0 || (count > 0 && types == nullptr) || count < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("rule plugin '", path, "': ", SONDE_PLUGIN_SYMBOL_V1, " failed"));
  }
  for (int32_t i = 0; i < count; ++i) {
    const SondeRuleTypeV1* type = &types[i];
    if (type->rule_type == nullptr || type->create == nullptr || type->on_step == nullptr ||
        type->destroy == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat(
          "rule plugin '", path, "': rule type ", i, " lacks a name or a callback"));
    }
    RuleInfo info;
    info.rule_type = type->rule_type;
    info.description = type->description != nullptr ? type->description : "";
    info.suggestion = type->suggestion != nullptr ? type->suggestion : "";
    for (int32_t p = 0; p < type->parameter_count; ++p) {
      const SondeParameter& param = type->parameters[p];
      info.parameters.push_back({param.name != nullptr ? param.name : "",
                                 param.default_value != nullptr ? param.default_value : "",
                                 param.description != nullptr ? param.description : ""});
    }
    for (int32_t c = 0; c < type->default_collection_count; ++c) {
      info.default_collections.push_back(type->default_collections[c]);
    }
    info.source = path;
    info.needs_values = type->needs_values != 0;
    RuleMaker maker = [type](RuleParams& params) -> absl::StatusOr<std::unique_ptr<Rule>> {
      const std::map<std::string, std::string> given = params.TakeAll();
      std::vector<const char*> keys, values;
      for (const auto& [k, v] : given) {
        keys.push_back(k.c_str());
        values.push_back(v.c_str());
      }
      char error[512] = {0};
      void* instance = type->create(keys.data(), values.data(), static_cast<int32_t>(keys.size()),
                                    error, sizeof(error));
      if (instance == nullptr) {
        return absl::InvalidArgumentError(absl::StrCat(
            type->rule_type, ": ", error[0] != '\0' ? Terminated(error, sizeof(error))
                                                   : std::string("bad parameters")));
      }
      return std::unique_ptr<Rule>(new PluginRule(type, instance));
    };
    absl::Status s = factory.Register(std::move(info), std::move(maker));
    if (!s.ok()) return absl::Status(s.code(), absl::StrCat("rule plugin '", path, "': ", s.message()));
  }
  return absl::OkStatus();
}

}  // namespace sonde::rules
