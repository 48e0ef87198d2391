// Security end to end: the real collector on a loopback port with TLS
// (certificates made at test time by /usr/bin/openssl in a temporary
// directory), client certificates, and bearer tokens, driven by the real
// hook, query client, a raw ingest stream, and the sonde-collector binary.
#include <sys/wait.h>

#include <chrono>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "client/hook.h"
#include "client/query_client.h"
#include "common/channel.h"
#include "glog/logging.h"
#include "gmock/gmock.h"
#include "google/protobuf/descriptor.h"
#include "google/protobuf/message.h"
#include "grpcpp/generic/generic_stub.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "proto/collector.grpc.pb.h"
#include "server/access.h"
#include "server/auth.h"
#include "server/collector.h"
#include "tests/testing/status_matchers.h"
#include "tests/testing/test_certificates.h"
#include "tests/testing/temp_dir.h"

namespace sonde {
namespace {

using ::sonde::testing::IsOk;
using ::sonde::testing::StatusIs;
using ::sonde::testing::TempDir;

using ::sonde::testing::Certificates;
using ::sonde::testing::RunShell;
using ::sonde::testing::WriteFile;

// Collects everything the process logs through glog while it lives.
class LogCapture : public google::LogSink {
 public:
  LogCapture() { google::AddLogSink(this); }
  ~LogCapture() override { google::RemoveLogSink(this); }
  void send(google::LogSeverity, const char*, const char*, int, const struct ::tm*,
            const char* message, size_t length) override {
    absl::MutexLock lock(&mu_);
    absl::StrAppend(&text_, absl::string_view(message, length), "\n");
  }
  std::string text() const {
    absl::MutexLock lock(&mu_);
    return text_;
  }

 private:
  mutable absl::Mutex mu_;
  std::string text_ ABSL_GUARDED_BY(mu_);
};

std::unique_ptr<server::Collector> StartCollector(const TempDir& dir,
                                                  const server::ServerSecurityOptions& security) {
  server::CollectorOptions options;
  options.listen = "127.0.0.1:0";
  options.data_dir = dir.Sub("db");
  options.security = security;
  auto c = server::Collector::Start(options);
  EXPECT_THAT(c.status(), IsOk());
  return c.ok() ? std::move(*c) : nullptr;
}

std::unique_ptr<QueryClient> Query(const std::string& address, const ChannelSecurity& security) {
  auto q = QueryClient::Connect(address, security, absl::Seconds(20));
  EXPECT_THAT(q.status(), IsOk());
  return q.ok() ? std::move(*q) : nullptr;
}

// Streams two steps of job `job` through the real hook; the status of Close.
absl::Status StreamJob(const std::string& address, const ChannelSecurity& security,
                       const std::string& job) {
  HookOptions o;
  o.collector = address;
  o.security = security;
  o.job = job;
  o.config.save_config = SaveConfig::Every(1);
  o.config.include_collections = {"weights", "losses"};
  o.close_timeout = absl::Seconds(20);
  auto hook = Hook::Create(o);
  if (!hook.ok()) return hook.status();
  (*hook)->SetMode(v1::MODE_TRAIN);
  std::vector<float> w = {1, 2, 3, 4};
  for (int step = 0; step < 2; ++step) {
    (*hook)->StartStep();
    absl::Status s = (*hook)->SaveTensor("fc.weight", HostTensor(w.data(), {2, 2}), {"weights"});
    if (!s.ok()) return s;
    s = (*hook)->SaveScalar("loss", 1.0 / (step + 1), {"losses"});
    if (!s.ok()) return s;
  }
  return (*hook)->Close();
}

// Opens a raw ingest stream and says hello for `job`: OK once the hello is
// acknowledged, otherwise the status the collector ended the stream with.
absl::Status Hello(const std::string& address, const ChannelSecurity& security,
                   const std::string& job) {
  auto channel = MakeChannel(address, security, grpc::ChannelArguments());
  if (!channel.ok()) return channel.status();
  auto stub = v1::Collector::NewStub(*channel);
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(20)));
  auto stream = stub->Stream(&context);
  v1::ClientMessage hello;
  hello.set_seq(1);
  hello.mutable_hello()->set_job(job);
  hello.mutable_hello()->set_world_size(1);
  hello.mutable_hello()->set_client_id(42);
  stream->Write(hello);
  v1::ServerMessage reply;
  if (stream->Read(&reply) && reply.has_hello_ack()) {
    context.TryCancel();
    stream->Finish();
    return absl::OkStatus();
  }
  const grpc::Status status = stream->Finish();
  return absl::Status(static_cast<absl::StatusCode>(status.error_code()),
                      status.error_message());
}

