#include "server/query_service.h"

#include <algorithm>
#include <deque>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/crc32c.h"
#include "common/dtype.h"
#include "common/grpc_status.h"
#include "common/pattern.h"
#include "common/status_macros.h"
#include "server/report/report.h"
#include "server/retention.h"

namespace sonde::server {
namespace {

// StepInfo.complete: every worker stored its end of the step, and none
// dropped anything in it.
bool StepComplete(const v1::StepInfo& s, int32_t world_size) {
  std::set<int32_t> workers(s.workers().begin(), s.workers().end());
  return static_cast<int64_t>(workers.size()) >= std::max(world_size, 1) &&
         s.tensors_dropped() == 0 && s.values_dropped() == 0;
}

// What ReadMetrics and ReadEvents return when the request sets no limit
// (proto/query.proto), and the most bytes one answer holds whatever the
// request's limit: under gRPC's default 4 MiB message limit (Python's and
// grpcurl's too), since events' and metrics' names may be 1024 bytes long.
constexpr size_t kDefaultMaxMetricPoints = 200000;
constexpr size_t kDefaultMaxEvents = 100000;
constexpr size_t kMaxAnswerBytes = 3 << 20;

// Where a series by global step starts in one mode: the global and mode
// step of the first point at or after mode step x, none if there is none.
using FirstPoint = std::optional<std::pair<int64_t, int64_t>>;
using FirstPointFn = std::function<absl::StatusOr<FirstPoint>(int64_t x)>;

// The first mode step whose point's global step is at least `global`, by
// an exponential and then a binary search of `first_at` (a few seeks); -1
// if none. Sound where global steps rise with mode steps, as in one
// worker's points (the hook counts both up together; ingest refuses a
// stream's step whose mode step does not follow its last).
absl::StatusOr<int64_t> FirstModeStepFrom(const FirstPointFn& first_at, int64_t global) {
  constexpr int64_t kMax = std::numeric_limits<int64_t>::max();
  auto reaches = [&](const FirstPoint& f) { return !f.has_value() || f->first >= global; };
  SONDE_ASSIGN_OR_RETURN(FirstPoint first, first_at(0));
  if (!first.has_value()) return -1;
  if (first->first >= global) return first->second;
  // first_at(lo) falls short; grow hi from lo until first_at(hi) reaches.
  int64_t lo = first->second;
  int64_t hi = lo;
  int64_t stride = 1;
  while (true) {
    if (lo == kMax) return -1;
    hi = lo > kMax - stride ? kMax : lo + stride;
    SONDE_ASSIGN_OR_RETURN(FirstPoint f, first_at(hi));
    if (reaches(f)) break;
    lo = f->second;  // at or past hi, and short
    if (stride <= kMax / 2) stride *= 2;
  }
  while (hi - lo > 1) {
    const int64_t mid = lo + (hi - lo) / 2;
    SONDE_ASSIGN_OR_RETURN(FirstPoint f, first_at(mid));
    if (reaches(f)) {
      hi = mid;
    } else {
      lo = f->second;  // short of it, at mid or past it (below hi)
    }
  }
  SONDE_ASSIGN_OR_RETURN(FirstPoint last, first_at(hi));
  return last.has_value() ? last->second : -1;
}

absl::StatusOr<v1::JobInfo> FindJob(storage::Store* store, const std::string& job) {
  if (job.empty()) return absl::InvalidArgumentError("no job given");
  return store->GetJob(job);
}

// A request's mode: one the proto names (a newer client's, or a raw
// number, would otherwise read as an empty index or as every mode).
absl::Status CheckMode(v1::Mode mode) {
  if (v1::Mode_IsValid(mode)) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(
      "unknown mode ", static_cast<int>(mode),
      " (expected MODE_UNSPECIFIED, MODE_TRAIN, MODE_EVAL, MODE_PREDICT or MODE_GLOBAL)"));
}

// A request's pattern (RE2, common/pattern.h); none for an empty one,
// InvalidArgument naming the pattern when it does not compile.
absl::StatusOr<std::optional<Pattern>> CompileRegex(const std::string& pattern) {
  if (pattern.empty()) return std::optional<Pattern>();
  absl::StatusOr<Pattern> p = Pattern::Compile(pattern, "regex");
  if (!p.ok()) return p.status();
  return std::optional<Pattern>(std::move(*p));
}

// Resolves (step, mode) of `worker` as smdebug's value(step, mode) does: a
// mode step for TRAIN/EVAL/PREDICT, a global step otherwise. A global step
// is looked up in the worker's own steps: workers' mode steps need not agree
// at one global step (one took a step more, or evaluated while the others
// trained), and another worker's mode step would read this worker's data of
// some other step.
absl::StatusOr<std::pair<v1::Mode, int64_t>> ResolveStep(storage::Store* store,
                                                         uint64_t job_id, int64_t step,
                                                         v1::Mode mode, int32_t worker) {
  if (mode == v1::MODE_TRAIN || mode == v1::MODE_EVAL || mode == v1::MODE_PREDICT) {
    return std::make_pair(mode, step);
  }
  SONDE_ASSIGN_OR_RETURN(std::optional<v1::StepInfo> info,
                         store->WorkerGlobalStepAt(job_id, step, worker));
  if (!info.has_value()) {
    return absl::NotFoundError(
        absl::StrCat("worker ", worker, " stored no step at global step ", step));
  }
  return std::make_pair(info->mode(), info->mode_step());
}

absl::Status ReadTensorImpl(storage::Store* store, const v1::ReadTensorRequest& req,
                            grpc::ServerWriter<v1::TensorChunk>* writer) {
  SONDE_ASSIGN_OR_RETURN(v1::JobInfo job, FindJob(store, req.job()));
  SONDE_RETURN_IF_ERROR(CheckMode(req.mode()));
  SONDE_ASSIGN_OR_RETURN(auto where,
                         ResolveStep(store, job.job_id(), req.step(), req.mode(), req.worker()));
  uint32_t index = 0;
  uint64_t offset = 0;
  SONDE_ASSIGN_OR_RETURN(
      v1::TensorRecord record,
      store->ReadTensor(
          job.job_id(), where.first, where.second, req.tensor(), req.worker(),
          [&](const v1::TensorRecord& r, absl::string_view piece) -> absl::Status {
            v1::TensorChunk c;
            c.set_job(req.job());
            c.set_worker(r.worker());
            c.set_step(r.step());
            c.set_mode(r.mode());
            c.set_mode_step(r.mode_step());
            c.set_tensor_name(r.tensor_name());
            *c.mutable_collections() = r.collections();
            c.set_dtype(r.dtype());
            *c.mutable_shape() = r.shape();
            c.set_chunk_count(r.chunk_count());
            c.set_total_bytes(r.total_bytes());
            if (index == 0) {
              *c.mutable_statistics() = r.statistics();
              if (r.has_histogram()) *c.mutable_histogram() = r.histogram();
            }
            c.set_chunk_index(index++);
            c.set_byte_offset(offset);
            c.set_payload(piece.data(), piece.size());
            c.set_crc32c(Crc32c(piece));
            offset += piece.size();
            if (!writer->Write(c)) return absl::CancelledError("the reader went away");
            return absl::OkStatus();
          }));
  if (!record.has_values()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "tensor '", req.tensor(), "' at ", ModeName(where.first), " step ", where.second,
        " was saved as statistics only (reductions); read it with ReadSeries"));
  }
  return absl::OkStatus();
}

}  // namespace

