#include "client/hook_profiler.h"

#include <unistd.h>

#include <fstream>
#include <sstream>
#include <string>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/strip.h"
#include "absl/strings/str_split.h"
#include "client/profiler/system_sampler.h"
#include "glog/logging.h"

namespace sonde {

absl::StatusOr<std::unique_ptr<HookProfiler>> HookProfiler::Start(const ProfilerOptions& options,
                                                                  Sink sink) {
  std::unique_ptr<HookProfiler> p(new HookProfiler(options, std::move(sink)));
  profiler::SystemSamplerOptions so;
  so.interval = options.interval;
  if (!options.system) {
    // The sampler still keeps the cadence batches are sent on.
    profiler::SystemMetricGroups& g = so.collection.groups;
    g.cpu = g.memory = g.network = g.process = g.gpu = g.own_cost = false;
  }
  HookProfiler* raw = p.get();
  auto sampler = profiler::SystemSampler::Start(so, [raw](const profiler::SystemSample& s) {
    v1::MetricSnapshot snapshot;
    snapshot.set_unix_micros(s.timestamp_us);
    for (const profiler::MetricPoint& point : s.points) {
      v1::MetricSample* sample = snapshot.add_samples();
      sample->set_name(point.name);
      sample->set_value(point.value);
    }
    raw->Flush(snapshot.samples().empty() ? nullptr : &snapshot);
  });
  if (!sampler.ok()) return sampler.status();
  p->sampler_ = std::move(*sampler);
  return p;
}

HookProfiler::HookProfiler(ProfilerOptions options, Sink sink)
    : options_(std::move(options)), sink_(std::move(sink)) {}

HookProfiler::~HookProfiler() { Stop(); }

void HookProfiler::Record(v1::TraceEvent event) {
  if (!options_.framework) return;
  absl::MutexLock lock(&mu_);
  if (stopped_) return;
  events_.push_back(std::move(event));
}

void HookProfiler::SetGauge(const std::string& name, double value) {
  absl::MutexLock lock(&mu_);
  gauges_[name] = value;
}

void HookProfiler::Flush(const v1::MetricSnapshot* snapshot) {
  v1::ProfileBatch batch;
  std::map<std::string, double> gauges;
  {
    absl::MutexLock lock(&mu_);
    for (v1::TraceEvent& e : events_) *batch.add_events() = std::move(e);
    events_.clear();
    gauges = gauges_;
  }
  if (snapshot != nullptr || !gauges.empty()) {
    v1::MetricSnapshot* s = batch.add_snapshots();
    if (snapshot != nullptr) {
      *s = *snapshot;
    } else {
      s->set_unix_micros(absl::ToUnixMicros(absl::Now()));
    }
    for (const auto& [name, value] : gauges) {
      v1::MetricSample* sample = s->add_samples();
      sample->set_name(name);
      sample->set_value(value);
    }
  }
  if (batch.events_size() == 0 && batch.snapshots_size() == 0) return;
  sink_(std::move(batch));
}

void HookProfiler::Stop() {
  {
    absl::MutexLock lock(&mu_);
    if (stopped_) return;
  }
  if (sampler_ != nullptr) sampler_->Stop();  // no callback runs after this
  Flush(nullptr);
  absl::MutexLock lock(&mu_);
  stopped_ = true;
}

double HookProfiler::cpu_seconds() const {
  return sampler_ != nullptr ? sampler_->cost().thread_cpu_seconds : 0;
}

absl::Time ProcessStartTime(absl::Time fallback) {
  std::ifstream stat_file("/proc/self/stat");
  std::stringstream self;
  self << stat_file.rdbuf();
  const std::string text = self.str();
  const size_t paren = text.rfind(')');  // the command name may hold spaces and parens
  if (paren == std::string::npos) return fallback;
  std::vector<absl::string_view> fields =
      absl::StrSplit(absl::string_view(text).substr(paren + 1), ' ', absl::SkipEmpty());
  // Field 22 of the file (starttime, clock ticks since boot) is the 20th
  // after the command name.
  uint64_t ticks = 0;
  if (fields.size() < 20 || !absl::SimpleAtoi(fields[19], &ticks)) return fallback;
  std::ifstream proc_stat("/proc/stat");
  std::string line;
  while (std::getline(proc_stat, line)) {
    absl::string_view rest(line);
    int64_t boot_seconds = 0;
    if (absl::ConsumePrefix(&rest, "btime ") && absl::SimpleAtoi(rest, &boot_seconds)) {
      const long hz = sysconf(_SC_CLK_TCK);
      if (hz <= 0) return fallback;
      return absl::FromUnixSeconds(boot_seconds) +
             absl::Milliseconds(static_cast<int64_t>(ticks) * 1000 / hz);
    }
  }
  return fallback;
}

}  // namespace sonde
