// sonde: the command-line client of a Sonde collector.
//
//   sonde jobs                       jobs with status and last step per mode
//   sonde job --job J                one job in detail
//   sonde tensors --job J [--collection C] [--regex R]
//   sonde steps --job J [--mode M]
//   sonde show --job J --tensor T --step S [--mode M] [--worker W]
//   sonde series --job J --tensor T [--mode M] [--start S] [--end E]
//   sonde rules --job J              rule results (like rule_job_summary)
//   sonde watch --job J              follow rule results live until the job ends
//   sonde rule-catalog               every rule the collector can run
//   sonde enable-rules --job J --rules 'Type(k=v,...);...'   before the job starts
//   sonde delete --job J             delete a job that has ended, and all its data
//   sonde report --job J [--out F]   the job's HTML report
//   sonde metrics --job J [--names a,b | --regex R] [--worker W] [--start T] [--end T]
//   sonde metrics --job J --list     the profiler's metric names per worker
//   sonde events --job J [--kind K] [--name N] [--worker W] [--start T] [--end T]
//
// Every command takes --collector (default 127.0.0.1:7070) and --json.
// Times (metrics, events) are unix microseconds or RFC3339 with a zone.
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/reflection.h"
#include "absl/flags/usage.h"
#include "absl/flags/usage_config.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/time/time.h"
#include "client/format.h"
#include "client/query_client.h"
#include "client/spool/spool.h"
#include "client/spool/upload.h"
#include "common/channel.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "common/dtype.h"
#include "proto/query.grpc.pb.h"
#include "nlohmann/json.hpp"
#include "rules/rule_config.h"

ABSL_FLAG(std::string, collector, "127.0.0.1:7070", "collector address host:port");
ABSL_FLAG(std::string, tls_ca, "",
          "PEM file of the CA to trust for the collector's certificate; given: use TLS");
ABSL_FLAG(std::string, tls_cert, "", "PEM file of a client certificate (mutual TLS)");
ABSL_FLAG(std::string, tls_key, "", "PEM file of the client certificate's key");
ABSL_FLAG(std::string, tls_server_name, "",
          "name to check the collector's certificate against (default: --collector's host)");
ABSL_FLAG(std::string, token, "",
          "bearer token (visible to other local users in the process list: prefer the "
          "SONDE_TOKEN environment variable)");
ABSL_FLAG(std::string, job, "", "job name");
ABSL_FLAG(std::string, tensor, "", "tensor name");
ABSL_FLAG(std::string, collection, "", "only tensors in this collection");
ABSL_FLAG(std::string, regex, "",
          "tensors: only tensors whose name matches; metrics: only metrics where this "
          "RE2 pattern finds a match");
ABSL_FLAG(std::string, names, "",
          "metrics: only these metrics, comma-separated (with --regex: these and the "
          "matches)");
ABSL_FLAG(bool, list, false, "metrics: list the metric names per worker instead of values");
ABSL_FLAG(std::string, kind, "",
          "events: only this kind: step, data_wait, forward, backward, span or init "
          "(default: every kind)");
ABSL_FLAG(std::string, name, "", "events: only events of this name (spans)");
ABSL_FLAG(int32_t, limit, 0,
          "metrics/events: at most this many points/events in one answer (0: the collector's "
          "limit, 200000 points or 100000 events)");
ABSL_FLAG(std::string, mode, "", "TRAIN, EVAL, PREDICT or GLOBAL (default: every mode)");
ABSL_FLAG(int64_t, step, -1, "step (a mode step with --mode TRAIN/EVAL/PREDICT, else global)");
ABSL_FLAG(std::string, start, "",
          "series: first step; metrics/events: first time, inclusive, as unix microseconds "
          "or RFC3339 with a zone (2024-05-01T12:00:00Z) (default: from the start)");
ABSL_FLAG(std::string, end, "",
          "series: end step, exclusive; metrics/events: end time, exclusive, as --start "
          "(default: no end)");
ABSL_FLAG(int32_t, worker, -1,
          "worker (default: 0 for show, every worker for series, metrics and events)");