grpc::Status QueryService::ListJobs(grpc::ServerContext*, const v1::ListJobsRequest*,
                                    v1::ListJobsResponse* response) {
  auto jobs = store_->ListJobs();
  if (!jobs.ok()) return ToGrpcStatus(jobs.status());
  for (auto& j : *jobs) *response->add_jobs() = std::move(j);
  return grpc::Status::OK;
}

grpc::Status QueryService::GetJob(grpc::ServerContext*, const v1::GetJobRequest* request,
                                  v1::JobInfo* response) {
  auto job = FindJob(store_, request->job());
  if (!job.ok()) return ToGrpcStatus(job.status());
  *response = std::move(*job);
  return grpc::Status::OK;
}

grpc::Status QueryService::ListTensors(grpc::ServerContext* context,
                                       const v1::ListTensorsRequest* request,
                                       v1::ListTensorsResponse* response) {
  auto job = FindJob(store_, request->job());
  if (!job.ok()) return ToGrpcStatus(job.status());
  auto regex = CompileRegex(request->regex());
  if (!regex.ok()) return ToGrpcStatus(regex.status());
  const bool paged = request->max_tensors() > 0;
  size_t seen = 0;
  size_t bytes = 0;
  bool cancelled = false;
  absl::Status scanned = store_->ForEachTensor(
      job->job_id(), request->start_after(), [&](v1::TensorInfo& t) {
        // Work for a client that has gone stops (checked every 1024 names).
        if (++seen % 1024 == 0 && context->IsCancelled()) {
          cancelled = true;
          return false;
        }
        if (!request->collection().empty() &&
            std::find(t.collections().begin(), t.collections().end(), request->collection()) ==
                t.collections().end()) {
          return true;
        }
        if (regex->has_value() && !(*regex)->Search(t.name())) return true;
        if (paged) {
          bytes += t.ByteSizeLong() + 6;
          if (response->tensors_size() > 0 &&
              (static_cast<uint32_t>(response->tensors_size()) >= request->max_tensors() ||
               bytes > kMaxAnswerBytes)) {
            response->set_truncated(true);
            return false;
          }
        }
        *response->add_tensors() = std::move(t);
        return true;
      });
  if (cancelled) {
    return grpc::Status(grpc::StatusCode::CANCELLED, "the client cancelled ListTensors");
  }
  if (!scanned.ok()) return ToGrpcStatus(scanned);
  return grpc::Status::OK;
}

