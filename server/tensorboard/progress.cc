#include "server/tensorboard/progress.h"

#include <cstdio>
#include <fstream>
#include <sstream>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace sonde::server::tensorboard {
namespace {

constexpr char kFileName[] = ".sonde-tensorboard-progress";
constexpr char kHeader[] = "sonde-tensorboard-progress v1";

// A path the record may name: relative, inside the job directory.
bool SafeRelativePath(const std::string& path) {
  if (path.empty() || path[0] == '/') return false;
  for (absl::string_view part : absl::StrSplit(path, '/')) {
    if (part.empty() || part == "." || part == "..") return false;
  }
  return true;
}

}  // namespace

absl::StatusOr<std::optional<ExportProgress>> ReadExportProgress(const std::string& job_dir) {
  const std::string path = absl::StrCat(job_dir, "/", kFileName);
  std::ifstream in(path);
  if (!in) return std::nullopt;
  ExportProgress progress;
  std::string line;
  int number = 0;
  bool saw_job = false;
  bool saw_through = false;
  auto bad = [&](absl::string_view why) {
    return absl::DataLossError(
        absl::StrCat(path, " line ", number, ": ", why, ": '", line, "'"));
  };
  while (std::getline(in, line)) {
    ++number;
    if (number == 1) {
      if (line != kHeader) return bad("not a progress record");
      continue;
    }
    std::vector<std::string> fields = absl::StrSplit(line, ' ');
    if (fields.size() == 2 && fields[0] == "job_id") {
      if (!absl::SimpleAtoi(fields[1], &progress.job_id)) return bad("bad job id");
      saw_job = true;
    } else if (fields.size() == 2 && fields[0] == "exported_through") {
      if (!absl::SimpleAtoi(fields[1], &progress.exported_through)) return bad("bad step");
      saw_through = true;
    } else if (fields.size() == 3 && fields[0] == "file") {
      uint64_t bytes = 0;
      if (!SafeRelativePath(fields[1])) return bad("bad file path");
      if (!absl::SimpleAtoi(fields[2], &bytes)) return bad("bad size");
      progress.files[fields[1]] = bytes;
    } else {
      return bad("unknown line");
    }
  }
  if (number == 0 || !saw_job || !saw_through) {
    return absl::DataLossError(absl::StrCat(path, ": incomplete progress record"));
  }
  return progress;
}

absl::Status WriteExportProgress(const std::string& job_dir, const ExportProgress& progress) {
  std::ostringstream text;
  text << kHeader << "\njob_id " << progress.job_id << "\nexported_through "
       << progress.exported_through << "\n";
  for (const auto& [file, bytes] : progress.files) text << "file " << file << " " << bytes << "\n";
  const std::string path = absl::StrCat(job_dir, "/", kFileName);
  const std::string temporary = path + ".tmp";
  {
    std::ofstream out(temporary, std::ios::trunc);
    out << text.str();
    out.flush();
    if (!out) return absl::InternalError(absl::StrCat("cannot write '", temporary, "'"));
  }
  if (std::rename(temporary.c_str(), path.c_str()) != 0) {
    return absl::InternalError(absl::StrCat("cannot rename '", temporary, "' to '", path, "'"));
  }
  return absl::OkStatus();
}

}  // namespace sonde::server::tensorboard