ABSL_FLAG(int32_t, max_values, 64, "values printed by show (0: all)");
ABSL_FLAG(bool, json, false, "print JSON instead of a table");
ABSL_FLAG(std::string, out, "", "report: the HTML file to write (default: stdout)");
ABSL_FLAG(absl::Duration, timeout, absl::Hours(24), "how long watch follows a job");
ABSL_FLAG(bool, end_jobs, false,
          "sync: end the job of a spool whose client was killed (no job end in it); "
          "default: leave it open for a restarted run");
ABSL_FLAG(std::string, rules, "",
          "enable-rules: 'Type(key=value,...);...' as the collector's --rules flag");

namespace sonde {
namespace {

int Fail(const absl::Status& s) {
  std::cerr << "sonde: " << s.message() << " (" << absl::StatusCodeToString(s.code()) << ")\n";
  return s.code() == absl::StatusCode::kNotFound ? 3 : 1;
}

int Usage(const std::string& msg) {
  std::cerr << "sonde: " << msg << "\n"
            << "usage: sonde {jobs|job|tensors|steps|show|series|rules|watch|rule-catalog|enable-rules|"
               "delete|report|metrics|events|sync} "
               "[flags]; "
               "sonde --help for flags\n";
  return 2;
}

std::string Num(double v) {
  if (std::isnan(v)) return "nan";
  if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
  return absl::StrFormat("%.6g", v);
}

// min/max-like fields mean nothing when every value is NaN.
std::string Extreme(const v1::Statistics& s, double v) {
  return s.count() > s.nan_count() ? Num(v) : "-";
}

nlohmann::json StatsJson(const v1::Statistics& s) {
  return {{"count", s.count()},       {"finite_count", s.finite_count()},
          {"nan_count", s.nan_count()}, {"pos_inf_count", s.pos_inf_count()},
          {"neg_inf_count", s.neg_inf_count()}, {"zero_count", s.zero_count()},
          {"min", s.min()},           {"max", s.max()},
          {"mean", s.mean()},         {"std", s.std()},
          {"variance", s.variance()}, {"sum", s.sum()},
          {"l1", s.l1()},             {"l2", s.l2()},
          {"abs_min", s.abs_min()},   {"abs_max", s.abs_max()}};
}

absl::StatusOr<v1::Mode> ModeFlag() {
  const std::string m = absl::GetFlag(FLAGS_mode);
  if (m.empty()) return v1::MODE_UNSPECIFIED;
  return ParseMode(m);
}

std::string StepsByMode(const v1::JobInfo& j) {
  std::vector<std::string> parts;
  for (const auto& m : j.modes()) parts.push_back(absl::StrCat(ModeName(m.mode()), ":", m.last_step()));
  return parts.empty() ? "-" : absl::StrJoin(parts, " ");
}

int Jobs(QueryClient& q, bool json) {
  auto jobs = q.ListJobs();
  if (!jobs.ok()) return Fail(jobs.status());
  if (json) {
    std::cout << JobsJson(*jobs) << "\n";
    return 0;
  }
  std::vector<std::vector<std::string>> rows;
  for (const auto& j : *jobs) {
    rows.push_back({j.job(), std::string(JobStatusName(j.status())),
                    absl::StrCat(j.workers_size(), "/", j.world_size()), StepsByMode(j),
                    absl::FormatTime("%Y-%m-%d %H:%M:%S", absl::FromUnixMicros(j.start_unix_micros()),
                                     absl::UTCTimeZone())});
  }
  std::cout << Table({"JOB", "STATUS", "WORKERS", "LAST STEP", "STARTED (UTC)"}, rows);
  return 0;
}

int Job(QueryClient& q, const std::string& name, bool json) {
  auto j = q.GetJob(name);
  if (!j.ok()) return Fail(j.status());
  if (json) {
    std::cout << nlohmann::json::parse(JobsJson({*j}))[0].dump(2) << "\n";
    return 0;
  }
  std::cout << "job:        " << j->job() << "\n"
            << "status:     " << JobStatusName(j->status())
            << (j->end_reason().empty() ? "" : absl::StrCat(" (", j->end_reason(), ")")) << "\n"
            << "workers:    " << j->workers_size() << " of " << j->world_size() << "\n"
            << "last step:  " << j->last_step() << "\n";
  for (const auto& m : j->modes()) {
    std::cout << "  " << ModeName(m.mode()) << ": steps " << m.first_step() << ".."
              << m.last_step() << " (" << m.step_count() << " saved)\n";
  }
  for (const auto& r : j->rules()) std::cout << "rule:       " << r.name() << " (" << r.rule_type() << ")\n";
  for (const auto& [k, v] : j->metadata()) std::cout << "meta:       " << k << " = " << v << "\n";
  return 0;
}

int Tensors(QueryClient& q, const std::string& job, bool json) {
  auto ts = q.ListTensors(job, absl::GetFlag(FLAGS_collection), absl::GetFlag(FLAGS_regex));
  if (!ts.ok()) return Fail(ts.status());
  if (json) {
    nlohmann::json arr = nlohmann::json::array();
    for (const auto& t : *ts) {
      arr.push_back({{"name", t.name()},
                     {"collections", std::vector<std::string>(t.collections().begin(), t.collections().end())},
                     {"dtype", std::string(DTypeName(t.dtype()))},
                     {"shape", std::vector<int64_t>(t.shape().begin(), t.shape().end())}});
    }
    std::cout << arr.dump(2) << "\n";
    return 0;
  }
  std::vector<std::vector<std::string>> rows;
  for (const auto& t : *ts) {
    rows.push_back({t.name(), std::string(DTypeName(t.dtype())), ShapeString(t.shape()),
                    absl::StrJoin(t.collections(), ",")});
  }
  std::cout << Table({"TENSOR", "DTYPE", "SHAPE", "COLLECTIONS"}, rows);
  return 0;
}

int Steps(QueryClient& q, const std::string& job, v1::Mode mode, bool json) {
  auto steps = q.ListSteps(job, mode);
  if (!steps.ok()) return Fail(steps.status());
  if (json) {
    nlohmann::json arr = nlohmann::json::array();
    for (const auto& s : *steps) {
      arr.push_back({{"step", s.step()}, {"mode", std::string(ModeName(s.mode()))},
                     {"mode_step", s.mode_step()}, {"tensors", s.tensor_count()},
                     {"duration_seconds", s.duration_seconds()},
                     {"workers", std::vector<int32_t>(s.workers().begin(), s.workers().end())},
                     {"tensors_dropped", s.tensors_dropped()},
                     {"values_dropped", s.values_dropped()},
                     {"complete", s.complete()}});
    }
    std::cout << arr.dump(2) << "\n";
    return 0;
  }
  std::vector<std::vector<std::string>> rows;
  for (const auto& s : *steps) {
    rows.push_back({absl::StrCat(s.step()), std::string(ModeName(s.mode())),
                    absl::StrCat(s.mode_step()), absl::StrCat(s.tensor_count()),
                    absl::StrFormat("%.3f", s.duration_seconds() * 1000),
                    absl::StrJoin(s.workers(), ","),
                    s.complete() ? "yes"
                                 : absl::StrCat("no (", s.tensors_dropped(), " tensors, ",
                                                s.values_dropped(), " values dropped)")});
  }
  std::cout << Table({"STEP", "MODE", "MODE STEP", "TENSORS", "DURATION (ms)", "WORKERS", "COMPLETE"},
                     rows);
  return 0;
}

int Show(QueryClient& q, const std::string& job, v1::Mode mode, bool json) {
  const std::string tensor = absl::GetFlag(FLAGS_tensor);
  const int64_t step = absl::GetFlag(FLAGS_step);
  if (tensor.empty() || step < 0) return Usage("show needs --tensor and --step");
  const int32_t worker = std::max(0, absl::GetFlag(FLAGS_worker));
  auto value = q.ReadTensor(job, tensor, step, mode, worker);
  if (!value.ok()) return Fail(value.status());
  auto values = DecodeAsDouble(value->bytes, value->header.dtype());
  if (!values.ok()) return Fail(values.status());
  const auto& h = value->header;
  if (json) {
    nlohmann::json out = {{"tensor", h.tensor_name()},
                          {"step", h.step()},
                          {"mode", std::string(ModeName(h.mode()))},
                          {"mode_step", h.mode_step()},
                          {"worker", h.worker()},
                          {"dtype", std::string(DTypeName(h.dtype()))},
                          {"shape", std::vector<int64_t>(h.shape().begin(), h.shape().end())},
                          {"statistics", StatsJson(h.statistics())}};
    nlohmann::json vals = nlohmann::json::array();
    for (double v : *values) {
      if (std::isfinite(v)) {
        vals.push_back(v);
      } else {
        vals.push_back(std::isnan(v) ? "nan" : (v > 0 ? "inf" : "-inf"));
      }
    }
    out["values"] = vals;
    std::cout << out.dump(2) << "\n";
    return 0;
  }
  const auto& s = h.statistics();
  std::cout << h.tensor_name() << " at step " << h.step() << " (" << ModeName(h.mode()) << " "
            << h.mode_step() << "), worker " << h.worker() << ": " << DTypeName(h.dtype())
            << " " << ShapeString(h.shape()) << "\n"
            << "  min " << Num(s.min()) << "  max " << Num(s.max()) << "  mean " << Num(s.mean())
            << "  std " << Num(s.std()) << "  l2 " << Num(s.l2()) << "  nan " << s.nan_count()
            << "  inf " << s.pos_inf_count() + s.neg_inf_count() << "\n";
  const size_t limit = absl::GetFlag(FLAGS_max_values) <= 0
                           ? values->size()
                           : std::min<size_t>(values->size(), absl::GetFlag(FLAGS_max_values));
  std::vector<std::string> shown;
  for (size_t i = 0; i < limit; ++i) shown.push_back(Num((*values)[i]));
  std::cout << "  values: [" << absl::StrJoin(shown, ", ")
            << (limit < values->size() ? absl::StrCat(", ... (", values->size() - limit, " more)") : "")
            << "]\n";
  return 0;
}

// --start/--end of `series`: steps; empty means 0 (from the first step / no end).
absl::StatusOr<int64_t> StepFlag(const std::string& flag, const std::string& text) {
  if (text.empty()) return 0;
  int64_t step;
  if (!absl::SimpleAtoi(text, &step) || step < 0) {
    return absl::InvalidArgumentError(absl::StrCat("--", flag, ": '", text, "' is not a step"));
  }
  return step;
}

// --start/--end of `metrics` and `events`: unix microseconds or RFC3339;
// empty means 0 (from the start / no end).
absl::StatusOr<int64_t> TimeFlag(const std::string& flag, const std::string& text) {
  if (text.empty()) return 0;
  auto micros = ParseUnixMicros(text);
  if (!micros.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("--", flag, ": ", micros.status().message()));
  }
  if (*micros <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--", flag, ": '", text, "' is not after 1970-01-01T00:00:00Z"));
  }
  return *micros;
}

struct TimeRange {
  int64_t start = 0;  // inclusive; 0: from the start
  int64_t end = 0;    // exclusive; 0: no end
};

absl::StatusOr<TimeRange> TimeRangeFlags() {
  auto start = TimeFlag("start", absl::GetFlag(FLAGS_start));
  if (!start.ok()) return start.status();
  auto end = TimeFlag("end", absl::GetFlag(FLAGS_end));
  if (!end.ok()) return end.status();
  if (*end > 0 && *end <= *start) {
    return absl::InvalidArgumentError(
        absl::StrCat("--end (", FormatUnixMicros(*end), ") must be after --start (",
                     FormatUnixMicros(*start), ")"));
  }
  return TimeRange{*start, *end};
}

absl::StatusOr<uint32_t> LimitFlag() {
  const int32_t limit = absl::GetFlag(FLAGS_limit);
  if (limit < 0) {
    return absl::InvalidArgumentError(absl::StrCat("--limit must be >= 0, got ", limit));
  }
  return static_cast<uint32_t>(limit);
}

int Series(QueryClient& q, const std::string& job, v1::Mode mode, bool json) {
  const std::string tensor = absl::GetFlag(FLAGS_tensor);
  if (tensor.empty()) return Usage("series needs --tensor");
  auto start = StepFlag("start", absl::GetFlag(FLAGS_start));
  if (!start.ok()) return Fail(start.status());
  auto end = StepFlag("end", absl::GetFlag(FLAGS_end));
  if (!end.ok()) return Fail(end.status());
  auto points = q.ReadSeries(job, tensor, mode, *start, *end, absl::GetFlag(FLAGS_worker));
  if (!points.ok()) return Fail(points.status());
  if (json) {
    nlohmann::json arr = nlohmann::json::array();
    for (const auto& p : *points) {
      nlohmann::json o = StatsJson(p.statistics());
      o["step"] = p.step();
      o["mode"] = std::string(ModeName(p.mode()));
      o["mode_step"] = p.mode_step();
      o["worker"] = p.worker();
      arr.push_back(o);
    }
    std::cout << arr.dump(2) << "\n";
    return 0;
  }
  std::vector<std::vector<std::string>> rows;
  for (const auto& p : *points) {
    const auto& s = p.statistics();
    rows.push_back({absl::StrCat(p.step()), std::string(ModeName(p.mode())),
                    absl::StrCat(p.mode_step()), absl::StrCat(p.worker()), Extreme(s, s.min()),
                    Extreme(s, s.max()), Num(s.mean()), Num(s.std()), Num(s.l2()),
                    absl::StrCat(s.nan_count()), absl::StrCat(s.pos_inf_count() + s.neg_inf_count())});
  }
  std::cout << Table({"STEP", "MODE", "MODE STEP", "WORKER", "MIN", "MAX", "MEAN", "STD", "L2",
                      "NAN", "INF"},
                     rows);
  return 0;
}

int Rules(QueryClient& q, const std::string& job, bool json) {
  auto results = q.RuleResults(job);
  if (!results.ok()) return Fail(results.status());
  if (json) {
    std::cout << RulesJson(*results) << "\n";
  } else {
    std::cout << RuleSummary(job, *results);
  }
  return 0;
}

int Watch(QueryClient& q, const std::string& job, bool json) {
  absl::Status s = q.WatchRuleResults(
      job,
      [json](const v1::RuleResult& r) {
        if (json) {
          std::cout << nlohmann::json::parse(RulesJson({r}))[0].dump() << std::endl;
        } else {
          std::cout << r.rule() << "  " << RuleStatusName(r.status()) << "  step " << r.step()
                    << "  " << r.message() << std::endl;
        }
        return true;
      },
      absl::GetFlag(FLAGS_timeout));
  if (!s.ok() && s.code() != absl::StatusCode::kDeadlineExceeded) return Fail(s);
  return 0;
}

int Catalog(QueryClient& q, bool json) {
  auto rules = q.RuleCatalog();
  if (!rules.ok()) return Fail(rules.status());
  if (json) {
    nlohmann::json arr = nlohmann::json::array();
    for (const auto& r : *rules) {
      nlohmann::json params = nlohmann::json::array();
      for (const auto& p : r.parameters()) {
        params.push_back({{"name", p.name()},
                          {"default", p.default_value()},
                          {"description", p.description()}});
      }
      arr.push_back({{"rule", r.rule_type()},
                     {"description", r.description()},
                     {"parameters", params},
                     {"collections", std::vector<std::string>(r.default_collections().begin(),
                                                              r.default_collections().end())},
                     {"suggestion", r.suggestion()},
                     {"source", r.source()}});
    }
    std::cout << arr.dump(2) << "\n";
    return 0;
  }
  for (const auto& r : *rules) {
    std::cout << r.rule_type() << " (" << r.source() << "): " << r.description() << "\n"
              << "  reads: "
              << (r.default_collections().empty() ? std::string("every tensor saved")
                                                  : absl::StrJoin(r.default_collections(), ", "))
              << "\n";
    for (const auto& p : r.parameters()) {
      std::cout << "  " << p.name() << " = " << (p.default_value().empty() ? "\"\"" : p.default_value())
                << "  " << p.description() << "\n";
    }
  }
  return 0;
}

int EnableRules(QueryClient& q, const std::string& job, bool json) {
  auto specs = rules::ParseRuleFlag(absl::GetFlag(FLAGS_rules));
  if (!specs.ok()) return Fail(specs.status());
  if (specs->empty()) return Usage("enable-rules needs --rules");
  auto all = q.EnableRules(job, *specs);
  if (!all.ok()) return Fail(all.status());
  if (json) {
    nlohmann::json arr = nlohmann::json::array();
    for (const auto& r : *all) arr.push_back({{"name", r.name()}, {"rule_type", r.rule_type()}});
    std::cout << arr.dump(2) << "\n";
    return 0;
  }
  std::cout << "job '" << job << "' will start with " << all->size() << " rule(s):";
  for (const auto& r : *all) std::cout << " " << r.name();
  std::cout << "\n";
  return 0;
}

int Delete(QueryClient& q, const std::string& job, bool json) {
  auto deleted = q.DeleteJob(job);
  if (!deleted.ok()) return Fail(deleted.status());
  if (json) {
    nlohmann::json out = {{"job", job},
                          {"job_id", deleted->job_id()},
                          {"approximate_bytes", deleted->approximate_bytes()}};
    std::cout << out.dump(2) << "\n";
    return 0;
  }
  std::cout << "deleted job '" << job << "' (id " << deleted->job_id() << ", about "
            << deleted->approximate_bytes() << " bytes)\n";
  return 0;
}

// The job's HTML report (Query.GetReport) into --out, or stdout. The
// client was connected with a longer timeout for it (Main).
int Report(QueryClient& q, const std::string& job) {
  auto html = q.GetReport(job);
  if (!html.ok()) return Fail(html.status());
  const std::string out = absl::GetFlag(FLAGS_out);
  if (out.empty() || out == "-") {
    std::cout << *html;
    return 0;
  }
  std::ofstream file(out, std::ios::binary | std::ios::trunc);
  file << *html;
  file.close();
  if (!file) return Fail(absl::UnavailableError(absl::StrCat("cannot write '", out, "'")));
  std::cerr << "wrote the report of job '" << job << "' to " << out << " (" << html->size()
            << " bytes)\n";
  return 0;
}

// Profiler metrics: the names per worker (--list), or the points of the
// chosen series. A truncated answer is printed as it came, with a line on
// stderr saying where it stops; the exit code stays 0.
int Metrics(QueryClient& q, const std::string& job, bool json) {
  const int32_t worker = absl::GetFlag(FLAGS_worker);
  if (absl::GetFlag(FLAGS_list)) {
    auto workers = q.ListMetrics(job, worker);
    if (!workers.ok()) return Fail(workers.status());
    std::cout << (json ? MetricNamesJson(*workers) + "\n" : MetricNamesTable(*workers));
    return 0;
  }
  const std::vector<std::string> names =
      absl::StrSplit(absl::GetFlag(FLAGS_names), ',', absl::SkipEmpty());
  auto range = TimeRangeFlags();
  if (!range.ok()) return Fail(range.status());
  auto limit = LimitFlag();
  if (!limit.ok()) return Fail(limit.status());
  auto read = q.ReadMetrics(job, names, absl::GetFlag(FLAGS_regex), worker, range->start,
                            range->end, *limit);
  if (!read.ok()) return Fail(read.status());
  std::cout << (json ? MetricsJson(read->series, read->truncated) + "\n"
                     : MetricsTable(read->series));
  if (read->truncated) {
    size_t points = 0;
    for (const auto& s : read->series) points += s.unix_micros_size();
    std::cerr << "sonde: truncated: more points match than one answer holds (" << points
              << " shown, by worker, then metric, then time); narrow the time range with "
                 "--start/--end, or ask for fewer metrics (--names, --regex) or one --worker, "
                 "for the rest";
    if (!read->series.empty() && read->series.back().unix_micros_size() > 0) {
      const auto& last = read->series.back();
      std::cerr << ". The last series shown, '" << last.name() << "' of worker "
                << last.worker() << ", stops at "
                << FormatUnixMicros(last.unix_micros(last.unix_micros_size() - 1));
    }
    std::cerr << "\n";
  }
  return 0;
}

// Framework events (steps, data waits, forward, backward, spans,
// initialisation), truncated like Metrics.
int Events(QueryClient& q, const std::string& job, bool json) {
  v1::TraceEvent::Kind kind = v1::TraceEvent::KIND_UNSPECIFIED;
  if (const std::string k = absl::GetFlag(FLAGS_kind); !k.empty()) {
    auto parsed = ParseEventKind(k);
    if (!parsed.ok()) {
      return Fail(absl::InvalidArgumentError(absl::StrCat("--kind: ", parsed.status().message())));
    }
    kind = *parsed;
  }
  auto range = TimeRangeFlags();
  if (!range.ok()) return Fail(range.status());
  auto limit = LimitFlag();
  if (!limit.ok()) return Fail(limit.status());
  auto read = q.ReadEvents(job, kind, absl::GetFlag(FLAGS_name), absl::GetFlag(FLAGS_worker),
                           range->start, range->end, *limit);
  if (!read.ok()) return Fail(read.status());
  std::cout << (json ? EventsJson(read->events, read->truncated) + "\n"
                     : EventsTable(read->events));
  if (read->truncated) {
    std::cerr << "sonde: truncated: more events match than one answer holds ("
              << read->events.size()
              << " shown, by worker, then kind, then name, then start); narrow the time range "
                 "with --start/--end, or use --kind, --name or --worker, for the rest";
    if (!read->events.empty()) {
      const auto& last = read->events.back();
      std::cerr << ". The last shown is a " << EventKindName(last.event().kind())
                << " event of worker " << last.worker() << " starting at "
                << FormatUnixMicros(last.event().start_unix_micros());
    }
    std::cerr << "\n";
  }
  return 0;
}

// sonde sync [DIR]: uploads the spools clients left in DIR.
int Sync(const std::string& dir, const ChannelSecurity& security, bool json) {
  spool::UploadOptions options;
  const absl::CommandLineFlag* collector = absl::FindCommandLineFlag("collector");
  // (This Abseil hides whether a flag was given: a value other than the
  // default is taken as given.)
  if (collector != nullptr && collector->CurrentValue() != collector->DefaultValue()) {
    options.collector = absl::GetFlag(FLAGS_collector);
  }
  options.security = security;
  options.end_job = absl::GetFlag(FLAGS_end_jobs);
  const std::vector<spool::LeftSpool> left = spool::FindLeft(dir);
  nlohmann::json out = nlohmann::json::array();
  int failed = 0;
  uint64_t stored = 0, duplicates = 0;
  for (const spool::LeftSpool& l : left) {
    spool::UploadResult result;
    const absl::Status s = spool::Upload(l, options, &result);
    failed += !s.ok();
    stored += result.steps_stored;
    duplicates += result.steps_duplicate;
    const std::string target = options.collector.empty() ? l.collector : options.collector;
    if (json) {
      out.push_back({{"spool", l.path},
                     {"job", l.hello.job()},
                     {"worker", l.hello.worker()},
                     {"collector", target},
                     {"entries", l.segments.size()},
                     {"bytes", l.bytes},
                     {"steps_stored", result.steps_stored},
                     {"steps_already_stored", result.steps_duplicate},
                     {"entries_damaged", result.segments_damaged},
                     {"removed", result.removed},
                     {"error", s.ok() ? "" : std::string(s.message())}});
      continue;
    }
    std::cout << "job " << l.hello.job() << " worker " << l.hello.worker() << " -> " << target
              << ": " << l.segments.size() << " entries (" << l.bytes << " bytes): ";
    if (s.ok()) {
      std::cout << result.steps_stored << " steps stored, " << result.steps_duplicate
                << " already stored; spool removed\n";
    } else {
      std::cout << "not uploaded: " << s.message() << "\n";
    }
  }
  if (json) {
    std::cout << out.dump(2) << "\n";
  } else {
    std::cout << left.size() << " spools in " << dir << ": " << stored << " steps stored, "
              << duplicates << " already stored, " << failed << " failed\n";
  }
  return failed == 0 ? 0 : 1;
}

int Main(const std::vector<char*>& args) {
  if (args.size() < 2) return Usage("no command");
  const std::string cmd = args[1];
  const size_t max_args = cmd == "sync" ? 3 : 2;
  if (args.size() > max_args) {
    return Usage(absl::StrCat("unexpected argument '", args[max_args], "'"));
  }
  const bool json = absl::GetFlag(FLAGS_json);
  auto mode = ModeFlag();
  if (!mode.ok()) return Fail(mode.status());
  ChannelSecurity security;
  security.ca_file = absl::GetFlag(FLAGS_tls_ca);
  security.cert_file = absl::GetFlag(FLAGS_tls_cert);
  security.key_file = absl::GetFlag(FLAGS_tls_key);
  security.server_name_override = absl::GetFlag(FLAGS_tls_server_name);
  security.token = absl::GetFlag(FLAGS_token);
  if (const char* env = std::getenv("SONDE_TOKEN"); security.token.empty() && env != nullptr) {
    security.token = env;
  }
  if (cmd == "sync") return Sync(args.size() > 2 ? args[2] : spool::DefaultDir(), security, json);
  // A large job's report takes longer to render than a query to answer.
  const absl::Duration timeout = cmd == "report" ? absl::Minutes(2) : absl::Seconds(30);
  auto connected = QueryClient::Connect(absl::GetFlag(FLAGS_collector), security, timeout);
  // Exit code 3 means "no such job": an unreadable PEM file is a usage error.
  if (!connected.ok()) return Fail(absl::InvalidArgumentError(connected.status().message()));
  std::unique_ptr<QueryClient> q = std::move(*connected);
  if (cmd == "jobs") return Jobs(*q, json);
  if (cmd == "rule-catalog") return Catalog(*q, json);
  const std::string job = absl::GetFlag(FLAGS_job);
  const bool known = cmd == "job" || cmd == "tensors" || cmd == "steps" || cmd == "show" ||
                     cmd == "series" || cmd == "rules" || cmd == "watch" ||
                     cmd == "enable-rules" || cmd == "delete" || cmd == "report" ||
                     cmd == "metrics" || cmd == "events";
  if (!known) return Usage(absl::StrCat("unknown command '", cmd, "'"));
  if (job.empty()) return Usage(absl::StrCat(cmd, " needs --job"));
  if (cmd == "job") return Job(*q, job, json);
  if (cmd == "tensors") return Tensors(*q, job, json);
  if (cmd == "steps") return Steps(*q, job, *mode, json);
  if (cmd == "show") return Show(*q, job, *mode, json);
  if (cmd == "series") return Series(*q, job, *mode, json);
  if (cmd == "rules") return Rules(*q, job, json);
  if (cmd == "enable-rules") return EnableRules(*q, job, json);
  if (cmd == "delete") return Delete(*q, job, json);
  if (cmd == "report") return Report(*q, job);
  if (cmd == "metrics") return Metrics(*q, job, json);
  if (cmd == "events") return Events(*q, job, json);
  return Watch(*q, job, json);
}

}  // namespace
}  // namespace sonde

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "sonde {jobs|job|tensors|steps|show|series|rules|watch|rule-catalog|enable-rules|delete|"
      "report|metrics|events|sync} "
      "[--collector=host:port] [--tls_ca=ca.pem [--tls_cert=c.pem --tls_key=k.pem]] "
      "[--token=T, or SONDE_TOKEN in the environment] "
      "[--job=J] [--json] ...\n"
      "  sonde metrics --job=J [--names=a,b | --regex=R] [--worker=W] [--start=T] [--end=T]\n"
      "  sonde metrics --job=J --list\n"
      "  sonde events --job=J [--kind=step|data_wait|forward|backward|span|init] [--name=N] "
      "[--worker=W] [--start=T] [--end=T]\n"
      "  sonde sync [DIR] [--collector=host:port] [--end_jobs]: upload the spools hooks "
      "left in DIR (default $SONDE_SPOOL_DIR, else ~/.cache/sonde/spool), each to the "
      "collector it was streaming to unless --collector is given\n"
      "Times T are unix microseconds (1714564800000000) or RFC3339 with a zone "
      "(2024-05-01T12:00:00Z, 2024-05-01T14:00:00.5+02:00); ranges are [start, end).");
  // --help lists the flags of this file (by default only those of a file
  // named after the program, "sonde.cc", which does not exist).
  absl::FlagsUsageConfig usage_config;
  usage_config.contains_help_flags = [](absl::string_view file) {
    return absl::EndsWith(file, "client/sonde_cli.cc");
  };
  absl::SetFlagsUsageConfig(usage_config);
  std::vector<char*> args = absl::ParseCommandLine(argc, argv);
  return sonde::Main(args);
}