grpc::Status QueryService::ListMetrics(grpc::ServerContext*,
                                       const v1::ListMetricsRequest* request,
                                       v1::ListMetricsResponse* response) {
  auto job = FindJob(store_, request->job());
  if (!job.ok()) return ToGrpcStatus(job.status());
  auto listed = store_->ListMetrics(job->job_id());
  if (!listed.ok()) return ToGrpcStatus(listed.status());
  for (auto& [worker, names] : *listed) {
    v1::WorkerMetrics* w = response->add_workers();
    w->set_worker(worker);
    for (std::string& name : names) w->add_names(std::move(name));
  }
  return grpc::Status::OK;
}

grpc::Status QueryService::ReadMetrics(grpc::ServerContext*,
                                       const v1::ReadMetricsRequest* request,
                                       v1::ReadMetricsResponse* response) {
  auto job = FindJob(store_, request->job());
  if (!job.ok()) return ToGrpcStatus(job.status());
  auto regex = CompileRegex(request->regex());
  if (!regex.ok()) return ToGrpcStatus(regex.status());
  std::function<bool(const std::string&)> keep;
  if (regex->has_value()) {
    keep = [regex = **regex](const std::string& name) { return regex.Search(name); };
  }
  const std::vector<std::string> names(request->names().begin(), request->names().end());
  const size_t max_points =
      request->max_points() > 0 ? request->max_points() : kDefaultMaxMetricPoints;
  bool truncated = false;
  auto series = store_->ReadMetrics(job->job_id(), names, keep, request->worker(),
                                    request->start_unix_micros(), request->end_unix_micros(),
                                    max_points, &truncated);
  if (!series.ok()) return ToGrpcStatus(series.status());
  size_t bytes = 0;
  for (v1::MetricSeries& s : *series) {
    const size_t head = s.name().size() + 16;
    if (response->series_size() > 0 && bytes + head > kMaxAnswerBytes) {
      // Even a series with no point in the range costs its name: the
      // answer ends before it (the reader goes on after the last series).
      truncated = true;
      break;
    }
    bytes += head;
    // A point costs its time (a varint of at most 10 bytes) and its value.
    const size_t room = bytes < kMaxAnswerBytes ? (kMaxAnswerBytes - bytes) / 18 : 0;
    if (static_cast<size_t>(s.unix_micros_size()) > room) {
      // Cut here, as max_points cuts: the last series is partial.
      s.mutable_unix_micros()->Truncate(static_cast<int>(room));
      s.mutable_values()->Truncate(static_cast<int>(room));
      if (room > 0) *response->add_series() = std::move(s);
      truncated = true;
      break;
    }
    bytes += 18 * static_cast<size_t>(s.unix_micros_size());
    *response->add_series() = std::move(s);
  }
  response->set_truncated(truncated);
  return grpc::Status::OK;
}

