// An address on 127.0.0.1 held for a server that starts later (or
// restarts) on it: for tests whose clients must begin while nothing
// listens there.
//
// The port is picked by binding to port 0, and the socket stays bound,
// with SO_REUSEPORT, for the holder's life: no other socket can take the
// port meanwhile (closing it at once, as a plain "free port" helper does,
// leaves a window in which another test may), while gRPC servers, which
// set SO_REUSEPORT too, bind and listen on it. The socket never listens, so
// connecting before the server is up is refused, as with no server at all.
#ifndef SONDE_TESTS_TESTING_FREE_ADDRESS_H_
#define SONDE_TESTS_TESTING_FREE_ADDRESS_H_

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdint>
#include <string>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"

namespace sonde::testing {

class ReservedLoopbackAddress {
 public:
  // A free port.
  ReservedLoopbackAddress() : ReservedLoopbackAddress(0) {}
  // `port` itself, e.g. one a running server listens on, held across its
  // restart.
  explicit ReservedLoopbackAddress(uint16_t port) {
    fd_ = socket(AF_INET, SOCK_STREAM, 0);
    const int one = 1;
    EXPECT_EQ(setsockopt(fd_, SOL_SOCKET, SO_REUSEPORT, &one, sizeof(one)), 0);
    EXPECT_EQ(setsockopt(fd_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one)), 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    addr.sin_port = htons(port);
    EXPECT_EQ(bind(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
    socklen_t len = sizeof(addr);
    EXPECT_EQ(getsockname(fd_, reinterpret_cast<sockaddr*>(&addr), &len), 0);
    address_ = absl::StrCat("127.0.0.1:", ntohs(addr.sin_port));
  }
  ~ReservedLoopbackAddress() {
    if (fd_ >= 0) close(fd_);
  }
  ReservedLoopbackAddress(const ReservedLoopbackAddress&) = delete;
  ReservedLoopbackAddress& operator=(const ReservedLoopbackAddress&) = delete;

  const std::string& address() const { return address_; }

 private:
  int fd_ = -1;
  std::string address_;
};

}  // namespace sonde::testing

#endif  // SONDE_TESTS_TESTING_FREE_ADDRESS_H_
