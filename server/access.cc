#include "server/access.h"

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "glog/logging.h"
#include "google/protobuf/descriptor.h"

namespace sonde::server {
namespace {

constexpr MethodAccess kTable[] = {
    // The ingest stream: checked at its Hello.
    {"/sonde.v1.Collector/Stream", Right::kWrite, "hello.job"},
    // Reading.
    {"/sonde.v1.Query/ListJobs", Right::kRead, "", /*filters_answer=*/true},
    {"/sonde.v1.Query/GetJob", Right::kRead, "job"},
    {"/sonde.v1.Query/ListTensors", Right::kRead, "job"},
    {"/sonde.v1.Query/ListSteps", Right::kRead, "job"},
    {"/sonde.v1.Query/ReadTensor", Right::kRead, "job"},
    {"/sonde.v1.Query/ReadSeries", Right::kRead, "job"},
    {"/sonde.v1.Query/GetRuleResults", Right::kRead, "job"},
    {"/sonde.v1.Query/WatchRuleResults", Right::kRead, "job"},
    {"/sonde.v1.Query/WatchSteps", Right::kRead, "job"},
    {"/sonde.v1.Query/ListMetrics", Right::kRead, "job"},
    {"/sonde.v1.Query/ReadMetrics", Right::kRead, "job"},
    {"/sonde.v1.Query/ReadEvents", Right::kRead, "job"},
    {"/sonde.v1.Query/GetReport", Right::kRead, "job"},
    // The rule catalogue is about no job: any known token reads it.
    {"/sonde.v1.Query/ListRuleCatalog", Right::kRead, ""},
    // Writing.
    {"/sonde.v1.Query/PostRuleResult", Right::kWrite, "result.job"},
    {"/sonde.v1.Query/EnableRules", Right::kWrite, "job"},
    // Administration.
    {"/sonde.v1.Query/DeleteJob", Right::kAdmin, "job"},
};

}  // namespace

absl::Span<const MethodAccess> AccessTable() { return kTable; }

const MethodAccess* FindAccess(absl::string_view method) {
  for (const MethodAccess& a : kTable) {
    if (a.method == method) return &a;
  }
  return nullptr;
}

absl::StatusOr<std::string> JobOf(const MethodAccess& access,
                                  const google::protobuf::Message& request) {
  const google::protobuf::Message* m = &request;
  const std::vector<absl::string_view> path = absl::StrSplit(access.job_field, '.');
  for (size_t i = 0; i < path.size(); ++i) {
    const google::protobuf::FieldDescriptor* field =
        m->GetDescriptor()->FindFieldByName(std::string(path[i]));
    const bool last = i + 1 == path.size();
    const auto want = last ? google::protobuf::FieldDescriptor::CPPTYPE_STRING
                           : google::protobuf::FieldDescriptor::CPPTYPE_MESSAGE;
    if (field == nullptr || field->is_repeated() || field->cpp_type() != want) {
      return absl::InvalidArgumentError(
          absl::StrCat("the access table's job field '", access.job_field, "' of ", access.method,
                       " is not a path of singular fields of ", request.GetTypeName()));
    }
    if (last) return m->GetReflection()->GetString(*m, field);
    m = &m->GetReflection()->GetMessage(*m, field);
  }
  return absl::InvalidArgumentError(absl::StrCat(access.method, " names no job field"));
}

absl::Status Authorize(const TokenGrant& grant, absl::string_view method,
                       const google::protobuf::Message& request, absl::string_view peer) {
  const MethodAccess* access = FindAccess(method);
  absl::Status allowed;
  if (access == nullptr) {
    allowed = absl::PermissionDeniedError(
        absl::StrCat(method, " is not in the collector's access table"));
  } else if (access->job_field.empty()) {
    return absl::OkStatus();  // about no job: a known token suffices
  } else {
    absl::StatusOr<std::string> job = JobOf(*access, request);
    allowed = job.ok() ? TokenTable::Check(grant, *job, access->right)
                       : absl::PermissionDeniedError(job.status().message());
  }
  if (!allowed.ok()) {
    LOG(WARNING) << "refused " << method << " from " << peer << " (token fingerprint "
                 << grant.fingerprint << "): " << allowed.message();
  }
  return allowed;
}

absl::StatusOr<const TokenGrant*> AuthorizeCall(const TokenTable& tokens,
                                                const grpc::ServerContextBase& context,
                                                absl::string_view method,
                                                const google::protobuf::Message& request) {
  absl::StatusOr<const TokenGrant*> grant = AuthenticateCall(tokens, context);
  if (!grant.ok()) return grant.status();
  absl::Status allowed = Authorize(**grant, method, request, context.peer());
  if (!allowed.ok()) return allowed;
  return grant;
}

}  // namespace sonde::server
