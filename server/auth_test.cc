#include "server/auth.h"

#include <fstream>
#include <string>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/security.h"
#include "tests/testing/status_matchers.h"
#include "tests/testing/temp_dir.h"

namespace sonde::server {
namespace {

using ::sonde::testing::IsOk;
using ::sonde::testing::StatusIs;

std::string Entry(const std::string& name, const std::string& token, const std::string& scope,
                  const std::string& rights) {
  return absl::StrCat("{\"name\": \"", name, "\", \"sha256\": \"", Sha256Hex(token), "\", ",
                      scope, ", \"rights\": ", rights, "}");
}

std::unique_ptr<TokenTable> Table() {
  auto table = TokenTable::FromJson(absl::StrCat(
      "{\"tokens\": [",
      Entry("a-writer", "secret-a-write", "\"project\": \"teamA-\"", "[\"write\"]"), ",",
      Entry("a-reader", "secret-a-read", "\"project\": \"teamA-\"", "[\"read\"]"), ",",
      Entry("listed", "secret-listed", "\"jobs\": [\"one\", \"two\"]", "[\"read\", \"write\"]"),
      ",", Entry("ops", "secret-ops", "\"project\": \"*\"", "[\"admin\"]"), "]}"));
  EXPECT_TRUE(table.ok()) << table.status();
  return table.ok() ? std::move(*table) : nullptr;
}

const TokenGrant& Grant(const TokenTable& table, const std::string& token) {
  const std::string header = "Bearer " + token;
  auto grant = table.Authenticate(&header);
  EXPECT_TRUE(grant.ok()) << grant.status();
  return **grant;
}

TEST(Sha256Hex, MatchesKnownDigest) {
  EXPECT_EQ(Sha256Hex("abc"),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
}

TEST(TokenTable, AuthenticatesKnownTokensOnly) {
  auto table = Table();
  ASSERT_NE(table, nullptr);
  EXPECT_EQ(table->size(), 4u);
  EXPECT_EQ(Grant(*table, "secret-a-write").name, "a-writer");
  EXPECT_EQ(Grant(*table, "secret-ops").name, "ops");
  EXPECT_EQ(Grant(*table, "secret-ops").fingerprint, Sha256Hex("secret-ops").substr(0, 8));
  const std::string lower = "bearer secret-listed";
  ASSERT_THAT(table->Authenticate(&lower).status(), IsOk());
  EXPECT_EQ((*table->Authenticate(&lower))->name, "listed");

  EXPECT_THAT(table->Authenticate(nullptr).status(),
              StatusIs(absl::StatusCode::kUnauthenticated, "requires a token"));
  const std::string unknown = "Bearer secret-nobody";
  EXPECT_THAT(table->Authenticate(&unknown).status(),
              StatusIs(absl::StatusCode::kUnauthenticated, "unknown token"));
  const std::string basic = "Basic secret-ops";
  EXPECT_THAT(table->Authenticate(&basic).status(),
              StatusIs(absl::StatusCode::kUnauthenticated, "not 'Bearer <token>'"));
  const std::string hash_as_token = "Bearer " + Sha256Hex("secret-ops");
  EXPECT_THAT(table->Authenticate(&hash_as_token).status(),
              StatusIs(absl::StatusCode::kUnauthenticated, "unknown token"));
}

TEST(TokenTable, RightsAreCheckedPerJob) {
  auto table = Table();
  ASSERT_NE(table, nullptr);
  const TokenGrant& writer = Grant(*table, "secret-a-write");
  EXPECT_THAT(TokenTable::Check(writer, "teamA-resnet", Right::kWrite), IsOk());
  EXPECT_THAT(TokenTable::Check(writer, "teamA-resnet", Right::kRead),
              StatusIs(absl::StatusCode::kPermissionDenied, "no read right"));
  EXPECT_THAT(TokenTable::Check(writer, "teamB-resnet", Right::kWrite),
              StatusIs(absl::StatusCode::kPermissionDenied, "no write right"));
  EXPECT_THAT(TokenTable::Check(writer, "teamA-resnet", Right::kAdmin),
              StatusIs(absl::StatusCode::kPermissionDenied, "no admin right"));

  const TokenGrant& reader = Grant(*table, "secret-a-read");
  EXPECT_THAT(TokenTable::Check(reader, "teamA-x", Right::kRead), IsOk());
  EXPECT_THAT(TokenTable::Check(reader, "teamA-x", Right::kWrite),
              StatusIs(absl::StatusCode::kPermissionDenied, ""));

  const TokenGrant& listed = Grant(*table, "secret-listed");
  EXPECT_THAT(TokenTable::Check(listed, "one", Right::kRead), IsOk());
  EXPECT_THAT(TokenTable::Check(listed, "two", Right::kWrite), IsOk());
  EXPECT_THAT(TokenTable::Check(listed, "three", Right::kRead),
              StatusIs(absl::StatusCode::kPermissionDenied, ""));
  EXPECT_THAT(TokenTable::Check(listed, "one-more", Right::kRead),
              StatusIs(absl::StatusCode::kPermissionDenied, ""));

  const TokenGrant& ops = Grant(*table, "secret-ops");  // admin implies read and write
  for (Right r : {Right::kRead, Right::kWrite, Right::kAdmin}) {
    EXPECT_THAT(TokenTable::Check(ops, "anything", r), IsOk());
  }
}

TEST(TokenTable, RefusalDependsOnlyOnTokenRightAndJobName) {
  auto table = Table();
  ASSERT_NE(table, nullptr);
  const TokenGrant& writer = Grant(*table, "secret-a-write");
  const absl::Status refused = TokenTable::Check(writer, "teamB-x", Right::kWrite);
  EXPECT_EQ(refused.message(), "token 'a-writer' has no write right on job 'teamB-x'");
  EXPECT_EQ(refused.message().find("secret"), absl::string_view::npos);
}

TEST(TokenTable, RejectsMalformedFiles) {
  const std::string hash = Sha256Hex("t");
  const struct {
    std::string json;
    std::string error;
  } cases[] = {
      {"not json", "not valid JSON"},
      {"{\"tokenz\": []}", "expected {\"tokens\""},
      {"{\"tokens\": [{\"sha256\": \"" + hash + "\", \"project\": \"a\", \"rights\": [\"read\"]}]}",
       "'name'"},
      {"{\"tokens\": [{\"name\": \"n\", \"sha256\": \"abc\", \"project\": \"a\", \"rights\": [\"read\"]}]}",
       "64 hex digits"},
      {"{\"tokens\": [{\"name\": \"n\", \"sha256\": \"" + hash + "\", \"rights\": [\"read\"]}]}",
       "'project' or a list of 'jobs'"},
      {"{\"tokens\": [{\"name\": \"n\", \"sha256\": \"" + hash +
           "\", \"project\": \"a\", \"rights\": [\"root\"]}]}",
       "unknown right 'root'"},
      {"{\"tokens\": [{\"name\": \"n\", \"sha256\": \"" + hash +
           "\", \"project\": \"a\", \"rights\": [\"read\"], \"token\": \"t\"}]}",
       "unknown key 'token'"},
      {"{\"tokens\": [{\"name\": \"n\", \"sha256\": \"" + hash +
           "\", \"project\": \"a\", \"rights\": [\"read\"]}, {\"name\": \"n\", \"sha256\": \"" +
           Sha256Hex("u") + "\", \"project\": \"a\", \"rights\": [\"read\"]}]}",
       "duplicate name 'n'"},
  };
  for (const auto& c : cases) {
    EXPECT_THAT(TokenTable::FromJson(c.json).status(),
                StatusIs(absl::StatusCode::kInvalidArgument, c.error))
        << c.json;
  }
}

TEST(TokenTable, ReadsAFile) {
  sonde::testing::TempDir dir;
  const std::string path = dir.Sub("tokens.json");
  std::ofstream(path) << "{\"tokens\": [" << Entry("x", "tok", "\"jobs\": [\"j\"]", "[\"read\"]")
                      << "]}";
  auto table = TokenTable::FromFile(path);
  ASSERT_THAT(table.status(), IsOk());
  EXPECT_EQ((*table)->size(), 1u);
  EXPECT_THAT(TokenTable::FromFile(dir.Sub("missing.json")).status(),
              StatusIs(absl::StatusCode::kNotFound, "missing.json"));
}

TEST(ServerSecurity, LoopbackAddresses) {
  EXPECT_TRUE(IsLoopbackListen("127.0.0.1:7070"));
  EXPECT_TRUE(IsLoopbackListen("127.3.2.1:0"));
  EXPECT_TRUE(IsLoopbackListen("localhost:7070"));
  EXPECT_TRUE(IsLoopbackListen("[::1]:7070"));
  EXPECT_FALSE(IsLoopbackListen("0.0.0.0:7070"));
  EXPECT_FALSE(IsLoopbackListen("[::]:7070"));
  EXPECT_FALSE(IsLoopbackListen("10.1.2.3:7070"));
  EXPECT_FALSE(IsLoopbackListen("example.com:7070"));
}

TEST(ServerSecurity, PlaintextWithoutAuthOnlyOnLoopback) {
  ServerSecurityOptions none;
  EXPECT_THAT(CheckServerSecurity("127.0.0.1:0", none), IsOk());
  EXPECT_THAT(CheckServerSecurity("0.0.0.0:7070", none),
              StatusIs(absl::StatusCode::kFailedPrecondition, "--allow_insecure"));
  ServerSecurityOptions allowed;
  allowed.allow_insecure = true;
  EXPECT_THAT(CheckServerSecurity("0.0.0.0:7070", allowed), IsOk());
  ServerSecurityOptions tls;
  tls.tls_cert_file = "c.pem";
  tls.tls_key_file = "k.pem";
  EXPECT_THAT(CheckServerSecurity("0.0.0.0:7070", tls), IsOk());
  ServerSecurityOptions auth;
  auth.auth_tokens_file = "tokens.json";
  EXPECT_THAT(CheckServerSecurity("0.0.0.0:7070", auth), IsOk());
  ServerSecurityOptions half;
  half.tls_cert_file = "c.pem";
  EXPECT_THAT(CheckServerSecurity("127.0.0.1:0", half),
              StatusIs(absl::StatusCode::kInvalidArgument, "key file"));
  ServerSecurityOptions ca_only;
  ca_only.tls_client_ca_file = "ca.pem";
  EXPECT_THAT(CheckServerSecurity("127.0.0.1:0", ca_only),
              StatusIs(absl::StatusCode::kInvalidArgument, "need TLS"));
}

}  // namespace
}  // namespace sonde::server
