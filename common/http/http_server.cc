#include "common/http/http_server.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <utility>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"

namespace sonde::http {
namespace {

// After the response, how long a connection may still send what we did not
// read (so closing does not reset the connection under the response).
constexpr absl::Duration kLinger = absl::Milliseconds(500);
// Connections accepted per turn of the loop.
constexpr int kAcceptBatch = 16;

std::string Serialize(const HttpResponse& r, bool allow_get) {
  std::string out = absl::StrCat("HTTP/1.1 ", r.status, " ", ReasonPhrase(r.status), "\r\n",
                                 "Content-Type: ", r.content_type, "\r\n",
                                 "Content-Length: ", r.body.size(), "\r\n",
                                 "Cache-Control: no-store\r\n", "Connection: close\r\n");
  if (allow_get) out += "Allow: GET\r\n";
  out += "\r\n";
  out += r.body;
  return out;
}

HttpResponse Plain(int status, std::string body) {
  HttpResponse r;
  r.status = status;
  r.body = std::move(body);
  return r;
}

// Splits "host:port" / "[v6]:port".
absl::Status SplitHostPort(const std::string& listen, std::string* host, std::string* port) {
  size_t colon;
  if (!listen.empty() && listen[0] == '[') {
    const size_t close = listen.find(']');
    if (close == std::string::npos || close + 1 >= listen.size() || listen[close + 1] != ':') {
      return absl::InvalidArgumentError(
          absl::StrCat("listen address '", listen, "' is not [host]:port"));
    }
    *host = listen.substr(1, close - 1);
    colon = close + 1;
  } else {
    colon = listen.rfind(':');
    if (colon == std::string::npos) {
      return absl::InvalidArgumentError(
          absl::StrCat("listen address '", listen, "' is not host:port"));
    }
    *host = listen.substr(0, colon);
  }
  *port = listen.substr(colon + 1);
  int number = -1;
  if (host->empty() || !absl::SimpleAtoi(*port, &number) || number < 0 || number > 65535) {
    return absl::InvalidArgumentError(absl::StrCat(
        "listen address '", listen, "' needs a host and a port from 0 to 65535"));
  }
  return absl::OkStatus();
}

std::string FormatAddress(const sockaddr_storage& addr) {
  char text[INET6_ADDRSTRLEN] = {};
  if (addr.ss_family == AF_INET6) {
    const auto* a = reinterpret_cast<const sockaddr_in6*>(&addr);
    inet_ntop(AF_INET6, &a->sin6_addr, text, sizeof(text));
    return absl::StrCat("[", text, "]:", ntohs(a->sin6_port));
  }
  const auto* a = reinterpret_cast<const sockaddr_in*>(&addr);
  inet_ntop(AF_INET, &a->sin_addr, text, sizeof(text));
  return absl::StrCat(text, ":", ntohs(a->sin_port));
}

}  // namespace

const char* ReasonPhrase(int status) {
  switch (status) {
    case 200:
      return "OK";
    case 400:
      return "Bad Request";
    case 404:
      return "Not Found";
    case 405:
      return "Method Not Allowed";
    case 408:
      return "Request Timeout";
    case 431:
      return "Request Header Fields Too Large";
    case 500:
      return "Internal Server Error";
    case 503:
      return "Service Unavailable";
    default:
      return "Unknown";
  }
}

struct HttpServer::Connection {
  enum class State { kReading, kWriting, kDraining };
  int fd = -1;
  State state = State::kReading;
  absl::Time deadline;
  std::string in;
  std::string out;
  size_t sent = 0;
};

absl::StatusOr<std::unique_ptr<HttpServer>> HttpServer::Start(
    const HttpServerOptions& options, std::map<std::string, HttpHandler> handlers) {
  if (options.max_request_bytes < 16 || options.max_connections < 1 ||
      options.io_timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError(
        "http server needs max_request_bytes >= 16, max_connections >= 1, io_timeout > 0");
  }
  std::string host, port;
  absl::Status split = SplitHostPort(options.listen, &host, &port);
  if (!split.ok()) return split;

  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  addrinfo* found = nullptr;
  const int gai = getaddrinfo(host.c_str(), port.c_str(), &hints, &found);
  if (gai != 0) {
    return absl::UnavailableError(
        absl::StrCat("cannot resolve '", options.listen, "': ", gai_strerror(gai)));
  }
  int fd = -1;
  std::string error = "no address";
  for (addrinfo* a = found; a != nullptr && fd < 0; a = a->ai_next) {
    fd = socket(a->ai_family, a->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, a->ai_protocol);
    if (fd < 0) {
      error = std::strerror(errno);
      continue;
    }
    const int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (bind(fd, a->ai_addr, a->ai_addrlen) != 0 || listen(fd, 128) != 0) {
      error = std::strerror(errno);
      close(fd);
      fd = -1;
    }
  }
  freeaddrinfo(found);
  if (fd < 0) {
    return absl::UnavailableError(
        absl::StrCat("cannot listen on '", options.listen, "': ", error));
  }
  sockaddr_storage bound{};
  socklen_t len = sizeof(bound);
  getsockname(fd, reinterpret_cast<sockaddr*>(&bound), &len);

  std::unique_ptr<HttpServer> server(new HttpServer(options, std::move(handlers)));
  server->listen_fd_ = fd;
  server->address_ = FormatAddress(bound);
  server->wake_fd_ = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (server->wake_fd_ < 0) {
    return absl::InternalError(absl::StrCat("eventfd: ", std::strerror(errno)));
  }
  server->thread_ = std::thread([s = server.get()] { s->Loop(); });
  return server;
}

HttpServer::~HttpServer() {
  if (thread_.joinable()) {
    const uint64_t one = 1;
    (void)!write(wake_fd_, &one, sizeof(one));
    thread_.join();
  }
  if (wake_fd_ >= 0) close(wake_fd_);
  if (listen_fd_ >= 0) close(listen_fd_);
}

void HttpServer::Respond(Connection& c, size_t head_end) {
  const std::string head = c.in.substr(0, head_end);
  const size_t eol = head.find_first_of("\r\n");
  const std::vector<std::string> parts =
      absl::StrSplit(head.substr(0, eol), ' ');
  bool allow = false;
  HttpResponse r;
  if (parts.size() != 3 || parts[0].empty() || parts[1].empty() ||
      parts[2].rfind("HTTP/1.", 0) != 0) {
    r = Plain(400, "malformed request line\n");
  } else {
    const std::string path = parts[1].substr(0, parts[1].find_first_of("?#"));
    auto it = handlers_.find(path);
    if (it == handlers_.end()) {
      r = Plain(404, absl::StrCat("no such path: ", path, "\n"));
    } else if (parts[0] != "GET") {
      r = Plain(405, "only GET is supported\n");
      allow = true;
    } else {
      r = it->second();
    }
  }
  c.out = Serialize(r, allow);
  c.sent = 0;
  c.state = Connection::State::kWriting;
}

void HttpServer::Loop() {
  std::vector<std::unique_ptr<Connection>> conns;
  char buf[4096];

  // Does what the connection's state allows without blocking; false when
  // the connection is finished and should be closed.
  auto advance = [&](Connection& c) -> bool {
    while (c.state == Connection::State::kReading) {
      const ssize_t n = recv(c.fd, buf, sizeof(buf), 0);
      if (n == 0) return false;  // gone before asking anything
      if (n < 0) return errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR;
      c.in.append(buf, static_cast<size_t>(n));
      size_t end = c.in.find("\r\n\r\n");
      size_t head_end = end == std::string::npos ? end : end + 4;
      if (head_end == std::string::npos) {
        end = c.in.find("\n\n");  // bare LF, tolerated as RFC 9112 allows
        head_end = end == std::string::npos ? end : end + 2;
      }
      if (head_end != std::string::npos && head_end <= options_.max_request_bytes) {
        Respond(c, head_end);
      } else if (c.in.size() > options_.max_request_bytes) {
        c.out = Serialize(Plain(431, "request head too large\n"), false);
        c.state = Connection::State::kWriting;
      }
    }
    while (c.state == Connection::State::kWriting) {
      const ssize_t n =
          send(c.fd, c.out.data() + c.sent, c.out.size() - c.sent, MSG_NOSIGNAL);
      if (n < 0) return errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR;
      c.sent += static_cast<size_t>(n);
      if (c.sent == c.out.size()) {
        shutdown(c.fd, SHUT_WR);
        c.state = Connection::State::kDraining;
        c.deadline = std::min(c.deadline, absl::Now() + kLinger);
      }
    }
    while (c.state == Connection::State::kDraining) {
      const ssize_t n = recv(c.fd, buf, sizeof(buf), 0);
      if (n == 0) return false;
      if (n < 0) return errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR;
    }
    return true;
  };

  while (true) {
    std::vector<pollfd> fds;
    fds.push_back({wake_fd_, POLLIN, 0});
    fds.push_back({listen_fd_, POLLIN, 0});
    absl::Time next = absl::Now() + absl::Seconds(1);
    for (const auto& c : conns) {
      fds.push_back(
          {c->fd, static_cast<short>(c->state == Connection::State::kWriting ? POLLOUT : POLLIN),
           0});
      next = std::min(next, c->deadline);
    }
    const int64_t wait_ms =
        std::max<int64_t>(0, absl::ToInt64Milliseconds(next - absl::Now()) + 1);
    if (poll(fds.data(), fds.size(), static_cast<int>(wait_ms)) < 0 && errno != EINTR) break;
    if (fds[0].revents != 0) break;  // stopping

    // Connections first (their pollfds follow the two fixed ones), then
    // deadlines, then new connections.
    const absl::Time now = absl::Now();
    std::vector<std::unique_ptr<Connection>> keep;
    for (size_t i = 0; i < conns.size(); ++i) {
      Connection& c = *conns[i];
      bool open = true;
      if (fds[i + 2].revents != 0) open = advance(c);
      if (open && now >= c.deadline) {
        if (c.state == Connection::State::kReading) {
          // Best effort: tell the client why, then close.
          const std::string reply = Serialize(Plain(408, "request timeout\n"), false);
          (void)!send(c.fd, reply.data(), reply.size(), MSG_NOSIGNAL);
        }
        open = false;
      }
      if (open) {
        keep.push_back(std::move(conns[i]));
      } else {
        close(c.fd);
      }
    }
    conns = std::move(keep);

    if (fds[1].revents != 0) {
      // A bounded batch, so clients that keep connecting cannot starve the
      // open connections (their closes would go unnoticed and fill the table).
      for (int batch = 0; batch < kAcceptBatch; ++batch) {
        const int fd = accept4(listen_fd_, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0) break;
        if (conns.size() >= static_cast<size_t>(options_.max_connections)) {
          const std::string reply =
              Serialize(Plain(503, "too many connections\n"), false);
          (void)!send(fd, reply.data(), reply.size(), MSG_NOSIGNAL);
          close(fd);
          continue;
        }
        auto c = std::make_unique<Connection>();
        c->fd = fd;
        c->deadline = absl::Now() + options_.io_timeout;
        if (advance(*c)) {
          conns.push_back(std::move(c));
        } else {
          close(fd);
        }
      }
    }
  }
  for (const auto& c : conns) close(c->fd);
}

}  // namespace sonde::http
