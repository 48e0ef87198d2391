#include "client/query_client.h"

#include <iterator>
#include <map>
#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/grpc_status.h"
#include "common/tensor_chunks.h"
#include "grpcpp/create_channel.h"

namespace sonde {
namespace {

// Where the page after one cut at step `last` starts: past `last`, or an
// error when the collector said it cut a page that holds nothing past
// `from` (asking again would loop).
absl::StatusOr<int64_t> NextPage(const char* what, int page_size, int64_t from, int64_t last) {
  if (page_size == 0 || last < from) {
    return absl::InternalError(absl::StrCat("the collector cut its answer of ", what,
                                            " from step ", from, " without going past it"));
  }
  return last + 1;
}

}  // namespace

std::unique_ptr<QueryClient> QueryClient::Connect(const std::string& address,
                                                  absl::Duration timeout) {
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(64 << 20);
  auto channel = grpc::CreateCustomChannel(address, grpc::InsecureChannelCredentials(), args);
  return std::unique_ptr<QueryClient>(new QueryClient(v1::Query::NewStub(channel), timeout));
}

absl::StatusOr<std::unique_ptr<QueryClient>> QueryClient::Connect(
    const std::string& address, const ChannelSecurity& security, absl::Duration timeout) {
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(64 << 20);
  auto channel = MakeChannel(address, security, args);
  if (!channel.ok()) return channel.status();
  return std::unique_ptr<QueryClient>(
      new QueryClient(v1::Query::NewStub(*channel), timeout));
}

void QueryClient::SetDeadline(grpc::ClientContext& ctx) const {
  ctx.set_deadline(absl::ToChronoTime(absl::Now() + timeout_));
}

absl::StatusOr<std::vector<v1::JobInfo>> QueryClient::ListJobs() {
  grpc::ClientContext ctx;
  SetDeadline(ctx);
  v1::ListJobsResponse resp;
  grpc::Status s = stub_->ListJobs(&ctx, v1::ListJobsRequest(), &resp);
  if (!s.ok()) return FromGrpcStatus(s);
  return std::vector<v1::JobInfo>(resp.jobs().begin(), resp.jobs().end());
}

absl::StatusOr<v1::JobInfo> QueryClient::GetJob(const std::string& job) {
  grpc::ClientContext ctx;
  SetDeadline(ctx);
  v1::GetJobRequest req;
  req.set_job(job);
  v1::JobInfo resp;
  grpc::Status s = stub_->GetJob(&ctx, req, &resp);
  if (!s.ok()) return FromGrpcStatus(s);
  return resp;
}

absl::StatusOr<std::vector<v1::TensorInfo>> QueryClient::ListTensors(const std::string& job,
                                                                     const std::string& collection,
                                                                     const std::string& regex) {
  // In pages, so a job with many names never passes a message's limit.
  std::vector<v1::TensorInfo> tensors;
  std::string after;
  while (true) {
    grpc::ClientContext ctx;
    SetDeadline(ctx);
    v1::ListTensorsRequest req;
    req.set_job(job);
    req.set_collection(collection);
    req.set_regex(regex);
    req.set_start_after(after);
    req.set_max_tensors(kPageSize);
    v1::ListTensorsResponse resp;
    grpc::Status s = stub_->ListTensors(&ctx, req, &resp);
    if (!s.ok()) return FromGrpcStatus(s);
    const bool more = resp.truncated();
    for (v1::TensorInfo& t : *resp.mutable_tensors()) tensors.push_back(std::move(t));
    if (!more) return tensors;
    // Names come in byte order: the next page starts past the last.
    if (resp.tensors_size() == 0 || tensors.back().name() <= after) {
      return absl::InternalError(absl::StrCat(
          "the collector cut its answer of tensor names after '", after,
          "' without going past it"));
    }
    after = tensors.back().name();
  }
}

absl::StatusOr<std::vector<v1::StepInfo>> QueryClient::ListSteps(const std::string& job,
                                                                 v1::Mode mode) {
  // In pages, so a long job's list never passes a message's limit.
  const bool by_mode_step =
      mode == v1::MODE_TRAIN || mode == v1::MODE_EVAL || mode == v1::MODE_PREDICT;
  std::vector<v1::StepInfo> steps;
  int64_t from = 0;
  while (true) {
    grpc::ClientContext ctx;
    SetDeadline(ctx);
    v1::ListStepsRequest req;
    req.set_job(job);
    req.set_mode(mode);
    req.set_start_step(from);
    req.set_max_steps(kPageSize);
    v1::ListStepsResponse resp;
    grpc::Status s = stub_->ListSteps(&ctx, req, &resp);
    if (!s.ok()) return FromGrpcStatus(s);
    // An older collector ignores the paging and says nothing of it.
    const bool more = resp.truncated();
    const int page = resp.steps_size();
    for (v1::StepInfo& step : *resp.mutable_steps()) steps.push_back(std::move(step));
    if (!more) return steps;
    auto next = NextPage("steps", page, from,
                         page == 0 ? from - 1
                                   : (by_mode_step ? steps.back().mode_step() : steps.back().step()));
    if (!next.ok()) return next.status();
    from = *next;
  }
}

absl::StatusOr<TensorValue> QueryClient::ReadTensor(const std::string& job,
                                                    const std::string& tensor, int64_t step,
                                                    v1::Mode mode, int32_t worker) {
  grpc::ClientContext ctx;
  SetDeadline(ctx);
  v1::ReadTensorRequest req;
  req.set_job(job);
  req.set_tensor(tensor);
  req.set_step(step);
  req.set_mode(mode);
  req.set_worker(worker);
  auto reader = stub_->ReadTensor(&ctx, req);
  TensorAssembler::Limits limits;
  limits.max_chunk_bytes = 64 << 20;
  limits.max_tensor_bytes = uint64_t{1} << 40;
  TensorAssembler assembler(limits);
  v1::TensorChunk chunk;
  v1::Statistics stats;
  absl::Status bad;
  while (reader->Read(&chunk)) {
    if (chunk.chunk_index() == 0) stats = chunk.statistics();
    if (bad.ok()) bad = assembler.Add(chunk);
  }
  grpc::Status s = reader->Finish();
  if (!s.ok()) return FromGrpcStatus(s);
  if (!bad.ok()) return bad;
  if (!assembler.complete()) {
    return absl::DataLossError(absl::StrCat("tensor '", tensor, "' arrived incomplete"));
  }
  TensorValue value;
  value.header = assembler.header();
  *value.header.mutable_statistics() = stats;
  value.bytes = assembler.TakeBytes();
  return value;
}

absl::StatusOr<std::vector<v1::SeriesPoint>> QueryClient::ReadSeries(
    const std::string& job, const std::string& tensor, v1::Mode mode, int64_t start_step,
    int64_t end_step, int32_t worker) {
  // In pages, so a long series never passes a message's limit.
  const bool by_mode_step =
      mode == v1::MODE_TRAIN || mode == v1::MODE_EVAL || mode == v1::MODE_PREDICT;
  std::vector<v1::SeriesPoint> points;
  int64_t from = start_step;
  while (true) {
    grpc::ClientContext ctx;
    SetDeadline(ctx);
    v1::ReadSeriesRequest req;
    req.set_job(job);
    req.set_tensor(tensor);
    req.set_mode(mode);
    req.set_start_step(from);
    req.set_end_step(end_step);
    req.set_worker(worker);
    req.set_max_points(kPageSize);
    v1::ReadSeriesResponse resp;
    grpc::Status s = stub_->ReadSeries(&ctx, req, &resp);
    if (!s.ok()) return FromGrpcStatus(s);
    const bool more = resp.truncated();
    const int page = resp.points_size();
    for (v1::SeriesPoint& p : *resp.mutable_points()) points.push_back(std::move(p));
    if (!more) return points;
    auto next = NextPage("series points", page, from,
                         page == 0 ? from - 1
                                   : (by_mode_step ? points.back().mode_step() : points.back().step()));
    if (!next.ok()) return next.status();
    from = *next;
  }
}

absl::StatusOr<std::vector<v1::RuleResult>> QueryClient::RuleResults(const std::string& job) {
  grpc::ClientContext ctx;
  SetDeadline(ctx);
  v1::GetRuleResultsRequest req;
  req.set_job(job);
  v1::GetRuleResultsResponse resp;
  grpc::Status s = stub_->GetRuleResults(&ctx, req, &resp);
  if (!s.ok()) return FromGrpcStatus(s);
  return std::vector<v1::RuleResult>(resp.results().begin(), resp.results().end());
}

absl::StatusOr<std::vector<v1::RuleCatalogEntry>> QueryClient::RuleCatalog() {
  grpc::ClientContext ctx;
  SetDeadline(ctx);
  v1::ListRuleCatalogResponse resp;
  grpc::Status s = stub_->ListRuleCatalog(&ctx, v1::ListRuleCatalogRequest(), &resp);
  if (!s.ok()) return FromGrpcStatus(s);
  return std::vector<v1::RuleCatalogEntry>(resp.rules().begin(), resp.rules().end());
}

absl::StatusOr<std::vector<v1::RuleSpec>> QueryClient::EnableRules(
    const std::string& job, const std::vector<v1::RuleSpec>& rules) {
  grpc::ClientContext ctx;
  SetDeadline(ctx);
  v1::EnableRulesRequest req;
  req.set_job(job);
  for (const auto& r : rules) *req.add_rules() = r;
  v1::EnableRulesResponse resp;
  grpc::Status s = stub_->EnableRules(&ctx, req, &resp);
  if (!s.ok()) return FromGrpcStatus(s);
  return std::vector<v1::RuleSpec>(resp.rules().begin(), resp.rules().end());
}

absl::StatusOr<v1::DeleteJobResponse> QueryClient::DeleteJob(const std::string& job) {
  grpc::ClientContext ctx;
  SetDeadline(ctx);
  v1::DeleteJobRequest req;
  req.set_job(job);
  v1::DeleteJobResponse resp;
  grpc::Status s = stub_->DeleteJob(&ctx, req, &resp);
  if (!s.ok()) return FromGrpcStatus(s);
  return resp;
}

absl::StatusOr<std::vector<v1::WorkerMetrics>> QueryClient::ListMetrics(const std::string& job,
                                                                        int32_t worker) {
  grpc::ClientContext ctx;
  SetDeadline(ctx);
  v1::ListMetricsRequest req;
  req.set_job(job);
  v1::ListMetricsResponse resp;
  grpc::Status s = stub_->ListMetrics(&ctx, req, &resp);
  if (!s.ok()) return FromGrpcStatus(s);
  std::vector<v1::WorkerMetrics> out;
  for (auto& w : *resp.mutable_workers()) {
    if (worker < 0 || w.worker() == worker) out.push_back(std::move(w));
  }
  return out;
}

absl::StatusOr<MetricsRead> QueryClient::ReadMetrics(const std::string& job,
                                                     const std::vector<std::string>& names,
                                                     const std::string& regex, int32_t worker,
                                                     int64_t start_unix_micros,
                                                     int64_t end_unix_micros,
                                                     uint32_t max_points) {
  grpc::ClientContext ctx;
  SetDeadline(ctx);
  v1::ReadMetricsRequest req;
  req.set_job(job);
  for (const auto& n : names) req.add_names(n);
  req.set_regex(regex);
  req.set_worker(worker);
  req.set_start_unix_micros(start_unix_micros);
  req.set_end_unix_micros(end_unix_micros);
  req.set_max_points(max_points);
  v1::ReadMetricsResponse resp;
  grpc::Status s = stub_->ReadMetrics(&ctx, req, &resp);
  if (!s.ok()) return FromGrpcStatus(s);
  MetricsRead out;
  out.series.assign(std::make_move_iterator(resp.mutable_series()->begin()),
                    std::make_move_iterator(resp.mutable_series()->end()));
  out.truncated = resp.truncated();
  return out;
}

absl::StatusOr<EventsRead> QueryClient::ReadEvents(const std::string& job,
                                                   v1::TraceEvent::Kind kind,
                                                   const std::string& name, int32_t worker,
                                                   int64_t start_unix_micros,
                                                   int64_t end_unix_micros, uint32_t max_events) {
  grpc::ClientContext ctx;
  SetDeadline(ctx);
  v1::ReadEventsRequest req;
  req.set_job(job);
  req.set_kind(kind);
  req.set_name(name);
  req.set_worker(worker);
  req.set_start_unix_micros(start_unix_micros);
  req.set_end_unix_micros(end_unix_micros);
  req.set_max_events(max_events);
  v1::ReadEventsResponse resp;
  grpc::Status s = stub_->ReadEvents(&ctx, req, &resp);
  if (!s.ok()) return FromGrpcStatus(s);
  EventsRead out;
  out.events.assign(std::make_move_iterator(resp.mutable_events()->begin()),
                    std::make_move_iterator(resp.mutable_events()->end()));
  out.truncated = resp.truncated();
  return out;
}

absl::StatusOr<std::string> QueryClient::GetReport(const std::string& job) {
  grpc::ClientContext ctx;
  SetDeadline(ctx);
  v1::GetReportRequest req;
  req.set_job(job);
  v1::GetReportResponse resp;
  grpc::Status s = stub_->GetReport(&ctx, req, &resp);
  if (!s.ok()) return FromGrpcStatus(s);
  return std::move(*resp.mutable_html());
}

namespace {

// Reads a watch until it ends, `fn` returns false (then cancels it: OK), or
// its deadline passes.
template <typename T, typename Reader, typename Fn>
absl::Status Follow(grpc::ClientContext& ctx, Reader& reader, Fn&& fn) {
  T message;
  while (reader->Read(&message)) {
    if (!fn(message)) {
      ctx.TryCancel();
      break;
    }
  }
  grpc::Status s = reader->Finish();
  if (s.error_code() == grpc::StatusCode::CANCELLED) return absl::OkStatus();
  return FromGrpcStatus(s);
}

}  // namespace

absl::Status QueryClient::WatchRuleResults(const std::string& job,
                                           const std::function<bool(const v1::RuleResult&)>& fn,
                                           absl::Duration timeout) {
  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(absl::Now() + timeout));
  v1::GetRuleResultsRequest req;
  req.set_job(job);
  auto reader = stub_->WatchRuleResults(&ctx, req);
  return Follow<v1::RuleResult>(ctx, reader, fn);
}