grpc::Status QueryService::ReadEvents(grpc::ServerContext*, const v1::ReadEventsRequest* request,
                                      v1::ReadEventsResponse* response) {
  auto job = FindJob(store_, request->job());
  if (!job.ok()) return ToGrpcStatus(job.status());
  if (!v1::TraceEvent::Kind_IsValid(request->kind())) {
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                        absl::StrCat("unknown event kind ", static_cast<int>(request->kind())));
  }
  const size_t max_events =
      request->max_events() > 0 ? request->max_events() : kDefaultMaxEvents;
  bool truncated = false;
  auto events = store_->ReadEvents(job->job_id(), request->kind(), request->name(),
                                   request->worker(), request->start_unix_micros(),
                                   request->end_unix_micros(), max_events, &truncated);
  if (!events.ok()) return ToGrpcStatus(events.status());
  size_t bytes = 0;
  for (v1::WorkerEvent& e : *events) {
    bytes += e.ByteSizeLong() + 6;
    if (bytes > kMaxAnswerBytes && response->events_size() > 0) {
      truncated = true;  // as max_events would have: the first ones, in order
      break;
    }
    *response->add_events() = std::move(e);
  }
  response->set_truncated(truncated);
  return grpc::Status::OK;
}

absl::StatusOr<std::string> RenderReportPage(storage::Store& store,
                                             const rules::RuleFactory* rule_factory,
                                             const std::string& job) {
  SONDE_ASSIGN_OR_RETURN(v1::JobInfo info, FindJob(&store, job));
  std::vector<v1::RuleCatalogEntry> catalogue;
  if (rule_factory != nullptr) {
    for (const rules::RuleInfo& rule : rule_factory->Catalog()) {
      catalogue.push_back(rules::ToProto(rule));
    }
  }
  auto html = report::RenderJobReport(store, info, catalogue);
  if (absl::IsNotFound(html.status())) {  // the job exists: something under it is missing
    return absl::InternalError(
        absl::StrCat("report of job '", job, "': ", html.status().message()));
  }
  return html;
}

grpc::Status QueryService::GetReport(grpc::ServerContext*, const v1::GetReportRequest* request,
                                     v1::GetReportResponse* response) {
  auto html = RenderReportPage(*store_, rule_factory_, request->job());
  if (!html.ok()) return ToGrpcStatus(html.status());
  response->set_html(std::move(*html));
  return grpc::Status::OK;
}

