#include "common/metrics/metrics.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <set>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "glog/logging.h"

namespace sonde::metrics {
namespace {

void AtomicAdd(std::atomic<double>& target, double delta) {
  double seen = target.load(std::memory_order_relaxed);
  while (!target.compare_exchange_weak(seen, seen + delta, std::memory_order_relaxed)) {
  }
}

const char* TypeName(MetricType type) {
  switch (type) {
    case MetricType::kCounter:
      return "counter";
    case MetricType::kGauge:
      return "gauge";
    case MetricType::kHistogram:
      return "histogram";
  }
  return "untyped";
}

bool ValidBounds(const std::vector<double>& bounds) {
  for (size_t i = 0; i < bounds.size(); ++i) {
    if (!std::isfinite(bounds[i])) return false;
    if (i > 0 && !(bounds[i - 1] < bounds[i])) return false;
  }
  return true;
}

// `{a="x",b="y"}` (empty when there are no labels), with an extra label
// appended when `extra_name` is set (histograms' le).
std::string LabelSet(const std::vector<std::string>& names,
                     const std::vector<std::string>& values, const char* extra_name = nullptr,
                     const std::string& extra_value = "") {
  if (names.empty() && extra_name == nullptr) return "";
  std::string out = "{";
  for (size_t i = 0; i < names.size(); ++i) {
    if (i > 0) out += ',';
    absl::StrAppend(&out, names[i], "=\"", EscapeLabelValue(values[i]), "\"");
  }
  if (extra_name != nullptr) {
    if (!names.empty()) out += ',';
    absl::StrAppend(&out, extra_name, "=\"", EscapeLabelValue(extra_value), "\"");
  }
  out += '}';
  return out;
}

bool SameDefinition(const FamilySnapshot& a, const FamilySnapshot& b) {
  return a.type == b.type && a.help == b.help && a.label_names == b.label_names;
}

}  // namespace

void Gauge::Add(double delta) { AtomicAdd(value_, delta); }

Histogram::Histogram(std::vector<double> bounds)
    : bounds_(std::move(bounds)), counts_(new std::atomic<uint64_t>[bounds_.size() + 1]) {
  for (size_t i = 0; i <= bounds_.size(); ++i) counts_[i].store(0, std::memory_order_relaxed);
}

void Histogram::Observe(double value) {
  // First bound >= value; NaN compares false everywhere and lands in +Inf.
  size_t i = std::isnan(value)
                 ? bounds_.size()
                 : static_cast<size_t>(std::lower_bound(bounds_.begin(), bounds_.end(), value) -
                                       bounds_.begin());
  counts_[i].fetch_add(1, std::memory_order_relaxed);
  AtomicAdd(sum_, value);
}

Histogram::Snapshot Histogram::snapshot() const {
  Snapshot s;
  s.bounds = bounds_;
  s.cumulative.resize(bounds_.size() + 1);
  uint64_t running = 0;
  for (size_t i = 0; i <= bounds_.size(); ++i) {
    running += counts_[i].load(std::memory_order_relaxed);
    s.cumulative[i] = running;
  }
  s.count = running;
  s.sum = sum_.load(std::memory_order_relaxed);
  return s;
}

std::vector<double> LatencyBuckets() {
  return {0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10};
}

std::vector<double> ExponentialBuckets(double start, double factor, int count) {
  std::vector<double> out;
  if (!(start > 0) || !(factor > 1)) return out;
  double v = start;
  for (int i = 0; i < count; ++i, v *= factor) out.push_back(v);
  return out;
}

template <typename T>
T* Family<T>::Get(const std::vector<std::string>& label_values) {
  absl::MutexLock lock(&mu_);
  if (label_values.size() != label_names_.size()) {
    LOG(ERROR) << "metric series with " << label_values.size() << " label values for labels ["
               << absl::StrJoin(label_names_, ",") << "]; not exported";
    if (discard_ == nullptr) discard_ = make_();
    return discard_.get();
  }
  std::unique_ptr<T>& slot = series_[label_values];
  if (slot == nullptr) slot = make_();
  return slot.get();
}

template class Family<Counter>;
template class Family<Gauge>;
template class Family<Histogram>;

struct Registry::Entry {
  std::string name;
  std::string help;
  MetricType type = MetricType::kGauge;
  std::vector<std::string> label_names;
  std::vector<double> bounds;
  bool callback = false;
  std::unique_ptr<Family<Counter>> counters;
  std::unique_ptr<Family<Gauge>> gauges;
  std::unique_ptr<Family<Histogram>> histograms;
  std::map<uint64_t, SampleFn> callbacks;
};

Registration::Registration(Registration&& other) noexcept
    : registry_(other.registry_), id_(other.id_) {
  other.registry_ = nullptr;
}

Registration& Registration::operator=(Registration&& other) noexcept {
  if (this != &other) {
    Reset();
    registry_ = other.registry_;
    id_ = other.id_;
    other.registry_ = nullptr;
  }
  return *this;
}

void Registration::Reset() {
  if (registry_ != nullptr) registry_->Remove(id_);
  registry_ = nullptr;
}

Registry::Registry() = default;
Registry::~Registry() = default;

Registry& Registry::Default() {
  static Registry* const registry = new Registry();
  return *registry;
}

Registry::Entry* Registry::FindOrAdd(const std::string& name, const std::string& help,
                                     MetricType type,
                                     const std::vector<std::string>& label_names,
                                     const std::vector<double>& bounds, bool callback) {
  std::string problem;
  if (!IsValidMetricName(name)) problem = "invalid metric name";
  for (const std::string& l : label_names) {
    if (!IsValidLabelName(l) || (type == MetricType::kHistogram && l == "le")) {
      problem = absl::StrCat("invalid label name '", l, "'");
    }
  }
  if (std::set<std::string>(label_names.begin(), label_names.end()).size() !=
      label_names.size()) {
    problem = "repeated label name";
  }
  if (type == MetricType::kHistogram && !ValidBounds(bounds)) {
    problem = "histogram bounds must be finite and increasing";
  }
  if (callback && type == MetricType::kHistogram) problem = "callback histograms are unsupported";
  if (problem.empty()) {
    auto it = entries_.find(name);
    if (it == entries_.end()) {
      auto entry = std::make_unique<Entry>();
      entry->name = name;
      entry->help = help;
      entry->type = type;
      entry->label_names = label_names;
      entry->bounds = bounds;
      entry->callback = callback;
      Entry* raw = entry.get();
      entries_[name] = std::move(entry);
      return raw;
    }
    const Entry& e = *it->second;
    if (e.type == type && e.help == help && e.label_names == label_names &&
        e.bounds == bounds && e.callback == callback) {
      return it->second.get();
    }
    problem = "already defined differently";
  }
  LOG(ERROR) << "metric '" << name << "' (" << TypeName(type) << "): " << problem
             << "; not exported";
  return nullptr;
}

Counter* Registry::AddCounter(const std::string& name, const std::string& help) {
  return AddCounterFamily(name, help, {})->Get({});
}

Gauge* Registry::AddGauge(const std::string& name, const std::string& help) {
  return AddGaugeFamily(name, help, {})->Get({});
}

Histogram* Registry::AddHistogram(const std::string& name, const std::string& help,
                                  std::vector<double> bounds) {
  return AddHistogramFamily(name, help, std::move(bounds), {})->Get({});
}

Family<Counter>* Registry::AddCounterFamily(const std::string& name, const std::string& help,
                                            std::vector<std::string> label_names) {
  absl::MutexLock lock(&mu_);
  Entry* e = FindOrAdd(name, help, MetricType::kCounter, label_names, {}, false);
  if (e == nullptr) {
    unexported_.push_back(std::make_unique<Entry>());
    e = unexported_.back().get();
  }
  if (e->counters == nullptr) {
    e->counters.reset(new Family<Counter>(label_names, [] { return std::make_unique<Counter>(); }));
  }
  return e->counters.get();
}

Family<Gauge>* Registry::AddGaugeFamily(const std::string& name, const std::string& help,
                                        std::vector<std::string> label_names) {
  absl::MutexLock lock(&mu_);
  Entry* e = FindOrAdd(name, help, MetricType::kGauge, label_names, {}, false);
  if (e == nullptr) {
    unexported_.push_back(std::make_unique<Entry>());
    e = unexported_.back().get();
  }
  if (e->gauges == nullptr) {
    e->gauges.reset(new Family<Gauge>(label_names, [] { return std::make_unique<Gauge>(); }));
  }
  return e->gauges.get();
}

Family<Histogram>* Registry::AddHistogramFamily(const std::string& name,
                                                const std::string& help,
                                                std::vector<double> bounds,
                                                std::vector<std::string> label_names) {
  absl::MutexLock lock(&mu_);
  Entry* e = FindOrAdd(name, help, MetricType::kHistogram, label_names, bounds, false);
  if (e == nullptr) {
    unexported_.push_back(std::make_unique<Entry>());
    e = unexported_.back().get();
    // Keep the unexported histogram usable even with bad bounds.
    if (!ValidBounds(bounds)) bounds.clear();
  }
  if (e->histograms == nullptr) {
    e->histograms.reset(new Family<Histogram>(
        label_names, [bounds] { return std::make_unique<Histogram>(bounds); }));
  }
  return e->histograms.get();
}

Registration Registry::AddCallback(MetricType type, const std::string& name,
                                   const std::string& help,
                                   std::vector<std::string> label_names, SampleFn fn) {
  absl::MutexLock lock(&mu_);
  Entry* e = FindOrAdd(name, help, type, label_names, {}, true);
  if (e == nullptr) return Registration();
  const uint64_t id = next_callback_id_++;
  e->callbacks[id] = std::move(fn);
  return Registration(this, id);
}

Registration Registry::AddCallbackGauge(const std::string& name, const std::string& help,
                                        std::function<double()> fn) {
  return AddCallback(MetricType::kGauge, name, help, {},
                     [fn = std::move(fn)] { return std::vector<Sample>{{{}, fn()}}; });
}

Registration Registry::AddCallbackCounter(const std::string& name, const std::string& help,
                                          std::function<double()> fn) {
  return AddCallback(MetricType::kCounter, name, help, {},
                     [fn = std::move(fn)] { return std::vector<Sample>{{{}, fn()}}; });
}

void Registry::Remove(uint64_t id) {
  absl::MutexLock lock(&mu_);
  for (auto& [name, entry] : entries_) {
    if (entry->callbacks.erase(id) > 0) return;
  }
}

std::vector<FamilySnapshot> Registry::Collect() const {
  std::vector<FamilySnapshot> out;
  absl::MutexLock lock(&mu_);
  for (const auto& [name, entry] : entries_) {
    FamilySnapshot f;
    f.name = entry->name;
    f.help = entry->help;
    f.type = entry->type;
    f.label_names = entry->label_names;
    if (entry->callback) {
      std::map<std::vector<std::string>, double> seen;
      for (const auto& [id, fn] : entry->callbacks) {
        for (Sample& s : fn()) {
          if (s.label_values.size() != entry->label_names.size()) continue;
          seen.emplace(std::move(s.label_values), s.value);  // first one wins
        }
      }
      for (auto& [labels, value] : seen) {
        FamilySnapshot::Series s;
        s.label_values = labels;
        s.value = value;
        f.series.push_back(std::move(s));
      }
    } else if (entry->counters != nullptr) {
      absl::MutexLock family(&entry->counters->mu_);
      for (const auto& [labels, c] : entry->counters->series_) {
        FamilySnapshot::Series s;
        s.label_values = labels;
        s.value = static_cast<double>(c->value());
        f.series.push_back(std::move(s));
      }
    } else if (entry->gauges != nullptr) {
      absl::MutexLock family(&entry->gauges->mu_);
      for (const auto& [labels, g] : entry->gauges->series_) {
        FamilySnapshot::Series s;
        s.label_values = labels;
        s.value = g->value();
        f.series.push_back(std::move(s));
      }
    } else if (entry->histograms != nullptr) {
      absl::MutexLock family(&entry->histograms->mu_);
      for (const auto& [labels, h] : entry->histograms->series_) {
        FamilySnapshot::Series s;
        s.label_values = labels;
        s.histogram = h->snapshot();
        f.series.push_back(std::move(s));
      }
    }
    if (!f.series.empty()) out.push_back(std::move(f));
  }
  return out;
}

std::string FormatValue(double value) {
  if (std::isnan(value)) return "NaN";
  if (std::isinf(value)) return value > 0 ? "+Inf" : "-Inf";
  if (value == 0) return "0";
  char buf[64];
  if (value == std::floor(value) && std::fabs(value) < 1e15) {
    std::snprintf(buf, sizeof(buf), "%.0f", value);
    return buf;
  }
  for (int precision = 1; precision <= 17; ++precision) {
    std::snprintf(buf, sizeof(buf), "%.*g", precision, value);
    if (std::strtod(buf, nullptr) == value) break;
  }
  return buf;
}

std::string EscapeLabelValue(const std::string& value) {
  std::string out;
  out.reserve(value.size());
  for (char c : value) {
    switch (c) {
      case '\\':
        out += "\\\\";
        break;
      case '"':
        out += "\\\"";
        break;
      case '\n':
        out += "\\n";
        break;
      default:
        out += c;
    }
  }
  return out;
}

std::string EscapeHelp(const std::string& help) {
  std::string out;
  out.reserve(help.size());
  for (char c : help) {
    if (c == '\\') {
      out += "\\\\";
    } else if (c == '\n') {
      out += "\\n";
    } else {
      out += c;
    }
  }
  return out;
}

bool IsValidMetricName(const std::string& name) {
  if (name.empty()) return false;
  for (size_t i = 0; i < name.size(); ++i) {
    const char c = name[i];
    const bool alpha = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' || c == ':';
    if (!alpha && !(i > 0 && c >= '0' && c <= '9')) return false;
  }
  return true;
}

bool IsValidLabelName(const std::string& name) {
  if (name.empty() || name.rfind("__", 0) == 0) return false;
  for (size_t i = 0; i < name.size(); ++i) {
    const char c = name[i];
    const bool alpha = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_';
    if (!alpha && !(i > 0 && c >= '0' && c <= '9')) return false;
  }
  return true;
}

std::string RenderText(const std::vector<FamilySnapshot>& families) {
  std::string out;
  for (const FamilySnapshot& f : families) {
    absl::StrAppend(&out, "# HELP ", f.name, " ", EscapeHelp(f.help), "\n");
    absl::StrAppend(&out, "# TYPE ", f.name, " ", TypeName(f.type), "\n");
    for (const FamilySnapshot::Series& s : f.series) {
      if (f.type != MetricType::kHistogram) {
        absl::StrAppend(&out, f.name, LabelSet(f.label_names, s.label_values), " ",
                        FormatValue(s.value), "\n");
        continue;
      }
      const Histogram::Snapshot& h = s.histogram;
      for (size_t i = 0; i < h.cumulative.size(); ++i) {
        const std::string le = i < h.bounds.size() ? FormatValue(h.bounds[i]) : "+Inf";
        absl::StrAppend(&out, f.name, "_bucket", LabelSet(f.label_names, s.label_values, "le", le),
                        " ", h.cumulative[i], "\n");
      }
      const std::string labels = LabelSet(f.label_names, s.label_values);
      absl::StrAppend(&out, f.name, "_sum", labels, " ", FormatValue(h.sum), "\n");
      absl::StrAppend(&out, f.name, "_count", labels, " ", h.count, "\n");
    }
  }
  return out;
}

std::string RenderText(absl::Span<const Registry* const> registries) {
  std::vector<FamilySnapshot> merged;
  std::map<std::string, size_t> index;
  for (const Registry* r : registries) {
    for (FamilySnapshot& f : r->Collect()) {
      auto it = index.find(f.name);
      if (it == index.end()) {
        index[f.name] = merged.size();
        merged.push_back(std::move(f));
        continue;
      }
      FamilySnapshot& into = merged[it->second];
      if (!SameDefinition(into, f)) {
        LOG_EVERY_N(ERROR, 100) << "metric '" << f.name
                                << "' is defined differently in two registries; exporting one";
        continue;
      }
      std::set<std::vector<std::string>> have;
      for (const auto& s : into.series) have.insert(s.label_values);
      for (auto& s : f.series) {
        if (have.insert(s.label_values).second) into.series.push_back(std::move(s));
      }
      std::sort(into.series.begin(), into.series.end(),
                [](const auto& a, const auto& b) { return a.label_values < b.label_values; });
    }
  }
  std::sort(merged.begin(), merged.end(),
            [](const auto& a, const auto& b) { return a.name < b.name; });
  return RenderText(merged);
}

}  // namespace sonde::metrics
