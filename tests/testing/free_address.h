// An address on 127.0.0.1 that nothing listens on right now (bound to
// port 0, read, closed): for tests whose server must start later, or
// restart, on a fixed address.
#ifndef SONDE_TESTS_TESTING_FREE_ADDRESS_H_
#define SONDE_TESTS_TESTING_FREE_ADDRESS_H_

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <string>

#include "absl/strings/str_cat.h"

namespace sonde::testing {

inline std::string FreeLoopbackAddress() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
  socklen_t len = sizeof(addr);
  getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  close(fd);
  return absl::StrCat("127.0.0.1:", ntohs(addr.sin_port));
}

}  // namespace sonde::testing

#endif  // SONDE_TESTS_TESTING_FREE_ADDRESS_H_