grpc::Status QueryService::ListSteps(grpc::ServerContext*, const v1::ListStepsRequest* request,
                                     v1::ListStepsResponse* response) {
  auto job = FindJob(store_, request->job());
  if (!job.ok()) return ToGrpcStatus(job.status());
  if (absl::Status mode = CheckMode(request->mode()); !mode.ok()) return ToGrpcStatus(mode);
  const bool by_mode_step = request->mode() == v1::MODE_TRAIN ||
                            request->mode() == v1::MODE_EVAL ||
                            request->mode() == v1::MODE_PREDICT;
  const bool paged = request->max_steps() > 0;
  // GLOBAL's index is by its own mode steps, which need not be the global
  // steps start_step counts (a job may switch modes): read it whole.
  const bool seek = request->mode() != v1::MODE_GLOBAL;
  size_t bytes = 0;
  absl::Status scanned = store_->ForEachStep(
      job->job_id(), request->mode(), seek ? request->start_step() : 0, [&](v1::StepInfo& s) {
        if (!seek && s.step() < request->start_step()) return true;
        s.set_complete(StepComplete(s, job->world_size()));
        for (int32_t w : MissingWorkers(s.workers(), job->world_size())) s.add_missing_workers(w);
        if (paged) {
          // Cut between step numbers only: the next page starts past the
          // last one, so two entries with one number (modes that share a
          // global step) go in one page.
          const int n = response->steps_size();
          const int64_t number = by_mode_step ? s.mode_step() : s.step();
          const bool new_number =
              n == 0 || (by_mode_step ? response->steps(n - 1).mode_step()
                                      : response->steps(n - 1).step()) != number;
          bytes += s.ByteSizeLong() + 6;
          if (new_number && n > 0 &&
              (static_cast<uint32_t>(n) >= request->max_steps() || bytes > kMaxAnswerBytes)) {
            response->set_truncated(true);
            return false;
          }
        }
        *response->add_steps() = std::move(s);
        return true;
      });
  if (!scanned.ok()) return ToGrpcStatus(scanned);
  return grpc::Status::OK;
}

grpc::Status QueryService::ReadTensor(grpc::ServerContext*, const v1::ReadTensorRequest* request,
                                      grpc::ServerWriter<v1::TensorChunk>* writer) {
  return ToGrpcStatus(ReadTensorImpl(store_, *request, writer));
}

