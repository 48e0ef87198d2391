#include "client/profiler/system_sampler.h"

#include <chrono>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace sonde::profiler {

absl::StatusOr<std::unique_ptr<SystemSampler>> SystemSampler::Start(SystemSamplerOptions options,
                                                                    Callback callback) {
  if (options.interval < kMinInterval || options.interval > kMaxInterval) {
    return absl::InvalidArgumentError(absl::StrCat(
        "system metrics interval ", absl::FormatDuration(options.interval), " is outside ",
        absl::FormatDuration(kMinInterval), " to ", absl::FormatDuration(kMaxInterval)));
  }
  if (!callback) return absl::InvalidArgumentError("system metrics sampler needs a callback");
  auto sampler =
      std::unique_ptr<SystemSampler>(new SystemSampler(std::move(options), std::move(callback)));
  sampler->thread_ = std::thread([s = sampler.get()] { s->Run(); });
  return sampler;
}

SystemSampler::SystemSampler(SystemSamplerOptions options, Callback callback)
    : options_(std::move(options)), callback_(std::move(callback)) {}

SystemSampler::~SystemSampler() { Stop(); }

void SystemSampler::Stop() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  absl::call_once(join_once_, [this] { thread_.join(); });
}

SamplerCost SystemSampler::cost() const {
  absl::MutexLock lock(&mu_);
  return cost_;
}

void SystemSampler::Run() {
  using Clock = std::chrono::steady_clock;
  SystemCollector collector(options_.collection);  // may load NVML: slow with GPUs
  collector.Collect();                              // the reading rates start from
  const auto record_cost = [&](int64_t delivered) {
    absl::MutexLock lock(&mu_);
    cost_.samples += delivered;
    cost_.collect_cpu_seconds = collector.cpu_seconds();
    cost_.thread_cpu_seconds = ThreadCpuSeconds();
  };
  record_cost(0);
  const auto interval = absl::ToChronoNanoseconds(options_.interval);
  Clock::time_point next = Clock::now() + interval;
  while (true) {
    {
      absl::MutexLock lock(&mu_);
      if (mu_.AwaitWithTimeout(absl::Condition(&stopping_), absl::FromChrono(next - Clock::now()))) {
        return;
      }
    }
    callback_(collector.Collect());
    record_cost(1);
    next += interval;
    const Clock::time_point now = Clock::now();
    while (next <= now) next += interval;  // skip the ticks this sample overran
  }
}

}  // namespace sonde::profiler