// ---------------------------------------------------------------- TLS

class TlsTest : public ::testing::Test {
 protected:
  void SetUp() override { ASSERT_TRUE(certs_.ok()) << "openssl failed; see " << certs_("openssl.log"); }

  server::ServerSecurityOptions ServerTls(bool require_client_cert) const {
    server::ServerSecurityOptions s;
    s.tls_cert_file = certs_("server.pem");
    s.tls_key_file = certs_("server.key");
    if (require_client_cert) s.tls_client_ca_file = certs_("ca.pem");
    return s;
  }
  ChannelSecurity ClientTls(const std::string& cert = "") const {
    ChannelSecurity s;
    s.ca_file = certs_("ca.pem");
    if (!cert.empty()) {
      s.cert_file = certs_(cert + ".pem");
      s.key_file = certs_(cert + ".key");
    }
    return s;
  }

  Certificates certs_;
  TempDir dir_;
};

TEST_F(TlsTest, HookStreamsAndQueryReadsBackOverTls) {
  auto collector = StartCollector(dir_, ServerTls(false));
  ASSERT_NE(collector, nullptr);
  SONDE_ASSERT_OK(StreamJob(collector->address(), ClientTls(), "tls-job"));
  auto q = Query(collector->address(), ClientTls());
  auto steps = q->ListSteps("tls-job");
  SONDE_ASSERT_OK(steps);
  EXPECT_EQ(steps->size(), 2u);
  auto value = q->ReadTensor("tls-job", "fc.weight", 1, v1::MODE_TRAIN);
  SONDE_ASSERT_OK(value);
  EXPECT_EQ(value->bytes.size(), 4 * sizeof(float));

  // "localhost" is in the certificate too.
  const std::string port = collector->address().substr(collector->address().rfind(':'));
  auto by_name = Query("localhost" + port, ClientTls());
  EXPECT_THAT(by_name->ListJobs().status(), IsOk());
}

TEST_F(TlsTest, PlaintextClientAndUntrustingClientFail) {
  auto collector = StartCollector(dir_, ServerTls(false));
  ASSERT_NE(collector, nullptr);
  auto plaintext = Query(collector->address(), ChannelSecurity());
  EXPECT_THAT(plaintext->ListJobs().status(), StatusIs(absl::StatusCode::kUnavailable, ""));
  EXPECT_THAT(Hello(collector->address(), ChannelSecurity(), "p"),
              StatusIs(absl::StatusCode::kUnavailable, ""));
  ChannelSecurity other_ca;
  other_ca.ca_file = certs_("other_ca.pem");  // does not trust the server's CA
  auto untrusting = Query(collector->address(), other_ca);
  EXPECT_THAT(untrusting->ListJobs().status(), StatusIs(absl::StatusCode::kUnavailable, ""));
}

TEST_F(TlsTest, MutualTlsRequiresAClientCertificateFromTheConfiguredCa) {
  auto collector = StartCollector(dir_, ServerTls(true));
  ASSERT_NE(collector, nullptr);
  auto good = Query(collector->address(), ClientTls("client"));
  EXPECT_THAT(good->ListJobs().status(), IsOk());
  SONDE_EXPECT_OK(Hello(collector->address(), ClientTls("client"), "mtls-job"));

  auto without_cert = Query(collector->address(), ClientTls());
  EXPECT_THAT(without_cert->ListJobs().status(), StatusIs(absl::StatusCode::kUnavailable, ""));
  EXPECT_THAT(Hello(collector->address(), ClientTls(), "mtls-job"),
              StatusIs(absl::StatusCode::kUnavailable, ""));
  auto foreign_cert = Query(collector->address(), ClientTls("other_client"));
  EXPECT_THAT(foreign_cert->ListJobs().status(), StatusIs(absl::StatusCode::kUnavailable, ""));
}

