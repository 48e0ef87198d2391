#include "server/rpc_metrics.h"

#include <array>
#include <atomic>
#include <map>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/metrics/metrics.h"
#include "google/protobuf/descriptor.h"
#include "proto/collector.grpc.pb.h"
#include "proto/collector.pb.h"
#include "proto/query.grpc.pb.h"

namespace sonde::server {
namespace {

using grpc::experimental::InterceptionHookPoints;
using grpc::experimental::InterceptorBatchMethods;

std::string CodeName(grpc::StatusCode code) {
  return absl::StatusCodeToString(static_cast<absl::StatusCode>(code));
}

// Client message kinds, in the order of kClientKinds.
constexpr std::array<const char*, 6> kClientKinds = {"hello",   "chunk",   "summary",
                                                     "step_end", "job_end", "other"};
size_t ClientKind(const v1::ClientMessage& m) {
  switch (m.kind_case()) {
    case v1::ClientMessage::kHello:
      return 0;
    case v1::ClientMessage::kChunk:
      return 1;
    case v1::ClientMessage::kSummary:
      return 2;
    case v1::ClientMessage::kStepEnd:
      return 3;
    case v1::ClientMessage::kJobEnd:
      return 4;
    default:
      return 5;
  }
}

constexpr std::array<const char*, 5> kServerKinds = {"hello_ack", "ack", "action", "warning",
                                                     "other"};
size_t ServerKind(const v1::ServerMessage& m) {
  switch (m.kind_case()) {
    case v1::ServerMessage::kHelloAck:
      return 0;
    case v1::ServerMessage::kAck:
      return 1;
    case v1::ServerMessage::kAction:
      return 2;
    case v1::ServerMessage::kWarning:
      return 3;
    default:
      return 4;
  }
}

struct IngestMetrics {
  metrics::Gauge* streams_open;
  metrics::Family<metrics::Counter>* streams_closed;
  std::array<metrics::Counter*, kClientKinds.size()> received;
  std::array<metrics::Counter*, kClientKinds.size()> received_bytes;
  std::array<metrics::Counter*, kServerKinds.size()> sent;
  metrics::Counter* steps_committed;
  metrics::Histogram* commit_latency;

  IngestMetrics() {
    metrics::Registry& r = metrics::Registry::Default();
    streams_open = r.AddGauge("sonde_ingest_streams_open",
                              "Ingest streams (training processes) connected now.");
    streams_closed = r.AddCounterFamily(
        "sonde_ingest_streams_closed_total",
        "Ingest streams ended, by the gRPC status code the collector ended them with.",
        {"code"});
    streams_closed->Get({"OK"});
    auto* in = r.AddCounterFamily("sonde_ingest_messages_received_total",
                                  "Client messages received on ingest streams, by kind.",
                                  {"kind"});
    auto* in_bytes = r.AddCounterFamily(
        "sonde_ingest_received_bytes_total",
        "Bytes of client messages (protobuf encoding) received on ingest streams, by kind.",
        {"kind"});
    for (size_t i = 0; i < kClientKinds.size(); ++i) {
      received[i] = in->Get({kClientKinds[i]});
      received_bytes[i] = in_bytes->Get({kClientKinds[i]});
    }
    auto* out = r.AddCounterFamily("sonde_ingest_messages_sent_total",
                                   "Server messages sent on ingest streams, by kind (ack: a "
                                   "step or job end is durably stored).",
                                   {"kind"});
    for (size_t i = 0; i < kServerKinds.size(); ++i) sent[i] = out->Get({kServerKinds[i]});
    steps_committed = r.AddCounter(
        "sonde_ingest_steps_committed_total",
        "Steps of one worker stored and acknowledged (duplicates of stored steps excluded).");
    commit_latency = r.AddHistogram(
        "sonde_ingest_commit_latency_seconds",
        "From receiving a step end to sending its ack: storage pool queue, statistics, "
        "the RocksDB write.",
        metrics::LatencyBuckets());
  }
};

const IngestMetrics& Ingest() {
  static const IngestMetrics* const m = new IngestMetrics();
  return *m;
}

// Streams open and how they ended. (The stream's messages are raw bytes
// here: IngestStreamMetrics counts them once the reactor has parsed them.)
class IngestInterceptor final : public grpc::experimental::Interceptor {
 public:
  explicit IngestInterceptor(const IngestMetrics* m) : m_(m) { m_->streams_open->Increment(); }
  ~IngestInterceptor() override {
    m_->streams_open->Decrement();
    if (!status_sent_.load()) m_->streams_closed->Get({"CANCELLED"})->Increment();
  }

  void Intercept(InterceptorBatchMethods* methods) override {
    if (methods->QueryInterceptionHookPoint(InterceptionHookPoints::PRE_SEND_STATUS)) {
      status_sent_.store(true);
      m_->streams_closed->Get({CodeName(methods->GetSendStatus().error_code())})->Increment();
    }
    methods->Proceed();
  }

