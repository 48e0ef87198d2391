#include "server/auth.h"

#include <openssl/crypto.h>
#include <openssl/sha.h>

#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "common/channel.h"
#include "glog/logging.h"
#include "nlohmann/json.hpp"

namespace sonde::server {
namespace {

std::array<uint8_t, 32> Sha256(absl::string_view text) {
  std::array<uint8_t, 32> digest;
  SHA256(reinterpret_cast<const unsigned char*>(text.data()), text.size(), digest.data());
  return digest;
}

std::string Hex(const uint8_t* data, size_t n) {
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string out;
  out.reserve(2 * n);
  for (size_t i = 0; i < n; ++i) {
    out.push_back(kDigits[data[i] >> 4]);
    out.push_back(kDigits[data[i] & 15]);
  }
  return out;
}

absl::StatusOr<std::array<uint8_t, 32>> ParseHexDigest(const std::string& hex) {
  std::array<uint8_t, 32> out;
  if (hex.size() != 64) {
    return absl::InvalidArgumentError(
        absl::StrCat("sha256 must be 64 hex digits, got ", hex.size(), " characters"));
  }
  for (size_t i = 0; i < 32; ++i) {
    uint8_t byte = 0;
    for (size_t k = 0; k < 2; ++k) {
      const char c = absl::ascii_tolower(hex[2 * i + k]);
      int v;
      if (c >= '0' && c <= '9') {
        v = c - '0';
      } else if (c >= 'a' && c <= 'f') {
        v = c - 'a' + 10;
      } else {
        return absl::InvalidArgumentError("sha256 must be 64 hex digits");
      }
      byte = static_cast<uint8_t>(byte << 4 | v);
    }
    out[i] = byte;
  }
  return out;
}

absl::StatusOr<TokenGrant> ParseGrant(const nlohmann::json& entry, size_t index) {
  const std::string where = absl::StrCat("token entry ", index);
  if (!entry.is_object()) return absl::InvalidArgumentError(where + ": not an object");
  for (const auto& [key, value] : entry.items()) {
    if (key != "name" && key != "sha256" && key != "project" && key != "jobs" &&
        key != "rights") {
      return absl::InvalidArgumentError(absl::StrCat(where, ": unknown key '", key, "'"));
    }
  }
  TokenGrant g;
  if (!entry.contains("name") || !entry["name"].is_string() ||
      entry["name"].get<std::string>().empty()) {
    return absl::InvalidArgumentError(where + ": needs a non-empty string 'name'");
  }
  g.name = entry["name"].get<std::string>();
  const std::string named = absl::StrCat(where, " ('", g.name, "')");
  if (!entry.contains("sha256") || !entry["sha256"].is_string()) {
    return absl::InvalidArgumentError(named + ": needs 'sha256', the token's SHA-256 in hex");
  }
  auto digest = ParseHexDigest(entry["sha256"].get<std::string>());
  if (!digest.ok()) return absl::InvalidArgumentError(absl::StrCat(named, ": ", digest.status().message()));
  g.sha256 = *digest;
  g.fingerprint = Hex(g.sha256.data(), 4);
  if (entry.contains("project")) {
    if (!entry["project"].is_string() || entry["project"].get<std::string>().empty()) {
      return absl::InvalidArgumentError(
          named + ": 'project' must be a non-empty job-name prefix, or \"*\" for every job");
    }
    g.project = entry["project"].get<std::string>();
    if (g.project == "*") {
      g.all_jobs = true;
      g.project.clear();
    }
  }
  if (entry.contains("jobs")) {
    if (!entry["jobs"].is_array()) return absl::InvalidArgumentError(named + ": 'jobs' must be a list");
    for (const auto& j : entry["jobs"]) {
      if (!j.is_string() || j.get<std::string>().empty()) {
        return absl::InvalidArgumentError(named + ": 'jobs' must hold non-empty job names");
      }
      g.jobs.insert(j.get<std::string>());
    }
  }
  if (!g.all_jobs && g.project.empty() && g.jobs.empty()) {
    return absl::InvalidArgumentError(named + ": give a 'project' or a list of 'jobs'");
  }
  if (!entry.contains("rights") || !entry["rights"].is_array() || entry["rights"].empty()) {
    return absl::InvalidArgumentError(
        named + ": needs 'rights', a list of \"read\", \"write\", \"admin\"");
  }
  for (const auto& r : entry["rights"]) {
    const std::string right = r.is_string() ? r.get<std::string>() : r.dump();
    if (right == "read") {
      g.rights |= static_cast<uint8_t>(Right::kRead);
    } else if (right == "write") {
      g.rights |= static_cast<uint8_t>(Right::kWrite);
    } else if (right == "admin") {
      g.rights |= static_cast<uint8_t>(Right::kAdmin) | static_cast<uint8_t>(Right::kRead) |
                  static_cast<uint8_t>(Right::kWrite);
    } else {
      return absl::InvalidArgumentError(absl::StrCat(
          named, ": unknown right '", right, "' (known: read, write, admin)"));
    }
  }
  return g;
}

}  // namespace

absl::string_view RightName(Right right) {
  switch (right) {
    case Right::kRead:
      return "read";
    case Right::kWrite:
      return "write";
    case Right::kAdmin:
      return "admin";
  }
  return "?";
}

bool TokenGrant::Covers(absl::string_view job) const {
  if (all_jobs) return true;
  if (!project.empty() && absl::StartsWith(job, project)) return true;
  return jobs.count(std::string(job)) > 0;
}

std::string Sha256Hex(absl::string_view text) {
  const auto digest = Sha256(text);
  return Hex(digest.data(), digest.size());
}

absl::StatusOr<std::unique_ptr<TokenTable>> TokenTable::FromJson(absl::string_view text) {
  nlohmann::json doc = nlohmann::json::parse(text.begin(), text.end(), nullptr,
                                             /*allow_exceptions=*/false);
  if (doc.is_discarded()) return absl::InvalidArgumentError("tokens file: not valid JSON");
  if (!doc.is_object() || !doc.contains("tokens") || !doc["tokens"].is_array()) {
    return absl::InvalidArgumentError("tokens file: expected {\"tokens\": [...]}");
  }
  std::unique_ptr<TokenTable> table(new TokenTable());
  std::set<std::string> names;
  for (size_t i = 0; i < doc["tokens"].size(); ++i) {
    auto grant = ParseGrant(doc["tokens"][i], i);
    if (!grant.ok()) return absl::InvalidArgumentError(
        absl::StrCat("tokens file: ", grant.status().message()));
    if (!names.insert(grant->name).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("tokens file: token entry ", i, ": duplicate name '", grant->name, "'"));
    }
    for (const TokenGrant& other : table->grants_) {
      if (other.sha256 == grant->sha256) {
        return absl::InvalidArgumentError(absl::StrCat(
            "tokens file: entries '", other.name, "' and '", grant->name,
            "' have the same sha256"));
      }
    }
    table->grants_.push_back(std::move(*grant));
  }
  return table;
}