TEST_F(TlsTest, UnreadableFilesAreReportedNotIgnored) {
  ChannelSecurity missing;
  missing.ca_file = dir_.Sub("nope.pem");
  EXPECT_THAT(QueryClient::Connect("127.0.0.1:1", missing).status(),
              StatusIs(absl::StatusCode::kNotFound, "nope.pem"));
  server::CollectorOptions options;
  options.listen = "127.0.0.1:0";
  options.data_dir = dir_.Sub("db");
  options.security.tls_cert_file = dir_.Sub("nope.pem");
  options.security.tls_key_file = certs_("server.key");
  EXPECT_THAT(server::Collector::Start(options).status(),
              StatusIs(absl::StatusCode::kNotFound, "nope.pem"));
}

// ---------------------------------------------------------------- tokens

constexpr char kAWrite[] = "tok-a-write-0123456789";
constexpr char kARead[] = "tok-a-read-0123456789";
constexpr char kB[] = "tok-b-0123456789";
constexpr char kAdmin[] = "tok-admin-0123456789";

class TokenTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto entry = [](const std::string& name, const std::string& token,
                    const std::string& project, const std::string& rights) {
      return absl::StrCat("{\"name\": \"", name, "\", \"sha256\": \"", server::Sha256Hex(token),
                          "\", \"project\": \"", project, "\", \"rights\": ", rights, "}");
    };
    WriteFile(dir_.Sub("tokens.json"),
              absl::StrCat("{\"tokens\": [", entry("a-write", kAWrite, "teamA-", "[\"write\"]"),
                           ",", entry("a-read", kARead, "teamA-", "[\"read\"]"), ",",
                           entry("b", kB, "teamB-", "[\"read\", \"write\"]"), ",",
                           entry("ops", kAdmin, "*", "[\"admin\"]"), "]}"));
    server::ServerSecurityOptions security;
    security.auth_tokens_file = dir_.Sub("tokens.json");
    collector_ = StartCollector(dir_, security);
    ASSERT_NE(collector_, nullptr);
  }

  ChannelSecurity Token(const std::string& token) const {
    ChannelSecurity s;
    s.token = token;
    return s;
  }
  std::unique_ptr<QueryClient> QueryAs(const std::string& token) const {
    return Query(collector_->address(), Token(token));
  }
  const std::string& address() const { return collector_->address(); }

  LogCapture log_;  // before the collector: sees everything it logs
  TempDir dir_;
  std::unique_ptr<server::Collector> collector_;
};

TEST_F(TokenTest, MissingOrUnknownTokenIsUnauthenticated) {
  EXPECT_THAT(QueryAs("")->ListJobs().status(),
              StatusIs(absl::StatusCode::kUnauthenticated, "requires a token"));
  EXPECT_THAT(QueryAs("")->RuleCatalog().status(),
              StatusIs(absl::StatusCode::kUnauthenticated, ""));
  EXPECT_THAT(QueryAs("tok-nobody")->GetJob("teamA-x").status(),
              StatusIs(absl::StatusCode::kUnauthenticated, "unknown token"));
  EXPECT_THAT(Hello(address(), Token(""), "teamA-x"),
              StatusIs(absl::StatusCode::kUnauthenticated, ""));
  EXPECT_THAT(Hello(address(), Token("tok-nobody"), "teamA-x"),
              StatusIs(absl::StatusCode::kUnauthenticated, ""));
  EXPECT_THAT(QueryAs(kARead)->RuleCatalog().status(), IsOk());
}

