// A raw HTTP/1.1 exchange over a real socket, for tests of the operators'
// endpoints: connect to host:port, send exactly the given bytes, read until
// the server closes, split the response into status, headers and body.
#ifndef SONDE_TESTS_TESTING_HTTP_GET_H_
#define SONDE_TESTS_TESTING_HTTP_GET_H_

#include <netdb.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <map>
#include <string>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"

namespace sonde::testing {

struct HttpReply {
  int status = 0;                              // 0: no parsable response
  std::map<std::string, std::string> headers;  // names lower-cased
  std::string body;
  std::string raw;
};

// A connected socket to "host:port" / "[v6]:port", or -1.
inline int ConnectTo(const std::string& address) {
  std::string host, port;
  if (!address.empty() && address[0] == '[') {
    const size_t close = address.find(']');
    host = address.substr(1, close - 1);
    port = address.substr(close + 2);
  } else {
    const size_t colon = address.rfind(':');
    host = address.substr(0, colon);
    port = address.substr(colon + 1);
  }
  addrinfo hints{};
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  if (getaddrinfo(host.c_str(), port.c_str(), &hints, &found) != 0) return -1;
  int fd = -1;
  for (addrinfo* a = found; a != nullptr && fd < 0; a = a->ai_next) {
    fd = socket(a->ai_family, a->ai_socktype, a->ai_protocol);
    if (fd >= 0 && connect(fd, a->ai_addr, a->ai_addrlen) != 0) {
      close(fd);
      fd = -1;
    }
  }
  freeaddrinfo(found);
  return fd;
}

inline bool SendAll(int fd, absl::string_view data) {
  while (!data.empty()) {
    const ssize_t n = send(fd, data.data(), data.size(), MSG_NOSIGNAL);
    if (n <= 0) return false;
    data.remove_prefix(static_cast<size_t>(n));
  }
  return true;
}

// Reads until the peer closes (or an error) and parses what came.
inline HttpReply ReadReply(int fd) {
  HttpReply reply;
  char buf[4096];
  while (true) {
    const ssize_t n = recv(fd, buf, sizeof(buf), 0);
    if (n <= 0) break;
    reply.raw.append(buf, static_cast<size_t>(n));
  }
  const size_t head_end = reply.raw.find("\r\n\r\n");
  if (head_end == std::string::npos) return reply;
  std::vector<std::string> lines =
      absl::StrSplit(reply.raw.substr(0, head_end), "\r\n");
  std::vector<std::string> status_line = absl::StrSplit(lines[0], absl::MaxSplits(' ', 2));
  if (status_line.size() < 2 || status_line[0] != "HTTP/1.1" ||
      !absl::SimpleAtoi(status_line[1], &reply.status)) {
    reply.status = 0;
    return reply;
  }
  for (size_t i = 1; i < lines.size(); ++i) {
    const size_t colon = lines[i].find(':');
    if (colon == std::string::npos) continue;
    reply.headers[absl::AsciiStrToLower(lines[i].substr(0, colon))] =
        std::string(absl::StripAsciiWhitespace(lines[i].substr(colon + 1)));
  }
  reply.body = reply.raw.substr(head_end + 4);
  return reply;
}

// Sends `request` verbatim and reads the reply.
inline HttpReply HttpExchange(const std::string& address, const std::string& request) {
  const int fd = ConnectTo(address);
  if (fd < 0) return HttpReply();
  SendAll(fd, request);
  HttpReply reply = ReadReply(fd);
  close(fd);
  return reply;
}

// A GET that gives up after `timeout` without an answer (a server that
// accepts connections before it serves them), for readiness probes.
inline HttpReply HttpGetWithin(const std::string& address, const std::string& path,
                               int timeout_seconds) {
  const int fd = ConnectTo(address);
  if (fd < 0) return HttpReply();
  timeval timeout{timeout_seconds, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof(timeout));
  SendAll(fd, absl::StrCat("GET ", path, " HTTP/1.1\r\nHost: ", address,
                           "\r\nConnection: close\r\n\r\n"));
  HttpReply reply = ReadReply(fd);
  close(fd);
  return reply;
}

inline HttpReply HttpGet(const std::string& address, const std::string& path) {
  return HttpExchange(address, absl::StrCat("GET ", path, " HTTP/1.1\r\nHost: ", address,
                                            "\r\nUser-Agent: sonde-test\r\n\r\n"));
}

}  // namespace sonde::testing

#endif  // SONDE_TESTS_TESTING_HTTP_GET_H_