 private:
  const IngestMetrics* const m_;
  std::atomic<bool> status_sent_{false};
};

struct QueryMetrics {
  metrics::Family<metrics::Counter>* calls;
  std::map<std::string, metrics::Histogram*> duration;  // by method; fixed after construction

  QueryMetrics() {
    metrics::Registry& r = metrics::Registry::Default();
    calls = r.AddCounterFamily("sonde_query_rpcs_total",
                               "Query RPCs finished, by method and gRPC status code.",
                               {"method", "code"});
    auto* durations = r.AddHistogramFamily(
        "sonde_query_rpc_duration_seconds",
        "Query RPCs from arrival to status, by method (Watch* calls last as long as "
        "the watch).",
        metrics::LatencyBuckets(), {"method"});
    const google::protobuf::ServiceDescriptor* service =
        google::protobuf::DescriptorPool::generated_pool()->FindServiceByName(
            v1::Query::service_full_name());
    for (int i = 0; service != nullptr && i < service->method_count(); ++i) {
      const std::string& method = service->method(i)->name();
      calls->Get({method, "OK"});
      duration[method] = durations->Get({method});
    }
  }
};

class QueryInterceptor final : public grpc::experimental::Interceptor {
 public:
  QueryInterceptor(const QueryMetrics* m, std::string method, metrics::Histogram* duration)
      : m_(m), method_(std::move(method)), duration_(duration), start_(absl::Now()) {}
  ~QueryInterceptor() override {
    if (!status_sent_.load()) m_->calls->Get({method_, "CANCELLED"})->Increment();
  }

  void Intercept(InterceptorBatchMethods* methods) override {
    if (methods->QueryInterceptionHookPoint(InterceptionHookPoints::PRE_SEND_STATUS)) {
      status_sent_.store(true);
      m_->calls->Get({method_, CodeName(methods->GetSendStatus().error_code())})->Increment();
      duration_->ObserveDuration(absl::Now() - start_);
    }
    methods->Proceed();
  }

 private:
  const QueryMetrics* const m_;
  const std::string method_;
  metrics::Histogram* const duration_;
  const absl::Time start_;
  std::atomic<bool> status_sent_{false};
};

class RpcMetricsFactory final : public grpc::experimental::ServerInterceptorFactoryInterface {
 public:
  RpcMetricsFactory()
      : stream_method_(absl::StrCat("/", v1::Collector::service_full_name(), "/Stream")),
        query_prefix_(absl::StrCat("/", v1::Query::service_full_name(), "/")) {
    Ingest();  // the ingest metrics exist (at zero) from the start
  }

  grpc::experimental::Interceptor* CreateServerInterceptor(
      grpc::experimental::ServerRpcInfo* info) override {
    const char* method = info->method();
    if (method == nullptr) return nullptr;
    if (stream_method_ == method) return new IngestInterceptor(&Ingest());
    if (absl::StartsWith(method, query_prefix_)) {
      std::string name(method + query_prefix_.size());
      auto it = query_.duration.find(name);
      if (it == query_.duration.end()) return nullptr;  // not a method we know
      return new QueryInterceptor(&query_, std::move(name), it->second);
    }
    return nullptr;  // health, reflection
  }

 private:
  const std::string stream_method_;
  const std::string query_prefix_;
  const QueryMetrics query_;
};

}  // namespace

void IngestStreamMetrics::Received(const v1::ClientMessage& msg, size_t bytes) {
  const IngestMetrics& m = Ingest();
  const size_t kind = ClientKind(msg);
  m.received[kind]->Increment();
  m.received_bytes[kind]->Increment(bytes);
  if (msg.has_step_end()) {
    step_end_nanos_.store(absl::GetCurrentTimeNanos(), std::memory_order_relaxed);
    step_end_seq_.store(msg.seq(), std::memory_order_release);
  }
}

void IngestStreamMetrics::Sent(const v1::ServerMessage& msg) {
  const IngestMetrics& m = Ingest();
  m.sent[ServerKind(msg)]->Increment();
  if (msg.has_ack() && !msg.ack().duplicate() && msg.ack().acked_seq() != 0 &&
      msg.ack().acked_seq() == step_end_seq_.load(std::memory_order_acquire)) {
    const int64_t took =
        absl::GetCurrentTimeNanos() - step_end_nanos_.load(std::memory_order_relaxed);
    m.steps_committed->Increment();
    m.commit_latency->Observe(static_cast<double>(took) / 1e9);
  }
}

std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>
NewRpcMetricsInterceptorFactory() {
  return std::make_unique<RpcMetricsFactory>();
}

}  // namespace sonde::server