TEST_F(TokenTest, AHookRefusedForItsTokenGivesUpInsteadOfRetrying) {
  // The refusal ends the hello's stream with PERMISSION_DENIED: the hook
  // disables itself at once (Close says so) rather than retrying until its
  // close timeout (20 s) runs out.
  // The reason reaches Close's status.
  EXPECT_THAT(StreamJob(address(), Token(kARead), "teamA-refused"),
              StatusIs(absl::StatusCode::kUnavailable, "has no write right on job"));
  EXPECT_THAT(StreamJob(address(), Token("tok-nobody"), "teamA-refused"),
              StatusIs(absl::StatusCode::kUnavailable, "refused job 'teamA-refused': unknown token"));
}

TEST_F(TokenTest, WriteTokenStreamsItsProjectAndReadTokenReadsIt) {
  SONDE_ASSERT_OK(StreamJob(address(), Token(kAWrite), "teamA-run"));
  auto steps = QueryAs(kARead)->ListSteps("teamA-run");
  SONDE_ASSERT_OK(steps);
  EXPECT_EQ(steps->size(), 2u);
  auto value = QueryAs(kARead)->ReadTensor("teamA-run", "fc.weight", 0, v1::MODE_TRAIN);
  SONDE_EXPECT_OK(value);
  // Writing does not grant reading.
  EXPECT_THAT(QueryAs(kAWrite)->ListSteps("teamA-run").status(),
              StatusIs(absl::StatusCode::kPermissionDenied, "no read right"));
}

TEST_F(TokenTest, ReadOnlyTokenCannotStream) {
  EXPECT_THAT(Hello(address(), Token(kARead), "teamA-run"),
              StatusIs(absl::StatusCode::kPermissionDenied,
                       "token 'a-read' has no write right on job 'teamA-run'"));
  SONDE_EXPECT_OK(Hello(address(), Token(kAWrite), "teamA-run"));
}

TEST_F(TokenTest, ProjectATokensCannotTouchProjectB) {
  SONDE_ASSERT_OK(StreamJob(address(), Token(kB), "teamB-run"));
  EXPECT_THAT(Hello(address(), Token(kAWrite), "teamB-run"),
              StatusIs(absl::StatusCode::kPermissionDenied, ""));
  auto a = QueryAs(kARead);
  EXPECT_THAT(a->GetJob("teamB-run").status(), StatusIs(absl::StatusCode::kPermissionDenied, ""));
  EXPECT_THAT(a->ListSteps("teamB-run").status(),
              StatusIs(absl::StatusCode::kPermissionDenied, ""));
  EXPECT_THAT(a->ReadTensor("teamB-run", "fc.weight", 0, v1::MODE_TRAIN).status(),
              StatusIs(absl::StatusCode::kPermissionDenied, ""));
  EXPECT_THAT(a->ReadSeries("teamB-run", "loss").status(),
              StatusIs(absl::StatusCode::kPermissionDenied, ""));
  EXPECT_THAT(a->RuleResults("teamB-run").status(),
              StatusIs(absl::StatusCode::kPermissionDenied, ""));
  EXPECT_THAT(a->WatchRuleResults("teamB-run", [](const v1::RuleResult&) { return true; },
                                  absl::Seconds(20)),
              StatusIs(absl::StatusCode::kPermissionDenied, ""));
  EXPECT_THAT(a->ListTensors("teamB-run").status(),
              StatusIs(absl::StatusCode::kPermissionDenied, ""));
  EXPECT_THAT(QueryAs(kAWrite)->EnableRules("teamB-next", {}).status(),
              StatusIs(absl::StatusCode::kPermissionDenied, ""));
}

