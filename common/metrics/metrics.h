// Counters, gauges and histograms for operators, rendered in Prometheus' text
// exposition format 0.0.4 (what `/metrics` of the collector serves).
//
// Who owns what:
//  * A Registry owns metric families; a family owns its series (one per
//    combination of label values). Pointers handed out by a registry stay
//    valid for the registry's lifetime; series are never removed.
//  * Registry::Default() is the process-wide registry; the collector serves
//    it on /metrics together with its own registry (see
//    server/operator_views.h). Code anywhere records into it without
//    plumbing, defining a metric beside its use:
//
//      static metrics::Counter* const resent = metrics::Registry::Default()
//          .AddCounter("sonde_ingest_resent_steps_total", "Steps clients resent.");
//      resent->Increment();
//
//      static metrics::Family<metrics::Counter>* const by_kind =
//          metrics::Registry::Default().AddCounterFamily(
//              "sonde_things_total", "Things by kind.", {"kind"});
//      by_kind->Get({"chunk"})->Increment();
//
//    Adding the same name again with the same type, help and label names
//    returns the same family, so two call sites may define one metric.
//    A conflicting or malformed definition is logged and gets a working but
//    unexported family (a bad metric never crashes the collector).
//  * Values that belong to one object (a store, a thread pool) are callbacks
//    evaluated at scrape time, registered in a registry the object's owner
//    controls; the returned Registration removes the callback when it is
//    destroyed, so destroy it before the object the callback reads.
//
// Thread-safety: everything is thread-safe. Counter::Increment, Gauge::Set/
// Add and Histogram::Observe are lock-free (relaxed atomics). Family::Get
// takes the family's lock: hot paths look their series up once and keep the
// pointer. Callbacks run under the registry's lock during a scrape, so they
// must be quick and must not touch the registry.
//
// Naming: `sonde_<component>_<what>_<unit>`, counters end in `_total`, units
// are seconds and bytes (Prometheus' conventions).
#ifndef SONDE_COMMON_METRICS_METRICS_H_
#define SONDE_COMMON_METRICS_METRICS_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "absl/types/span.h"

namespace sonde::metrics {

enum class MetricType { kCounter, kGauge, kHistogram };

// A monotonically increasing integer count.
class Counter {
 public:
  void Increment(uint64_t n = 1) { value_.fetch_add(n, std::memory_order_relaxed); }
  uint64_t value() const { return value_.load(std::memory_order_relaxed); }

 private:
  std::atomic<uint64_t> value_{0};
};

// A value that goes up and down.
class Gauge {
 public:
  void Set(double v) { value_.store(v, std::memory_order_relaxed); }
  void Add(double delta);
  void Increment() { Add(1); }
  void Decrement() { Add(-1); }
  double value() const { return value_.load(std::memory_order_relaxed); }

 private:
  std::atomic<double> value_{0};
};

// Counts observations into fixed buckets (upper bounds, inclusive, as
// Prometheus' `le`), plus their sum. Latencies are observed in seconds.
class Histogram {
 public:
  // `bounds`: finite, strictly increasing upper bounds; the +Inf bucket is
  // implicit. (Registry::AddHistogram checks them.)
  explicit Histogram(std::vector<double> bounds);

  // A NaN lands in the +Inf bucket and makes the sum NaN, as in Prometheus'
  // own clients.
  void Observe(double value);
  void ObserveDuration(absl::Duration d) { Observe(absl::ToDoubleSeconds(d)); }

  struct Snapshot {
    std::vector<double> bounds;
    std::vector<uint64_t> cumulative;  // one per bound, then +Inf (== count)
    double sum = 0;
    uint64_t count = 0;
  };
  // Counts are read bucket by bucket while others may observe: each bucket
  // is exact, and count is by construction the +Inf bucket.
  Snapshot snapshot() const;

  const std::vector<double>& bounds() const { return bounds_; }

 private:
  const std::vector<double> bounds_;
  std::unique_ptr<std::atomic<uint64_t>[]> counts_;  // bounds_.size() + 1
  std::atomic<double> sum_{0};
};

// Latency buckets in seconds, 0.5 ms to 10 s (fits commits, rules, queries).
std::vector<double> LatencyBuckets();
// `count` bounds: start, start*factor, ... (start > 0, factor > 1).
std::vector<double> ExponentialBuckets(double start, double factor, int count);

// One metric (a name, help and label names) and its series.
template <typename T>
class Family {
 public:
  // The series for `label_values` (one per label name, in order), created
  // on first use. A wrong number of values is logged and gets a series that
  // is never exported.
  T* Get(const std::vector<std::string>& label_values);

 private:
  friend class Registry;
  Family(std::vector<std::string> label_names, std::function<std::unique_ptr<T>()> make)
      : label_names_(std::move(label_names)), make_(std::move(make)) {}

