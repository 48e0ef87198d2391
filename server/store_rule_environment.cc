#include "server/store_rule_environment.h"

#include "absl/strings/str_cat.h"
#include "common/dtype.h"
#include "common/status_macros.h"

namespace sonde::server {

absl::StatusOr<std::vector<double>> StoreRuleEnvironment::ReadValues(
    const std::string& job, v1::Mode mode, int64_t mode_step, const std::string& tensor,
    int32_t worker) const {
  SONDE_ASSIGN_OR_RETURN(v1::JobInfo info, store_->GetJob(job));
  std::string bytes;
  SONDE_ASSIGN_OR_RETURN(
      v1::TensorRecord record,
      store_->ReadTensor(info.job_id(), mode, mode_step, tensor, worker,
                         [&bytes](const v1::TensorRecord&, absl::string_view piece) {
                           bytes.append(piece.data(), piece.size());
                           return absl::OkStatus();
                         }));
  if (!record.has_values()) {
    return absl::NotFoundError(absl::StrCat("job '", job, "' kept only statistics of '", tensor,
                                            "' at step ", mode_step));
  }
  return DecodeAsDouble(bytes, record.dtype());
}

}  // namespace sonde::server