grpc::Status QueryService::ReadSeries(grpc::ServerContext*, const v1::ReadSeriesRequest* request,
                                      v1::ReadSeriesResponse* response) {
  auto job = FindJob(store_, request->job());
  if (!job.ok()) return ToGrpcStatus(job.status());
  if (request->tensor().empty()) {
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "no tensor given");
  }
  if (absl::Status mode = CheckMode(request->mode()); !mode.ok()) return ToGrpcStatus(mode);
  const bool by_mode_step = request->mode() == v1::MODE_TRAIN ||
                            request->mode() == v1::MODE_EVAL ||
                            request->mode() == v1::MODE_PREDICT;
  const int64_t end = request->end_step() > 0 ? request->end_step() : -1;
  const bool paged = request->max_points() > 0;
  auto number = [by_mode_step](const v1::SeriesPoint& p) {
    return by_mode_step ? p.mode_step() : p.step();
  };
  size_t bytes = 0;
  // Adds a point in range; false once the page is full.
  auto add = [&](v1::SeriesPoint& p) {
    if (!by_mode_step &&
        (p.step() < request->start_step() || (end >= 0 && p.step() >= end))) {
      return true;
    }
    const int n = response->points_size();
    const bool new_step = n == 0 || number(response->points(n - 1)) != number(p);
    if (paged) {
      // Cut between steps only: every worker's point of a step, or none.
      bytes += p.ByteSizeLong() + 6;
      if (new_step && n > 0 &&
          (static_cast<uint32_t>(n) >= request->max_points() || bytes > kMaxAnswerBytes)) {
        response->set_truncated(true);
        return false;
      }
    }
    *response->add_points() = std::move(p);
    return true;
  };
  if (by_mode_step) {
    // One mode's index, from its start: a page reads what it sends.
    absl::Status scanned = store_->ForEachSeriesPoint(job->job_id(), request->tensor(),
                                                      request->mode(), request->start_step(),
                                                      end, request->worker(), add);
    if (!scanned.ok()) return ToGrpcStatus(scanned);
    return grpc::Status::OK;
  }
  // Global steps: every mode's points (or GLOBAL's, whose own mode steps
  // are not global steps), ordered by global step. For one worker's points
  // (asked for, or the job has one), a page reads each mode from the mode
  // step where the global steps reach start_step (searched in the series
  // itself), a page's worth and one step more, and merges them: a mode read
  // to its own page limit ends past the merged page's end, so nothing is
  // missing from it. Workers' mode steps need not agree on global steps
  // (one may have taken a step more), so every worker's points are walked
  // by the global step index (below).
  const int32_t one_worker =
      request->worker() >= 0 ? request->worker()
                             : (job->worker_last_step_size() == 1
                                    ? job->worker_last_step().begin()->first
                                    : -1);
  if (paged && one_worker >= 0) {
    std::vector<v1::Mode> modes;
    if (request->mode() == v1::MODE_GLOBAL) {
      modes = {v1::MODE_GLOBAL};
    } else {
      modes = {v1::MODE_TRAIN, v1::MODE_EVAL, v1::MODE_PREDICT, v1::MODE_GLOBAL};
    }
    std::vector<v1::SeriesPoint> merged;
    bool ordered = true;
    for (v1::Mode mode : modes) {
      auto first_at = [&](int64_t x) -> absl::StatusOr<FirstPoint> {
        FirstPoint found;
        absl::Status s = store_->ForEachSeriesPoint(job->job_id(), request->tensor(), mode, x,
                                                    -1, one_worker, [&](v1::SeriesPoint& p) {
                                                      found.emplace(p.step(), p.mode_step());
                                                      return false;
                                                    });
        if (!s.ok()) return s;
        return found;
      };
      absl::StatusOr<int64_t> from = FirstModeStepFrom(first_at, request->start_step());
      if (!from.ok()) return ToGrpcStatus(from.status());
      if (*from < 0) continue;
      int64_t last = -1;
      uint32_t steps = 0;
      size_t mode_bytes = 0;
      bool mode_full = false;
      absl::Status scanned = store_->ForEachSeriesPoint(
          job->job_id(), request->tensor(), mode, *from, -1, one_worker,
          [&](v1::SeriesPoint& p) {
            if (p.step() < last) {
              ordered = false;  // not in global order after all: read it whole
              return false;
            }
            if (p.step() < request->start_step()) return true;
            if (end >= 0 && p.step() >= end) return false;
            if (p.step() != last) {
              // One step past this mode's page is read too: the merge then
              // sees that more follow, and cuts there or before.
              if (mode_full) return false;
              mode_full = steps >= request->max_points() || mode_bytes > kMaxAnswerBytes;
              ++steps;
            }
            last = p.step();
            mode_bytes += p.ByteSizeLong() + 6;
            merged.push_back(std::move(p));
            return true;
          });
      if (!scanned.ok()) return ToGrpcStatus(scanned);
      if (!ordered) break;
    }
    if (ordered) {
      std::stable_sort(merged.begin(), merged.end(),
                       [](const v1::SeriesPoint& a, const v1::SeriesPoint& b) {
                         return a.step() < b.step();
                       });
      for (auto& p : merged) {
        if (!add(p)) break;
      }
      return grpc::Status::OK;
    }
    response->clear_points();
    response->set_truncated(false);
    bytes = 0;
  }
  if (paged) {
    // Every worker's points (or one worker's out of order): walked by the
    // global step index from start_step, reading each step's points at its
    // mode step (one seek) and keeping those of that global step, so
    // workers whose mode steps disagree come each at its own global step.
    // A tensor saved on few of the steps walked costs a seek for each: past
    // max_walked steps a page with points in it ends there
    // (truncated), so reading the whole series walks the job's steps about once
    // (the steps walked past a page's last point are walked again).
    const uint64_t max_walked = std::max<uint64_t>(4096, uint64_t{16} * request->max_points());
    uint64_t walked = 0;
    int64_t last_step = -1;
    bool full = false;
    absl::Status read;
    absl::Status scanned = store_->ForEachStep(
        job->job_id(), v1::MODE_UNSPECIFIED, request->start_step(), [&](v1::StepInfo& info) {
          if (end >= 0 && info.step() >= end) return false;
          if (info.step() != last_step) {
            // Between global steps: the page may end here.
            if (++walked > max_walked && response->points_size() > 0) {
              response->set_truncated(true);
              return false;
            }
            last_step = info.step();
          }
          if (request->mode() == v1::MODE_GLOBAL && info.mode() != v1::MODE_GLOBAL) return true;
          const int64_t at = info.mode_step();
          read = store_->ForEachSeriesPoint(
              job->job_id(), request->tensor(), info.mode(), at,
              at == std::numeric_limits<int64_t>::max() ? -1 : at + 1, request->worker(),
              [&](v1::SeriesPoint& p) {
                if (p.step() != info.step()) return true;  // another global step's
                if (!add(p)) full = true;
                return !full;
              });
          return read.ok() && !full;
        });
    if (!scanned.ok()) return ToGrpcStatus(scanned);
    if (!read.ok()) return ToGrpcStatus(read);
    return grpc::Status::OK;
  }
  auto points = store_->ReadSeries(job->job_id(), request->tensor(), request->mode(), 0, -1,
                                   request->worker());
  if (!points.ok()) return ToGrpcStatus(points.status());
  // (GLOBAL's points come in its own steps' order: by global step here.)
  std::stable_sort(points->begin(), points->end(),
                   [](const v1::SeriesPoint& a, const v1::SeriesPoint& b) {
                     return a.step() < b.step();
                   });
  for (auto& p : *points) {
    if (!add(p)) break;
  }
  return grpc::Status::OK;
}