absl::StatusOr<std::unique_ptr<TokenTable>> TokenTable::FromFile(const std::string& path) {
  auto text = ReadSecretFile(path);
  if (!text.ok()) return text.status();
  auto table = FromJson(*text);
  if (!table.ok()) {
    return absl::Status(table.status().code(),
                        absl::StrCat(path, ": ", table.status().message()));
  }
  return table;
}

absl::StatusOr<const TokenGrant*> TokenTable::Authenticate(const std::string* header) const {
  if (header == nullptr) {
    return absl::UnauthenticatedError(
        "this collector requires a token: send 'authorization: Bearer <token>' metadata");
  }
  absl::string_view value = *header;
  const size_t space = value.find(' ');
  if (space == absl::string_view::npos ||
      !absl::EqualsIgnoreCase(value.substr(0, space), "bearer")) {
    return absl::UnauthenticatedError("the authorization metadata is not 'Bearer <token>'");
  }
  const std::array<uint8_t, 32> digest =
      Sha256(absl::StripAsciiWhitespace(value.substr(space + 1)));
  const TokenGrant* found = nullptr;
  for (const TokenGrant& g : grants_) {  // every entry, whatever matches first
    if (CRYPTO_memcmp(g.sha256.data(), digest.data(), digest.size()) == 0) found = &g;
  }
  if (found == nullptr) return absl::UnauthenticatedError("unknown token");
  return found;
}

absl::Status TokenTable::Check(const TokenGrant& grant, absl::string_view job, Right right) {
  if ((grant.rights & static_cast<uint8_t>(right)) != 0 && grant.Covers(job)) {
    return absl::OkStatus();
  }
  return absl::PermissionDeniedError(absl::StrCat("token '", grant.name, "' has no ",
                                                  RightName(right), " right on job '", job,
                                                  "'"));
}

absl::StatusOr<const TokenGrant*> AuthenticateCall(const TokenTable& tokens,
                                                   const grpc::ServerContextBase& context) {
  const auto& metadata = context.client_metadata();
  const auto it = metadata.find("authorization");
  std::string header;
  if (it != metadata.end()) header.assign(it->second.data(), it->second.size());
  auto grant = tokens.Authenticate(it != metadata.end() ? &header : nullptr);
  if (!grant.ok()) {
    LOG(WARNING) << "refused a call from " << context.peer() << ": " << grant.status().message();
  }
  return grant;
}

}  // namespace sonde::server
