// Throwaway certificates for TLS tests, made at test time by /usr/bin/openssl
// in a temporary directory: a CA, a server certificate for 127.0.0.1 and
// localhost (for server and client authentication, so servers that also
// dial each other, as etcd members do, can use it), a client certificate
// from the same CA, and one from another CA.
#ifndef SONDE_TESTS_TESTING_TEST_CERTIFICATES_H_
#define SONDE_TESTS_TESTING_TEST_CERTIFICATES_H_

#include <sys/wait.h>

#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "tests/testing/temp_dir.h"

namespace sonde::testing {

inline int RunShell(const std::string& command) {
  const int rc = std::system(command.c_str());
  return WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
}

inline void WriteFile(const std::string& path, const std::string& text) {
  std::ofstream(path) << text;
}

// A throwaway CA, a server certificate for 127.0.0.1 and localhost, a
// client certificate from the same CA, and one from another CA.
class Certificates {
 public:
  Certificates() {
    const std::string d = dir_.path();
    WriteFile(dir_.Sub("ca.cnf"),
              "[req]\ndistinguished_name = dn\nprompt = no\nx509_extensions = v3_ca\n"
              "[dn]\nCN = Sonde test CA\n"
              "[v3_ca]\nbasicConstraints = critical,CA:TRUE\n"
              "keyUsage = critical,keyCertSign,cRLSign\nsubjectKeyIdentifier = hash\n");
    WriteFile(dir_.Sub("leaf.cnf"), "[req]\ndistinguished_name = dn\nprompt = no\n[dn]\nCN = sonde\n");
    WriteFile(dir_.Sub("server.ext"),
              "subjectAltName = IP:127.0.0.1,DNS:localhost\nbasicConstraints = CA:FALSE\n"
              "keyUsage = digitalSignature,keyEncipherment\nextendedKeyUsage = serverAuth,clientAuth\n");
    WriteFile(dir_.Sub("client.ext"),
              "basicConstraints = CA:FALSE\nkeyUsage = digitalSignature\n"
              "extendedKeyUsage = clientAuth\n");
    const std::string ssl = "/usr/bin/openssl";
    const std::string key = " -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes";
    std::string script = absl::StrCat("cd '", d, "' && set -e");
    for (const std::string ca : {"ca", "other_ca"}) {
      absl::StrAppend(&script, " && ", ssl, " req -x509 -config ca.cnf", key, " -keyout ", ca,
                      ".key -out ", ca, ".pem -days 2");
    }
    const std::vector<std::vector<std::string>> leaves = {
        {"server", "ca", "server.ext"}, {"client", "ca", "client.ext"},
        {"other_client", "other_ca", "client.ext"}};
    for (const auto& leaf : leaves) {
      absl::StrAppend(&script, " && ", ssl, " req -new -config leaf.cnf", key, " -keyout ",
                      leaf[0], ".key -out ", leaf[0], ".csr && ", ssl, " x509 -req -in ",
                      leaf[0], ".csr -CA ", leaf[1], ".pem -CAkey ", leaf[1],
                      ".key -CAcreateserial -days 2 -extfile ", leaf[2], " -out ", leaf[0],
                      ".pem");
    }
    absl::StrAppend(&script, " 2> openssl.log");
    ok_ = RunShell(script) == 0;
  }

  bool ok() const { return ok_; }
  std::string operator()(const std::string& name) const { return dir_.Sub(name); }
  const std::string& dir() const { return dir_.path(); }

 private:
  TempDir dir_;
  bool ok_ = false;
};

}  // namespace sonde::testing

#endif  // SONDE_TESTS_TESTING_TEST_CERTIFICATES_H_