grpc::Status QueryService::GetRuleResults(grpc::ServerContext*,
                                          const v1::GetRuleResultsRequest* request,
                                          v1::GetRuleResultsResponse* response) {
  if (request->job().empty()) {
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "no job given");
  }
  auto results = registry_->RuleResults(request->job());
  if (!results.ok()) return ToGrpcStatus(results.status());
  for (auto& r : *results) *response->add_results() = std::move(r);
  return grpc::Status::OK;
}

grpc::ServerWriteReactor<v1::RuleResult>* QueryService::WatchRuleResults(
    grpc::CallbackServerContext*, const v1::GetRuleResultsRequest* request) {
  return NewRuleResultsWatch(registry_, request->job());
}

grpc::Status QueryService::ListRuleCatalog(grpc::ServerContext*,
                                           const v1::ListRuleCatalogRequest*,
                                           v1::ListRuleCatalogResponse* response) {
  for (const rules::RuleInfo& info : rule_factory_->Catalog()) {
    *response->add_rules() = rules::ToProto(info);
  }
  return grpc::Status::OK;
}


grpc::ServerWriteReactor<v1::CompletedStep>* QueryService::WatchSteps(
    grpc::CallbackServerContext*, const v1::WatchStepsRequest* request) {
  return NewStepsWatch(registry_, store_, *request, watch_options_);
}

grpc::Status QueryService::PostRuleResult(grpc::ServerContext*,
                                          const v1::PostRuleResultRequest* request,
                                          v1::PostRuleResultResponse*) {
  return ToGrpcStatus(registry_->PostExternalResult(
      request->result(),
      std::vector<std::string>(request->actions().begin(), request->actions().end())));
}

grpc::Status QueryService::EnableRules(grpc::ServerContext*, const v1::EnableRulesRequest* request,
                                       v1::EnableRulesResponse* response) {
  auto rules = registry_->EnableRules(
      request->job(), std::vector<v1::RuleSpec>(request->rules().begin(), request->rules().end()));
  if (!rules.ok()) return ToGrpcStatus(rules.status());
  for (auto& r : *rules) *response->add_rules() = std::move(r);
  return grpc::Status::OK;
}

grpc::Status QueryService::DeleteJob(grpc::ServerContext*, const v1::DeleteJobRequest* request,
                                     v1::DeleteJobResponse* response) {
  if (request->job().empty()) {
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "no job given");
  }
  auto deleted = EraseJob(request->job(), *store_, *registry_);
  if (!deleted.ok()) return ToGrpcStatus(deleted.status());
  response->set_job_id(deleted->job_id);
  response->set_approximate_bytes(deleted->approximate_bytes);
  return grpc::Status::OK;
}

}  // namespace sonde::server