TEST_F(TokenTest, RefusalIsTheSameForExistingAndMissingJobs) {
  SONDE_ASSERT_OK(StreamJob(address(), Token(kB), "teamB-run"));
  auto a = QueryAs(kARead);
  const absl::Status existing = a->GetJob("teamB-run").status();
  const absl::Status missing = a->GetJob("teamB-nope").status();
  EXPECT_EQ(existing.code(), absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(missing.code(), existing.code());
  EXPECT_EQ(existing.message(), "token 'a-read' has no read right on job 'teamB-run'");
  EXPECT_EQ(missing.message(), "token 'a-read' has no read right on job 'teamB-nope'");
  // The same holds for the ingest stream and for deletion.
  const absl::Status stream_existing = Hello(address(), Token(kAWrite), "teamB-run");
  const absl::Status stream_missing = Hello(address(), Token(kAWrite), "teamB-nope");
  EXPECT_EQ(stream_existing.code(), absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(stream_missing.code(), stream_existing.code());
  EXPECT_EQ(stream_existing.message(), "token 'a-write' has no write right on job 'teamB-run'");
  EXPECT_EQ(stream_missing.message(), "token 'a-write' has no write right on job 'teamB-nope'");
  const absl::Status delete_existing = QueryAs(kB)->DeleteJob("teamB-run").status();
  const absl::Status delete_missing = QueryAs(kB)->DeleteJob("teamB-nope").status();
  EXPECT_EQ(delete_existing.code(), absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(delete_missing.code(), delete_existing.code());
  EXPECT_EQ(delete_existing.message(), "token 'b' has no admin right on job 'teamB-run'");
}

// One raw call of any method (unary or server streaming) with `request`,
// as `token`: its final status.
grpc::Status CallRaw(const std::string& address, const std::string& token,
                     const std::string& method, const google::protobuf::Message& request) {
  grpc::GenericStub stub(grpc::CreateChannel(address, grpc::InsecureChannelCredentials()));
  grpc::ClientContext context;
  if (!token.empty()) context.AddMetadata("authorization", "Bearer " + token);
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(2));
  grpc::CompletionQueue cq;
  void* tag;
  bool ok;
  auto call = stub.PrepareCall(&context, method, &cq);
  call->StartCall(reinterpret_cast<void*>(1));
  cq.Next(&tag, &ok);
  const std::string bytes = request.SerializeAsString();
  grpc::Slice slice(bytes);
  grpc::ByteBuffer buffer(&slice, 1);
  call->WriteLast(buffer, grpc::WriteOptions(), reinterpret_cast<void*>(2));
  cq.Next(&tag, &ok);
  grpc::ByteBuffer answer;
  do {
    call->Read(&answer, reinterpret_cast<void*>(3));
    cq.Next(&tag, &ok);
  } while (ok);
  grpc::Status status;
  call->Finish(&status, reinterpret_cast<void*>(4));
  cq.Next(&tag, &ok);
  cq.Shutdown();
  while (cq.Next(&tag, &ok)) {
  }
  return status;
}

// Sets the string at `path` ("job", "result.job") of `m`.
void SetJob(google::protobuf::Message* m, absl::string_view path, const std::string& job) {
  const std::vector<std::string> parts = absl::StrSplit(path, '.');
  for (size_t i = 0; i + 1 < parts.size(); ++i) {
    m = m->GetReflection()->MutableMessage(m, m->GetDescriptor()->FindFieldByName(parts[i]));
  }
  m->GetReflection()->SetString(m, m->GetDescriptor()->FindFieldByName(parts.back()), job);
}

// Every method of the Query service has an entry in the access table, and
// each entry is enforced over real gRPC: a token without the entry's right
// on the job its request names is refused with that right in the message,
// a token with it is let through, and no token is unauthenticated.
TEST_F(TokenTest, EveryMethodIsCheckedAsTheAccessTableSays) {
  const google::protobuf::ServiceDescriptor* service =
      google::protobuf::DescriptorPool::generated_pool()->FindServiceByName("sonde.v1.Query");
  ASSERT_NE(service, nullptr);
  ASSERT_GT(service->method_count(), 10);
  for (int i = 0; i < service->method_count(); ++i) {
    const google::protobuf::MethodDescriptor* method = service->method(i);
    const std::string name = absl::StrCat("/", service->full_name(), "/", method->name());
    SCOPED_TRACE(name);
    const server::MethodAccess* access = server::FindAccess(name);
    ASSERT_NE(access, nullptr) << name << " has no entry in server/access.cc";
    std::unique_ptr<google::protobuf::Message> request(
        google::protobuf::MessageFactory::generated_factory()
            ->GetPrototype(method->input_type())
            ->New());
    EXPECT_THAT(CallRaw(address(), "", name, *request).error_code(),
                grpc::StatusCode::UNAUTHENTICATED);
    if (access->job_field.empty()) {  // about no job: any known token
      EXPECT_TRUE(CallRaw(address(), kAWrite, name, *request).ok());
      continue;
    }
    SetJob(request.get(), access->job_field, "teamB-run");
    SONDE_EXPECT_OK(server::JobOf(*access, *request).status());
    // a-read has only read on teamA-: refused for teamB-run whatever the right.
    const grpc::Status refused = CallRaw(address(), kARead, name, *request);
    EXPECT_EQ(refused.error_code(), grpc::StatusCode::PERMISSION_DENIED);
    EXPECT_EQ(refused.error_message(),
              absl::StrCat("token 'a-read' has no ", server::RightName(access->right),
                           " right on job 'teamB-run'"));
    // b has read and write on teamB-; admin needs ops.
    const char* allowed_token = access->right == server::Right::kAdmin ? kAdmin : kB;
    const grpc::Status let = CallRaw(address(), allowed_token, name, *request);
    EXPECT_NE(let.error_code(), grpc::StatusCode::PERMISSION_DENIED) << let.error_message();
    EXPECT_NE(let.error_code(), grpc::StatusCode::UNAUTHENTICATED) << let.error_message();
    if (access->right != server::Right::kAdmin) {
      // The admin right covers the others.
      EXPECT_NE(CallRaw(address(), kAdmin, name, *request).error_code(),
                grpc::StatusCode::PERMISSION_DENIED);
    }
  }
  // And the table names nothing the services do not serve.
  for (const server::MethodAccess& a : server::AccessTable()) {
    const std::vector<std::string> parts = absl::StrSplit(a.method, '/');
    ASSERT_EQ(parts.size(), 3u) << a.method;
    const google::protobuf::ServiceDescriptor* s =
        google::protobuf::DescriptorPool::generated_pool()->FindServiceByName(parts[1]);
    ASSERT_NE(s, nullptr) << a.method;
    const google::protobuf::MethodDescriptor* m = s->FindMethodByName(parts[2]);
    ASSERT_NE(m, nullptr) << a.method;
    if (!a.job_field.empty()) {
      std::unique_ptr<google::protobuf::Message> request(
          google::protobuf::MessageFactory::generated_factory()->GetPrototype(m->input_type())->New());
      SONDE_EXPECT_OK(server::JobOf(a, *request).status()) << a.method;
    }
  }
}

TEST_F(TokenTest, ListJobsShowsOnlyReadableJobs) {
  SONDE_ASSERT_OK(StreamJob(address(), Token(kAWrite), "teamA-run"));
  SONDE_ASSERT_OK(StreamJob(address(), Token(kB), "teamB-run"));
  auto names = [&](const std::string& token) {
    std::vector<std::string> out;
    auto jobs = QueryAs(token)->ListJobs();
    EXPECT_THAT(jobs.status(), IsOk());
    if (jobs.ok()) {
      for (const auto& j : *jobs) out.push_back(j.job());
    }
    return out;
  };
  EXPECT_THAT(names(kARead), ::testing::ElementsAre("teamA-run"));
  EXPECT_THAT(names(kB), ::testing::ElementsAre("teamB-run"));
  EXPECT_THAT(names(kAWrite), ::testing::IsEmpty());  // write only: nothing to read
  EXPECT_THAT(names(kAdmin), ::testing::UnorderedElementsAre("teamA-run", "teamB-run"));
}

TEST_F(TokenTest, OnlyAdminDeletes) {
  SONDE_ASSERT_OK(StreamJob(address(), Token(kB), "teamB-run"));
  EXPECT_THAT(QueryAs(kB)->DeleteJob("teamB-run").status(),
              StatusIs(absl::StatusCode::kPermissionDenied, "no admin right"));
  SONDE_EXPECT_OK(QueryAs(kAdmin)->DeleteJob("teamB-run").status());
  EXPECT_THAT(QueryAs(kB)->GetJob("teamB-run").status(),
              StatusIs(absl::StatusCode::kNotFound, ""));
}

TEST_F(TokenTest, TokensNeverReachTheLog) {
  SONDE_ASSERT_OK(StreamJob(address(), Token(kAWrite), "teamA-run"));
  EXPECT_FALSE(Hello(address(), Token(kARead), "teamA-run").ok());
  EXPECT_FALSE(QueryAs(kAWrite)->GetJob("teamB-x").ok());
  EXPECT_FALSE(QueryAs("tok-nobody-0123456789")->ListJobs().ok());
  EXPECT_FALSE(QueryAs(kB)->DeleteJob("teamB-x").ok());
  const std::string log = log_.text();
  EXPECT_THAT(log, ::testing::HasSubstr("refused"));  // the refusals were logged...
  EXPECT_THAT(log, ::testing::HasSubstr(server::Sha256Hex(kARead).substr(0, 8)));
  for (const char* secret : {kAWrite, kARead, kB, kAdmin, "tok-nobody-0123456789"}) {
    EXPECT_THAT(log, ::testing::Not(::testing::HasSubstr(secret)));  // ...never the tokens
    EXPECT_THAT(log, ::testing::Not(::testing::HasSubstr(server::Sha256Hex(secret))));
  }
}

TEST_F(TokenTest, TokenOverTlsWithClientCertificates) {
  Certificates certs;
  ASSERT_TRUE(certs.ok());
  TempDir dir;
  server::ServerSecurityOptions security;
  security.tls_cert_file = certs("server.pem");
  security.tls_key_file = certs("server.key");
  security.tls_client_ca_file = certs("ca.pem");
  security.auth_tokens_file = dir_.Sub("tokens.json");
  auto collector = StartCollector(dir, security);
  ASSERT_NE(collector, nullptr);
  ChannelSecurity client;
  client.ca_file = certs("ca.pem");
  client.cert_file = certs("client.pem");
  client.key_file = certs("client.key");
  client.token = kAWrite;
  SONDE_ASSERT_OK(StreamJob(collector->address(), client, "teamA-secure"));
  client.token = kARead;
  auto steps = Query(collector->address(), client)->ListSteps("teamA-secure");
  SONDE_ASSERT_OK(steps);
  EXPECT_EQ(steps->size(), 2u);
  client.token = "";
  EXPECT_THAT(Query(collector->address(), client)->ListSteps("teamA-secure").status(),
              StatusIs(absl::StatusCode::kUnauthenticated, ""));
}

// ---------------------------------------------------------------- listen

std::string CollectorBinary() {
  const char* srcdir = std::getenv("TEST_SRCDIR");
  const char* workspace = std::getenv("TEST_WORKSPACE");
  return absl::StrCat(srcdir ? srcdir : ".", "/", workspace ? workspace : "sonde",
                      "/server/sonde-collector");
}

TEST(InsecureListen, RefusedOffLoopbackUnlessAllowed) {
  TempDir dir;
  server::CollectorOptions options;
  options.listen = "0.0.0.0:0";
  options.data_dir = dir.Sub("db");
  EXPECT_THAT(server::Collector::Start(options).status(),
              StatusIs(absl::StatusCode::kFailedPrecondition, "--allow_insecure"));
  options.security.allow_insecure = true;
  auto allowed = server::Collector::Start(options);
  SONDE_EXPECT_OK(allowed.status());
}

TEST(InsecureListen, BinaryExitsWithCode2) {
  TempDir dir;
  const std::string base = absl::StrCat(CollectorBinary(), " --data_dir=", dir.Sub("db"));
  EXPECT_EQ(RunShell(absl::StrCat(base, " --listen=0.0.0.0:0 2>", dir.Sub("err.txt"))), 2);
  std::ifstream err(dir.Sub("err.txt"));
  std::string text((std::istreambuf_iterator<char>(err)), std::istreambuf_iterator<char>());
  EXPECT_THAT(text, ::testing::HasSubstr("without TLS or authentication"));
  // No database was created: nothing was started.
  EXPECT_NE(RunShell(absl::StrCat("test -e ", dir.Sub("db"))), 0);
}

}  // namespace
}  // namespace sonde