absl::Status QueryClient::WatchSteps(const std::string& job, int64_t from_step,
                                     const std::function<bool(const v1::CompletedStep&)>& fn,
                                     absl::Duration timeout) {
  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(absl::Now() + timeout));
  v1::WatchStepsRequest req;
  req.set_job(job);
  req.set_from_step(from_step);
  auto reader = stub_->WatchSteps(&ctx, req);
  // A step past a message's size comes in parts: `fn` gets it whole.
  std::optional<v1::CompletedStep> joined;
  absl::Status followed = Follow<v1::CompletedStep>(ctx, reader, [&](v1::CompletedStep& part) {
    if (joined.has_value()) {
      if (part.step() != joined->step() || part.mode() != joined->mode()) {
        // A part without its rest (an older collector, or a bug): the step
        // is given as it came, not merged with another.
        const bool go_on = fn(*joined);
        joined.reset();
        if (!go_on) return false;
      } else {
        for (v1::TensorRecord& t : *part.mutable_tensors()) {
          *joined->add_tensors() = std::move(t);
        }
        *joined->mutable_missing_workers() = std::move(*part.mutable_missing_workers());
        joined->set_more(part.more());
        if (joined->more()) return true;
        const bool go_on = fn(*joined);
        joined.reset();
        return go_on;
      }
    }
    if (part.more()) {
      joined = std::move(part);
      return true;
    }
    return fn(part);
  });
  if (followed.ok() && joined.has_value()) {
    return absl::UnavailableError(absl::StrCat("the watch ended in the middle of step ",
                                               joined->step(), ", which came in parts"));
  }
  return followed;
}

}  // namespace sonde

