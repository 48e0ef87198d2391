#include "client/hook_profiler.h"

#include <algorithm>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "client/profiler/proc_stats.h"
#include "client/profiler/system_sampler.h"
#include "common/profile_check.h"
#include "glog/logging.h"

namespace sonde {

absl::Status HookProfiler::ValidateOptions(const ProfilerOptions& options) {
  if (options.interval < profiler::SystemSampler::kMinInterval ||
      options.interval > profiler::SystemSampler::kMaxInterval) {
    return absl::InvalidArgumentError(absl::StrCat(
        "profiler interval ", absl::FormatDuration(options.interval), " is outside ",
        absl::ToInt64Milliseconds(profiler::SystemSampler::kMinInterval), "ms..",
        absl::ToInt64Seconds(profiler::SystemSampler::kMaxInterval), "s"));
  }
  if (options.nvml_library.empty()) {
    return absl::InvalidArgumentError(
        "profiler nvml_library is empty (the default is \"libnvidia-ml.so.1\")");
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<HookProfiler>> HookProfiler::Start(const ProfilerOptions& options,
                                                                  Sink sink) {
  absl::Status valid = ValidateOptions(options);
  if (!valid.ok()) return valid;
  std::unique_ptr<HookProfiler> p(new HookProfiler(options, std::move(sink)));
  profiler::SystemSamplerOptions so;
  so.interval = options.interval;
  so.collection.nvml_library = options.nvml_library;
  if (!options.system) {
    // The sampler still keeps the cadence batches are sent on.
    profiler::SystemMetricGroups& g = so.collection.groups;
    g.cpu = g.memory = g.network = g.process = g.gpu = g.own_cost = false;
  }
  HookProfiler* raw = p.get();
  auto sampler = profiler::SystemSampler::Start(so, [raw](const profiler::SystemSample& s) {
    if (s.points.empty()) {
      raw->Flush(std::nullopt);
      return;
    }
    v1::MetricSnapshot snapshot;
    snapshot.set_unix_micros(s.timestamp_us);
    for (const profiler::MetricPoint& point : s.points) {
      v1::MetricSample* sample = snapshot.add_samples();
      sample->set_name(point.name);
      sample->set_value(point.value);
    }
    raw->Flush(std::move(snapshot));
  });
  if (!sampler.ok()) return sampler.status();
  p->sampler_ = std::move(*sampler);
  return p;
}

HookProfiler::HookProfiler(ProfilerOptions options, Sink sink)
    : options_(std::move(options)),
      sink_(std::move(sink)),
      // Where /proc cannot tell, the initialisation is timed from here.
      process_start_(profiler::ProcessStartTime().value_or(absl::Now())) {}

HookProfiler::~HookProfiler() { Stop(); }

void HookProfiler::LogOnce(const absl::Status& dropped) {
  {
    absl::MutexLock lock(&mu_);
    if (logged_drop_) return;
    logged_drop_ = true;
  }
  LOG(WARNING) << "sonde: profiler data dropped (the collector would refuse it): " << dropped
               << " (logged once)";
}

void HookProfiler::Record(v1::TraceEvent event) {
  if (!options_.framework) return;
  if (event.end_unix_micros() < event.start_unix_micros()) {
    event.set_end_unix_micros(event.start_unix_micros());  // the clock stepped back
  }
  absl::Status valid = ValidateTraceEvent(event);
  if (!valid.ok()) {
    LogOnce(valid);
    return;
  }
  absl::MutexLock lock(&mu_);
  if (stopped_) return;
  events_.push_back(std::move(event));
}

void HookProfiler::SetGauge(const std::string& name, double value) {
  if (!options_.framework) return;
  v1::MetricSample sample;
  sample.set_name(name);
  sample.set_value(value);
  absl::Status valid = ValidateMetricSample(sample);
  if (!valid.ok()) {
    LogOnce(valid);
    return;
  }
  absl::MutexLock lock(&mu_);
  gauges_[name] = value;
}

void HookProfiler::RecordInit(absl::Time first_step_start, v1::Mode mode) {
  v1::TraceEvent init;
  init.set_kind(v1::TraceEvent::KIND_INIT);
  init.set_mode(mode);
  init.set_step(-1);
  init.set_start_unix_micros(absl::ToUnixMicros(std::min(process_start_, first_step_start)));
  init.set_end_unix_micros(absl::ToUnixMicros(first_step_start));
  Record(std::move(init));
}

void HookProfiler::Flush(std::optional<v1::MetricSnapshot> snapshot) {
  v1::ProfileBatch batch;
  std::vector<v1::TraceEvent> events;
  std::map<std::string, double> gauges;
  {
    absl::MutexLock lock(&mu_);
    events.swap(events_);
    gauges = gauges_;
  }
  if (snapshot.has_value() || !gauges.empty()) {
    v1::MetricSnapshot* s = batch.add_snapshots();
    if (snapshot.has_value()) {
      *s = std::move(*snapshot);
    } else {
      s->set_unix_micros(absl::ToUnixMicros(absl::Now()));
    }
    for (const auto& [name, value] : gauges) {
      v1::MetricSample* sample = s->add_samples();
      sample->set_name(name);
      sample->set_value(value);
    }
  }
  // Events follow, a batch cut wherever the next event would pass the
  // size (each field costs its bytes, a tag and a length of at most 5).
  size_t bytes = batch.ByteSizeLong();
  for (v1::TraceEvent& e : events) {
    const size_t cost = e.ByteSizeLong() + 6;
    if (bytes + cost > kMaxBatchBytes && bytes > 0) {
      sink_(std::move(batch));
      batch = v1::ProfileBatch();
      bytes = 0;
    }
    *batch.add_events() = std::move(e);
    bytes += cost;
  }
  if (batch.events_size() == 0 && batch.snapshots_size() == 0) return;
  sink_(std::move(batch));
}

void HookProfiler::Stop() {
  {
    absl::MutexLock lock(&mu_);
    if (stopped_) return;
    stopped_ = true;  // from here Record drops: nothing is left behind unsent
  }
  if (sampler_ != nullptr) sampler_->Stop();  // no callback runs after this
  Flush(std::nullopt);
}

}  // namespace sonde
