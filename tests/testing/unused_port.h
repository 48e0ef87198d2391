// A loopback port nothing listens on just now: bound to port 0, read back
// and closed. For servers that cannot share a port held open (etcd 3.4,
// nats-server; see free_address.h for the ones that can): another process
// may take the port before the server binds it, so callers retry.
#ifndef SONDE_TESTS_TESTING_UNUSED_PORT_H_
#define SONDE_TESTS_TESTING_UNUSED_PORT_H_

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

namespace sonde::testing {

inline int UnusedLoopbackPort() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(addr);
  int port = 0;
  if (bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0 &&
      getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0) {
    port = ntohs(addr.sin_port);
  }
  close(fd);
  return port;
}

// A socket listening on 127.0.0.1 at a port the kernel picked, held open:
// for test servers in this process (tests/testing/http_server.h,
// smtp_server.h). Sets `port`; the caller closes the socket.
inline int ListenOnLoopback(int* port) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(addr);
  *port = 0;
  if (bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0 && listen(fd, 16) == 0 &&
      getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0) {
    *port = ntohs(addr.sin_port);
  }
  return fd;
}

}  // namespace sonde::testing

#endif  // SONDE_TESTS_TESTING_UNUSED_PORT_H_