namespace sonde {

absl::StatusOr<std::vector<v1::RuleResult>> QueryClient::WaitForRuleVerdicts(
    const std::string& job, absl::Duration timeout) {
  // Start from every rule the job has, so one early verdict is not taken
  // for all of them; the watch then brings the changes.
  auto current = RuleResults(job);
  if (!current.ok()) return current.status();
  std::map<std::string, v1::RuleResult> latest;  // by rule instance
  for (const auto& r : *current) latest[r.rule()] = r;
  auto settled = [&latest] {
    for (const auto& [name, r] : latest) {
      if (r.status() == v1::RULE_STATUS_IN_PROGRESS) return false;
    }
    return !latest.empty();
  };
  if (!settled()) {
    absl::Status s = WatchRuleResults(
        job,
        [&](const v1::RuleResult& r) {
          latest[r.rule()] = r;
          return !settled();
        },
        timeout);
    if (!s.ok()) return s;
  }
  if (!settled()) {
    return absl::DeadlineExceededError(
        absl::StrCat("rules of job '", job, "' still in progress after ",
                     absl::FormatDuration(timeout)));
  }
  std::vector<v1::RuleResult> out;
  for (auto& [name, r] : latest) out.push_back(std::move(r));
  return out;
}

}  // namespace sonde