  const std::vector<std::string> label_names_;
  const std::function<std::unique_ptr<T>()> make_;
  mutable absl::Mutex mu_;
  std::map<std::vector<std::string>, std::unique_ptr<T>> series_ ABSL_GUARDED_BY(mu_);
  std::unique_ptr<T> discard_ ABSL_GUARDED_BY(mu_);
};

// One sample of a callback metric.
struct Sample {
  std::vector<std::string> label_values;
  double value = 0;
};

// What a registry holds at one moment, ready to render.
struct FamilySnapshot {
  std::string name;
  std::string help;
  MetricType type = MetricType::kGauge;
  std::vector<std::string> label_names;
  struct Series {
    std::vector<std::string> label_values;
    double value = 0;                  // counters and gauges
    Histogram::Snapshot histogram;     // histograms
  };
  std::vector<Series> series;  // sorted by label values
};

class Registry;

// Keeps a callback registered; destroying (or Reset) removes it. Movable.
class Registration {
 public:
  Registration() = default;
  Registration(Registration&& other) noexcept;
  Registration& operator=(Registration&& other) noexcept;
  ~Registration() { Reset(); }
  // After Reset returns, the callback is not running and never runs again.
  void Reset();

 private:
  friend class Registry;
  Registration(Registry* registry, uint64_t id) : registry_(registry), id_(id) {}
  Registry* registry_ = nullptr;
  uint64_t id_ = 0;
};

class Registry {
 public:
  Registry();
  ~Registry();
  Registry(const Registry&) = delete;
  Registry& operator=(const Registry&) = delete;

  // The process-wide registry (never destroyed).
  static Registry& Default();

  // Unlabelled metrics: the one series, exported from the start at 0.
  Counter* AddCounter(const std::string& name, const std::string& help);
  Gauge* AddGauge(const std::string& name, const std::string& help);
  Histogram* AddHistogram(const std::string& name, const std::string& help,
                          std::vector<double> bounds);

  // Labelled families. Label names match [a-zA-Z_][a-zA-Z0-9_]*, do not start
  // with "__", and are not "le" for histograms. A family is exported once it
  // has a series: Get the label values you know of up front so they show 0.
  Family<Counter>* AddCounterFamily(const std::string& name, const std::string& help,
                                    std::vector<std::string> label_names);
  Family<Gauge>* AddGaugeFamily(const std::string& name, const std::string& help,
                                std::vector<std::string> label_names);
  Family<Histogram>* AddHistogramFamily(const std::string& name, const std::string& help,
                                        std::vector<double> bounds,
                                        std::vector<std::string> label_names);

  // Metrics computed at scrape time. `type` is kCounter or kGauge. Several
  // callbacks may feed one family (each its own series); a series reported
  // twice is exported once. A malformed or conflicting definition is logged
  // and the callback never runs.
  using SampleFn = std::function<std::vector<Sample>()>;
  Registration AddCallback(MetricType type, const std::string& name, const std::string& help,
                           std::vector<std::string> label_names, SampleFn fn);
  Registration AddCallbackGauge(const std::string& name, const std::string& help,
                                std::function<double()> fn);
  Registration AddCallbackCounter(const std::string& name, const std::string& help,
                                  std::function<double()> fn);

  // Every exported family with its current values, sorted by name.
  std::vector<FamilySnapshot> Collect() const;

 private:
  friend class Registration;
  struct Entry;

  // The entry for a definition: existing if identical, new if the name is
  // free, nullptr (logged) if malformed or conflicting.
  Entry* FindOrAdd(const std::string& name, const std::string& help, MetricType type,
                   const std::vector<std::string>& label_names,
                   const std::vector<double>& bounds, bool callback)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Remove(uint64_t id);

  mutable absl::Mutex mu_;
  std::map<std::string, std::unique_ptr<Entry>> entries_ ABSL_GUARDED_BY(mu_);
  // Families of rejected definitions: they work, nobody exports them.
  std::vector<std::unique_ptr<Entry>> unexported_ ABSL_GUARDED_BY(mu_);
  uint64_t next_callback_id_ ABSL_GUARDED_BY(mu_) = 1;
};

// The text exposition format 0.0.4 of `families` (as Collect returns them):
// HELP and TYPE lines, escaped label values, histograms as cumulative
// _bucket{le=...} series ending in le="+Inf", then _sum and _count.
std::string RenderText(const std::vector<FamilySnapshot>& families);

// Collects from every registry and renders them as one exposition. A family
// name present in several registries is merged when type, help and labels
// agree (the first registry's series win on duplicates), else only the first
// is kept.
std::string RenderText(absl::Span<const Registry* const> registries);

// The Content-Type of RenderText's output.
inline constexpr char kTextContentType[] = "text/plain; version=0.0.4";

// Exposition number formatting: integers without exponent or fraction, other
// values in the shortest form that reads back exactly, "NaN", "+Inf", "-Inf".
std::string FormatValue(double value);

// Escapes for the format: label values (\\, \", \n) and HELP text (\\, \n).
std::string EscapeLabelValue(const std::string& value);
std::string EscapeHelp(const std::string& help);

// Validity of names per the data model.
bool IsValidMetricName(const std::string& name);
bool IsValidLabelName(const std::string& name);

}  // namespace sonde::metrics

#endif  // SONDE_COMMON_METRICS_METRICS_H_
